"""The one scoring core: answer normalisation, EM/F1/cover-EM and retrieval metrics.

Every env, reward wrapper, TRL-style reward function and the evaluator calls these functions;
nothing else in rag-gym re-implements them.

Answer metrics follow the SQuAD / HotpotQA official evaluation scripts, which the 2Wiki,
MuSiQue, Search-R1 and FlashRAG scorers copy: normalise (lower-case, delete every ASCII
punctuation character, underscores included, remove the articles *a, an, the*, collapse white
space), then take the best score over all gold aliases. ``docs/metrics.md`` says which official
scorer each metric matches, and where they differ. A gold alias that normalises to nothing
(``"The"``, ``"a."``) is a ``ValueError`` in every answer metric: against it the official
scorers count ``"an"`` as exactly right, a reward a policy could learn to collect.

>>> normalize_answer("The  Eiffel_Tower!")
'eiffeltower'
>>> exact_match("the eiffel tower", ["Eiffel Tower", "La tour Eiffel"])
1.0
>>> round(f1_score("Eiffel tower in Paris", ["Eiffel Tower"]), 4)
0.6667
>>> cover_exact_match("It is the Eiffel Tower.", ["eiffel tower"])
1.0
>>> cover_exact_match("Parisian cafés", ["Paris"]), sub_exact_match("Parisian cafés", ["Paris"])
(0.0, 1.0)

Retrieval metrics take the ranked retrieved ids and the gold ids:

>>> recall_at_k(["a", "x", "b"], ["a", "b"], k=2)
0.5
>>> average_precision(["a", "x", "b"], ["a", "b"])  # (1/1 + 2/3) / 2
0.8333333333333333
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_YES_NO = {"yes", "no", "noanswer"}


def normalize_answer(text: str) -> str:
    """Lower-case, delete ASCII punctuation (``_`` included), drop articles, collapse spaces.

    Exactly the SQuAD / HotpotQA ``normalize_answer``: ``"Eiffel_Tower"`` becomes
    ``"eiffeltower"``; non-ASCII punctuation such as curly quotes is kept, as there.
    """
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _as_list(golds: str | Iterable[str]) -> list[str]:
    return [golds] if isinstance(golds, str) else list(golds)


def _normalised_golds(golds: str | Iterable[str]) -> list[str]:
    """The normalised gold aliases; a ``ValueError`` for one that normalises to nothing."""
    out = []
    for gold in _as_list(golds):
        norm = normalize_answer(gold)
        if not norm:
            raise ValueError(
                f"expected gold answers that keep a word after normalisation, got {gold!r}, "
                "which normalises to '' (articles and punctuation only) and would score answers "
                "such as 'an' as exactly right: fix the answer or drop the alias (the dataset "
                "loaders refuse such answers, naming the file and record)"
            )
        out.append(norm)
    return out


def exact_match(prediction: str, golds: str | Iterable[str]) -> float:
    """1.0 when the normalised prediction equals some normalised gold alias, else 0.0.

    A gold alias that normalises to nothing (``"The"``) is a ``ValueError``, in every answer
    metric: the official scorers would count ``"an"`` as exactly right against it.

    >>> exact_match("an", ["The"])
    Traceback (most recent call last):
    ...
    ValueError: expected gold answers that keep a word after normalisation, got 'The', which normalises to '' (articles and punctuation only) and would score answers such as 'an' as exactly right: fix the answer or drop the alias (the dataset loaders refuse such answers, naming the file and record)
    """
    refs = _normalised_golds(golds)
    pred = normalize_answer(prediction)
    return float(any(pred == ref for ref in refs))


def _f1_single(pred: str, ref: str) -> float:
    """F1 of a normalised prediction against one normalised gold alias."""
    # HotpotQA's official script: a yes/no/noanswer mismatch scores 0 even if tokens overlap.
    if (pred in _YES_NO or ref in _YES_NO) and pred != ref:
        return 0.0
    pred_toks, ref_toks = pred.split(), ref.split()
    common = Counter(pred_toks) & Counter(ref_toks)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_toks)
    recall = overlap / len(ref_toks)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, golds: str | Iterable[str]) -> float:
    """Token-level F1 of the normalised prediction, the maximum over gold aliases."""
    refs = _normalised_golds(golds)
    pred = normalize_answer(prediction)
    return max((_f1_single(pred, ref) for ref in refs), default=0.0)


def cover_exact_match(prediction: str, golds: str | Iterable[str]) -> float:
    """1.0 when some normalised gold alias occurs as whole tokens in the normalised prediction.

    Token-aligned: ``"Paris"`` is not covered by ``"Parisian"``. This is rag-gym's own,
    stricter reading of "the answer is in the response"; Search-R1's ``subem_check`` and
    FlashRAG's ``acc`` are :func:`sub_exact_match`.
    """
    refs = _normalised_golds(golds)
    pred = f" {normalize_answer(prediction)} "
    return float(any(f" {ref} " in pred for ref in refs))


def sub_exact_match(prediction: str, golds: str | Iterable[str]) -> float:
    """1.0 when some normalised gold alias is a substring of the normalised prediction.

    A raw substring test after normalisation, exactly Search-R1's ``subem_check``
    (``qa_em.py``) and FlashRAG's ``acc`` (``Sub_ExactMatch``): ``"Paris"`` is found in
    ``"Parisian"``. An empty alias list scores 0.0; an alias that normalises to ``""``
    (``"The"``), which those scorers find in every prediction, is a ``ValueError`` here.
    """
    refs = _normalised_golds(golds)
    pred = normalize_answer(prediction)
    return float(any(ref in pred for ref in refs))


def answer_scores(prediction: str, golds: str | Iterable[str]) -> dict[str, float]:
    """EM, F1 and cover-EM at once (what the envs report in ``info["scores"]``)."""
    golds = _as_list(golds)
    return {
        "em": exact_match(prediction, golds),
        "f1": f1_score(prediction, golds),
        "cover_em": cover_exact_match(prediction, golds),
    }


# ---- retrieval ----------------------------------------------------------------------------------
def _top(retrieved: Sequence[str], k: int | None) -> list[str]:
    """The first ``k`` distinct retrieved ids (all when ``k`` is None)."""
    top = list(dict.fromkeys(retrieved))
    return top if k is None else top[:k]


def recall_at_k(retrieved: Sequence[str], gold: Iterable[str], k: int | None = None) -> float:
    """Fraction of gold ids among the first ``k`` distinct retrieved ids (all when ``k`` is None).

    An example with no gold ids has recall 0.0 (nothing to find, nothing found); callers that
    average should skip such examples.
    """
    gold_set = set(gold)
    if not gold_set:
        return 0.0
    top = _top(retrieved, k)
    return len(gold_set.intersection(top)) / len(gold_set)


def full_recall(retrieved: Sequence[str], gold: Iterable[str], k: int | None = None) -> float:
    """1.0 when every gold id is among the first ``k`` retrieved ids (Full-Recall@k, R²AG §4.1)."""
    gold_set = set(gold)
    if not gold_set:
        return 0.0
    top = _top(retrieved, k)
    return float(gold_set.issubset(top))


def average_precision(
    retrieved: Sequence[str], gold: Iterable[str], k: int | None = None, distinct: bool = True
) -> float:
    """Average precision normalised by the number of gold documents, as R²AG defines it.

    R²AG ("R²AG: Learning to Reason, Retrieve, and Self-Evolve through a Multi-Branch Retrieval
    Tree", §2.4, eq. 5):
    ``AP = 1/|g| * sum_{u=1..t} P@u * 1{r_u in g}``, with ``P@u`` the precision of the first
    ``u`` results and ``t = k``. Dividing by ``|g|`` (not by the number of hits) means a missed
    gold document lowers AP. With ``distinct`` (the default, a ranking's AP) duplicate
    retrieved ids count once, at their first rank; ``distinct=False`` takes the formula
    literally over a list with repeats, as R²AG's reward does over the documents of a step's
    branches (two branches hitting the same gold document both count, so AP can pass 1).

    >>> average_precision(["x", "a"], ["a", "b"])  # (1/2) / 2
    0.25
    >>> average_precision(["g1", "x", "g2"], ["g1", "g2"], k=4, distinct=False)  # (1/1 + 2/3) / 2
    0.8333333333333333
    >>> average_precision(["g", "g"], ["g"], distinct=False), average_precision(["g", "g"], ["g"])
    (2.0, 1.0)
    """
    gold_set = set(gold)
    if not gold_set:
        return 0.0
    top = _top(retrieved, k) if distinct else list(retrieved if k is None else retrieved[:k])
    hits, total = 0, 0.0
    for u, doc in enumerate(top, 1):
        if doc in gold_set:
            hits += 1
            total += hits / u
    return total / len(gold_set)


def mean_average_precision(
    runs: Iterable[tuple[Sequence[str], Iterable[str]]], k: int | None = None
) -> float:
    """Mean of :func:`average_precision` over ``(retrieved, gold)`` pairs (mAP)."""
    aps = [average_precision(r, g, k) for r, g in runs]
    return sum(aps) / len(aps) if aps else 0.0


def retrieval_count(action_types: Iterable[str]) -> int:
    """Number of SEARCH actions in an episode (the RC of LWTS §3.3)."""
    return sum(1 for a in action_types if str(a).upper() == "SEARCH")
