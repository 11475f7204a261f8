"""The annotation expert on real-format records: EM 1, every gold passage retrieved, drops
counted; and on ../shared/data's samples when present."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest

import rag_gym  # noqa: F401  (registers the envs)
from rag_gym.agents.real_expert import (
    DROP_REASONS,
    AnnotationExpert,
    ExpertReport,
    keywords,
    play_split,
)
from rag_gym.wrappers import TextActions
from tests.conftest import SHARED_DATA, shared_file

DISTRACTORS = [
    ["Kest", ["Kest is a market town on the river Orl.", " It has a bridge."]],
    ["Morrow Hall", ["Morrow Hall is a concert venue.", " It opened in 1990."]],
    ["Tuln", ["Tuln is a village.", " Its church is old."]],
]

HOTPOT = [
    {  # bridge: the book names its author, the author's paragraph holds the answer
        "_id": "hb1",
        "question": "Where was the author of the novel Vell Tales born?",
        "answer": "Orlin",
        "type": "bridge",
        "level": "hard",
        "supporting_facts": [["Vell Tales", 0], ["Ada Marr", 1]],
        "context": [
            ["Vell Tales", ["Vell Tales is a novel by Ada Marr.", " It was published in 1901."]],
            ["Ada Marr", ["Ada Marr was a novelist.", " She was born in Orlin."]],
            *DISTRACTORS,
        ],
    },
    {  # comparison: two entities, the answer is one of them
        "_id": "hc1",
        "question": "Which opened first, Morrow Hall or Pell Arena?",
        "answer": "Pell Arena",
        "type": "comparison",
        "level": "hard",
        "supporting_facts": [["Morrow Hall", 1], ["Pell Arena", 0]],
        "context": [
            *DISTRACTORS,
            ["Pell Arena", ["Pell Arena opened in 1971 in Kest."]],
        ],
    },
]

TWOWIKI = [
    {
        "_id": "w1",
        "type": "compositional",
        "question": "Where was the director of film Grey Harbour born?",
        "answer": "Tuln",
        "context": [
            ["Grey Harbour", ["Grey Harbour is a 1950 film directed by Iva Roon."]],
            ["Iva Roon", ["Iva Roon was a film director.", "Roon was born in Tuln."]],
            *DISTRACTORS,
        ],
        "supporting_facts": [["Grey Harbour", 0], ["Iva Roon", 1]],
        "evidences": [
            ["Grey Harbour", "director", "Iva Roon"],
            ["Iva Roon", "place of birth", "Tuln"],
        ],
        "entity_ids": "Q1_Q2",
    },
    {  # no evidence triples: no plan
        "_id": "w2",
        "type": "comparison",
        "question": "Which film came out first, Grey Harbour or Red Harbour?",
        "answer": "Grey Harbour",
        "context": [
            ["Grey Harbour", ["Grey Harbour is a 1950 film directed by Iva Roon."]],
            ["Red Harbour", ["Red Harbour is a 1960 film."]],
            *DISTRACTORS,
        ],
        "supporting_facts": [["Grey Harbour", 0], ["Red Harbour", 0]],
        "evidences": [],
        "entity_ids": "Q1_Q3",
    },
]

MUSIQUE = [
    {
        "id": "2hop__1_2",
        "question": "What river flows through the birthplace of Ada Marr?",
        "answer": "Orl",
        "answer_aliases": ["the Orl"],
        "answerable": True,
        "paragraphs": [
            {
                "idx": 0,
                "title": "Tuln",
                "paragraph_text": "Tuln is a village.",
                "is_supporting": False,
            },
            {
                "idx": 1,
                "title": "Ada Marr",
                "paragraph_text": "Ada Marr was a novelist. She was born in Kest.",
                "is_supporting": True,
            },
            {
                "idx": 2,
                "title": "Kest",
                "paragraph_text": "Kest is a market town. The river Orl flows through Kest.",
                "is_supporting": True,
            },
            {
                "idx": 3,
                "title": "Morrow Hall",
                "paragraph_text": "Morrow Hall is a venue.",
                "is_supporting": False,
            },
        ],
        "question_decomposition": [
            {
                "id": 1,
                "question": "Ada Marr >> place of birth",
                "answer": "Kest",
                "paragraph_support_idx": 1,
            },
            {
                "id": 2,
                "question": "What river flows through #1?",
                "answer": "Orl",
                "paragraph_support_idx": 2,
            },
        ],
    }
]


def _env(env_id: str, path: Path, k: int = 3) -> gym.Env:
    return TextActions(gym.make(env_id, data_path=str(path), k=k), tags="search_r1")


def _check_kept(demos, env) -> None:
    for demo in demos:
        example = env.unwrapped.examples[demo.index]
        assert demo.info["scores"]["em"] == 1.0
        assert set(example.supporting_ids) <= set(demo.info["gold_found"])
        assert demo.turns[-1].action.endswith(f"<answer>{example.answer}</answer>")
        # every search turn is a think then a search, written as the policy writes it
        for turn in demo.turns[:-1]:
            assert turn.action.startswith("<think>") and turn.action.endswith("</search>")


@pytest.mark.parametrize(
    ("env_id", "name", "records", "kept", "dropped"),
    [
        ("rag_gym/HotpotQA-v0", "h.json", HOTPOT, 2, {}),
        ("rag_gym/2WikiMultiHopQA-v0", "w.json", TWOWIKI, 1, {("comparison", "no_plan"): 1}),
        ("rag_gym/MuSiQue-v0", "m.jsonl", MUSIQUE, 1, {}),
    ],
)
def test_transcripts_of_each_dataset_pass_their_checks(
    tmp_path, env_id, name, records, kept, dropped
):
    path = tmp_path / name
    if name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        path.write_text(json.dumps(records))
    env = _env(env_id, path)
    demos, report = play_split(env, AnnotationExpert(env.tags, seed=0))
    assert len(demos) == kept
    _check_kept(demos, env)
    dataset = env.unwrapped.dataset
    assert {(t, r): n for (_, t, r), n in report.dropped.items()} == dropped
    assert sum(report.kept.values()) == kept
    assert all(d == dataset for d, _ in report.kept)


def test_queries_are_written_as_a_searcher_writes_them(tmp_path):
    """The bridge's second search is the entity read plus the relation sought, the 2Wiki
    searches are subject plus relation, MuSiQue's the sub-question with the answer read."""
    path = tmp_path / "h.json"
    path.write_text(json.dumps(HOTPOT[:1]))
    env = _env("rag_gym/HotpotQA-v0", path, k=1)
    demo, outcome = AnnotationExpert(env.tags).play(env, 0)
    assert outcome == "kept"
    searches = [t.action.split("<search>")[1].split("</search>")[0] for t in demo.turns[:-1]]
    assert searches[0] == HOTPOT[0]["question"]
    assert searches[1].startswith("Ada Marr ") and searches[1] != "Ada Marr"
    reading = demo.turns[1].action
    assert "Vell Tales is a novel by Ada Marr" in reading  # the supporting sentence, quoted
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(MUSIQUE[0]) + "\n")
    env = _env("rag_gym/MuSiQue-v0", path, k=1)
    demo, outcome = AnnotationExpert(env.tags).play(env, 0)
    searches = [t.action.split("<search>")[1].split("</search>")[0] for t in demo.turns[:-1]]
    assert outcome == "kept" and searches == [
        "Ada Marr place of birth",
        "What river flows through Kest?",
    ]
    assert "The river Orl flows through Kest" in demo.turns[-1].action


