"""The preference model f_φ of EVO-RAG (§3.3) and the pairs its two learners train on: reward-model
pairs by return gap (Δ), policy pairs by preference score gap (δ)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rag_gym.rewards.core import EVO_RAG_TERMS
from rag_gym.train.evo_rag_dpo.branching import VisitedState
from rag_gym.train.evo_rag_dpo.config import _TOL, POLICY_MARGIN, RM_MARGIN, _check_int


def _torch():
    try:
        import torch
    except ImportError as exc:
        raise ImportError(
            "the preference model needs torch: pip install torch==2.13.0 'rag-gym[dense]'"
        ) from exc
    return torch


def preference_pairs(returns: Sequence[float], margin: float = RM_MARGIN) -> list[tuple[int, int]]:
    """Reward-model pairs among one state's siblings (§3.3): ``(i⁺, i⁻)`` for every two branches
    whose returns differ by at least ``margin`` (Δ = 0.3), the higher return first."""
    pairs = []
    for i in range(len(returns)):
        for j in range(i + 1, len(returns)):
            gap = float(returns[i]) - float(returns[j])
            if abs(gap) >= margin - _TOL:
                pairs.append((i, j) if gap > 0 else (j, i))
    return pairs


def policy_pair(scores: Sequence[float], margin: float = POLICY_MARGIN) -> tuple[int, int] | None:
    """The policy pair of one state (§3.4 (ii)): ``(best, worst)`` by preference-model score when
    the gap is at least ``margin`` (δ = 0.2), else ``None``. Ties go to the earlier sibling."""
    if len(scores) < 2:
        return None
    best = max(range(len(scores)), key=lambda i: (scores[i], -i))
    worst = min(range(len(scores)), key=lambda i: (scores[i], i))
    if best != worst and float(scores[best]) - float(scores[worst]) >= margin - _TOL:
        return best, worst
    return None


class PreferenceModel:
    """f_φ (§3.3): a frozen encoder and seven linear heads, one per EVO-RAG reward term.

    ``score(x) = (1/7) Σ_k f^(k)(x)``, and the loss over pairs ``(x⁺, x⁻)`` is the averaged
    pairwise logistic loss ``L_RM = −(1/7) Σ_k log σ(f^(k)(x⁺) − f^(k)(x⁻))`` (mean over pairs).
    Only the heads train (Adam); embeddings are cached per text.

    Args:
        encoder: ``None`` (the embedded all-MiniLM-L6-v2), a sentence-transformers id or path,
            or a callable ``texts -> array (n, d)``.
        n_heads: one per reward term (seven, :data:`~rag_gym.rewards.core.EVO_RAG_TERMS`).
        learning_rate: Adam's.
        seed: initialises the heads (the heads differ only by it: they see the same pairs).
    """

    def __init__(
        self,
        encoder: str | Path | Callable[[Sequence[str]], Any] | None = None,
        n_heads: int = len(EVO_RAG_TERMS),
        learning_rate: float = 1e-2,
        seed: int = 0,
    ) -> None:
        torch = _torch()
        from rag_gym.retrieval.encoders import SentenceEncoder, default_encoder

        _check_int("n_heads", n_heads)
        if encoder is None:
            encoder = default_encoder()
        elif isinstance(encoder, (str, Path)):
            encoder = SentenceEncoder(encoder)
        elif not callable(encoder):
            raise TypeError(
                "expected encoder to be None, a model id / path or a callable texts -> array, "
                f"got {type(encoder).__name__}"
            )
        self.encoder = encoder
        self._cache: dict[str, np.ndarray] = {}
        dim = self._embed_numpy(["probe"]).shape[1]
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.heads = torch.nn.Linear(dim, n_heads)
        self.optimizer = torch.optim.Adam(self.heads.parameters(), lr=learning_rate)

    @property
    def n_heads(self) -> int:
        return int(self.heads.out_features)

    def _embed_numpy(self, texts: Sequence[str]) -> np.ndarray:
        missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if missing:
            vectors = np.asarray(self.encoder(missing), dtype=np.float32)
            if vectors.ndim != 2 or len(vectors) != len(missing):
                raise ValueError(
                    f"expected the encoder to return an array (n, d) for n={len(missing)} texts, "
                    f"got shape {vectors.shape}"
                )
            self._cache.update(zip(missing, vectors, strict=True))
        return np.stack([self._cache[t] for t in texts])

    def embed(self, texts: Sequence[str]) -> Any:
        """The frozen encoder's embeddings as a float32 tensor ``(n, d)``."""
        torch = _torch()
        return torch.from_numpy(self._embed_numpy(list(texts)))

    def head_scores(self, texts: Sequence[str]) -> Any:
        """``f^(k)(x)`` for every text and head: a tensor ``(n, n_heads)``."""
        return self.heads(self.embed(texts))

    def scores(self, texts: Sequence[str]) -> list[float]:
        """The scalar score of each text: the mean of its heads."""
        torch = _torch()
        if not texts:
            return []
        with torch.no_grad():
            return self.head_scores(texts).mean(dim=1).tolist()

    def loss(self, chosen: Sequence[str], rejected: Sequence[str]) -> Any:
        """``L_RM`` over the pairs ``(chosen[i], rejected[i])`` (a scalar tensor)."""
        torch = _torch()
        if len(chosen) != len(rejected) or not chosen:
            raise ValueError(
                f"expected as many chosen as rejected texts (at least one), "
                f"got {len(chosen)} and {len(rejected)}"
            )
        gap = self.head_scores(chosen) - self.head_scores(rejected)
        return -torch.nn.functional.logsigmoid(gap).mean()

    def train_epoch(
        self, pairs: Sequence[tuple[str, str]], batch_size: int = 64, seed: int = 0
    ) -> float:
        """One pass over ``pairs`` (shuffled) in batches of ``batch_size``; returns the mean loss
        of the batches (each measured before its update)."""
        order = list(range(len(pairs)))
        random.Random(seed).shuffle(order)
        losses = []
        for start in range(0, len(order), batch_size):
            batch = [pairs[i] for i in order[start : start + batch_size]]
            loss = self.loss([p for p, _ in batch], [n for _, n in batch])
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            losses.append(float(loss.item()))
        return float(np.mean(losses)) if losses else float("nan")

    def evaluate(self, pairs: Sequence[tuple[str, str]]) -> dict[str, float]:
        """``L_RM`` and the accuracy (``score(x⁺) > score(x⁻)``) on ``pairs``, no update."""
        torch = _torch()
        if not pairs:
            return {"loss": float("nan"), "accuracy": float("nan")}
        with torch.no_grad():
            loss = float(self.loss([p for p, _ in pairs], [n for _, n in pairs]).item())
        chosen = self.scores([p for p, _ in pairs])
        rejected = self.scores([n for _, n in pairs])
        accuracy = float(np.mean([c > r for c, r in zip(chosen, rejected, strict=True)]))
        return {"loss": loss, "accuracy": accuracy}

    def save(self, path: str | Path) -> Path:
        """Write the heads to a safetensors file."""
        from safetensors.torch import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().contiguous() for k, v in self.heads.state_dict().items()}, path)
        return path

    def load(self, path: str | Path) -> None:
        """Read heads written by :meth:`save`."""
        from safetensors.torch import load_file

        self.heads.load_state_dict(load_file(str(path)))


