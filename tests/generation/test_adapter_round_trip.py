"""LoRA adapters ship to llama.cpp for every supported architecture: a tiny random base of each
(llama, Mistral, Qwen2, Qwen3, Gemma 3) is written as a GGUF, a LoRA is trained on it for a few
steps in PEFT, converted (:func:`rag_gym.generation.adapters.lora_to_gguf`), and loaded by
llama.cpp on the GGUF, whose greedy answers to fixed prompts must be PEFT's."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import requires_lora_to_llama

# slow: every test uses `trained`, which trains an adapter per architecture
pytestmark = [pytest.mark.slow, requires_lora_to_llama]

ARCHS = ["llama", "mistral", "qwen2", "qwen3", "gemma3"]
NEW = 8


def fixed_prompts() -> tuple[list[list[int]], list[list[int]]]:
    rng = np.random.default_rng(2)
    prompts = [[int(t) for t in rng.integers(3, 512, size=n)] for n in (12, 20, 31)]
    targets = [[int(t) for t in rng.integers(3, 512, size=NEW)] for _ in prompts]
    return prompts, targets


def peft_greedy(model, ids: list[int]) -> list[int]:
    import torch

    out: list[int] = []
    with torch.no_grad():
        for _ in range(NEW):
            out.append(int(model(torch.tensor([ids + out])).logits[0, -1].argmax()))
    return out


def llama_greedy(path, adapter, prompts) -> tuple[list[list[int]], np.ndarray]:
    """Greedy answers of llama.cpp (the base GGUF with the adapter) and the logits of the first
    prompt."""
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(path),
        lora_path=None if adapter is None else str(adapter),
        n_ctx=256,
        n_threads=1,
        logits_all=True,
        verbose=False,
    )
    try:
        answers, first = [], None
        for ids in prompts:
            llm.reset()
            llm.eval(ids)
            if first is None:
                first = np.array(llm.scores[: len(ids)])
            out: list[int] = []
            for _ in range(NEW):
                out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
                llm.eval([out[-1]])
            answers.append(out)
        return answers, first
    finally:
        llm.close()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Per architecture: the base GGUF, the PEFT model trained to answer the fixed prompts with
    their targets, and its adapter folder."""
    import torch
    from peft import get_peft_model

    from rag_gym.train.models import lora_config
    from tests.generation.tiny_gguf import tiny_model, write_gguf

    torch.set_num_threads(1)
    prompts, targets = fixed_prompts()
    out = {}
    for arch in ARCHS:
        root = tmp_path_factory.mktemp(arch)
        model = tiny_model(arch)
        base = write_gguf(model, root / "base.gguf", arch)
        with torch.no_grad():
            base_logits = model(torch.tensor([prompts[0]])).logits[0].numpy()
        peft = get_peft_model(model, lora_config(8, 16))
        opt = torch.optim.Adam([p for p in peft.parameters() if p.requires_grad], lr=1e-2)
        peft.train()
        for _ in range(40):
            loss = 0.0
            for ids, target in zip(prompts, targets, strict=True):
                x = torch.tensor([ids + target])
                labels = x.clone()
                labels[:, : len(ids)] = -100
                loss = loss + peft(input_ids=x, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
        peft.eval()
        peft.save_pretrained(str(root / "adapter"))
        out[arch] = (base, base_logits, peft, root / "adapter")
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_the_base_gguf_is_the_transformers_model(trained, arch):
    """The test's own base conversion is right: llama.cpp's logits are transformers' (its KV
    cache is float16, hence the tolerance), and so are the greedy picks."""
    base, want, _, _ = trained[arch]
    prompts, _ = fixed_prompts()
    _, got = llama_greedy(base, None, prompts[:1])
    assert got.shape == want.shape
    assert np.abs(got - want).max() < 1e-2, np.abs(got - want).max()
    assert (got.argmax(-1) == want.argmax(-1)).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_an_adapter_gives_llama_cpp_the_peft_models_answers(trained, arch):
    from rag_gym.generation.adapters import check_adapter_fits, lora_to_gguf

    base, _, peft, folder = trained[arch]
    prompts, targets = fixed_prompts()
    want = [peft_greedy(peft, ids) for ids in prompts]
    assert want == targets  # trained: the adapter changes what the base says
    adapter = lora_to_gguf(folder, base=base)
    check_adapter_fits(adapter, base)
    got, logits = llama_greedy(base, adapter, prompts)
    assert got == want
    import torch

    with torch.no_grad():
        peft_logits = peft(torch.tensor([prompts[0]])).logits[0].numpy()
    assert np.abs(logits - peft_logits).max() < 5e-2  # the adapter is float16 in the GGUF


def test_a_wrong_q_k_permutation_is_seen(trained):
    """The round trip can fail: the llama adapter converted with wrong head counts (so a wrong
    Q/K row permutation) no longer gives PEFT's logits."""
    from rag_gym.generation.adapters import lora_to_gguf

    base, _, peft, folder = trained["llama"]
    prompts, _ = fixed_prompts()
    right = lora_to_gguf(folder, folder / "right.gguf", base=base)
    wrong = lora_to_gguf(folder, folder / "wrong.gguf", architecture="llama", n_head=2, n_head_kv=1)
    import torch

    with torch.no_grad():
        want = peft(torch.tensor([prompts[0]])).logits[0].numpy()
    _, good = llama_greedy(base, right, prompts[:1])
    _, bad = llama_greedy(base, wrong, prompts[:1])
    assert np.abs(good - want).max() < 5e-2
    assert np.abs(bad - want).max() > 0.1


def test_the_architecture_comes_from_the_base(trained):
    """The GGUF adapter carries its base's llama.cpp architecture; one converted for another
    base is refused before llama.cpp loads it."""
    import gguf

    from rag_gym.generation.adapters import AdapterError, check_adapter_fits, lora_to_gguf

    qwen_base, _, _, qwen_folder = trained["qwen3"]
    gemma_base, _, _, _ = trained["gemma3"]
    adapter = lora_to_gguf(qwen_folder, qwen_folder / "q.gguf", base=qwen_base)
    reader = gguf.GGUFReader(str(adapter))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    assert arch == "qwen3"
    names = {t.name for t in reader.tensors}
    assert "blk.1.ffn_down.weight.lora_b" in names and "blk.0.attn_q.weight.lora_a" in names
    with pytest.raises(AdapterError, match=r"'qwen3', the base .* is 'gemma3'"):
        check_adapter_fits(adapter, gemma_base)
