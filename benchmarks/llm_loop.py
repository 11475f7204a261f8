"""The llama.cpp generation loop against the model's floor, and batched decoding against one
sequence at a time.

    python benchmarks/llm_loop.py --episodes 8

With the trained SynthHop agent (``search_r1:synthhop``: the embedded SmolLM2-135M with the
shipped LoRA adapter) on llama.cpp, all in one run:

1. **Raw speeds** of llama.cpp on this machine: prefill (``Llama.eval`` of 1,024 prompt tokens,
   llama-cpp-python's own 512-token batches) and decode (``Llama.generate``, 128 greedy tokens),
   the best of ``--repeats`` rounds.
2. **Episode time against the floor.** ``rag_gym.evaluate`` plays ``--episodes`` questions of
   SynthHop (and of HotpotQA when ``../shared/data`` holds its sample) with ``batch_size=1``,
   recording every prompt and reply. An episode's floor is what its tokens need at the raw
   speeds: its final context (last prompt and reply) prefilled once, except the generated
   tokens, which are decoded. Ratio = the episodes' measured seconds over their floors
   (target <= 1.25).
3. **Batched decode.** ``--batch`` first prompts of SynthHop episodes, sampled (temperature
   0.8, ``--decode-tokens`` tokens at most), decoded together and one at a time: aggregate
   decode tokens/s (generated tokens over the call's time outside prefill), batch against one
   (target >= 3). The same prompts greedy, batched and one at a time: how many replies differ.

Every figure comes from this run; on a machine shared with other work they are upper bounds
for the times and lower bounds for the speeds, and the ratios are only indicative.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import rag_gym  # noqa: F401
from rag_gym.agents.search_r1 import SearchR1Agent, checkpoint_path
from rag_gym.evaluate import EvalConfig, evaluate
from rag_gym.generation.adapters import adapter_gguf
from rag_gym.generation.llama_cpp import LlamaCppLM
from rag_gym.generation.lm import GenerationConfig

HOTPOT = Path(__file__).resolve().parents[2] / "shared" / "data" / "hotpotqa"
HOTPOT_FILE = HOTPOT / "hotpot_dev_distractor_300.json"


class Recording(LlamaCppLM):
    """Keeps (prompt, prompt tokens, completion tokens) of every reply."""

    def generate(self, prompts, config=None):
        out = super().generate(prompts, config)
        self.calls.extend(
            (p, g[0].prompt_tokens, g[0].completion_tokens)
            for p, g in zip(prompts, out, strict=True)
        )
        return out


def raw_speeds(lm: LlamaCppLM, repeats: int) -> tuple[float, float]:
    """Prefill and decode tokens/s of llama-cpp-python's own ``eval`` and ``generate``."""
    llm = lm._llm
    text = "The quick brown fox jumps over the lazy dog. " * 120
    tokens = llm.tokenize(text.encode(), add_bos=False)[:1024]
    prefill = decode = 0.0
    for _ in range(repeats):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(tokens)
        prefill = max(prefill, len(tokens) / (time.perf_counter() - t0))
        llm.reset()
        n = 0
        t0 = time.perf_counter()
        for _token in llm.generate(tokens[:32], temp=0.0, top_k=1):
            n += 1
            if n == 128:
                break
        # the 32-token prompt's prefill is part of this time: the decode speed is a lower bound
        decode = max(decode, n / (time.perf_counter() - t0))
    llm.reset()
    lm.engine.invalidate()
    return prefill, decode


def episodes(lm: Recording, env_id: str, env_kwargs: dict, n: int, out: str) -> list[dict]:
    """Play ``n`` questions one at a time; each episode's seconds, final context and generated
    tokens."""
    lm.calls = []
    cfg = EvalConfig(
        env_id=env_id,
        env_kwargs=env_kwargs,
        split="test",
        n=n,
        seed=0,
        agents=("search_r1:synthhop",),
        batch_size=1,
        out_dir=out,
        run_name=env_id.split("/")[1],
        lm_spec="llama_cpp",
    )
    before = dict(lm.engine.stats)
    result = evaluate(cfg, lambda _name, env: SearchR1Agent(lm))
    spent = {k: lm.engine.stats[k] - before[k] for k in before}
    print(
        f"  engine: {spent['prefilled']:.0f} tokens prefilled in {spent['prefill_s']:.1f} s "
        f"({spent['prefilled'] / max(spent['prefill_s'], 1e-9):.0f} tok/s), "
        f"{spent['reused']:.0f} reused, {spent['decoded']:.0f} decoded in "
        f"{spent['decode_s']:.1f} s of llama_decode"
    )
    groups: list[list[tuple[str, int, int]]] = []
    for call in lm.calls:  # an episode's prompts each extend the one before
        if groups and call[0].startswith(groups[-1][-1][0]):
            groups[-1].append(call)
        else:
            groups.append([call])
    assert len(groups) == len(result.episodes), (len(groups), len(result.episodes))
    return [
        {
            "seconds": e["seconds"],
            "context": g[-1][1] + g[-1][2],
            "generated": sum(c[2] for c in g),
            "prefilled": sum(c[1] for c in g),
        }
        for e, g in zip(result.episodes, groups, strict=True)
    ]


