"""Every reward term on scripted episodes, against values computed by hand from the papers."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rag_gym
from rag_gym.data import Corpus, Passage, QAExample
from rag_gym.envs import ReaderEnv, SearchEnv, TreeSearchEnv
from rag_gym.retrieval import BM25Retriever
from rag_gym.rewards import core
from rag_gym.wrappers import (
    AnswerCorrectnessReward,
    ArenaBonus,
    BacktrackPenalty,
    DropBaseReward,
    JointHitReward,
    MultiHitReward,
    MultiStageAnswerReward,
    QueryOverlapPenalty,
    R2AGGate,
    ReaderAccuracyReward,
    ReaderFormatReward,
    RefusalReward,
    RelevanceReward,
    RetrievalActionPenalty,
    RetrievalHitReward,
    StepCost,
    TextActions,
    TimeDynamicWeights,
    TopTAPReward,
    TreeFormatReward,
)
from rag_gym.wrappers.presets import apply
from tests.conftest import requires_dense

S, A, B, R, E = 0, 1, 2, 3, 4

PASSAGES = [
    Passage("ada", "Ada Vell", "Ada Vell is a painter born in Orrin."),
    Passage("orrin", "Orrin", "Orrin is a city in Tamaria."),
    Passage("guild", "Kestrel Guild", "Kestrel Guild is a guild founded by Bo Rann."),
    Passage("bo", "Bo Rann", "Bo Rann is a weaver born in Lusk."),
]
Q = QAExample(
    "q1", "In which country is the birthplace of Ada Vell?", ("Tamaria",), ("ada", "orrin"), hops=2
)
Q_UNANS = QAExample(
    "q2", "Who founded Zorn Academy?", ("Ebbin",), ("guild",), hops=2, answerable=False
)

# a stub encoder with hand-picked vectors, so cosines are exact
VECTORS = {
    "ada vell": [1.0, 0.0, 0.0],
    "orrin city": [0.6, 0.8, 0.0],  # cos with "ada vell" = 0.6
    "orrin country": [0.8, 0.6, 0.0],  # cos = 0.8 with "ada vell", 0.96 with "orrin city"
    "kestrel guild": [0.0, 0.0, 1.0],  # cos 0 with all
    "lusk": [-1.0, 0.0, 0.0],  # cos -1 with "ada vell"
}


def stub_encoder(texts):
    return np.array([VECTORS[t.lower()] for t in texts])


def search_env(**kwargs) -> SearchEnv:
    return SearchEnv(
        examples=[Q, Q_UNANS], retriever=BM25Retriever(Corpus(PASSAGES)), k=1, **kwargs
    )


def act(t, text=""):
    return {"type": t, "text": text}


def run(env, actions, question="q1"):
    env.reset(options={"question_id": question})
    return [env.step(a) for a in actions]


# ---------------------------------------------------------------- EVO-RAG terms ----------------
def test_retrieval_hit():
    env = RetrievalHitReward(search_env())
    steps = run(env, [act(S, "ada vell"), act(S, "kestrel guild"), act(E, "note"), act(S, " ")])
    assert [s[4]["reward_raw"]["retrieval_hit"] for s in steps] == [
        1.0,
        -1.0,
        0.0,
        0.0,
    ]  # invalid search: 0
    assert steps[0][4]["reward_terms"]["retrieval_hit"] == 1.0


def test_query_overlap_first_query_and_max_cosine():
    env = QueryOverlapPenalty(search_env(), encoder=stub_encoder)
    steps = run(
        env,
        [
            act(S, "ada vell"),
            act(S, "orrin city"),
            act(E, "x"),
            act(S, "orrin country"),
            act(S, "lusk"),
        ],
    )
    raw = [s[4]["reward_raw"]["query_overlap"] for s in steps]
    # first query 0; then -0.6; evaluate 0; -max(0.8, 0.96); lusk: cos -1, -0.6, -0.8 -> -max = +0.6
    assert raw == pytest.approx([0.0, -0.6, 0.0, -0.96, 0.6])
    env.reset(options={"question_id": "q1"})
    assert (
        env.step(act(S, "orrin city"))[4]["reward_raw"]["query_overlap"] == 0.0
    )  # a new episode forgets


def test_backtrack_penalty():
    env = BacktrackPenalty(search_env())
    steps = run(env, [act(B), act(S, "ada vell"), act(B)])
    assert [s[4]["reward_raw"]["backtrack"] for s in steps] == [
        0.0,
        0.0,
        -1.0,
    ]  # the first is invalid


@pytest.mark.parametrize(
    ("question", "searches", "expected"),
    [
        ("q1", [], 1.0),  # evidence insufficient: refusing is right
        ("q1", ["ada vell", "orrin city"], -1.0),  # all gold retrieved: refusing is wrong
        ("q2", ["kestrel guild"], 1.0),
    ],  # unanswerable: never sufficient
)
def test_refusal_with_and_without_evidence(question, searches, expected):
    env = RefusalReward(search_env())
    steps = run(env, [act(S, q) for q in searches] + [act(R)], question)
    assert steps[-1][4]["reward_raw"]["refusal"] == expected
    assert all(s[4]["reward_raw"]["refusal"] == 0.0 for s in steps[:-1])


@pytest.mark.parametrize(
    ("question", "searches", "expected"),
    [
        ("q1", [], -1.0),  # answerable: refusing is wrong before any search too
        ("q1", ["ada vell", "orrin city"], -1.0),
        ("q2", [], 1.0),  # unanswerable: refusing is right
        ("q2", ["kestrel guild"], 1.0),
    ],
)
def test_the_answerable_verifier_judges_the_question_not_the_evidence(question, searches, expected):
    env = RefusalReward(search_env(), verifier="answerable")
    steps = run(env, [act(S, q) for q in searches] + [act(R)], question)
    assert steps[-1][4]["reward_raw"]["refusal"] == expected


def test_an_unknown_refusal_verifier_is_named():
    with pytest.raises(ValueError, match="did you mean 'evidence'"):
        RefusalReward(search_env(), verifier="evidense")
    with pytest.raises(ValueError, match="a name in"):
        RefusalReward(search_env(), verifier=3)


def test_refusal_verifier_is_pluggable():
    seen = {}

    def judge(question, evidence, info):
        seen["evidence"] = [p.id for p in evidence]
        return True

    env = RefusalReward(search_env(), verifier=judge)
    steps = run(env, [act(S, "ada vell"), act(R)])
    assert steps[-1][4]["reward_raw"]["refusal"] == -1.0 and seen["evidence"] == ["ada"]


def test_step_cost():
    env = StepCost(search_env())
    assert [
        s[4]["reward_raw"]["step_cost"] for s in run(env, [act(S, "x y"), act(E, ""), act(A, "x")])
    ] == [-1.0] * 3


@pytest.mark.parametrize(
    ("metric", "answer", "expected"),
    [
        ("em_f1", "Tamaria city", 0.5 * (0 + 2 / 3)),
        ("em_f1", "the Tamaria", 1.0),
        ("em", "Tamaria city", 0.0),
        ("f1", "Tamaria city", 2 / 3),
    ],
)
def test_answer_correctness(metric, answer, expected):
    env = AnswerCorrectnessReward(search_env(), metric=metric)
    (step,) = run(env, [act(A, answer)])
    assert step[4]["reward_raw"]["answer"] == pytest.approx(expected)


def test_answer_correctness_zero_on_unanswerable_and_non_terminal():
    env = AnswerCorrectnessReward(search_env())
    assert run(env, [act(A, "Ebbin")], "q2")[0][4]["reward_raw"]["answer"] == 0.0
    assert run(env, [act(S, "ada vell")])[0][4]["reward_raw"]["answer"] == 0.0


def test_retrieval_action_penalty_around_p_0_3():
    env = RetrievalActionPenalty(QueryOverlapPenalty(search_env(), encoder=stub_encoder), t_max=20)
    # steps t = 0..4 evaluate, t = 5 (p = 0.25) search, t = 6 (p = 0.30) search
    steps = run(
        env, [act(E, "n")] * 5 + [act(S, "ada vell"), act(S, "orrin city"), act(S, "kestrel guild")]
    )
    raw = [s[4]["reward_raw"] for s in steps]
    assert raw[5]["retrieval_action"] == 0.0  # p = 0.25 < 0.3 (and first query: r_dup = 0)
    assert (
        raw[6]["query_overlap"] == pytest.approx(-0.6) and raw[6]["retrieval_action"] == -1.0
    )  # p = 0.3
    assert (
        raw[7]["query_overlap"] == 0.0 and raw[7]["retrieval_action"] == 0.0
    )  # r_dup = 0 is not < 0
    with pytest.raises(ValueError, match="wrap the env in QueryOverlapPenalty first"):
        RetrievalActionPenalty(search_env())


def test_first_query_late_has_no_action_penalty():
    env = RetrievalActionPenalty(QueryOverlapPenalty(search_env(), encoder=stub_encoder), t_max=20)
    steps = run(env, [act(E, "n")] * 8 + [act(S, "ada vell")])
    assert steps[-1][4]["reward_raw"]["retrieval_action"] == 0.0


# ---------------------------------------------------------------- EVO-RAG schedule -------------
TABLE1 = {  # (Start, Mid, End)
    "retrieval_hit": (2.0, 1.0, 0.5),
    "retrieval_action": (1.5, 0.8, 0.4),
    "query_overlap": (0.1, 0.5, 1.2),
    "backtrack": (0.3, 0.5, 1.0),
    "refusal": (0.5, 0.5, 0.5),
    "step_cost": (0.02, 0.05, 0.10),
    "answer": (0.05, 0.10, 1.00),
}


@pytest.mark.parametrize("t", [0, 10, 20])
@pytest.mark.parametrize("stage", ["discovery", "refinement"])
def test_schedule_equals_table1_interpolation(t, stage):
    p = t / 20
    weights = core.evo_rag_weights(p, stage)
    for k, (start, mid, end) in TABLE1.items():
        early, late = (start, mid) if stage == "discovery" else (mid, end)
        assert weights[k] == pytest.approx((1 - p) * early + p * late)
    if t == 0:
        assert weights == pytest.approx(
            {k: v[0] if stage == "discovery" else v[1] for k, v in TABLE1.items()}
        )
    if t == 20:
        assert weights == pytest.approx(
            {k: v[1] if stage == "discovery" else v[2] for k, v in TABLE1.items()}
        )


def test_fixed_and_none_schedules():
    fixed = core.evo_rag_weights(0.9, "discovery", "fixed")
    assert fixed == pytest.approx({k: (v[0] + v[1]) / 2 for k, v in TABLE1.items()})
    assert core.evo_rag_weights(0.1, "refinement", "fixed") == pytest.approx(
        {k: (v[1] + v[2]) / 2 for k, v in TABLE1.items()}
    )
    none = core.evo_rag_weights(0.4, "refinement", "none")
    assert none["answer"] == 1.0 and sum(none.values()) == 1.0


def evo_stack(stage="discovery"):
    """The ``evo_rag`` preset itself (DropBaseReward, the seven terms, TimeDynamicWeights)."""
    return apply(search_env(), "evo_rag", t_max=20, encoder=stub_encoder, stage=stage)


def test_time_dynamic_total_by_hand():
    env = evo_stack()
    env.reset(options={"question_id": "q1"})
    # t = 0 (p = 0): weights = Start; SEARCH hits: r_ret 1, r_dup 0, r_act 0, r_step -1
    _, reward, *_, info = env.step(act(S, "ada vell"))
    assert reward == pytest.approx(2.0 * 1 + 0.02 * -1)
    assert info["reward_vector"].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, -1.0, 0.0]
    # t = 1 (p = 0.05): SEARCH hits "orrin city": r_dup -0.6
    _, reward, *_, info = env.step(act(S, "orrin city"))
    w = {k: 0.95 * v[0] + 0.05 * v[1] for k, v in TABLE1.items()}
    assert reward == pytest.approx(
        w["retrieval_hit"] * 1 + w["query_overlap"] * -0.6 + w["step_cost"] * -1
    )
    assert info["reward_weights"] == pytest.approx(w)
    # t = 2 (p = 0.1): ANSWER "Tamaria": r_ans 1, r_step -1
    _, reward, terminated, *_ = env.step(act(A, "Tamaria"))
    w = {k: 0.9 * v[0] + 0.1 * v[1] for k, v in TABLE1.items()}
    assert terminated and reward == pytest.approx(w["answer"] * 1 + w["step_cost"] * -1)


def test_switching_stage_changes_the_next_step_only():
    env = evo_stack()
    env.reset(options={"question_id": "q1"})
    _, _, *_, first = env.step(act(E, "note"))
    env.set_stage("refinement")
    assert first["reward_stage"] == "discovery"
    _, reward, *_, info = env.step(act(E, "note"))  # t = 1, p = 0.05, refinement: Mid -> End
    assert info["reward_stage"] == "refinement"
    assert info["reward_weights"]["step_cost"] == pytest.approx(0.95 * 0.05 + 0.05 * 0.10)
    assert reward == pytest.approx(-(0.95 * 0.05 + 0.05 * 0.10))
    with pytest.raises(ValueError, match="expected stage in"):
        env.set_stage("exploration")


def test_time_dynamic_needs_all_terms():
    with pytest.raises(
        ValueError,
        match=r"needs all seven EVO-RAG terms; missing \['retrieval_hit', 'retrieval_action'",
    ):
        TimeDynamicWeights(StepCost(search_env()))


# ---------------------------------------------------------------- ARENA ------------------------
POOL = tuple(Passage(f"p{i}", f"T{i}", f"text {i}") for i in range(1, 7))
RQ = QAExample("r1", "Who?", ("Ada Vell",), ("p1", "p5"), POOL, hops=2)


def arena_env():
    return ArenaBonus(
        RelevanceReward(
            ReaderAccuracyReward(ReaderFormatReward(DropBaseReward(ReaderEnv(examples=[RQ]))))
        )
    )


@pytest.mark.parametrize(
    ("action", "terms", "total"),
    [
        (
            "<relevance>[1, 5]</relevance><analysis>x</analysis><answer>Ada Vell</answer>",
            (1, 1, 1, 10),
            13.0,
        ),
        (
            "<relevance>[1, 2]</relevance><analysis>x</analysis><answer>Ada Vell</answer>",
            (1, 1, 0.5, 0),
            2.5,
        ),
        ("<relevance>[3]</relevance><analysis>x</analysis><answer>Ada</answer>", (1, 0, 0, 0), 1.0),
        (
            "<answer>Ada Vell</answer><relevance>[1, 5]</relevance><analysis>x</analysis>",
            (0, 1, 1, 0),
            2.0,
        ),
    ],
)
def test_arena_terms(action, terms, total):
    env = arena_env()
    env.reset()
    _, reward, *_, info = env.step(action)
    raw = info["reward_raw"]
    assert (raw["format"], raw["accuracy"], raw["relevance"], raw["bonus"]) == terms
    assert reward == total


# ---------------------------------------------------------------- R²AG -------------------------
def r2ag_env(**kwargs):
    env = DropBaseReward(
        TreeSearchEnv(examples=[Q], retriever=BM25Retriever(Corpus(PASSAGES)), **kwargs)
    )
    return R2AGGate(TreeFormatReward(TopTAPReward(JointHitReward(MultiHitReward(env)))))


def test_r2ag_step_by_hand():
    env = r2ag_env()
    env.reset()
    action = TreeSearchEnv.format_action(
        "t", base=["Ada Vell painter", "Kestrel Guild"], predicted=["Orrin city"]
    )
    _, reward, *_, info = env.step(action)
    raw = info["reward_raw"]
    assert raw["multi_hit"] == pytest.approx(1 + 1.25 * 1)  # ada (base) + orrin (predicted)
    assert raw["top_t_ap"] == pytest.approx(
        0.5 + 0.5
    )  # base [ada, guild]: 1/2; predicted [orrin]: 1/2
    assert (
        raw["format"] == pytest.approx(0.02) and raw["joint_hit"] == 0.0
    )  # 3 blocks, capped at 0.02
    assert reward == pytest.approx(0.2 * 2.25 + 0.3 * 0 + 0.2 * 1.0 + 0.02)
    _, reward, terminated, *_, info = env.step(TreeSearchEnv.format_action("done", stop=True))
    assert terminated and reward == pytest.approx(0.3 * 1 + 0.01) and not info["r2ag_gated"]


@pytest.mark.parametrize(
    "actions",
    [
        ["<base-Q>Ada Vell painter</base-Q>"],  # no think block
        [
            TreeSearchEnv.format_action("t", base=["Ada Vell painter"]),
            TreeSearchEnv.format_action("t", stop=True),
        ],
    ],
)
def test_r2ag_gate_zeroes_the_reward(actions):
    env = r2ag_env()
    env.reset()
    for action in actions:
        _, reward, *_, info = env.step(action)
    assert (
        reward == 0.0
        and info["r2ag_gated"]
        and all(v == 0.0 for v in info["reward_terms"].values())
    )
    assert info["reward_raw"]["multi_hit"] >= 0.0  # raw terms stay visible


def test_r2ag_truncated_output_is_zero():
    env = r2ag_env(max_action_chars=60)
    env.reset()
    _, reward, *_, info = env.step(
        TreeSearchEnv.format_action("t", base=["Ada Vell painter"]) + " " * 100
    )
    assert info["output_truncated"] and reward == 0.0


# ---------------------------------------------------------------- Eval-RAR ---------------------
@pytest.mark.parametrize(
    ("notes", "answer", "expected"),
    [
        (
            ["Ada was born in Orrin, in Tamaria."],
            "Lusk",
            0.1,
        ),  # wrong answer, gold in the evaluation
        (["Ada was born in Orrin, in Tamaria."], "Tamaria", 1.0),  # right answer: R_ans only
        (["Nothing useful."], "Lusk", 0.0),
        ([], "Tamaria", 1.0),
    ],
)
def test_eval_rar_total(notes, answer, expected):
    env = apply(search_env(), "eval_rar")
    steps = run(env, [act(E, n) for n in notes] + [act(A, answer)])
    assert steps[-1][1] == pytest.approx(expected)
    assert all(s[1] == 0.0 for s in steps[:-1])


# ---------------------------------------------------------------- LWTS -------------------------
def lwts_env(stage=1, normalization="printed"):
    """The ``when_to_search`` preset (TextActions, r_f, r_s, r_a) with a stub encoder."""
    return apply(
        search_env(),
        "when_to_search",
        encoder=stub_encoder,
        normalization=normalization,
        stage=stage,
    )


def play_text(env, turns):
    env.reset(options={"question_id": "q1"})
    return [env.step(t) for t in turns]


def test_lwts_no_search_correct():
    steps = play_text(
        lwts_env(), ["<think>known</think><reflect>sure</reflect><answer>Tamaria</answer>"]
    )
    raw = steps[-1][4]["reward_raw"]
    assert (raw["lwts_format"], raw["lwts_search"], raw["lwts_answer"]) == (1.0, 0.0, 1.0)  # RC = 0
    assert steps[-1][1] == 2.0


@pytest.mark.parametrize(
    ("query", "r_s"),
    [("ada vell", 0.0), ("Where was Ada Vell born?", -1.0)],  # RC = 1: concise or not
)
def test_lwts_one_search(query, r_s):
    VECTORS.setdefault(query.lower(), [1.0, 0.0, 0.0])
    steps = play_text(
        lwts_env(stage=2),
        [
            f"<think>a</think><search>{query}</search>",
            "<reflect>ok</reflect><answer>Tamaria</answer>",
        ],
    )
    raw = steps[-1][4]["reward_raw"]
    assert raw["lwts_search"] == r_s
    assert raw["lwts_format"] == 1.0  # think search information reflect answer
    assert raw["lwts_answer"] == pytest.approx(1 - 0.3 * 1)  # stage 2, correct, RC = 1
    assert steps[0][1] == 0.0  # nothing before the end


def test_lwts_two_searches_avg_sim_and_wrong_answer():
    turns = [
        "<think>a</think><search>ada vell</search>",
        "<reflect>more</reflect><think>b</think><search>orrin city</search>",
        "<reflect>done</reflect><answer>Lusk</answer>",
    ]
    for normalization, avg in (
        ("printed", 0.6 / 2),
        ("mean", 0.6),
    ):  # one pair, cos 0.6; N(N-1) = 2
        steps = play_text(lwts_env(stage=1, normalization=normalization), turns)
        raw = steps[-1][4]["reward_raw"]
        assert raw["lwts_search"] == pytest.approx(-avg)
        assert raw["lwts_format"] == 1.0  # think search information reflect, twice, then answer
        assert raw["lwts_answer"] == pytest.approx(-1 + 0.3 * 2)  # stage 1, wrong, RC = 2


def test_lwts_truncated_episode_scores_as_wrong():
    base = TextActions(
        gym.wrappers.TimeLimit(DropBaseReward(search_env()), 3), tags="when_to_search"
    )
    env = MultiStageAnswerReward(base, stage=2)
    env.reset(options={"question_id": "q1"})
    for _ in range(3):
        _, reward, terminated, truncated, info = env.step("<think>hmm</think>")
    assert (
        truncated
        and not terminated
        and info["reward_raw"]["lwts_answer"] == -1.0
        and reward == -1.0
    )


# ---------------------------------------------------------------- presets ----------------------
KW = {"dataset_kwargs": {"n_passages": 2000, "n_questions": [40, 10, 10]}}


def test_preset_evo_rag_by_hand():
    env = apply(gym.make("rag_gym/SynthHop-v0", **KW), "evo_rag", encoder=stub_encoder_words)
    _, info = env.reset(seed=0)
    _, reward, *_, info = env.step(act(E, "thinking"))  # t = 0: only the step cost
    assert reward == pytest.approx(-0.02) and set(info["reward_terms"]) == set(core.EVO_RAG_TERMS)
    env2 = apply(
        gym.make("rag_gym/SynthHop-v0", **KW),
        "evo_rag_two_stage",
        encoder=stub_encoder_words,
        stage="refinement",
    )
    env2.reset(seed=0)
    assert env2.step(act(E, "thinking"))[1] == pytest.approx(-(0.05 + 0.10) / 2)


def stub_encoder_words(texts):
    return np.array([[len(t), t.count(" ") + 1.0] for t in texts])


def test_preset_arena_r2ag_eval_rar_totals():
    env = rag_gym.make("rag_gym/SynthHop-Reader-v0", reward_preset="arena", **KW)
    _, info = env.reset(seed=1)
    gold = env.unwrapped.current_example.answer
    assert env.step(ReaderEnv.format_action(info["gold_references"], "x", gold))[1] == 13.0

    env = rag_gym.make("rag_gym/SynthHop-Tree-v0", reward_preset="r2ag", **KW)
    env.reset(seed=1)
    _, reward, *_, info = env.step("<base-Q>x</base-Q>")
    assert reward == 0.0 and info["r2ag_gated"]

    env = rag_gym.make("rag_gym/SynthHop-v0", reward_preset="eval_rar", **KW)
    env.reset(seed=1)
    gold = env.unwrapped.current_example.answer
    env.step(act(E, f"So it is {gold}."))
    assert env.step(act(A, "nope"))[1] == pytest.approx(0.1)
    env.reset(seed=1)
    assert env.step(act(A, gold))[1] == 1.0
    # the step limit ends an episode before any answer: R_ans = 0, so R_total = R_eval, paid on
    # that last step
    env = rag_gym.make("rag_gym/SynthHop-v0", reward_preset="eval_rar", max_episode_steps=2, **KW)
    env.reset(seed=1)
    gold = env.unwrapped.current_example.answer
    assert env.step(act(E, f"So it is {gold}."))[1] == 0.0
    _, reward, terminated, truncated, info = env.step(act(S, gold))
    assert truncated and not terminated
    assert reward == pytest.approx(0.1) and info["reward_terms"]["evaluation"] == pytest.approx(0.1)


def test_preset_when_to_search_total():
    env = apply(gym.make("rag_gym/SynthHop-v0", **KW), "when_to_search", encoder=stub_encoder_words)
    env.reset(seed=1)
    gold = env.unwrapped.current_example.answer
    _, reward, terminated, *_ = env.step(
        f"<think>I know</think><reflect>yes</reflect><answer>{gold}</answer>"
    )
    assert terminated and reward == pytest.approx(1.0 + 0.0 + 1.0)  # r_a + r_s + r_f


def test_preset_errors():
    env = gym.make("rag_gym/SynthHop-v0", **KW)
    with pytest.raises(ValueError, match="did you mean 'arena'"):
        apply(env, "arina")
    with pytest.raises(ValueError, match="reward preset 'arena' needs a ReaderEnv, got SearchEnv"):
        apply(env, "arena")
    with pytest.raises(TypeError, match=r"got unknown options \['beta'\]"):
        apply(env, "evo_rag", beta=1)
    assert apply(env, "none") is env
    with pytest.raises(TypeError, match="expected a reward preset name"):
        apply(env, 3)


def _rewards(env, actions, seed=1):
    env.reset(seed=seed)
    out = []
    for action in actions:
        _, reward, terminated, truncated, info = env.step(action)
        out.append((reward, terminated, truncated, info["reward_terms"]))
        if terminated or truncated:
            break
    return out


def test_preset_stack_sits_outside_the_one_time_limit():
    env = rag_gym.make("rag_gym/SynthHop-v0", reward_preset="eval_rar", max_episode_steps=3, **KW)
    chain, inner = [], env
    while isinstance(inner, gym.Wrapper):
        chain.append(type(inner).__name__)
        inner = inner.env
    assert chain.count("TimeLimit") == 1
    assert chain.index("TimeLimit") > chain.index("EvaluationReward")  # the stack is outside it
    steps = _rewards(env, [act(E, "x")] * 10)
    assert [s[2] for s in steps] == [False, False, True]  # max_episode_steps=3 is honoured
    assert env.spec.max_episode_steps == 3
    assert [w.name for w in env.spec.additional_wrappers] == [
        "DropBaseReward",
        "AnswerCorrectnessReward",
        "EvaluationReward",
    ]


def test_preset_horizon_follows_max_episode_steps():
    env = rag_gym.make(
        "rag_gym/SynthHop-v0",
        reward_preset="evo_rag",
        max_episode_steps=4,
        reward_kwargs={"encoder": stub_encoder_words},
        **KW,
    )
    assert env.t_max == 4  # EVO-RAG's T_max is the env's step limit
    assert rag_gym.make("rag_gym/SynthHop-v0", reward_preset="evo_rag", **KW).t_max == 20
    lwts = rag_gym.make(
        "rag_gym/SynthHop-v0",
        reward_preset="when_to_search",
        max_episode_steps=2,
        reward_kwargs={"encoder": stub_encoder_words},
        **KW,
    )
    steps = _rewards(lwts, ["<search>ada vell</search>"] * 5)
    assert len(steps) == 2 and steps[-1][2]  # truncated at 2
    assert "format" in steps[-1][3] or any(steps[-1][3].values())  # scored at the episode's end


def test_preset_spec_round_trips_through_gym_make():
    env = rag_gym.make("rag_gym/SynthHop-v0", reward_preset="eval_rar", max_episode_steps=6, **KW)
    spec = env.spec
    assert spec.entry_point == "rag_gym.envs.search:SearchEnv"
    assert gym.envs.registration.EnvSpec.from_json(spec.to_json()) == spec
    again = gym.make(spec)
    assert again.spec == spec
    env.reset(seed=1)
    gold = env.unwrapped.current_example.answer
    actions = [act(S, "ada vell"), act(E, f"So it is {gold}."), act(A, "nope")]
    assert _rewards(again, actions) == _rewards(env, actions)
    assert _rewards(env, actions)[-1][0] == pytest.approx(0.1)  # Eval-RAR's R_eval paid


def test_reward_preset_as_env_argument_names_the_fix():
    with pytest.raises(TypeError, match=r"reward_preset= is not an env argument.*rag_gym\.make"):
        gym.make("rag_gym/SynthHop-v0", reward_preset="eval_rar", **KW)
    with pytest.raises(TypeError, match="reward_kwargs are the options of a reward preset"):
        SearchEnv(examples=[Q], reward_kwargs={})
    with pytest.raises(TypeError, match="reward_kwargs needs a reward_preset"):
        rag_gym.make("rag_gym/SynthHop-v0", reward_kwargs={"stage": 1}, **KW)


# ---------------------------------------------------------------- TRL-style functions ----------
def test_trl_functions_match_the_wrappers():
    from rag_gym.rewards import trl

    env = arena_env()
    text = "<relevance>[1, 2]</relevance><analysis>x</analysis><answer>Ada Vell</answer>"
    env.reset()
    assert trl.arena_reward([text], answer=["Ada Vell"], gold_references=[[1, 5]]) == [
        env.step(text)[1]
    ]
    traj = (
        "<think>a</think><search>q</search><information>d</information><evaluate>It is Tamaria.</evaluate>"
        "<answer>Lusk</answer>"
    )
    assert trl.eval_rar_reward(
        [traj, [{"role": "assistant", "content": traj}]], answer=["Tamaria", ["Tamaria"]]
    ) == [0.1, 0.1]
    assert trl.lwts_format_reward(
        ["<think>a</think><reflect>b</reflect><answer>c</answer>", "<answer>c</answer>"]
    ) == [1.0, -1.0]
    assert trl.lwts_answer_reward(
        ["<search>a</search><search>b</search><answer>x</answer>"], answer=["y"]
    ) == [pytest.approx(-0.4)]
    assert trl.lwts_search_reward(
        ["<search>ada vell</search><search>orrin city</search>"], encoder=stub_encoder
    ) == [pytest.approx(-0.3)]
    assert trl.exact_match_reward(["<answer>a</answer>"], answer=[None]) == [None]
    assert trl.episode_return(["x", "y"], episode_return=[1.5, None]) == [1.5, None]
    with pytest.raises(ValueError, match="one entry per completion"):
        trl.exact_match_reward(["a", "b"], answer=["x"])


# ---------------------------------------------------------------- conciseness rule -------------
@pytest.mark.parametrize(
    ("query", "concise"),
    [
        ("Ada Vell birthplace", True),
        ("who is Ada Vell", False),
        ("Ada Vell born in Orrin", False),
        ("please Ada Vell", False),
        ("Ada Vell?", False),
        ("", False),
        ("1962 Orrin mayor", True),
    ],
)
def test_conciseness_rule(query, concise):
    assert core.is_concise(query) is concise


# ---------------------------------------------------------------- the real MiniLM --------------
@requires_dense
def test_query_overlap_with_embedded_minilm():
    env = QueryOverlapPenalty(search_env())  # default encoder: the embedded all-MiniLM-L6-v2
    steps = run(
        env,
        [
            act(S, "Ada Vell birthplace"),
            act(S, "Ada Vell birthplace"),
            act(S, "Kestrel Guild founder"),
        ],
    )
    raw = [s[4]["reward_raw"]["query_overlap"] for s in steps]
    assert raw[0] == 0.0 and raw[1] == pytest.approx(-1.0, abs=1e-5)
    assert -1.0 < raw[2] < 0.0  # different topic: a weaker overlap than the repeat


@requires_dense
def test_make_time_evo_rag_preset_with_embedded_minilm():
    env = rag_gym.make("rag_gym/SynthHop-v0", reward_preset="evo_rag", **KW)
    _, info = env.reset(seed=0)
    _, r1, *_ = env.step(act(S, info["question"]))
    _, r2, *_, info = env.step(act(S, info["question"]))
    assert info["reward_raw"]["query_overlap"] == pytest.approx(-1.0, abs=1e-5)
    assert r2 < r1  # the repeated query pays the overlap penalty


# ---------------------------------------------------------------- LLM judges -------------------
def test_llm_sufficiency_judge_drives_refusal():
    from rag_gym.generation.judges import LLMSufficiencyJudge
    from tests.conftest import EchoLM

    lm = EchoLM(reply="Yes, it is.")
    env = RefusalReward(search_env(), verifier=LLMSufficiencyJudge(lm))
    steps = run(env, [act(S, "ada vell"), act(R)])
    assert steps[-1][4]["reward_raw"]["refusal"] == -1.0  # the judge says the evidence suffices
    assert "Ada Vell is a painter" in lm.calls[-1][0][0]["content"]
    judge = LLMSufficiencyJudge(EchoLM(fail=True))
    assert judge("q", [], {}) is False and judge.errors == 1


def test_llm_answer_judge_in_lwts():
    from rag_gym.generation.judges import LLMAnswerJudge
    from tests.conftest import EchoLM

    correctness = core.Correctness("judge", LLMAnswerJudge(EchoLM(reply="yes")))
    base = TextActions(DropBaseReward(search_env()), tags="when_to_search")
    env = MultiStageAnswerReward(base, stage=1, correctness=correctness)
    env.reset(options={"question_id": "q1"})
    _, reward, *_ = env.step(
        "<think>a</think><reflect>b</reflect><answer>the land of Tamaria</answer>"
    )
    assert reward == 1.0  # EM would say wrong; the judge says right
    with pytest.raises(ValueError, match="method='judge' needs judge=callable"):
        core.Correctness("judge")
    with pytest.raises(TypeError, match="expected a rag_gym LanguageModel"):
        LLMAnswerJudge("gpt")


def test_set_stage_through_gym_make_and_vector_envs():
    from rag_gym.wrappers.presets import set_stage

    env = rag_gym.make("rag_gym/SynthHop-v0", reward_preset="eval_rar", **KW)
    with pytest.raises(ValueError, match="no staged reward in this env"):
        set_stage(env, "refinement")
    env = apply(gym.make("rag_gym/SynthHop-v0", **KW), "evo_rag", encoder=stub_encoder_words)
    env.reset(seed=0)
    set_stage(env, "refinement")
    assert env.step(act(E, "x"))[4]["reward_stage"] == "refinement"


def test_make_with_preset_checks_its_arguments():
    with pytest.raises(TypeError, match="expected reward_kwargs to be a dict, got list"):
        rag_gym.make("rag_gym/SynthHop-v0", reward_preset="evo_rag", reward_kwargs=[1], **KW)
    with pytest.raises(ValueError, match="did you mean 'eval_rar'"):
        rag_gym.make("rag_gym/SynthHop-v0", reward_preset="evalrar", **KW)
