"""The papers' training recipes, as :class:`~rag_gym.train.grpo.EnvGRPOConfig` settings.

| recipe | env | algorithm | settings (paper section) |
|---|---|---|---|
| ``eval_rar`` | search, top-3 | GRPO | G = 5, β = 0.001, ε = 0.2, lr 1e-6, outcome + evaluation reward (Eval-RAR §3.2–3.3, §4.1 "Implementation details") |
| ``lwts`` | search, top-5, ≤ 5 turns | DAPO | stage 1 then stage 2 answer reward (eq. 10, 11), G = 32, lr 1e-6, KL coefficient 1e-4, temperature 1.0 (LWTS §3.3–3.4, Table 5) |
| ``arena`` | reader | GRPO | 7 samples per input, temperature 0.9, lr 3e-6, stabilised KL (ARENA §3.2, appendix E) |
| ``r2ag`` | tree, top-1, ≤ 5 expansions | DAPO | group size 12, ε_low 0.2, ε_high 0.28, lr 1e-6, iterative forest training ≤ 5 rounds, 4,096 output tokens (R²AG §2.4, appendix B.1–B.2) |

The papers: Eval-RAR ("Eval-RAR: Evaluation-Driven Retrieval-Augmented Reasoning via
Reinforcement Learning", Yu et al.); LWTS ("Learning When to Search: Multi-Stage Reward Design for
Efficient Agentic RAG with Reasoning Language Models", an anonymous ACL submission); ARENA
("Effective and Transparent RAG: Adaptive-Reward Reinforcement Learning for Decision
Traceability", arXiv:2505.13258); R²AG ("R²AG: Learning to Reason, Retrieve, and Self-Evolve
through a Multi-Branch Retrieval Tree", an anonymous submission under review).

Notes where the paper leaves a value open:

* LWTS's §3.3 says DAPO drops the KL term, but its Table 5 (the run's configuration) lists
  ``kl_loss_coef = 1e-4``; the recipe follows the table.
* ARENA's KL coefficient and clipping value are not legible in the text of appendix E; the recipe
  uses β = 0.04 (GRPO's and Open-R1's default, the framework ARENA trains with) and ε = 0.2.
* LWTS does not give the stage boundary; the recipe switches at half of ``max_steps``.
* Batch sizes are the papers' per-prompt group sizes; ``prompts_per_step`` (the papers use
  128–512 prompts per step on GPUs) is left to the user's budget.

>>> cfg = recipe("eval_rar", max_steps=10)
>>> cfg.num_generations, cfg.beta, cfg.env_kwargs["k"], cfg.algorithm
(5, 0.001, 3, 'grpo')
>>> recipe("lwts").stages
((1, 0.5), (2, 1.0))
"""

from __future__ import annotations

from typing import Any

from rag_gym._names import unknown_name
from rag_gym.train.grpo import EnvGRPOConfig
from rag_gym.wrappers.presets import PRESETS


def recipes() -> dict[str, dict[str, Any]]:
    """Every registered preset's recipe, by the name of its paper's agent (``eval_rar``,
    ``lwts``, ``arena``, ``r2ag``); a preset of your own with a recipe is there too."""
    out = {}
    for name in PRESETS:
        preset = PRESETS.get(name)
        if preset.recipe is not None:
            out[preset.agent or name] = dict(preset.recipe)
    return out


#: the recipes of rag-gym's presets (each lives beside its paper's reward terms, in
#: :mod:`rag_gym.wrappers`)
RECIPES = recipes()

#: R²AG trains on at most this many forest rounds (R²AG, appendix B.2).
R2AG_ITERATIONS = 5


def recipe(name: str, **overrides: Any) -> EnvGRPOConfig:
    """The config of recipe ``name`` (a preset's agent name, or the preset's) with
    ``overrides`` (``env_kwargs`` are merged)."""
    own = PRESETS.get(name).recipe if name in PRESETS else None
    settings = dict(own) if own is not None else recipes().get(name)
    if settings is None:
        raise unknown_name("training recipe", name, recipes())
    if "env_kwargs" in overrides:
        settings["env_kwargs"] = {**settings.get("env_kwargs", {}), **overrides.pop("env_kwargs")}
    settings.update(overrides)
    return EnvGRPOConfig(**settings)


def run(name: str, **overrides: Any) -> dict[str, Any]:
    """Train recipe ``name`` to the end: R²AG with :func:`~rag_gym.train.grpo.train_forest`
    (at most 5 rounds), the others with :func:`~rag_gym.train.grpo.train`."""
    from rag_gym.train.grpo import train, train_forest

    cfg = recipe(name, **overrides)
    if name == "r2ag":
        return train_forest(cfg, iterations=R2AG_ITERATIONS)
    return train(cfg)