def test_a_question_whose_gold_passage_is_never_retrieved_is_dropped_and_counted(tmp_path):
    record = json.loads(json.dumps(HOTPOT[0]))
    # a distractor that matches every query form better than the author's paragraph does
    record["context"].append(
        [
            "Decoy",
            ["Where was the author of the novel Vell Tales born? Ada Marr author novel born."],
        ]
    )
    path = tmp_path / "h.json"
    path.write_text(json.dumps([record]))
    env = _env("rag_gym/HotpotQA-v0", path, k=1)
    demos, report = play_split(env, AnnotationExpert(env.tags, max_attempts=1))
    assert demos == []
    assert report.dropped == {("hotpotqa", "bridge", "not_retrieved"): 1}
    assert report.as_rows() == [
        {
            "dataset": "hotpotqa",
            "type": "bridge",
            "kept": 0,
            "dropped": 1,
            "dropped_not_retrieved": 1,
        }
    ]


def test_expert_errors_are_clear():
    from rag_gym.envs.tags import tag_set

    with pytest.raises(ValueError, match="max_attempts >= 1"):
        AnnotationExpert(tag_set("search_r1"), max_attempts=0)
    assert keywords("Who directed the film Grey Harbour?", "Grey Harbour") == "directed film"
    assert set(DROP_REASONS) >= {"no_plan", "not_retrieved", "wrong_answer"}


@pytest.mark.shared_data
@pytest.mark.parametrize(
    ("env_id", "folder", "least"),
    [
        ("rag_gym/HotpotQA-v0", "hotpotqa", 0.9),
        ("rag_gym/2WikiMultiHopQA-v0", "2wikimultihopqa", 0.9),
        ("rag_gym/MuSiQue-v0", "musique", 0.6),
    ],
)
def test_the_samples_train_split_transcripts(env_id, folder, least):
    shared_file("hotpotqa/hotpot_dev_distractor_300.json")
    env = TextActions(
        gym.make(
            env_id,
            data_path=str(SHARED_DATA / folder),
            split="train",
            dataset_kwargs={"split_by_id": True},
        ),
        tags="search_r1",
    )
    demos, report = play_split(env, AnnotationExpert(env.tags, seed=0))
    _check_kept(demos, env)
    total = len(env.unwrapped.examples)
    assert sum(report.kept.values()) + sum(report.dropped.values()) == total
    assert len(demos) >= least * total, report.as_rows()
    assert isinstance(report, ExpertReport)
