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


def test_tool_call_demonstrations_follow_trl_rendering():
    pytest.importorskip("trl", reason="needs trl: pip install 'rag-gym[train]'")
    from rag_gym.train.models import tiny_policy

    _, tok = tiny_policy()
    prepare_tokenizer(tok)
    Env = make_env_class("rag_gym/SynthHop-v0", env_kwargs=WORLD)
    rows = tool_call_demonstrations(Env, tok, n=3, seed=0)
    assert len(rows) == 3
    for row in rows:
        # the tools in TRL's order, inside the rendered system turn
        listed = [
            row["prompt"].index(f'"name": "{n}"')
            for n in ("answer", "backtrack", "refuse", "search")
        ]
        assert listed == sorted(listed)
        assert row["prompt"].endswith("<|im_start|>assistant\n")
        completion = row["completion"]
        assert completion.index('{"name": "search"') < completion.index('{"name": "answer"')
        assert "<tool_response>\nDoc 1(Title: " in completion
        assert completion.count(ENDED) == 1 and completion.endswith("Done.<|im_end|>\n")
    with pytest.raises(ValueError, match="expected a SynthHop id"):
        tool_call_demonstrations(make_env_class("rag_gym/HotpotQA-v0"), tok, n=1)


def warm_start_tiny_policy(env_cls, steps: int = 150):
    """A 2-layer, 128-wide random Llama (SmolLM2's tokenizer, TRL's tool template) taught one
    fixed call, ``search(query="publisher")``, as its first reply to the rendered prompts of 8
    questions. A random model emits no parsable tool call and a real warm start
    (:func:`tool_call_demonstrations`) does not fit a CPU test's budget; this does, so that the
    GRPO run below reaches the env through TRL's own parsing."""
    import torch

    from rag_gym.train.models import tiny_policy

    model, tok = tiny_policy(hidden_size=128)
    prepare_tokenizer(tok)
    env = env_cls()
    call = '<tool_call>\n{"name": "search", "arguments": {"query": "publisher"}}\n</tool_call>'
    target = tok(call + tok.eos_token, add_special_tokens=False)["input_ids"]
    prompts = []
    for row in build_dataset(env_cls, n=8, seed=1):
        messages = [*row["prompt"][:-1], {"role": "user", "content": env.reset(**row)}]
        text = tok.apply_chat_template(
            messages, tools=tools_of(env), add_generation_prompt=True, tokenize=False
        )
        prompts.append(tok(text, add_special_tokens=False)["input_ids"])
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for step in range(steps):
        for ids in prompts[(step % 2) * 4 : (step % 2) * 4 + 4]:
            hidden = model.model(input_ids=torch.tensor([ids + target])).last_hidden_state
            logits = model.lm_head(hidden[0, len(ids) - 1 : -1])
            torch.nn.functional.cross_entropy(logits, torch.tensor(target)).backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    out = model.generate(torch.tensor([prompts[0]]), max_new_tokens=len(target), do_sample=False)
    assert tok.decode(out[0][len(prompts[0]) :]).startswith(call)
    model.train()
    return model, tok


@pytest.mark.slow
def test_grpo_environment_factory_two_steps_on_cpu(tmp_path):
    torch = pytest.importorskip("torch", reason="needs torch: pip install torch==2.13.0")
    trl = pytest.importorskip("trl", reason="needs trl: pip install 'rag-gym[train]'")
    pytest.importorskip("sentence_transformers", reason="evo_rag needs rag-gym[dense]")

    torch.set_num_threads(1)
    Env = make_env_class("rag_gym/SynthHop-v0", reward_preset="evo_rag", env_kwargs=WORLD)
    model, tok = warm_start_tiny_policy(Env)
    tok.padding_side = "left"

    terms = ["retrieval_hit", "step_cost", "answer"]
    captured: list[dict] = []

    class Recording(trl.GRPOTrainer):
        """Keeps what each generation step produced (nothing else changes)."""

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
            max_completion_length=384,
            max_tool_calling_iterations=2,
            temperature=0.5,
            learning_rate=1e-4,
            beta=0.0,
            reward_weights=[1.0] + [0.0] * len(terms),
            logging_steps=1,
            report_to=[],
            use_cpu=True,
            bf16=False,  # TRL's default is True: emulated, and many times slower, on a CPU without bf16
            gradient_checkpointing=False,
            save_strategy="no",
            seed=0,
        ),
    )
    trainer.train()

    calls = [c for step in captured for rollout in step["calls"] for c in rollout]
    searches = [c for c in calls if c == ("search", "publisher")]
    print(f"\n{len(calls)} tool calls reached the env in 2 GRPO steps ({len(searches)} searches)")
    assert len(captured) == 2 and searches, "no tool call reached the env"

    # rewards are finite and are the envs' own episode returns
    logged = [h for h in trainer.state.log_history if "rewards/episode_return/mean" in h]
    assert len(logged) == 2
    for step, log in zip(captured, logged, strict=True):
        assert all(math.isfinite(r) for r in step["returns"])
        assert log["rewards/episode_return/mean"] == pytest.approx(
            sum(step["returns"]) / len(step["returns"]), abs=1e-5
        )
    # a search costs evo_rag's step cost at least: the returns are the env's, not zeros
    assert any(r != 0.0 for step in captured for r in step["returns"])

    # env-written tokens (the tool results) have tool_mask 0; the model's own have 1
    checked = 0
    for step in captured:
        out = step["out"]
        for ids, mask, keep in zip(
            out["completion_ids"], out["tool_mask"], out["completion_mask"], strict=True
        ):
            ids, mask = ids[keep.bool()], mask[keep.bool()]
            env_text = tok.decode(ids[mask == 0])
            model_text = tok.decode(ids[mask == 1])
            if (mask == 0).any():
                assert "Doc 1(Title: " in env_text
                assert "Doc 1(Title: " not in model_text and "<tool_call>" in model_text
                checked += 1
    assert checked > 0
