"""The transformers backend on the embedded SmolLM2 GGUF: continuous batching, clients sharing the
batch, sampling seeds, stops, counts, failures."""

from __future__ import annotations

import importlib.util

import pytest

from rag_gym.generation.lm import GenerationConfig
from tests.conftest import llama_available

pytestmark = [
    pytest.mark.llm,
    pytest.mark.skipif(
        not llama_available()
        or any(
            importlib.util.find_spec(m) is None
            for m in ("torch", "transformers", "accelerate", "gguf")
        ),
        reason="needs the embedded SmolLM2 and transformers: pip install 'rag-gym[llama,hf]'",
    ),
]


# loading the model takes longer than most test files: the tests that use it are marked slow
@pytest.fixture(scope="module")
def lm():
    from rag_gym.generation.transformers_lm import TransformersLM

    return TransformersLM(batch_size=4)


@pytest.mark.slow
def test_batched_greedy_equals_one_at_a_time(lm):
    chats = [[{"role": "user", "content": f"Name a colour, number {i}."}] for i in range(3)]
    batched = lm.generate(chats, GenerationConfig(max_tokens=6))
    single = [lm.generate([c], GenerationConfig(max_tokens=6))[0] for c in chats]
    assert [g[0].text for g in batched] == [g[0].text for g in single]
    assert all(g[0].prompt_tokens > 5 and 0 < g[0].completion_tokens <= 6 for g in batched)


@pytest.mark.slow
def test_rows_leave_and_join_with_the_outputs_of_one_at_a_time(lm):
    # six prompts of different lengths on four rows: finished rows are replaced mid-generation
    chats = [
        [{"role": "user", "content": "Name a colour." + " Please." * i}] for i in (0, 5, 1, 9, 2, 3)
    ]
    cfg = GenerationConfig(max_tokens=3 + len(chats))
    batched = lm.generate(chats, cfg)
    single = [lm.generate([c], cfg)[0] for c in chats]
    assert [g[0].text for g in batched] == [g[0].text for g in single]
    assert [g[0].prompt_tokens for g in batched] == [g[0].prompt_tokens for g in single]
    assert len({g[0].prompt_tokens for g in batched}) == len(chats)


@pytest.mark.slow
def test_the_same_tokens_as_transformers_generate(lm):
    # the fallback path is transformers' own generate, one prompt at a time
    chats = [[{"role": "user", "content": q}] for q in ("What is 2 + 2?", "Name a river.")]
    cfg = GenerationConfig(max_tokens=10, stop=(".",))
    ours = lm.generate(chats, cfg)
    theirs = [lm._hf_batch([lm.render(c)], cfg, seed=0)[0] for c in chats]
    assert [g[0].text for g in ours] == [g[0].text for g in theirs]
    assert [g[0].finish_reason for g in ours] == [g[0].finish_reason for g in theirs]


@pytest.mark.slow
def test_clients_share_the_running_batch(lm, monkeypatch):
    rows_per_step = []
    forward = lm._engine.forward

    def counting(ids, positions, plan, last):
        rows_per_step.append(len(plan))
        return forward(ids, positions, plan, last)

    monkeypatch.setattr(lm._engine, "forward", counting)
    replies: list[tuple[int, int, str]] = []

    def client(i: int):
        def play() -> None:
            for turn in range(2):
                cfg = GenerationConfig(max_tokens=2 + 2 * i)
                (gens,) = lm.generate([f"Say the number {i + turn}."], cfg)
                replies.append((i, turn, gens[0].text))

        return play

    lm.run_clients([client(i) for i in range(3)])
    assert max(rows_per_step) == 3  # the three clients' requests decoded together
    assert sorted((i, t) for i, t, _ in replies) == [(i, t) for i in range(3) for t in range(2)]
    # client 0 asks for fewer tokens, so it sends its second request first
    assert [(i, t) for i, t, _ in replies][:2] == [(0, 0), (0, 1)]
    monkeypatch.undo()
    for i, turn, text in replies:
        (alone,) = lm.generate(
            [f"Say the number {i + turn}."], GenerationConfig(max_tokens=2 + 2 * i)
        )
        assert alone[0].text == text


