"""TRL's ``GRPOTrainer(environment_factory=...)`` driving rag-gym envs, for real, on the CPU."""

from __future__ import annotations

import math

import pytest

from rag_gym.integrations.trl_env import (
    ENDED,
    build_dataset,
    episode_return,
    make_env_class,
    prepare_tokenizer,
    reward_term,
    tool_call_demonstrations,
    tools_of,
)

WORLD = {"dataset_kwargs": {"n_passages": 2000, "n_questions": [60, 30, 30]}}


def test_env_class_contract_and_episode():
    Env = make_env_class("rag_gym/SynthHop-v0", reward_preset="eval_rar", env_kwargs=WORLD)
    env = Env()  # no arguments: TRL calls the factory so
    assert [t.__name__ for t in tools_of(env)] == [
        "answer",
        "backtrack",
        "evaluate",
        "refuse",
        "search",
    ]
    assert [t.__name__ for t in tools_of(make_env_class(env_kwargs=WORLD)())] == [
        "answer",
        "backtrack",
        "refuse",
        "search",
    ]
    qid = env.question_ids[3]
    first = env.reset(question_id=qid, prompt=[{"role": "user", "content": ""}])
    assert first == f"Question: {env.question}" and env.info["question_id"] == qid
    assert env.search(env.question).startswith("Doc 1(Title: ")
    out = env.search("")  # an empty query: the env's invalid action, the step is spent
    assert env.info["invalid_action"] and out == env.info["message"] and not env.done
    assert env.evaluate("the first hop is read").startswith("Noted")
    gold = env._env.unwrapped.current_example.answers[0]
    assert env.answer(gold) == ENDED
    assert env.done and env.episode_return == pytest.approx(1.0)  # eval_rar: R_ans = EM
    assert env.return_terms["answer"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="episode has ended"):
        env.search("more")
    # pooled instances are reused: reset clears the episode
    env.reset(question_id=qid)
    assert (env.episode_return, env.return_terms, env.done, env.calls) == (0.0, {}, False, [])
    assert episode_return(environments=[env]) == [0.0]
    assert reward_term("answer").__name__ == "rewards/answer"


def test_text_preset_env_takes_tool_calls_as_tags():
    Env = make_env_class("rag_gym/SynthHop-v0", reward_preset="when_to_search", env_kwargs=WORLD)
    env = Env()
    env.reset(index=0)
    out = env.search(env.question)
    assert "Doc 1(Title: " in out and env.info["format_ok"]
    assert env.answer("nobody") == ENDED
    assert env.done and env.info["actions"] == ["ANSWER"]
    assert set(env.return_terms) == set(env.info["reward_terms"]) and env.return_terms


def test_errors():
    with pytest.raises(ValueError, match="did you mean 'rag_gym/SynthHop-v0'"):
        make_env_class("rag_gym/SynthHop-v9")
    with pytest.raises(ValueError, match="expected a reward preset"):
        make_env_class(reward_preset="evorag")
    with pytest.raises(TypeError, match="env_kwargs to be a dict"):
        make_env_class(env_kwargs="k=5")
    with pytest.raises(ValueError, match="episode_return reads the env instances"):
        episode_return(completions=["x"])


@pytest.mark.slow
def test_grpo_environment_factory_two_steps_on_cpu(tmp_path):
    torch = pytest.importorskip("torch", reason="needs torch: pip install torch==2.13.0")
    trl = pytest.importorskip("trl", reason="needs trl: pip install 'rag-gym[train]'")
    pytest.importorskip("sentence_transformers", reason="evo_rag needs rag-gym[dense]")
    from datasets import Dataset

    from rag_gym.train.models import tiny_policy

    torch.set_num_threads(1)
    Env = make_env_class("rag_gym/SynthHop-v0", reward_preset="evo_rag", env_kwargs=WORLD)
    model, tok = tiny_policy(seed=0)
    prepare_tokenizer(tok)
    tok.padding_side = "left"

    # warm start: a short SFT on the expert's tool-call transcripts (the untrained policy
    # emits no parsable tool call)
    demos = tool_call_demonstrations(Env, tok, n=8, seed=0)
    sft = trl.SFTTrainer(
        model=model,
        processing_class=tok,
        train_dataset=Dataset.from_list(demos),
        args=trl.SFTConfig(
            output_dir=str(tmp_path / "sft"),
            max_steps=120,
            per_device_train_batch_size=4,
            learning_rate=3e-3,
            lr_scheduler_type="constant",
            max_length=2048,
            logging_steps=20,
            report_to=[],
            use_cpu=True,
            save_strategy="no",
            seed=0,
        ),
    )
    sft.train()
    assert sft.state.log_history[-2]["loss"] < sft.state.log_history[0]["loss"]

    terms = ["retrieval_hit", "step_cost", "answer"]
    captured: list[dict] = []

    class Recording(trl.GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            captured.append(
                {
                    "out": out,
                    "returns": [e.episode_return for e in self.environments],
                    "calls": [list(e.calls) for e in self.environments],
                }
            )
            return out

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = Recording(
        model=model,
        processing_class=tok,
        reward_funcs=[episode_return, *(reward_term(t) for t in terms)],
        train_dataset=build_dataset(Env, n=8, seed=0),
        environment_factory=Env,
        args=trl.GRPOConfig(
            output_dir=str(tmp_path / "grpo"),
            max_steps=2,
            per_device_train_batch_size=4,
            num_generations=2,
            max_completion_length=768,
            max_tool_calling_iterations=3,
            temperature=0.7,
            learning_rate=1e-3,
            beta=0.0,
            reward_weights=[1.0] + [0.0] * len(terms),
            logging_steps=1,
            report_to=[],
            use_cpu=True,
            save_strategy="no",
            seed=0,
        ),
    )
    trainer.train()

    calls = [c for step in captured for rollout in step["calls"] for c in rollout]
    searches = [c for c in calls if c[0] == "search"]
    print(f"\n{len(calls)} tool calls reached the env in 2 steps ({len(searches)} searches)")
    assert searches, "no tool call reached the env"

    # rewards are finite and are the envs' own episode returns
    logged = [h for h in trainer.state.log_history if "rewards/episode_return/mean" in h]
    assert len(logged) == 2
    for step, log in zip(captured, logged, strict=True):
        assert all(math.isfinite(r) for r in step["returns"])
        assert log["rewards/episode_return/mean"] == pytest.approx(
            sum(step["returns"]) / len(step["returns"]), abs=1e-5
        )
    assert any(r != 0.0 for step in captured for r in step["returns"])

    # env-written tokens (the tool results) have tool_mask 0; the model's own have 1
    checked = 0
    for step in captured:
        out = step["out"]
        for ids, mask, comp_mask in zip(
            out["completion_ids"], out["tool_mask"], out["completion_mask"], strict=True
        ):
            ids, mask = ids[comp_mask.bool()], mask[comp_mask.bool()]
            env_text = tok.decode(ids[mask == 0])
            model_text = tok.decode(ids[mask == 1])
            if "<tool_call>" in model_text and (mask == 0).any():
                assert "Doc 1(Title: " in env_text or "invalid" in env_text.lower()
                assert "Doc 1(Title: " not in model_text
                checked += 1
    assert checked > 0

    changed = sum(not torch.equal(before[n], p) for n, p in model.named_parameters())
    assert changed > 0
