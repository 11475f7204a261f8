"""Every baseline and paper agent: scripted replies check each method's logic; the embedded model
runs them all end to end through the evaluator."""

from __future__ import annotations

import json
import re

import gymnasium as gym
import pytest

import rag_gym  # noqa: F401
from rag_gym.baselines import AGENTS, make_agent
from rag_gym.envs import ActionType
from rag_gym.evaluate import EvalConfig, evaluate
from rag_gym.wrappers import TextActions
from tests.conftest import SMALL_WORLD, EchoLM, requires_llama

KW = {"dataset_kwargs": SMALL_WORLD}


def play(agent, env_id="rag_gym/SynthHop-v0", seed=0, max_steps=25):
    env = gym.make(env_id, split="validation", **KW)
    if agent.env_kind == "text":  # as the evaluator plays it
        env = TextActions(env, tags=agent.tags)
    obs, info = env.reset(seed=seed)
    agent.reset(seed)
    trace = []
    for _ in range(max_steps):
        action = agent.act(obs, info)
        obs, _reward, term, trunc, info = env.step(action)
        if agent.env_kind == "text":  # the env steps of the turn
            trace.extend((kind, action) for kind in info["actions"])
        else:
            trace.append((info.get("action_type"), action))
        if term or trunc:
            return trace, info, env
    raise AssertionError("the episode did not end")


def last_user(prompt) -> str:
    return prompt[-1]["content"] if isinstance(prompt, list) else prompt


def test_ircot_searches_each_thought_until_the_answer():
    replies = iter(["Ada wrote it.", "Ada was born in Orrin.", "So the answer is: Orrin."])
    trace, info, _ = play(make_agent("ircot", lm=EchoLM(reply=lambda p: next(replies))))
    kinds = [t[0] for t in trace]
    assert kinds == ["SEARCH", "SEARCH", "SEARCH", "ANSWER"]
    assert [t[1]["text"] for t in trace[1:3]] == ["Ada wrote it.", "Ada was born in Orrin."]
    assert info["prediction"] == "Orrin"


def test_react_follows_search_and_finish():
    replies = iter(
        ["I need the author. Action: Search[author of the book]", "Found. Action: Finish[Velmora]"]
    )
    trace, info, _ = play(make_agent("react", lm=EchoLM(reply=lambda p: next(replies))))
    assert [t[0] for t in trace] == ["SEARCH", "ANSWER"] and trace[0][1][
        "text"
    ] == "author of the book"
    assert info["prediction"] == "Velmora"


def test_self_ask_follow_up_intermediate_final():
    replies = iter(["Follow up: Who wrote it?", "Ada Vell.", "So the final answer is: Orrin"])
    lm = EchoLM(reply=lambda p: next(replies))
    trace, info, _ = play(make_agent("self_ask", lm=lm))
    assert [t[0] for t in trace] == ["SEARCH", "EVALUATE", "ANSWER"]
    assert trace[0][1]["text"] == "Who wrote it?" and info["prediction"] == "Orrin"
    assert "Intermediate answer:" in last_user(lm.calls[1][0])  # the second call asks for it


def test_iter_retgen_three_rounds_with_drafts():
    lm = EchoLM(reply="Velmora")
    trace, info, _ = play(make_agent("iter_retgen", lm=lm))
    assert [t[0] for t in trace] == ["SEARCH", "EVALUATE", "SEARCH", "EVALUATE", "SEARCH", "ANSWER"]
    assert (
        trace[2][1]["text"].endswith(" Velmora")
        and info["num_searches"] == 3
        and len(lm.calls) == 3
    )


def test_direct_cot_and_oracle_do_not_search():
    for name, reply in (("direct", "Orrin"), ("cot", "Ada wrote it. So the answer is: Orrin.")):
        trace, info, _ = play(make_agent(name, lm=EchoLM(reply=reply)))
        assert [t[0] for t in trace] == ["ANSWER"] and info["prediction"] == "Orrin"
    env = gym.make("rag_gym/SynthHop-v0", split="validation", **KW)
    lm = EchoLM(reply="x")
    oracle = make_agent("oracle", lm=lm, env=env)
    obs, info = env.reset(seed=0)
    oracle.reset(0)
    env.step(oracle.act(obs, info))
    gold_titles = [env.unwrapped.corpus[g].title for g in info["gold_ids"]]
    assert all(t in last_user(lm.calls[0][0]) for t in gold_titles)