@pytest.mark.slow
def test_a_prompt_starts_from_the_prefix_its_slot_kept(lm, monkeypatch):
    starts = []
    forward = lm._engine.forward

    def recording(ids, positions, plan, last):
        starts.extend(start for _, start, q0, q1 in plan if q1 - q0 > 1)  # prompt parts
        return forward(ids, positions, plan, last)

    monkeypatch.setattr(lm._engine, "forward", recording)
    passage = "Orrin is a river town. Its bridge was built in 1602 by Ada Vell. " * 3
    questions = [f"{passage}\nQuestion: {q}\nAnswer:" for q in ("Who built it?", "When?")]
    cfg = GenerationConfig(max_tokens=5)
    replies = []
    lm.run_clients([lambda: replies.extend(lm.generate([q], cfg)[0][0] for q in questions)])
    shared = len(lm.tokenizer(passage + "\nQuestion: ", add_special_tokens=False)["input_ids"])
    assert starts[0] == 0 and shared - 2 <= starts[1] <= shared  # the second skips the passage
    starts.clear()
    lm.generate([questions[1]], cfg)  # a new call starts clean
    assert starts == [0]
    monkeypatch.setattr(lm, "reuse_prefix", False)
    whole = [lm.generate([q], cfg)[0][0] for q in questions]
    assert [g.text for g in replies] == [g.text for g in whole]
    assert [g.prompt_tokens for g in replies] == [g.prompt_tokens for g in whole]


def _computed(lm, monkeypatch) -> list[tuple[int, int]]:
    """Records (cache start, tokens computed) of every prompt part the engine runs."""
    parts: list[tuple[int, int]] = []
    forward = lm._engine.forward

    def recording(ids, positions, plan, last):
        parts.extend((start, q1 - q0) for _, start, q0, q1 in plan if q1 - q0 > 1)
        return forward(ids, positions, plan, last)

    monkeypatch.setattr(lm._engine, "forward", recording)
    return parts


@pytest.mark.slow
def test_samples_of_one_prompt_compute_it_once(lm, monkeypatch):
    parts = _computed(lm, monkeypatch)
    chat = [{"role": "user", "content": "Tell me about rivers and the towns along them."}]
    out = lm.generate([chat], GenerationConfig(max_tokens=4, n=3, temperature=1.0, seed=3))
    length = out[0][0].prompt_tokens
    # the first sample computes the prompt; the others wait one step and compute only its
    # last token (one-token parts are not recorded)
    assert parts == [(0, length)]
    monkeypatch.setattr(lm, "reuse_prefix", False)
    again = lm.generate([chat], GenerationConfig(max_tokens=4, n=3, temperature=1.0, seed=3))
    assert [g.text for g in again[0]] == [g.text for g in out[0]]


@pytest.mark.slow
def test_a_session_keeps_prompt_and_reply_across_calls(lm, monkeypatch):
    parts = _computed(lm, monkeypatch)
    tok = lm.tokenizer
    prompt = tok("Orrin is a river town. Its bridge was built in 1602 by Ada Vell. Who built it?")[
        "input_ids"
    ]
    cfg = GenerationConfig(max_tokens=6)
    with lm.session():
        ((first, _),) = lm.generate_ids([prompt], cfg)
        turn = (
            prompt + first + tok(" Observation: the bridge.", add_special_tokens=False)["input_ids"]
        )
        ((second, _),) = lm.generate_ids([turn], cfg)
    # turn two computed only what turn one did not: its last sampled token and the observation
    assert parts[0] == (0, len(prompt))
    start, n = parts[1]
    assert start == len(prompt) + len(first) - 1 and start + n == len(turn)
    parts.clear()
    ((alone, _),) = lm.generate_ids([turn], cfg)  # outside the session: computed whole
    assert parts == [(0, len(turn))] and alone == second


@pytest.mark.slow
def test_generate_ids_keeps_the_end_token(lm):
    tok = lm.tokenizer
    chat = [{"role": "user", "content": "What is 2 + 2? Reply with the number only."}]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    ids = tok(ids, add_special_tokens=False)["input_ids"]
    [(tokens, finish)] = lm.generate_ids([ids], GenerationConfig(max_tokens=40))
    assert finish == "stop" and tokens[-1] in lm._eos and "4" in tok.decode(tokens)
    [(short, finish)] = lm.generate_ids([ids], GenerationConfig(max_tokens=1))
    assert finish == "length" and short == tokens[:1]


@pytest.mark.slow
def test_a_client_error_reaches_the_caller_after_the_others_finish(lm):
    finished = []

    def bad() -> None:
        lm.generate(["Hello"], GenerationConfig(max_tokens=2))
        raise KeyError("boom")

    def good() -> None:
        lm.generate(["Hello there"], GenerationConfig(max_tokens=4))
        finished.append(True)

    with pytest.raises(KeyError, match="boom"):
        lm.run_clients([bad, good])
    assert finished == [True]


