"""``TreeSearchEnv``: R²AG's reasoning-augmented retrieval tree, one expansion per step."""

from __future__ import annotations

from typing import Any

from rag_gym.envs.base import (
    DataConfig,
    QAEnv,
    check_int,
    clip_text,
    read_text_action,
    reset_options,
)
from rag_gym.envs.spaces import UnicodeText, sanitize
from rag_gym.envs.tags import parse
from rag_gym.metrics import average_precision

STOP_MARKER = "stop retrieval"
NO_PREDICTION = "none"
TREE_TAGS = frozenset({"think", "base-q", "predicted-q"})

INSTRUCTIONS = (
    "You are given a user question and evidence retrieved so far. Break the question into "
    "single-hop sub-questions that a search engine can answer, one fact each (who, when, where...). "
    "Think briefly inside <think>...</think>. Then write each base question, for the hop the evidence "
    "does not cover yet, inside its own <base-Q>...</base-Q>; do not repeat questions the evidence "
    "already answers. If the evidence already answers the user question, write "
    "<base-Q>stop retrieval</base-Q>. If you know enough to foresee a later hop, write each predicted "
    "question inside <predicted-Q>...</predicted-Q>, or <predicted-Q>none</predicted-Q>."
)


class TreeSearchEnv(QAEnv):
    """Step-wise expansion of a retrieval tree rooted at the question (R²AG).

    ## Description

    Each step the agent writes R²AG's output: a ``<think>`` block, then several *base*
    intermediate queries (``<base-Q>``) for the hop the evidence does not cover yet, and
    *predicted* (anticipatory) queries (``<predicted-Q>``) for later hops, or the stop signal
    ``<base-Q>stop retrieval</base-Q>``. Each query retrieves its top-``k`` documents (``k = 1``,
    the Hit@Top-1 constraint) and becomes a branch of the tree at the current depth. The
    documents of the branches kept as context (``prune``) are shown at the next step.

    ## Action Space

    ``UnicodeText(max_action_chars)``, the model's text; sanitised and cut like every text
    action, never crashing the episode. :meth:`format_action` writes it for structured agents.
    At most ``max_base`` base and ``max_predicted`` predicted queries are used per step (the rest
    are reported in ``info["dropped_queries"]``); ``none`` predictions and empty queries are
    ignored. Text with no query and no stop signal is an invalid step (``info["format_ok"]`` is
    ``False``, the observation says why).

    ## Observation Space

    ``UnicodeText(max_obs_chars)``: the instructions, ``Question: …``, and ``Evidence:`` — the
    documents of the context branches, numbered, oldest first — then a note on the last step.
    ``prune="gold"`` keeps only branches that hit a gold document (R²AG's progressive training
    context, appendix B.1); ``prune="none"`` keeps every branch.

    ## Rewards

    Base reward: Joint-Hit ``R_JH = 1{all gold retrieved and stop}`` at the stop step, else 0.
    The full R²AG reward (``R = α R_MH + β R_JH + γ R_AP + ω R_f``) is the ``r2ag`` reward
    preset, computed from ``info``.

    ## Starting State

    ``reset`` draws a question with ``self.np_random`` (or takes ``options={"question_index": i}`` /
    ``{"question_id": ...}``); the tree is the root alone, the evidence empty unless
    ``options["context_ids"]`` gives starting documents.

    ## Episode End

    Terminates on the stop signal (premature or not; ``info["premature_stop"]`` tells).
    Truncates after ``L_MAX-I = 5`` expansions (every ``-Tree-v0`` registration).

    ## Information

    | key | value |
    |-----|-------|
    | ``question_id``, ``question``, ``answerable``, ``gold_ids`` | the question and its gold documents |
    | ``step`` | expansions so far (the tree depth) |
    | ``branches`` | this step's branches: ``{depth, kind, query, ids, gold_hits, new_gold}`` |
    | ``new_gold_base``, ``new_gold_predicted`` | R_MH^b, R_MH^p: over this step's base / predicted branches, the number of retrieved gold documents not retrieved in earlier steps |
    | ``newly_found_gold`` | the distinct gold ids first found this step |
    | ``ap_base``, ``ap_predicted`` | R_AP^b, R_AP^p: :func:`rag_gym.metrics.average_precision` (``distinct=False``) over the documents of the first ``t`` base (4) / predicted (2) branches |
    | ``all_gold_found`` | every gold id retrieved so far (including the starting context) |
    | ``stop``, ``premature_stop`` | the stop signal, and whether it came before all gold was found |
    | ``think_ok`` | a ``<think>`` block precedes the first query block |
    | ``blocks_after_think`` | ``<base-Q>``/``<predicted-Q>`` blocks that follow a ``<think>`` block |
    | ``format_ok`` | at least one query or the stop signal was parsed |
    | ``context_ids`` | ids of the evidence shown next |
    | ``retrieved_history`` | every distinct id retrieved this episode |
    | ``num_branches`` | branches in the whole tree |
    | ``dropped_queries``, ``action_clipped``, ``message`` | what was ignored or cut, and why |
    | ``output_truncated`` | the text exceeded ``max_action_chars`` (R²AG's length limit: set it to the generation limit) |
    | ``reward_terms`` | ``{"joint_hit": ...}`` |

    ## Arguments

    The data arguments (:class:`~rag_gym.envs.DataConfig`, as for the search env); ``k`` (1); ``prune`` (``"gold"`` or
    ``"none"``); ``max_base`` (8), ``max_predicted`` (8); ``top_t_base`` (4) and
    ``top_t_predicted`` (2), R²AG's top-t/x setting (appendix B.2); ``max_query_chars`` (512),
    ``max_action_chars`` (16,384), ``max_obs_chars`` (16,384). ``reset(options={"context_ids":
    [...]})`` starts from given evidence (the previous round's pruned tree).

    ## References

    R²AG: "R²AG: Learning to Reason, Retrieve, and Self-Evolve through a Multi-Branch
    Retrieval Tree" (anonymous submission under review, no arXiv id), §2 and appendix B (output
    format, Top-Survivor, L_MAX-I = 5, k = 1, t = 4 / 2).

    ## Version History

    * v0: initial release.

    >>> import gymnasium as gym, rag_gym
    >>> env = gym.make("rag_gym/SynthHop-Tree-v0", dataset_kwargs={"n_passages": 2000, "n_questions": [40, 10, 10]})
    >>> obs, info = env.reset(seed=0)
    >>> action = TreeSearchEnv.format_action("split it", base=[info["question"], "a", "b"])
    >>> obs, reward, terminated, truncated, info = env.step(action)
    >>> len(info["branches"]), [len(b["ids"]) for b in info["branches"]]
    (3, [1, 1, 1])
    """

    _ended = "the episode has ended (stop signal); call reset()"

    def __init__(
        self,
        data: DataConfig | None = None,
        *,
        k: int = 1,
        prune: str = "gold",
        max_base: int = 8,
        max_predicted: int = 8,
        top_t_base: int = 4,
        top_t_predicted: int = 2,
        max_query_chars: int = 512,
        max_action_chars: int = 16384,
        max_obs_chars: int = 16384,
        render_mode: str | None = None,
        **data_kwargs: Any,
    ) -> None:
        if prune not in ("gold", "none"):
            raise ValueError(f"expected prune 'gold' or 'none', got {prune!r}")
        for name, value in (
            ("max_base", max_base),
            ("max_predicted", max_predicted),
            ("top_t_base", top_t_base),
            ("top_t_predicted", top_t_predicted),
            ("max_query_chars", max_query_chars),
            ("max_action_chars", max_action_chars),
        ):
            check_int(name, value, 1)
        super().__init__(
            data, k=k, max_obs_chars=max_obs_chars, render_mode=render_mode, **data_kwargs
        )
        self.prune = prune
        self.max_base, self.max_predicted = max_base, max_predicted
        self.top_t_base, self.top_t_predicted = top_t_base, top_t_predicted
        self.max_query_chars = max_query_chars
        self.max_action_chars = max_action_chars
        self.action_space = UnicodeText(max_length=max_action_chars)

    @staticmethod
    def format_action(
        think: str, base: list[str] = (), predicted: list[str] = (), stop: bool = False
    ) -> str:
        """The text action for a structured agent (R²AG's output format)."""
        parts = [f"<think>{think}</think>"]
        parts += [f"<base-Q>{q}</base-Q>" for q in ([STOP_MARKER] if stop else list(base))]
        parts += [f"<predicted-Q>{q}</predicted-Q>" for q in predicted]
        return "\n".join(parts)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        options = reset_options(options)
        context = options.pop("context_ids", None) or []
        if not isinstance(context, (list, tuple)) or not all(isinstance(c, str) for c in context):
            raise TypeError(
                f"expected options['context_ids'] to be a list of passage ids (str), got "
                f"{type(context).__name__}: {context!r:.80}"
            )
        example = self._choose_example(options)
        missing = [pid for pid in context if pid not in self.corpus]
        if missing:
            raise ValueError(f"options['context_ids'] names ids not in the corpus: {missing[:5]}")
        self._gold = list(example.supporting_ids)
        self._context = list(dict.fromkeys(context))
        self._seen: dict[str, None] = dict.fromkeys(self._context)
        self._tree: list[dict[str, Any]] = []
        self._step_count = 0
        self._message = ""
        self._done = False
        return self._render_obs(), self._info(branches=[], stop=False, extra={})

    def step(self, action: str):
        self._check_running()
        text, clipped = read_text_action(action, self.max_action_chars)
        self._step_count += 1
        depth = self._step_count
        parsed = parse(text, names=TREE_TAGS)
        think = [t for t in parsed.tags if t.name == "think"]
        blocks = [t for t in parsed.tags if t.name in ("base-q", "predicted-q")]
        first_think = think[0].end if think else None
        think_ok = first_think is not None and (not blocks or first_think <= blocks[0].start)
        after_think = sum(1 for b in blocks if first_think is not None and b.start >= first_think)

        stop = any(_is(b.content, STOP_MARKER) for b in blocks if b.name == "base-q")
        queries: list[tuple[str, str]] = []
        dropped: list[str] = []
        counts = {"base": 0, "predicted": 0}
        for b in blocks:
            kind = "base" if b.name == "base-q" else "predicted"
            q = " ".join(b.content.split())
            if not q or _is(q, STOP_MARKER) or (kind == "predicted" and _is(q, NO_PREDICTION)):
                continue
            limit = self.max_base if kind == "base" else self.max_predicted
            if counts[kind] >= limit or len(q) > self.max_query_chars:
                dropped.append(q[:80])
                continue
            counts[kind] += 1
            queries.append((kind, q))
        format_ok = bool(queries) or stop

        gold = set(self._gold)
        prior = set(self._seen)
        branches: list[dict[str, Any]] = []
        if queries and not stop:
            results = self._retrieve([q for _, q in queries], self.k)
            for (kind, q), ids in zip(queries, results, strict=True):
                branches.append(
                    {
                        "depth": depth,
                        "kind": kind,
                        "query": q,
                        "ids": ids,
                        "gold_hits": [i for i in ids if i in gold],
                        "new_gold": [i for i in ids if i in gold and i not in prior],
                    }
                )
            for br in branches:
                for pid in br["ids"]:
                    self._seen.setdefault(pid, None)
                if self.prune == "none" or br["gold_hits"]:
                    for pid in br["ids"]:
                        if pid not in self._context:
                            self._context.append(pid)
            self._tree.extend(branches)

        if not format_ok:
            self._message = (
                "Invalid output: no <base-Q> query and no stop signal was found. Write each "
                "sub-question inside <base-Q>...</base-Q>, or <base-Q>stop retrieval</base-Q>."
            )
        elif stop:
            self._message = "Stop signal received."
        else:
            self._message = f"Expansion {depth}: {len(branches)} new branches."
        all_found = gold.issubset(self._seen)
        joint_hit = 1.0 if stop and all_found and gold else 0.0
        self._done = stop
        extra = {
            "new_gold_base": sum(len(b["new_gold"]) for b in branches if b["kind"] == "base"),
            "new_gold_predicted": sum(
                len(b["new_gold"]) for b in branches if b["kind"] == "predicted"
            ),
            "newly_found_gold": [g for g in self._gold if g in self._seen and g not in prior],
            "ap_base": average_precision(
                [b["ids"][0] for b in branches if b["kind"] == "base" and b["ids"]],
                gold,
                self.top_t_base,
                distinct=False,
            ),
            "ap_predicted": average_precision(
                [b["ids"][0] for b in branches if b["kind"] == "predicted" and b["ids"]],
                gold,
                self.top_t_predicted,
                distinct=False,
            ),
            "think_ok": think_ok,
            "blocks_after_think": after_think,
            "format_ok": format_ok,
            "dropped_queries": dropped,
            "action_clipped": clipped,
            "output_truncated": clipped,
            "premature_stop": stop and not all_found,
            "reward_terms": {"joint_hit": joint_hit},
        }
        obs = "" if stop else self._render_obs()
        if self.render_mode == "human":
            self.render()
        return obs, joint_hit, stop, False, self._info(branches, stop, extra)

    def _info(
        self, branches: list[dict[str, Any]], stop: bool, extra: dict[str, Any]
    ) -> dict[str, Any]:
        ex = self._example
        assert ex is not None
        info = {
            "question_id": ex.id,
            "question": ex.question,
            "answerable": ex.answerable,
            "gold_ids": list(self._gold),
            "step": self._step_count,
            "branches": branches,
            "new_gold_base": 0,
            "new_gold_predicted": 0,
            "newly_found_gold": [],
            "ap_base": 0.0,
            "ap_predicted": 0.0,
            "all_gold_found": bool(self._gold) and set(self._gold).issubset(self._seen),
            "stop": stop,
            "premature_stop": False,
            "think_ok": False,
            "blocks_after_think": 0,
            "format_ok": True,
            "context_ids": list(self._context),
            "retrieved_history": list(self._seen),
            "num_branches": len(self._tree),
            "dropped_queries": [],
            "action_clipped": False,
            "output_truncated": False,
            "message": self._message,
            "reward_terms": {"joint_hit": 0.0},
        }
        info.update(extra)
        return info

    def _transcript(self) -> str:
        lines = [f"Question: {self._example.question}", f"Step {self._step_count}: {self._message}"]
        for br in self._tree:
            hits = f"  gold: {', '.join(br['gold_hits'])}" if br["gold_hits"] else ""
            lines.append(
                f"  depth {br['depth']} {br['kind']:9s} {br['query']!r} -> {', '.join(br['ids'])}{hits}"
            )
        lines.append(f"Context: {', '.join(self._context) or '(none)'}")
        return "\n".join(lines)

    def _render_obs(self) -> str:
        ex = self._example
        assert ex is not None
        lines = [INSTRUCTIONS, "", f"Question: {ex.question}", "", "Evidence:"]
        if not self._context:
            lines.append("(none yet)")
        for i, pid in enumerate(self._context, 1):
            p = self.corpus[pid]
            lines.append(f"[{i}] {p.title}: {p.text}" if p.title else f"[{i}] {p.text}")
        if self._message:
            lines += ["", f"Note: {self._message}"]
        text = sanitize("\n".join(lines))
        if (
            len(text) > self.max_obs_chars
        ):  # keep the instructions and question, cut the oldest evidence
            head = sanitize("\n".join(lines[:5]))[: self.max_obs_chars // 2]
            tail = text[len(text) - (self.max_obs_chars - len(head) - 40) :]
            text = f"{head}\n[... earlier evidence clipped ...]\n{tail}"
        return clip_text(text, self.max_obs_chars)


def _is(text: str, marker: str) -> bool:
    return text.strip().strip(".!").strip().lower() == marker