def test_evo_rag_parses_its_four_actions():
    replies = iter(["<search>who wrote it</search>", "<backtrack/>", "<refuse/>"])
    trace, _info, _ = play(make_agent("evo_rag", lm=EchoLM(reply=lambda p: next(replies))))
    assert [t[0] for t in trace] == ["SEARCH", "SEARCH", "BACKTRACK", "REFUSE"]


def test_eval_rar_evaluates_then_searches_from_one_generation():
    replies = iter(
        [
            "<think>hm</think><search>first</search>",
            "<evaluate>Found the author; the city is missing.</evaluate><search>second",
            "<evaluate>Done.</evaluate><answer>Orrin",
        ]
    )
    lm = EchoLM(reply=lambda p: next(replies))
    trace, info, _ = play(make_agent("eval_rar", lm=lm))
    assert [t[0] for t in trace] == ["SEARCH", "EVALUATE", "SEARCH", "EVALUATE", "ANSWER"]
    assert len(lm.calls) == 3 and info["prediction"] == "Orrin"
    assert "<information>Doc 1(Title:" in last_user(lm.calls[1][0])


def test_lwts_answers_from_knowledge_or_searches():
    trace, info, _ = play(
        make_agent(
            "lwts", lm=EchoLM(reply="<think>I know.</think><reflect>ok</reflect><answer>Orrin")
        )
    )
    assert [t[0] for t in trace] == ["ANSWER"] and info["prediction"] == "Orrin"
    replies = iter(
        ["<think>no idea</think><search>book author", "<reflect>it says</reflect><answer>Lusk"]
    )
    trace, info, _ = play(make_agent("lwts", lm=EchoLM(reply=lambda p: next(replies))))
    assert [t[0] for t in trace] == ["SEARCH", "ANSWER"]
    assert trace[0][1] == "<search>book author</search>"


def test_r2ag_top_survivor_limits_and_stop():
    many = (
        "<think>t</think>"
        + "".join(f"<base-Q>q{i}</base-Q>" for i in range(6))
        + "".join(f"<predicted-Q>p{i}</predicted-Q>" for i in range(3))
    )
    replies = iter([many, "<think>done</think><base-Q>stop retrieval</base-Q>"])
    trace, info, _ = play(
        make_agent("r2ag", lm=EchoLM(reply=lambda p: next(replies))), "rag_gym/SynthHop-Tree-v0"
    )
    first = trace[0][1]
    assert (
        first.count("<base-Q>") == 4 and first.count("<predicted-Q>") == 2
    )  # top-t = 4 base, 2 predicted
    assert info["stop"]


def test_arena_reader_output_passes_through():
    reply = "<relevance>[1, 2]</relevance><analysis>[1] says so</analysis><answer>Orrin</answer>"
    _, info, _ = play(make_agent("arena", lm=EchoLM(reply=reply)), "rag_gym/SynthHop-Reader-v0")
    assert info["relevance"] == [1, 2] and info["format_ok"] and info["prediction"] == "Orrin"
    _trace, info, _ = play(
        make_agent("arena", lm=EchoLM(reply="Orrin, I think.")), "rag_gym/SynthHop-Reader-v0"
    )
    assert info["prediction"] == "Orrin, I think." and not info["format_ok"]


def test_garbage_replies_never_break_an_episode():
    for name in AGENTS:
        if name == "random":
            continue
        env_id = {"r2ag": "rag_gym/SynthHop-Tree-v0", "arena": "rag_gym/SynthHop-Reader-v0"}.get(
            name, "rag_gym/SynthHop-v0"
        )
        env = gym.make(env_id, split="validation", **KW)
        for reply in ("", "<<<>>> \x00 ]]", "<search></search><answer></answer>"):
            agent = make_agent(name, lm=EchoLM(reply=reply), env=env)
            played = TextActions(env, tags=agent.tags) if agent.env_kind == "text" else env
            obs, info = played.reset(seed=1)
            agent.reset(1)
            for _ in range(30):
                obs, _, term, trunc, info = played.step(agent.act(obs, info))
                if term or trunc:
                    break
            assert term or trunc, name


def test_batched_evaluation_equals_one_at_a_time(tmp_path):
    reply = lambda p: re.sub(r"\W+", " ", last_user(p))[-20:]  # noqa: E731 (depends on the prompt only)
    results = []
    for batch in (1, 4):
        cfg = EvalConfig(
            n=6,
            seed=2,
            agents=("ircot", "naive_rag"),
            env_kwargs=KW,
            batch_size=batch,
            out_dir=str(tmp_path),
            run_name=f"b{batch}",
        )
        res = evaluate(cfg, lambda name, env: make_agent(name, lm=EchoLM(reply=reply)))
        results.append([{k: v for k, v in e.items() if k != "seconds"} for e in res.episodes])
    assert results[0] == results[1]


