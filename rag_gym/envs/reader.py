"""``ReaderEnv``: ARENA's evidence reader — pick the relevant references, reason, answer."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from rag_gym.data import QAExample
from rag_gym.envs.base import DataConfig, QAEnv, check_int, clip_text, read_text_action
from rag_gym.envs.spaces import UnicodeText, sanitize
from rag_gym.envs.tags import parse

READER_TAGS = ("relevance", "analysis", "answer")

INSTRUCTIONS = (
    "Answer the question using the numbered references. First list, inside <relevance>...</relevance>, "
    "ONLY the numbers of the references that help, in square brackets, e.g. [1, 5]. Then, inside "
    "<analysis>...</analysis>, combine what those references say into the answer, naming the reference "
    "behind each claim. Finally write the answer inside <answer>...</answer> as a short phrase or a "
    "single word, with no explanation."
)


def parse_relevance(content: str) -> list[int]:
    """Reference numbers in a ``<relevance>`` block, in order, without repeats.

    A number too long for Python's int-string conversion (4,300 digits by default) raises
    ``ValueError``; :class:`ReaderEnv` counts it as an invalid action.

    >>> parse_relevance("[1, 5]"), parse_relevance("3,3 and [7]"), parse_relevance("none")
    ([1, 5], [3, 7], [])
    """
    numbers = []
    for digits in re.findall(r"\d+", content):
        try:
            numbers.append(int(digits))
        except ValueError:  # over sys.get_int_max_str_digits()
            raise ValueError(
                f"expected reference numbers, got a number of {len(digits)} digits in <relevance>"
            ) from None
    return list(dict.fromkeys(numbers))


class ReaderEnv(QAEnv):
    """One-step evidence reading with explicit reference selection (ARENA).

    ## Description

    Each episode shows a question and the numbered references of its own passage pool (10 for
    HotpotQA and 2WikiMultiHopQA, 20 for MuSiQue, 10 for SynthHop) and takes one text action in
    ARENA's structured format. The episode ends after that action.

    ## Action Space

    ``UnicodeText(max_action_chars)``: the model's output, expected as
    ``<relevance>[i, j]</relevance><analysis>…</analysis><answer>…</answer>``. Characters outside
    the charset are replaced and over-long text is cut, so no output crashes the episode; a
    non-string raises ``TypeError``. :meth:`format_action` writes the text for structured agents.

    ## Observation Space

    ``UnicodeText(max_obs_chars)``: the instructions, ``Question: …`` and
    ``<references>[1] Title: text …</references>`` in the pool's order (ARENA appendix: the
    paragraphs in their original order with ids 1..n). After the step: ``""``.

    ## Rewards

    The base reward is the answer's correctness (EM by default, F1 or (EM+F1)/2 by
    ``answer_metric``), 0 when there is no ``<answer>``. ARENA's full reward (format,
    accuracy, relevance, +10 bonus; ARENA §3.3) is the ``arena`` reward preset.

    ## Starting State

    ``reset`` draws a question with ``self.np_random`` (or takes ``options={"question_index": i}`` /
    ``{"question_id": ...}``).

    ## Episode End

    Terminates after the single step.

    ## Information

    | key | value |
    |-----|-------|
    | ``question_id``, ``question``, ``answerable`` | the question |
    | ``gold_references`` | 1-based reference numbers of the gold passages (from the supporting facts) |
    | ``num_references`` | how many references were shown |
    | ``relevance`` | the parsed ``<relevance>`` numbers (``[]`` when absent) |
    | ``relevance_found`` | whether a ``<relevance>`` block was present |
    | ``prediction`` | the ``<answer>`` text (``None`` when absent) |
    | ``scores`` | ``{em, f1, cover_em}`` of the prediction |
    | ``format_ok`` | ``<relevance>``, ``<analysis>``, ``<answer>`` all present, in that order |
    | ``tags`` | the reader tags found, in order |
    | ``action_clipped`` | whether the text was cut |
    | ``invalid_action``, ``message`` | whether the output was rejected, and why (a ``<relevance>`` \
      number too long to read): it then earns 0, with ``format_ok`` false and no prediction |
    | ``reward_terms`` | ``{"answer": ...}`` |

    ## Arguments

    The data arguments (:class:`~rag_gym.envs.DataConfig`: ``dataset``, ``split``,
    ``data_path``, ``dataset_kwargs``, ``examples``; no ``corpus``, ``index`` or ``retriever``,
    as the reader reads each question's own pool), ``answer_metric``, ``max_obs_chars`` and
    ``max_action_chars`` (16,384). Questions without a passage pool, or unanswerable ones, are
    skipped (ARENA's setting has neither).

    ## References

    ARENA: Ren et al., "Effective and Transparent RAG: Adaptive-Reward Reinforcement Learning
    for Decision Traceability", arXiv:2505.13258, §3.1 (structured generation, Table 1) and
    §3.3.

    ## Version History

    * v0: initial release.

    >>> import gymnasium as gym, rag_gym
    >>> env = gym.make("rag_gym/SynthHop-Reader-v0", dataset_kwargs={"n_passages": 2000, "n_questions": [40, 10, 10]})
    >>> obs, info = env.reset(seed=0)
    >>> action = ReaderEnv.format_action(relevance=info["gold_references"], analysis="...", answer="x")
    >>> obs, reward, terminated, truncated, info = env.step(action)
    >>> info["relevance"] == info["gold_references"], info["format_ok"], terminated
    (True, True, True)
    """

    _ended = "the episode has ended (one step per question); call reset()"

    def __init__(
        self,
        data: DataConfig | None = None,
        *,
        answer_metric: str = "em",
        max_obs_chars: int = 32768,
        max_action_chars: int = 16384,
        render_mode: str | None = None,
        **data_kwargs: Any,
    ) -> None:
        check_int("max_action_chars", max_action_chars, 1)
        data = DataConfig.from_kwargs(data, **data_kwargs)
        searched = [f for f in ("corpus", "index", "retriever") if getattr(data, f) is not None]
        if searched:
            raise ValueError(
                f"expected no {'/'.join(searched)} argument for a ReaderEnv, got one: it reads "
                "each question's own passage pool; drop it (or use a search env id to search a corpus)"
            )
        if data.corpus_mode == "corpus":
            raise ValueError(
                "expected corpus_mode 'pool' or None for a ReaderEnv, got 'corpus': it reads "
                "each question's own passage pool"
            )
        super().__init__(
            dataclasses.replace(data, corpus_mode="pool"),
            answer_metric=answer_metric,
            max_obs_chars=max_obs_chars,
            render_mode=render_mode,
        )
        self.max_action_chars = max_action_chars
        self.action_space = UnicodeText(max_length=max_action_chars)

    @staticmethod
    def keep_example(example: QAExample) -> bool:
        return bool(example.passages) and example.answerable

    @staticmethod
    def format_action(relevance: list[int], analysis: str, answer: str) -> str:
        """The text action for a structured agent."""
        return (
            f"<relevance>[{', '.join(str(i) for i in relevance)}]</relevance>\n"
            f"<analysis>{analysis}</analysis>\n<answer>{answer}</answer>"
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        example = self._choose_example(options)
        ids = [p.id for p in example.passages]
        self._gold_refs = sorted(ids.index(g) + 1 for g in example.supporting_ids if g in ids)
        self._done = False
        self._last_action = ""
        return self._render_obs(), self._info()

    def step(self, action: str):
        self._check_running()
        text, clipped = read_text_action(action, self.max_action_chars)
        self._last_action = text
        parsed = parse(text, names=frozenset(READER_TAGS))
        first = {}
        for tag in parsed.tags:
            first.setdefault(tag.name, tag)
        order = [t.name for t in sorted(first.values(), key=lambda t: t.start)]
        format_ok = order == list(READER_TAGS)
        message = ""
        try:
            relevance = parse_relevance(first["relevance"].content) if "relevance" in first else []
        except ValueError as exc:  # an invalid action: rejected whole, the episode still ends
            relevance, message = [], f"invalid action: {exc}"
            format_ok = False
        prediction = first["answer"].content if "answer" in first and not message else None
        scores = self._score(prediction) if prediction else {"em": 0.0, "f1": 0.0, "cover_em": 0.0}
        reward = self._answer_reward(scores) if prediction else 0.0
        self._done = True
        info = self._info()
        info.update(
            {
                "relevance": relevance,
                "relevance_found": "relevance" in first,
                "prediction": prediction,
                "scores": scores,
                "format_ok": format_ok,
                "tags": parsed.names(),
                "action_clipped": clipped,
                "invalid_action": bool(message),
                "message": message,
                "reward_terms": {"answer": reward},
            }
        )
        if self.render_mode == "human":
            self.render()
        return "", float(reward), True, False, info

    def _info(self) -> dict[str, Any]:
        ex = self._example
        assert ex is not None
        return {
            "question_id": ex.id,
            "question": ex.question,
            "answerable": ex.answerable,
            "gold_references": list(self._gold_refs),
            "num_references": len(ex.passages),
            "relevance": [],
            "relevance_found": False,
            "prediction": None,
            "scores": {"em": 0.0, "f1": 0.0, "cover_em": 0.0},
            "format_ok": False,
            "tags": [],
            "action_clipped": False,
            "invalid_action": False,
            "message": "",
            "reward_terms": {"answer": 0.0},
        }

    def _transcript(self) -> str:
        if not self._done:
            return self._render_obs()
        self._done = False
        shown = self._render_obs()
        self._done = True
        return f"{shown}\n\nModel output:\n{self._last_action}"

    def _render_obs(self) -> str:
        ex = self._example
        assert ex is not None
        if self._done:
            return ""
        refs = "\n".join(
            f"[{i}] {p.title}: {p.text}" if p.title else f"[{i}] {p.text}"
            for i, p in enumerate(ex.passages, 1)
        )
        text = f"{INSTRUCTIONS}\n\nQuestion: {ex.question}\n\n<references>\n{refs}\n</references>"
        return clip_text(sanitize(text), self.max_obs_chars)
