"""Step traces: what an agent did at every step of an episode, in one versioned schema.

Evaluation (:func:`rag_gym.evaluate.evaluate`) and the trainers' sampled rollouts write the same
two files into a run folder, one JSON object per line, appended as episodes end:

``steps.jsonl``, one line per episode::

    {"schema_version": 1, "agent": "naive_rag", "question_id": "q7",
     "steps": [{"step": 1, "action": "SEARCH", "text": "who founded ...",
                "raw_output": null,
                "retrieved": [{"id": "p3", "rank": 1, "score": 7.2, "gold": true}, ...],
                "reward": 0.0, "reward_terms": {"answer": 0.0, "invalid": 0.0},
                "prompt_tokens": 0, "completion_tokens": 0,
                "invalid": false, "message": ""}, ...]}

Training rollouts add ``"train_step"`` (the optimiser step the rollout was sampled at) and may
leave ``question_id`` out. ``raw_output`` is the model's reply behind the action (``null`` for
rule-based actions); the token counts are those spent on that step.

``passages.jsonl``: each passage a run touched (retrieved or gold), once:
``{"id": "p3", "title": "...", "text": "..."}``. Steps refer to passages by id only, so a
trace stays small however often a passage comes back.

:func:`read_jsonl` reads either file back, tolerating a last line cut by a kill; it is the one
reader of a run folder's JSONL files (``episodes.jsonl`` too), with a policy for a bad line.
:func:`loads` is the one parser of a run folder's JSON, line or file: a value nested deeper than
:data:`MAX_DEPTH`, an integer longer than :data:`MAX_INT_DIGITS` digits or a lone surrogate escape
(``\\ud800``) is a ``ValueError`` saying so, like any other text that is not JSON.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: version of the ``steps.jsonl`` / ``passages.jsonl`` schema (see the module doc)
SCHEMA_VERSION = 1
STEPS_FILE = "steps.jsonl"
PASSAGES_FILE = "passages.jsonl"


def _float(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def step_record(
    step: int,
    action: Any,
    info: Mapping[str, Any],
    reward: float,
    gold_ids: Sequence[str],
    raw_output: str | None = None,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
) -> dict[str, Any]:
    """One step of a trace from the action an agent took and the ``info`` the env returned.

    ``action`` is a search-env action dict or text (a text agent's reply, then also its raw
    output when ``raw_output`` is ``None``). Retrieved ids come from ``info["retrieved_ids"]``
    (with ``info["retrieved_scores"]`` when the env gives them) or, for the tree env, from
    every branch (``query`` says which).

    >>> step_record(1, {"type": 0, "text": "q"}, {"action_type": "SEARCH", "query": "q",
    ...     "retrieved_ids": ["a", "b"], "retrieved_scores": [2.0, 1.0],
    ...     "reward_terms": {"answer": 0.0}}, 0.0, ["b"])["retrieved"][1]
    {'id': 'b', 'rank': 2, 'score': 1.0, 'gold': True}
    """
    gold = set(gold_ids)
    if isinstance(action, Mapping):
        text = str(action.get("text", ""))
    else:
        text = info.get("query") or info.get("prediction") or ""
        if raw_output is None and isinstance(action, str):
            raw_output = action
    retrieved: list[dict[str, Any]] = []
    if "branches" in info:
        for br in info.get("branches") or []:
            for rank, pid in enumerate(br.get("ids", []), 1):
                retrieved.append(
                    {
                        "id": str(pid),
                        "rank": rank,
                        "score": None,
                        "gold": pid in gold,
                        "query": br.get("query"),
                    }
                )
    else:
        ids = list(info.get("retrieved_ids") or [])
        scores = list(info.get("retrieved_scores") or [])
        for rank, pid in enumerate(ids, 1):
            score = _float(scores[rank - 1]) if rank <= len(scores) else None
            retrieved.append({"id": str(pid), "rank": rank, "score": score, "gold": pid in gold})
    terms = {str(k): _float(v) for k, v in (info.get("reward_terms") or {}).items()}
    return {
        "step": int(step),
        "action": str(info.get("action_type") or ("TEXT" if isinstance(action, str) else "ACT")),
        "text": str(text),
        "raw_output": raw_output,
        "retrieved": retrieved,
        "reward": _float(reward),
        "reward_terms": terms,
        "prompt_tokens": int(prompt_tokens),
        "completion_tokens": int(completion_tokens),
        "invalid": bool(info.get("invalid_action", False) or info.get("format_ok") is False),
        "message": str(info.get("message") or ""),
    }


def passages_of(info: Mapping[str, Any], corpus: Any, ids: Iterable[str]) -> dict[str, dict]:
    """``{id: {"title", "text"}}`` for ``ids``: from ``info["passages"]`` where the env gave
    them, else from ``corpus`` (a :class:`~rag_gym.data.Corpus`); ids found in neither are
    left out."""
    out: dict[str, dict] = {}
    for p in info.get("passages") or []:
        out[str(p["id"])] = {"title": p.get("title", ""), "text": p.get("text", "")}
    for pid in ids:
        if pid in out or corpus is None:
            continue
        try:
            i = corpus.position(pid)
        except (KeyError, ValueError, IndexError, AttributeError):
            continue
        out[pid] = {"title": corpus.titles[i], "text": corpus.texts[i]}
    return out


def trace_line(
    agent: str, question_id: str | None, steps: list[dict[str, Any]], **extra: Any
) -> str:
    """One ``steps.jsonl`` line (with its newline)."""
    rec = {"schema_version": SCHEMA_VERSION, "agent": agent, "question_id": question_id}
    rec.update(extra)
    rec["steps"] = steps
    return json.dumps(rec, ensure_ascii=False, default=str) + "\n"


class TraceWriter:
    """Appends traces to ``run_dir/steps.jsonl`` and each new passage to
    ``run_dir/passages.jsonl``, flushing after every episode.

    Opening trims a last line cut by a kill from either file (so an appended line never joins
    a broken one) and remembers the passages already stored."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.steps_path = self.run_dir / STEPS_FILE
        self.passages_path = self.run_dir / PASSAGES_FILE
        for path in (self.steps_path, self.passages_path):
            trim_cut_line(path)
        self.stored: set[str] = set()
        for rec, _ in read_jsonl(self.passages_path)[0]:
            if isinstance(rec, dict) and "id" in rec:
                self.stored.add(str(rec["id"]))
        self._steps = open(self.steps_path, "a", encoding="utf-8")  # noqa: SIM115 (close())
        self._passages = open(self.passages_path, "a", encoding="utf-8")  # noqa: SIM115

    def write(
        self,
        agent: str,
        question_id: str | None,
        steps: list[dict[str, Any]],
        passages: Mapping[str, Mapping[str, str]],
        **extra: Any,
    ) -> None:
        new = [(pid, p) for pid, p in passages.items() if pid not in self.stored]
        for pid, p in new:
            line = {"id": pid, "title": p.get("title", ""), "text": p.get("text", "")}
            self._passages.write(json.dumps(line, ensure_ascii=False) + "\n")
            self.stored.add(pid)
        self._passages.flush()
        self._steps.write(trace_line(agent, question_id, steps, **extra))
        self._steps.flush()

    def close(self) -> None:
        self._steps.close()
        self._passages.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def trim_cut_line(path: Path) -> bool:
    """Cut a last line without its newline from ``path`` (a write stopped by a kill); whether
    one was cut. A complete JSON line that only lacks its newline gets the newline."""
    if not path.is_file() or path.stat().st_size == 0:
        return False
    with open(path, "rb") as f:
        data = f.read()
    if data.endswith(b"\n"):
        return False
    cut = data.rfind(b"\n") + 1
    tail = data[cut:]
    try:
        loads(tail)
        ok = True
    except ValueError:
        ok = False
    _mend_last_line(path, cut, whole=ok)
    return not ok