@pytest.mark.llm
@requires_llama
@pytest.mark.slow
def test_every_agent_end_to_end_with_the_embedded_model(tmp_path):
    from rag_gym.generation.llama_cpp import LlamaCppLM

    lm = LlamaCppLM()
    cfg = EvalConfig(
        n=2,
        seed=0,
        agents=tuple(AGENTS),
        env_kwargs=KW,
        batch_size=2,
        out_dir=str(tmp_path),
        run_name="all",
        lm_spec="llama_cpp",
    )
    result = evaluate(cfg, lambda name, env: make_agent(name, lm=lm, env=env))
    rows = {r["agent"]: r for r in result.rows}
    assert set(rows) == set(AGENTS)
    for name, row in rows.items():
        assert row["episodes"] == 2 and row["errors"] == 0, name
        if name != "random":
            assert row["tokens"] > 0, name
    for e in result.episodes:
        assert e["terminated"] or e["truncated"], e["agent"]
    assert (tmp_path / "all" / "em_f1.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "all" / "accuracy_vs_retrievals.png").stat().st_size > 1000


@pytest.mark.llm
@requires_llama
@pytest.mark.slow
def test_the_run_folder_reproduces_the_leaderboard(tmp_path):
    from rag_gym.generation.backends import make_lm

    cfg = EvalConfig(
        n=4,
        seed=5,
        agents=("naive_rag", "ircot", "random"),
        env_kwargs=KW,
        batch_size=2,
        out_dir=str(tmp_path),
        run_name="first",
        lm_spec="llama_cpp",
    )
    first = evaluate(
        cfg, lambda name, env: make_agent(name, lm=make_lm("llama_cpp"), seed=cfg.seed, env=env)
    )
    again_cfg = EvalConfig.from_run(tmp_path / "first", run_name="again")
    assert again_cfg.agents == cfg.agents and again_cfg.lm_spec == "llama_cpp"
    again = evaluate(
        again_cfg,
        lambda name, env: make_agent(
            name, lm=make_lm(again_cfg.lm_spec), seed=again_cfg.seed, env=env
        ),
    )
    strip = lambda eps: [{k: v for k, v in e.items() if k != "seconds"} for e in eps]  # noqa: E731
    assert strip(first.episodes) == strip(again.episodes)
    saved = json.loads((tmp_path / "first" / "protocol.json").read_text())
    assert saved["question_ids"] == again.protocol["question_ids"]
    assert saved["agents"]["ircot"]["prompt_version"] == "ircot/v1"


def test_search_actions_are_dicts_of_the_env():
    trace, _, _ = play(make_agent("naive_rag", lm=EchoLM(reply="x")))
    assert trace[0][1]["type"] == ActionType.SEARCH


def test_bad_replies_are_counted_in_the_leaderboard(tmp_path):
    cfg = EvalConfig(
        n=3,
        seed=0,
        agents=("naive_rag", "evo_rag"),
        env_kwargs=KW,
        out_dir=str(tmp_path),
        run_name="bad",
    )
    result = evaluate(cfg, lambda name, env: make_agent(name, lm=EchoLM(reply="   ")))
    rows = {r["agent"]: r for r in result.rows}
    assert rows["naive_rag"]["bad_replies"] == 3 and rows["naive_rag"]["errors"] == 0
    assert rows["evo_rag"]["bad_replies"] >= 3
    assert "bad replies" in (tmp_path / "bad" / "leaderboard.md").read_text()


@pytest.mark.parametrize("name", ["eval_rar", "lwts", "evo_rag"])
def test_paper_agents_read_what_a_trained_policy_reads(name):
    """They act through TextActions: each observation the env renders (the <information>
    block a policy sees in training) is what the next prompt shows."""
    replies = iter(["<search>Ada Vell birthplace</search>", "<answer>Orrin</answer>"])
    lm = EchoLM(reply=lambda p: next(replies))
    agent = make_agent(name, lm=lm)
    assert agent.env_kind == "text"
    env = TextActions(gym.make("rag_gym/SynthHop-v0", split="validation", **KW), tags=agent.tags)
    obs, info = env.reset(seed=0)
    agent.reset(0)
    shown = []
    for _ in range(6):
        obs, _, term, trunc, info = env.step(agent.act(obs, info))
        if term or trunc:
            break
        shown.append(obs)
    assert term and info["prediction"] == "Orrin"
    assert shown and all(o.startswith("<information>Doc 1(Title: ") for o in shown)
    assert all(o in last_user(lm.calls[-1][0]) for o in shown)