def batched_decode(lm: LlamaCppLM, prompts: list[str], tokens: int) -> dict[str, float]:
    """Aggregate decode tokens/s of the prompts sampled together and one at a time, and how
    many greedy replies batching changes."""
    out = {}
    config = GenerationConfig(max_tokens=tokens, temperature=0.8, seed=1)
    for name, parallel in (("batch", len(prompts)), ("one", 1)):
        lm.engine.parallel = parallel
        lm.engine._bctx = None  # a context for this many sequences
        before = dict(lm.engine.stats)
        t0 = time.perf_counter()
        replies = lm.generate(prompts, config)
        wall = time.perf_counter() - t0
        generated = sum(g[0].completion_tokens for g in replies)
        prefill = lm.engine.stats["prefill_s"] - before["prefill_s"]
        out[name] = generated / (wall - prefill)
        out[f"{name}_tokens"] = generated
    lm.engine.parallel = len(prompts)
    lm.engine._bctx = None
    greedy = GenerationConfig(max_tokens=tokens, stop=("</search>", "</answer>"))
    one = [g[0].text for g in lm.generate(prompts, greedy)]
    lm.batch_greedy = True
    together = [g[0].text for g in lm.generate(prompts, greedy)]
    lm.batch_greedy = False
    out["greedy_differ"] = sum(a != b for a, b in zip(one, together, strict=True))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()

    lm = Recording(n_threads=args.threads, adapter=adapter_gguf(checkpoint_path("synthhop")))
    lm.calls = []
    prefill, decode = raw_speeds(lm, args.repeats)
    print(f"raw llama.cpp: prefill {prefill:.0f} tok/s, decode {decode:.0f} tok/s")

    envs = [("rag_gym/SynthHop-v0", {})]
    if HOTPOT_FILE.is_file():
        envs.append(("rag_gym/HotpotQA-v0", {"data_path": str(HOTPOT_FILE)}))
    else:
        print(f"HotpotQA: skipped ({HOTPOT_FILE} is absent)")
    first_prompts: list[str] = []
    with tempfile.TemporaryDirectory() as out:
        for env_id, kwargs in envs:
            eps = episodes(lm, env_id, kwargs, args.episodes, out)
            if not first_prompts:
                seen = []
                for p, _, _ in lm.calls:
                    if not any(p.startswith(q) for q in seen):
                        seen.append(p)
                first_prompts = seen
            n = len(eps)
            seconds = sum(e["seconds"] for e in eps)
            floor = sum(
                (e["context"] - e["generated"]) / prefill + e["generated"] / decode for e in eps
            )
            mean = {k: sum(e[k] for e in eps) / n for k in ("context", "generated", "prefilled")}
            print(
                f"{env_id}: {n} episodes, mean final context {mean['context']:.0f} tokens "
                f"({mean['generated']:.0f} generated; {mean['prefilled']:.0f} prompt tokens "
                f"sent), {seconds / n:.2f} s an episode against a floor of {floor / n:.2f} s: "
                f"{seconds / floor:.2f}x the floor (target <= 1.25)"
            )
    prompts = (first_prompts * args.batch)[: args.batch]
    b = batched_decode(lm, prompts, args.decode_tokens)
    print(
        f"decode at batch {args.batch}: {b['batch']:.0f} tok/s aggregate "
        f"({b['batch_tokens']} tokens) against {b['one']:.0f} tok/s one at a time "
        f"({b['one_tokens']} tokens): {b['batch'] / b['one']:.2f}x (target >= 3); greedy replies "
        f"batching changed: {b['greedy_differ']} of {args.batch}"
    )


if __name__ == "__main__":
    main()
