"""Package a trained LoRA adapter as a checkpoint folder that ``search_r1:DIR`` loads anywhere.

A checkpoint folder holds:

* ``adapter_config.json`` and ``adapter_model.safetensors`` (float16): the PEFT adapter, for the
  transformers backend (``transformers`` + ``search_r1:DIR``);
* ``adapter.gguf``: the same adapter for llama.cpp (:func:`~rag_gym.generation.adapters.lora_to_gguf`),
  so the default backend needs no torch (left out of a checkpoint inside rag-gym's own package,
  which ships the weights once and converts them into the cache on first use);
* ``rag_gym.json``: the base model (``"embedded"``: the embedded SmolLM2-135M-Instruct), the
  chat template its runs trained with (``chat_template``,
  :func:`~rag_gym.agents.provenance.recorded_template`), the
  exact command, seed and data split, the held-out results, and a few fixed test questions with
  the answers the checkpoint gives them (a test replays them);
* ``README.md``: the model card, written from ``rag_gym.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rag_gym.generation.adapters import (
    inside_package,
    load_lora_tensors,
    lora_to_gguf,
    read_adapter_config,
    resolve_adapter,
)


def package_adapter(
    adapter: str | Path, out_dir: str | Path, card: dict[str, Any], base: str = "embedded"
) -> Path:
    """Write the checkpoint folder ``out_dir`` from a LoRA adapter folder (or a run folder with
    ``final/``) and the model card fields ``card`` (``command``, ``seed``, ``data``,
    ``results``, ``fixed_questions``…), and ``training_sets``, the splits the adapter's runs
    trained on (read from its run folders, :func:`rag_gym.agents.provenance.training_sets`,
    unless ``card`` gives them). Returns ``out_dir``."""
    import numpy as np
    from safetensors.numpy import save_file

    source = resolve_adapter(adapter)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = read_adapter_config(source)
    config["base_model_name_or_path"] = base
    config["inference_mode"] = True
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = load_lora_tensors(source / "adapter_model.safetensors")
    save_file(
        {k: v.astype(np.float16) for k, v in tensors.items()},
        str(out / "adapter_model.safetensors"),
    )
    if not inside_package(out):  # rag-gym's own ships the weights once (converted on first use)
        lora_to_gguf(out, out / "adapter.gguf")
    meta = {"base": base, "lora_r": config.get("r"), "lora_alpha": config.get("lora_alpha"), **card}
    from rag_gym.agents.provenance import recorded_template, training_sets

    if "chat_template" not in meta:  # the template its runs trained with
        meta["chat_template"] = recorded_template(adapter)
    if "training_sets" not in meta:  # what rag-gym evaluate checks its questions against
        found = [ts.describe() for ts in training_sets(adapter)]
        if found:  # else the card's own env_id (and env_kwargs) stand for it
            meta["training_sets"] = found
    (out / "rag_gym.json").write_text(json.dumps(meta, indent=2) + "\n")
    (out / "README.md").write_text(model_card(meta))
    return out


def record_fixed_questions(
    folder: str | Path, indices: Any = range(8), split: str = "test", n_threads: int | None = 1
) -> dict[str, Any]:
    """Play the checkpoint in ``folder`` greedily on llama.cpp (its ``adapter.gguf``) on the
    questions ``indices`` of its env's ``split``, and write what it answers into its
    ``rag_gym.json`` (``fixed_questions``, ``fixed_questions_em``) and ``README.md``: the figures
    the shipped-checkpoint test replays. Returns the updated ``rag_gym.json``."""
    import rag_gym
    from rag_gym.baselines import make_agent
    from rag_gym.generation.llama_cpp import LlamaCppLM

    folder = Path(folder)
    meta = json.loads((folder / "rag_gym.json").read_text())
    agent = make_agent(f"search_r1:{folder}", lm=LlamaCppLM(n_threads=n_threads))
    env = rag_gym.make(
        meta["env_id"], text_actions=meta["tags"], split=split, **(meta.get("env_kwargs") or {})
    )
    fixed = []
    for index in indices:
        obs, info = env.reset(options={"question_index": int(index)})
        agent.reset(slot=0)
        while True:
            obs, _, terminated, truncated, info = env.step(agent.act(obs, info))
            if terminated or truncated:
                break
        fixed.append(
            {
                "index": int(index),
                "question": info["question"],
                "prediction": info.get("prediction"),
                "em": float((info.get("scores") or {}).get("em", 0.0)),
            }
        )
    env.close()
    meta["fixed_questions"] = fixed
    meta["fixed_questions_em"] = sum(q["em"] for q in fixed) / len(fixed)
    (folder / "rag_gym.json").write_text(json.dumps(meta, indent=2) + "\n")
    (folder / "README.md").write_text(model_card(meta))
    return meta


def model_card(meta: dict[str, Any]) -> str:
    """The model card (Markdown) of a checkpoint's ``rag_gym.json`` (``agent``: the name
    ``rag-gym evaluate`` plays it by, default ``search_r1:synthhop``)."""
    agent = meta.get("agent", "search_r1:synthhop")
    use_data = ""
    if meta.get("env_id") and meta["env_id"] != "rag_gym/SynthHop-v0":
        use_data = f" --env {meta['env_id']} --data-path DATA"
    lines = [
        f"# {meta.get('name', 'rag-gym search agent')}",
        "",
        meta.get("summary", ""),
        "",
        f"- Base model: {'the embedded SmolLM2-135M-Instruct (Q4_1 GGUF for llama.cpp)' if meta['base'] == 'embedded' else meta['base']}",
        f"- Adapter: LoRA r = {meta.get('lora_r')}, alpha = {meta.get('lora_alpha')}, every linear layer but the tied head",
        f"- Seed: {meta.get('seed')}",
        f"- Data: {meta.get('data', '')}",
        "",
        "## Command",
        "",
        "```bash",
        meta.get("command", ""),
        "```",
        "",
        "## Held-out results",
        "",
    ]
    for row in meta.get("results", []):
        lines.append(f"- {row}")
    if meta.get("fixed_questions"):
        lines += ["", "## Fixed test questions (replayed by the tests)", ""]
        lines += ["| index | question | answer given | EM |", "|---|---|---|---|"]
        for q in meta["fixed_questions"]:
            lines.append(f"| {q['index']} | {q['question']} | {q['prediction']} | {q['em']:.0f} |")
    lines += [
        "",
        "## Use",
        "",
        "```bash",
        f"rag-gym evaluate --agents {agent}{use_data}            # llama.cpp (adapter.gguf)",
        f"rag-gym evaluate --agents {agent}{use_data} --lm transformers   # PEFT adapter",
        "```",
        "",
    ]
    return "\n".join(lines)