def _mend_last_line(path: Path, start: int, whole: bool) -> None:
    """Mend the last line of ``path``, which lacks its newline and starts at byte ``start``: a
    ``whole`` record gets the newline; a line cut by a kill is removed."""
    with open(path, "r+b") as f:
        if whole:
            f.seek(0, os.SEEK_END)
            f.write(b"\n")
        else:
            f.truncate(start)


def _null(constant: str) -> None:
    return None


#: the deepest nesting of arrays and objects :func:`loads` accepts (rag-gym's records nest 4 deep)
MAX_DEPTH = 100
#: the longest integer :func:`loads` accepts, in digits (a float holds about 308)
MAX_INT_DIGITS = 100
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def _int(text: str) -> int:
    digits = len(text) - text.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {digits} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _depth_over(value: Any, limit: int) -> bool:
    """Whether ``value`` nests arrays and objects deeper than ``limit`` (without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def loads(data: bytes | str, allow_nan: bool = True) -> Any:
    """The JSON value of ``data`` (UTF-8 when bytes), read from a run folder's file; anything
    else is a ``ValueError`` saying why: text that is not JSON or not UTF-8, a value nested
    deeper than :data:`MAX_DEPTH`, an integer of more than :data:`MAX_INT_DIGITS` digits, a
    string holding a lone surrogate (an escape such as ``\\ud800``, which no UTF-8 file can
    hold). ``allow_nan=False`` reads ``NaN`` and the infinities as ``None``.

    >>> loads('{"a": [1, NaN]}', allow_nan=False)
    {'a': [1, None]}
    >>> loads("[" * 200 + "]" * 200)
    Traceback (most recent call last):
    ...
    ValueError: nested deeper than 100 arrays or objects
    """
    text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    try:
        value = json.loads(text, parse_int=_int, parse_constant=None if allow_nan else _null)
    except RecursionError:
        value, deep = None, True
    else:
        deep = (
            isinstance(value, (dict, list))
            and text.count("[") + text.count("{") > MAX_DEPTH
            and _depth_over(value, MAX_DEPTH)
        )
    if deep:
        raise ValueError(f"nested deeper than {MAX_DEPTH} arrays or objects")
    if _SURROGATE.search(text):
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a lone surrogate escape such as \\ud800 (not a character)") from None
    return value


def load_file(path: str | Path, allow_nan: bool = True) -> Any:
    """The JSON value of the file ``path`` (:func:`loads`); ``OSError`` when it cannot be read,
    ``ValueError`` naming the file when it is not a JSON value :func:`loads` accepts."""
    path = Path(path)
    data = path.read_bytes()
    try:
        return loads(data, allow_nan)
    except ValueError as exc:
        raise ValueError(f"{path}: not readable as JSON ({str(exc)[:200]})") from None


#: what :func:`read_jsonl` does with a line it cannot read: skip it (with a problem), raise
#: :class:`BadLine`, or raise and repair a last line cut by a kill
POLICIES = ("skip", "strict", "repair")


class BadLine(ValueError):
    """A line of a JSONL file that is not the record expected (:func:`read_jsonl`)."""

    def __init__(self, path: Path, line: int, text: bytes, expected: str, why: str) -> None:
        super().__init__(f"{path}:{line}: expected {expected}, got {text[:80]!r} ({why})")
        self.path, self.line = path, line


def read_jsonl(
    path: str | Path,
    policy: str = "skip",
    keys: Sequence[str] = (),
    what: str = "JSON",
) -> tuple[list[tuple[Any, int]], list[str]]:
    """``([(record, line number)], problems)`` of a JSONL file (a missing file gives
    ``([], [])``). A record is one JSON value a line; with ``keys``, a JSON object holding them
    (``what`` names it in messages).

    A last line without its newline was cut by a kill when it is not a record: it is skipped
    with a problem naming the file and line, under every policy. Any other line that is not a
    record is, by ``policy``:

    - ``"skip"`` (reports and viewers): skipped with a problem; ``NaN`` and infinities read as
      ``None``;
    - ``"strict"`` (the file is read, never changed): a :class:`BadLine` naming it;
    - ``"repair"`` (a run that appends to the file next): a :class:`BadLine` too; and a cut
      last line is removed from the file, a whole one that lacks only its newline gets it.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "x.jsonl"
    >>> _ = path.write_text('{"a": 1}\\n{"a": ')
    >>> records, problems = read_jsonl(path, "repair", keys=["a"])
    >>> records, path.read_text(), problems[0].endswith("removed it from the file (6 bytes)")
    ([({'a': 1}, 1)], '{"a": 1}\\n', True)
    """
    if policy not in POLICIES:
        from rag_gym._names import unknown_name

        raise unknown_name("JSONL policy", policy, POLICIES)
    path = Path(path)
    if not path.is_file():
        return [], []
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines[-1] if lines[-1].strip() else b""  # a last line without its newline
    expected = what if not keys else f"{what} with {', '.join(map(repr, keys))}"
    records: list[tuple[Any, int]] = []
    problems: list[str] = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = loads(line, allow_nan=policy != "skip")
            ok = not keys or (isinstance(rec, dict) and set(keys) <= rec.keys())
            why = "" if ok else f"not {expected}"
        except ValueError as exc:
            ok, why = False, str(exc)[:200]
        if i == len(lines) and tail:
            if policy == "repair":
                _mend_last_line(path, len(data) - len(tail), whole=ok)
            if ok:
                records.append((rec, i))
            else:
                problem = (
                    f"{path}:{i}: skipped it: the last line was cut off (the run was stopped "
                    "while writing it)"
                )
                if policy == "repair":
                    problem += f"; removed it from the file ({len(tail)} bytes)"
                problems.append(problem)
        elif ok:
            records.append((rec, i))
        elif policy == "skip":
            problems.append(f"{path}:{i}: skipped a line that is not {expected}: {why}")
        else:
            raise BadLine(path, i, line, expected, why)
    return records, problems