def reward_model_pairs(
    states: Sequence[VisitedState], margin: float = RM_MARGIN
) -> list[tuple[str, str]]:
    """``(text⁺, text⁻)`` of every sibling pair whose returns differ by at least Δ (§3.3)."""
    pairs = []
    for state in states:
        sib = state.siblings
        for i, j in preference_pairs([s.episode_return for s in sib], margin):
            pairs.append((sib[i].text, sib[j].text))
    return pairs


def policy_pairs(
    states: Sequence[VisitedState], model: PreferenceModel, margin: float = POLICY_MARGIN
) -> list[dict[str, list[int]]]:
    """One DPO example per state whose best and worst siblings (by ``model``'s score) differ by
    at least δ (§3.4 (ii)): ``{"prompt_ids", "chosen_ids", "rejected_ids"}``."""
    rows = []
    for state in states:
        pick = policy_pair(model.scores([s.text for s in state.siblings]), margin)
        if pick is None:
            continue
        chosen, rejected = state.siblings[pick[0]], state.siblings[pick[1]]
        if chosen.action_ids == rejected.action_ids:
            continue
        rows.append(
            {
                "prompt_ids": list(state.prompt_ids),
                "chosen_ids": list(chosen.action_ids),
                "rejected_ids": list(rejected.action_ids),
            }
        )
    return rows