@pytest.mark.slow
def test_a_failing_forward_fails_its_requests_and_the_model_goes_on(lm, monkeypatch):
    def broken(*args):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(lm._engine, "forward", broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        lm.generate(["Hello"], GenerationConfig(max_tokens=2))
    monkeypatch.undo()
    (gens,) = lm.generate(["Hello"], GenerationConfig(max_tokens=2))
    assert gens[0].completion_tokens == 2


@pytest.mark.slow
def test_sampling_is_seeded_and_n_samples(lm):
    cfg = GenerationConfig(max_tokens=8, temperature=1.0, n=3, seed=7)
    (first,) = lm.generate(["Once upon a time"], cfg)
    (again,) = lm.generate(["Once upon a time"], cfg)
    assert len(first) == 3 and [g.text for g in first] == [g.text for g in again]


@pytest.mark.slow
def test_stop_sequences_cut_the_text_and_end_the_row(lm):
    prompt = ["1, 2, 3, 4, 5, 6,"]
    (gens,) = lm.generate(prompt, GenerationConfig(max_tokens=12, stop=(" 8",)))
    assert gens[0].text.strip() == "7," and gens[0].finish_reason == "stop"
    # the row ended at the token that completed " 8", not at the token limit
    n = gens[0].completion_tokens
    (before,) = lm.generate(prompt, GenerationConfig(max_tokens=n - 1))
    (upto,) = lm.generate(prompt, GenerationConfig(max_tokens=n))
    assert " 8" not in before[0].text and " 8" in upto[0].text


def test_bad_model_path():
    from rag_gym.generation.transformers_lm import TransformersLM

    with pytest.raises(FileNotFoundError, match=r"no GGUF model file at nope\.gguf"):
        TransformersLM("nope.gguf")


def test_the_engine_runs_a_float32_policy_under_bf16_autocast():
    """Trainers with bf16=True (every GPU run) sample from a float32 policy under autocast, where
    projections come out in bfloat16: the engine's float32 cache and output take them (this
    failed on the first GPU run with "Index put requires the source and destination dtypes
    match"). CPU autocast reproduces it."""
    import torch

    from rag_gym.generation.transformers_lm import TransformersLM
    from rag_gym.train.models import tiny_policy

    model, tok = tiny_policy()
    model.eval()
    lm = TransformersLM.from_model(model, tok, batch_size=4)
    assert lm.engine_enabled
    config = GenerationConfig(max_tokens=8, temperature=0.6, n=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = lm.generate(["What is the capital of France?", "Name a river."], config)
    assert lm.engine_enabled  # no fallback to model.generate
    assert [len(o) for o in out] == [2, 2]
    assert all(g.completion_tokens > 0 and g.error is None for o in out for g in o)


def test_the_engine_runs_a_bf16_policy_prepared_for_mixed_precision():
    """A GPU trainer (bf16=True) wraps the policy's forward in accelerate's fp32 output
    conversion, which calls ``.float()`` on any output with a half ``dtype``: the engine's cache,
    returned as ``past_key_values``, must not look like one, and its self-check must accept
    bf16 rounding. Both made the first GPU run fall back to ``model.generate``."""
    import torch
    from accelerate.utils import convert_outputs_to_fp32

    from rag_gym.generation.transformers_lm import TransformersLM
    from rag_gym.train.models import tiny_policy

    model, tok = tiny_policy()
    model = model.to(torch.bfloat16).eval()
    model.forward = convert_outputs_to_fp32(model.forward)
    lm = TransformersLM.from_model(model, tok, batch_size=4)
    assert lm.engine_enabled, lm.engine_fallback
    out = lm.generate(["What is the capital of France?"], GenerationConfig(max_tokens=8))
    assert out[0][0].completion_tokens == 8 and out[0][0].error is None


@pytest.mark.slow  # loads SmolLM2 on transformers (the module's lm, 20 s)
def test_generate_ids_on_model_generate_gives_the_engines_tokens(lm):
    """For a model the engine cannot run, generate_ids decodes on model.generate (left-padded
    batches): the same greedy tokens and finish reasons as the engine, a row cut after its stop
    string or end token (the rest is padding)."""
    from rag_gym.generation.transformers_lm import _trim

    tok = lm.tokenizer
    chats = [[{"role": "user", "content": q}] for q in ("What is 2 + 2?", "Name a long river.")]
    prompts = [tok(lm.render(c), add_special_tokens=False)["input_ids"] for c in chats]
    for cfg in (
        GenerationConfig(max_tokens=40),
        GenerationConfig(max_tokens=2),
        GenerationConfig(max_tokens=40, stop=(" is",)),
    ):
        assert lm._hf_ids(prompts, cfg) == lm.generate_ids(prompts, cfg), cfg
    tokens = tok.encode("<search>a b</search> and then more", add_special_tokens=False)
    kept, finish = _trim(tokens, ("</search>",), tok)
    assert tok.decode(kept) == "<search>a b</search>" and finish == "stop"
    hi, eos = tok.encode("hi", add_special_tokens=False), tok.eos_token_id
    assert _trim([*hi, eos, eos], (), tok) == ([*hi, eos], "stop")
    assert _trim(hi, (), tok) == (hi, "length")
