"""Suites: several datasets evaluated against one corpus under one pinned protocol, reported as
one table (a column per dataset and their average, each with its 95% interval).

A suite is data, a small JSON file: its ``name``, a ``description``, the passages a search
returns (``k``), the answer ``metric`` (``em`` or ``f1``) and its ``datasets``, each with a
column ``name``, a registered ``env`` id, a ``split``, the ``data`` file or folder under the data
root, and optionally the loader (``dataset``, e.g. ``flashrag`` for FlashRAG's JSONL), a
question count ``n`` (default: all) and ``dataset_kwargs``. The shipped suites are the files in
``rag_gym/evaluate/suites`` (``search_r1``: Search-R1's seven datasets; ``multihop``: the four
multi-hop sets in their official formats); another suite is another file, given by its path.

:func:`run_suite` evaluates each dataset with :func:`~rag_gym.evaluate.runner.evaluate` into a
run folder of its own inside the suite's (``<run>/<dataset>/``: protocol, episodes, leaderboard,
report), every dataset against the same corpus (``corpus=``, ``index=`` or ``retriever=``), and
writes ``suite.json`` (the protocol: the suite file's text and checksum, the corpus and each
data file's checksum, the retriever, ``k``, the turn limits, the prompt, the answer normaliser,
the agents, the model, the seed and the results), ``suite.md`` and ``suite.csv``. A suite run
re-runs from its ``suite.json`` (:meth:`SuiteConfig.from_run`) to the same table: the suite is
read back from the saved text, not from the shipped file, and a corpus or data file whose
checksum changed is an error.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import types
import typing
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rag_gym import _names, traces
from rag_gym._http import is_server_url, is_url
from rag_gym.data.splits import canonical_split
from rag_gym.evaluate.config import EvalConfig
from rag_gym.evaluate.run_folder import atomic_write, check_out_dir, run_dir_of
from rag_gym.metrics import normalize_answer

SUITES_DIR = Path(__file__).resolve().parent / "suites"
"""The shipped suite files (``<name>.json``)."""
SUITE_FILE = "suite.json"
RUN_FILES = (SUITE_FILE, "suite.md", "suite.csv", "prompt.txt")
"""The files of a suite run beside its column folders."""
ALL_QUESTIONS = 10**9
"""A dataset's question count when the suite gives none: every question of its split."""
METRICS = ("em", "f1")


class SuiteError(ValueError):
    """A suite file, a suite run's options or its data that cannot be used; the message names the
    problem and the fix."""


@dataclass(frozen=True)
class SuiteDataset:
    """One column of a suite."""

    name: str
    env_id: str
    split: str
    data: str
    """The data file or folder, relative to the data root."""
    dataset: str | None = None
    """The loader (the env's ``dataset=``), when not the env's own."""
    n: int | None = None
    """Questions (a seeded sample); ``None``: all of the split."""
    dataset_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    k: int
    metric: str
    datasets: tuple[SuiteDataset, ...]
    text: str
    """The file's text, as read (what ``suite.json`` pins)."""

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def suite_names() -> list[str]:
    """The shipped suites' names."""
    return sorted(p.stem for p in SUITES_DIR.glob("*.json"))


def load_suite(spec: str | Path) -> Suite:
    """The shipped suite named ``spec``, or the suite file at the path ``spec``."""
    path = Path(spec)
    if str(spec) in suite_names():
        path = SUITES_DIR / f"{spec}.json"
    elif not path.is_file():
        raise SuiteError(
            f"expected a suite name ({', '.join(suite_names())}) or a suite file, got {spec!r}: "
            "no such suite or file"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SuiteError(f"cannot read the suite file {path}: {exc}") from None
    return parse_suite(text, str(path))


def parse_suite(text: str, where: str = "the suite") -> Suite:
    """A :class:`Suite` from a suite file's text; anything missing or malformed is a
    :class:`SuiteError` naming the field."""
    try:
        raw = traces.loads(text)
    except ValueError as exc:
        raise SuiteError(f"{where}: not valid JSON ({str(exc)[:200]})") from None

    def bad(what: str, expected: str, got: Any) -> SuiteError:
        return SuiteError(f"{where}: expected {what} to be {expected}, got {got!r}")

    if not isinstance(raw, dict):
        raise bad("the file", "a JSON object", type(raw).__name__)
    known = {"name", "description", "k", "metric", "datasets"}
    if set(raw) - known:
        raise SuiteError(
            f"{where}: unknown fields {sorted(set(raw) - known)}; a suite has {sorted(known)}"
        )
    name, k, metric = raw.get("name"), raw.get("k", 3), raw.get("metric", "em")
    if not isinstance(name, str) or not name:
        raise bad("name", "a non-empty string", name)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise bad("k", "an integer >= 1", k)
    if metric not in METRICS:
        raise bad("metric", f"one of {list(METRICS)}", metric)
    entries = raw.get("datasets")
    if not isinstance(entries, list) or not entries:
        raise bad("datasets", "a non-empty list", entries)
    datasets = []
    allowed = {"name", "env", "split", "data", "dataset", "n", "dataset_kwargs"}
    for i, entry in enumerate(entries):
        at = f"datasets[{i}]"
        if not isinstance(entry, dict):
            raise bad(at, "an object", entry)
        if set(entry) - allowed:
            raise SuiteError(
                f"{where}: {at} has unknown fields {sorted(set(entry) - allowed)}; a dataset has "
                f"{sorted(allowed)}"
            )
        for key in ("name", "env", "split", "data"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise bad(f"{at}.{key}", "a non-empty string", entry.get(key))
        try:
            canonical_split(entry["split"])
        except ValueError as exc:
            raise SuiteError(f"{where}: {at}.split: {exc}") from None
        n = entry.get("n")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise bad(f"{at}.n", "an integer >= 1 or absent", n)
        kwargs = entry.get("dataset_kwargs", {})
        if not isinstance(kwargs, dict):
            raise bad(f"{at}.dataset_kwargs", "an object", kwargs)
        loader = entry.get("dataset")
        if loader is not None and not isinstance(loader, str):
            raise bad(f"{at}.dataset", "a dataset name", loader)
        datasets.append(
            SuiteDataset(
                entry["name"], entry["env"], entry["split"], entry["data"], loader, n, kwargs
            )
        )
    names = [d.name for d in datasets]
    if len(set(names)) != len(names):
        raise SuiteError(f"{where}: expected distinct dataset names, got {names}")
    folders: dict[str, str] = {}  # a column's folder, lowercased (a case-blind file system)
    for d in datasets:
        folder = column_folder(d.name)
        if folder in (".", "..") or folder.lower() in RUN_FILES:
            raise SuiteError(
                f"{where}: expected a dataset name that can name its column's folder, got "
                f"{d.name!r}, whose folder {folder!r} is the suite run's own: rename the dataset"
            )
        if folder.lower() in folders:
            raise SuiteError(
                f"{where}: expected dataset names that give distinct column folders, got "
                f"{folders[folder.lower()]!r} and {d.name!r}, both the folder {folder!r} "
                "(letters, digits, '-', '_' and '.' are kept, case aside): rename one"
            )
        folders[folder.lower()] = d.name
    return Suite(name, str(raw.get("description", "")), k, metric, tuple(datasets), text)


def file_sha256(path: Path) -> str:
    """A file's SHA-256, or a folder's: of its files' relative paths and SHA-256s, sorted."""
    if path.is_dir():
        h = hashlib.sha256()
        for p in sorted(q for q in path.rglob("*") if q.is_file()):
            h.update(f"{p.relative_to(path).as_posix()}\0{file_sha256(p)}\n".encode())
        return h.hexdigest()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class SuiteConfig:
    """A suite run: which suite, against which corpus, for which agents."""

    suite: Suite
    agents: tuple[str, ...]
    corpus: str | None = None
    """A corpus JSONL, searched with BM25 (built in memory)."""
    index: str | None = None
    """Or a saved index (``rag-gym index build``) or a search-engine index URL."""
    retriever: str | None = None
    """Or a retrieval server's URL (``rag-gym serve``)."""
    data_root: str = "."
    """The folder the suite's ``data`` paths are relative to."""
    datasets: tuple[str, ...] | None = None
    """The columns to run (default: all of the suite's)."""
    n: int | None = None
    """At most this many questions a dataset (default: the suite's own counts)."""
    seed: int = 0
    batch_size: int = 8
    prompt: str | None = None
    """The prompt template's text (``{question}`` marks the question), for agents that take one."""
    prompt_file: str | None = None
    lm_spec: str | None = None
    n_ctx: int | None = None
    """The LM options, as :class:`~rag_gym.evaluate.config.EvalConfig` takes them: context size,"""
    max_new_tokens: int | None = None
    """most new tokens of a reply,"""
    temperature: float | None = None
    """sampling temperature"""
    chat_template: str | None = None
    """and chat template of every LLM agent (``None``: the backend's or agent's own)."""
    out_dir: str = "runs"
    run_name: str | None = None

    def __post_init__(self) -> None:
        EvalConfig(  # the LM options, checked as a single run checks them
            n_ctx=self.n_ctx,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            chat_template=self.chat_template,
        )
        given = [x for x in (self.corpus, self.index, self.retriever) if x is not None]
        if len(given) != 1:
            raise SuiteError(
                f"a suite searches one corpus for every dataset: pass exactly one of --corpus "
                f"FILE, --index DIR and --retriever URL (got {len(given)})"
            )
        if self.retriever is not None and not is_server_url(self.retriever):
            raise SuiteError(
                f"expected --retriever to be a server URL (http://host:port), got "
                f"{self.retriever!r}: a saved index is --index DIR"
            )
        if self.n is not None and (isinstance(self.n, bool) or self.n < 1):
            raise SuiteError(f"expected n >= 1, got {self.n!r}")
        if self.prompt is not None and "{question}" not in self.prompt:
            raise SuiteError(
                f"expected the prompt template ({self.prompt_file or 'prompt'}) to hold "
                "{question} where the question goes, got none"
            )
        names = [d.name for d in self.suite.datasets]
        if self.datasets is not None:
            unknown = [d for d in self.datasets if d not in names]
            if unknown:
                raise SuiteError(
                    f"expected datasets of the {self.suite.name} suite ({', '.join(names)}), got "
                    f"{', '.join(unknown)}"
                )
            if not self.datasets:
                raise SuiteError("expected at least one dataset, got none")
        check_out_dir(self.out_dir)
        if self.run_name is not None:
            run_dir_of(self.out_dir, self.run_name)

    @property
    def selected(self) -> tuple[SuiteDataset, ...]:
        if self.datasets is None:
            return self.suite.datasets
        return tuple(d for d in self.suite.datasets if d.name in self.datasets)

    def data_path(self, dataset: SuiteDataset) -> Path:
        return Path(self.data_root) / dataset.data

    def eval_config(self, dataset: SuiteDataset, run_dir: Path) -> EvalConfig:
        """The :class:`EvalConfig` of one column, whose run folder is ``run_dir/<column>``."""
        n = dataset.n or ALL_QUESTIONS
        if self.n is not None:
            n = min(n, self.n)
        env_kwargs: dict[str, Any] = {
            "data_path": str(self.data_path(dataset)),
            "k": self.suite.k,
            "answer_metric": self.suite.metric,
        }
        for key in ("corpus", "index", "retriever"):
            if getattr(self, key) is not None:
                env_kwargs[key] = getattr(self, key)
        if dataset.dataset is not None:
            env_kwargs["dataset"] = dataset.dataset
        if dataset.dataset_kwargs:
            env_kwargs["dataset_kwargs"] = dict(dataset.dataset_kwargs)
        return EvalConfig(
            env_id=dataset.env_id,
            split=dataset.split,
            n=n,
            seed=self.seed,
            agents=self.agents,
            env_kwargs=env_kwargs,
            batch_size=self.batch_size,
            lm_spec=self.lm_spec,
            n_ctx=self.n_ctx,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            chat_template=self.chat_template,
            out_dir=str(run_dir),
            run_name=column_folder(dataset.name),
        )

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["suite"] = self.suite.name
        out["agents"] = list(self.agents)
        out["datasets"] = None if self.datasets is None else list(self.datasets)
        return out

    @classmethod
    def from_run(cls, run_dir: str | Path, **overrides: Any) -> SuiteConfig:
        """The config a suite run saved (its suite read back from the pinned text), to run it
        again; ``overrides`` (``out_dir``, ``run_name``…) replace fields."""
        saved = read_suite_protocol(run_dir)
        config = dict(saved["config"])
        config["suite"] = parse_suite(saved["suite"]["text"], f"{run_dir}/{SUITE_FILE}")
        config["agents"] = tuple(config["agents"])
        if config.get("datasets") is not None:
            config["datasets"] = tuple(config["datasets"])
        config.update({k: v for k, v in overrides.items()})
        return cls(**config)


def column_folder(name: str) -> str:
    """The run folder of a column: its name, with anything but letters, digits, ``-``, ``_`` and
    ``.`` replaced."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def _json_type(hint: Any) -> type:
    """The JSON type a ``suite.json`` config field of type ``hint`` is saved as (its ``None``
    aside): the suite by its name, a tuple as a list."""
    kinds = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    kind = typing.get_origin(kinds[0]) or kinds[0]
    return {Suite: str, tuple: list}.get(kind, kind)


#: the types of the ``config`` fields of ``suite.json`` (``None`` allowed where the default is)
_CONFIG_TYPES = {name: _json_type(h) for name, h in typing.get_type_hints(SuiteConfig).items()}


def read_suite_protocol(run_dir: str | Path) -> dict[str, Any]:
    """The ``suite.json`` of a suite run, checked to be one :func:`run_suite` writes: the suite's
    text and checksum, the config, the corpus and each column's data pin. Anything damaged or
    missing is a :class:`SuiteError` naming the file and the key."""
    path = Path(run_dir) / SUITE_FILE
    if not path.is_file():
        raise SuiteError(
            f"{path} not found: expected a suite run folder (rag-gym evaluate --suite)"
        )
    try:
        saved = traces.load_file(path)
    except (OSError, ValueError) as exc:
        raise SuiteError(
            f"cannot read {path}: {str(exc)[:300]}; restore it, or rerun the suite"
        ) from None

    def bad(key: str, expected: str, got: Any) -> SuiteError:
        shown = json.dumps(got, default=str)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        return SuiteError(
            f"{path}: expected {key} to be {expected}, got {shown}: the file is damaged or was "
            "edited; restore it, or rerun the suite"
        )

    if not isinstance(saved, dict):
        raise bad("the file", "a JSON object (a suite run's protocol)", type(saved).__name__)
    suite = saved.get("suite")
    if not isinstance(suite, dict):
        raise bad("suite", "an object (the suite's text and checksum)", suite)
    for key in ("text", "sha256"):
        if not isinstance(suite.get(key), str):
            raise bad(f"suite.{key}", "a string", suite.get(key))
    if hashlib.sha256(suite["text"].encode("utf-8")).hexdigest() != suite["sha256"]:
        raise bad("suite.sha256", "the checksum of suite.text", suite["sha256"])
    config = saved.get("config")
    if not isinstance(config, dict):
        raise bad("config", "an object (the suite run's options)", config)
    unknown = sorted(set(config) - set(_CONFIG_TYPES))
    if unknown:
        raise bad(f"config.{unknown[0]}", f"absent (the options are {sorted(_CONFIG_TYPES)})", 1)
    for key, kind in _CONFIG_TYPES.items():
        value = config.get(key)
        required = key in ("suite", "agents")
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)  # JSON writes 1.0 as 1 where a person edits it
        if (value is None and required) or (
            value is not None and (not isinstance(value, kind) or isinstance(value, bool))
        ):
            expected = {str: "a string", int: "an integer", list: "a list", float: "a number"}[kind]
            expected += "" if required else " or null"
            raise bad(f"config.{key}", expected, value)
    for key in ("agents", "datasets"):
        names = config.get(key)
        if names is not None and not all(isinstance(x, str) for x in names):
            raise bad(f"config.{key}", "a list of names", names)
    if not isinstance(saved.get("corpus"), dict):
        raise bad("corpus", "an object (the corpus's checksum or URL)", saved.get("corpus"))
    data = saved.get("data")
    if not isinstance(data, dict):
        raise bad("data", "an object (each column's data file and checksum)", data)
    for name, pin in data.items():
        if not isinstance(pin, dict) or not isinstance(pin.get("sha256"), str):
            got = pin.get("sha256") if isinstance(pin, dict) else pin
            raise bad(f"data.{name}.sha256", "a checksum", got)
    return saved


def corpus_pin(config: SuiteConfig) -> dict[str, Any]:
    """What identifies the corpus: a file's or an index folder's checksum, or a server's URL."""
    if config.retriever is not None:
        return {"kind": "retriever", "url": config.retriever}
    kind = "corpus" if config.corpus is not None else "index"
    where = config.corpus if config.corpus is not None else config.index
    assert where is not None
    if is_url(where):  # a search-engine index
        return {"kind": kind, "url": where}
    path = Path(where)
    if not path.exists():
        raise SuiteError(f"expected --{kind} to exist, got {where}: no such file or folder")
    return {"kind": kind, "path": str(path.resolve()), "sha256": file_sha256(path)}


def data_pins(config: SuiteConfig) -> dict[str, dict[str, Any]]:
    """Each selected column's data path and checksum; a missing one is a :class:`SuiteError`
    naming every missing path and the ways out."""
    missing = [
        f"{d.name}: {config.data_path(d)}"
        for d in config.selected
        if not config.data_path(d).exists()
    ]
    if missing:
        raise SuiteError(
            f"the {config.suite.name} suite's data is missing under {config.data_root} ("
            + "; ".join(missing)
            + "): put the files there, point --data-root at their folder, or run the columns "
            "you have with --datasets"
        )
    return {
        d.name: {
            "path": str(config.data_path(d).resolve()),
            "sha256": file_sha256(config.data_path(d)),
        }
        for d in config.selected
    }


@dataclass
class SuiteResult:
    config: SuiteConfig
    run_dir: Path
    table: dict[str, dict[str, dict[str, float]]]
    """``agent -> column (and "average") -> {"mean", "low", "high", "n"}``."""
    protocol: dict[str, Any]


def suite_table(
    config: SuiteConfig, episodes: dict[str, list[dict[str, Any]]]
) -> dict[str, dict[str, dict[str, float]]]:
    """Each agent's metric per column (mean and 95% bootstrap interval over its questions) and
    the columns' average (its interval resamples each column's questions apart,
    :func:`~rag_gym.stats.macro_average_ci`)."""
    from rag_gym.stats import bootstrap_ci, macro_average_ci

    metric = config.suite.metric
    table: dict[str, dict[str, dict[str, float]]] = {}
    for agent in config.agents:
        row: dict[str, dict[str, float]] = {}
        groups = []
        for d in config.selected:
            scores = [float(e.get(metric) or 0.0) for e in episodes[d.name] if e["agent"] == agent]
            if not scores:
                continue
            low, high = bootstrap_ci(scores)
            row[d.name] = {
                "mean": sum(scores) / len(scores),
                "low": low,
                "high": high,
                "n": len(scores),
            }
            groups.append(scores)
        if groups:
            low, high = macro_average_ci(groups)
            means = [sum(g) / len(g) for g in groups]
            row["average"] = {
                "mean": sum(means) / len(means),
                "low": low,
                "high": high,
                "n": sum(len(g) for g in groups),
            }
        table[agent] = row
    return table


def suite_title(config: SuiteConfig) -> str:
    """The table's title: the suite, its metric, ``k`` and the seed."""
    return (
        f"{config.suite.name} suite · {config.suite.metric.upper()} · k = {config.suite.k} · "
        f"seed {config.seed} · mean (95% interval)"
    )


def column_heads(config: SuiteConfig, table: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    """Each column's name (the datasets, then ``average``) with its question count, if any."""
    heads = []
    for name in [d.name for d in config.selected] + ["average"]:
        n = next((row[name]["n"] for row in table.values() if name in row), None)
        heads.append(name if n is None else f"{name} ({n})")
    return heads


def suite_markdown(config: SuiteConfig, table: dict[str, dict[str, dict[str, float]]]) -> str:
    """The table as Markdown: a row per agent, a column per dataset and the average, each cell
    ``mean (low–high)``; the header names the metric and each column's question count."""
    columns = [d.name for d in config.selected] + ["average"]
    head = ["agent", *column_heads(config, table)]
    lines = [suite_title(config), "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for agent, row in table.items():
        cells = [cell_text(row.get(c)) for c in columns]
        lines.append("| " + " | ".join([agent, *cells]) + " |")
    return "\n".join(lines) + "\n"


def cell_text(cell: dict[str, float] | None) -> str:
    if cell is None:
        return "–"
    return f"{cell['mean']:.3f} ({cell['low']:.2f}–{cell['high']:.2f})"


def suite_csv(config: SuiteConfig, table: dict[str, dict[str, dict[str, float]]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["agent", "dataset", "metric", "mean", "low", "high", "n"])
    for agent, row in table.items():
        for col, cell in row.items():
            writer.writerow(
                [agent, col, config.suite.metric, f"{cell['mean']:.6f}", f"{cell['low']:.6f}",
                 f"{cell['high']:.6f}", cell["n"]]
            )  # fmt: skip
    return out.getvalue()


def run_suite(
    config: SuiteConfig,
    agent_factory: Callable[[str, Any], Any],
    *,
    progress: Callable[[str, int, int, float | None], None] | None = None,
    column_started: Callable[[SuiteDataset], None] | None = None,
    lm_description: dict[str, Any] | None = None,
    command: str | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> SuiteResult:
    """Run every selected column of the suite (see the module doc) and write the suite's files.

    ``resume`` goes on with the suite run in ``out_dir/run_name``: columns already finished are
    read back, a stopped one is resumed, the rest are run. ``overwrite`` replaces a suite run
    folder. Each column's run folder is an ordinary ``rag-gym evaluate`` run."""
    from rag_gym.evaluate.runner import evaluate

    data = data_pins(config)  # before anything slow: every file is there
    corpus = corpus_pin(config)
    run_name = config.run_name or _names.run_name(
        f"suite-{config.suite.name}", "suite", config.seed
    )
    run_dir = run_dir_of(config.out_dir, run_name)
    if (run_dir / SUITE_FILE).is_file():
        if resume:
            _check_same(read_suite_protocol(run_dir), config, corpus, data, run_dir)
        elif overwrite:
            import shutil

            shutil.rmtree(run_dir)
        else:
            raise SuiteError(
                f"{run_dir} already holds a suite run: pass --resume {run_dir} to go on with it, "
                "--overwrite to replace it, or another --run-name"
            )
    elif resume:
        raise SuiteError(f"expected a suite run to resume at {run_dir}, but it has no {SUITE_FILE}")
    elif run_dir.exists() and any(run_dir.iterdir()):
        raise SuiteError(f"{run_dir} exists and is not a suite run folder: pick another --run-name")
    run_dir.mkdir(parents=True, exist_ok=True)
    config = replace(config, run_name=run_name)
    if config.prompt is not None:
        atomic_write(run_dir / "prompt.txt", config.prompt)
    protocol: dict[str, Any] = {
        "suite": {
            "name": config.suite.name,
            "description": config.suite.description,
            "sha256": config.suite.sha256,
            "text": config.suite.text,
        },
        "corpus": corpus,
        "data": data,
        "k": config.suite.k,
        "metric": config.suite.metric,
        "answer_normaliser": {
            "function": f"{normalize_answer.__module__}.{normalize_answer.__qualname__}",
            "does": (normalize_answer.__doc__ or "").strip().splitlines()[0],
        },
        "prompt": None
        if config.prompt is None
        else {
            "file": config.prompt_file,
            "sha256": hashlib.sha256(config.prompt.encode("utf-8")).hexdigest(),
            "text": config.prompt,
        },
        "lm": lm_description,
        "command": command,
        "config": {**config.to_json(), "suite": config.suite.name},
        "columns": {},
    }
    atomic_write(run_dir / SUITE_FILE, json.dumps(protocol, indent=2) + "\n")
    episodes: dict[str, list[dict[str, Any]]] = {}
    for d in config.selected:
        if column_started is not None:
            column_started(d)
        column = config.eval_config(d, run_dir)
        folder = run_dir / column.run_name  # type: ignore[operator]
        again = (folder / "protocol.json").is_file()
        result = evaluate(
            column,
            agent_factory,
            progress=progress,
            lm_description=lm_description,
            command=command,
            resume=again,
        )
        episodes[d.name] = result.episodes
        p = result.protocol
        protocol["columns"][d.name] = {
            "folder": column.run_name,
            "env_id": d.env_id,
            "split": d.split,
            "n": p["n"],
            "retriever": p["retriever"],
            "k": p["k"],
            "corpus_mode": p["corpus_mode"],
            "corpus_size": p["corpus_size"],
            "max_episode_steps": p["max_episode_steps"],
            "max_turns": {
                name: a.get("max_turns") for name, a in p["agents"].items() if "max_turns" in a
            },
            "seen_questions": {
                name: a["seen_questions"]
                for name, a in p["agents"].items()
                if "seen_questions" in a
            },
        }
        atomic_write(run_dir / SUITE_FILE, json.dumps(protocol, indent=2) + "\n")
    table = suite_table(config, episodes)
    protocol["results"] = table
    atomic_write(run_dir / SUITE_FILE, json.dumps(protocol, indent=2) + "\n")
    atomic_write(run_dir / "suite.md", suite_markdown(config, table))
    atomic_write(run_dir / "suite.csv", suite_csv(config, table))
    return SuiteResult(config, run_dir, table, protocol)


def _check_same(
    saved: dict[str, Any],
    config: SuiteConfig,
    corpus: dict[str, Any],
    data: dict[str, dict[str, Any]],
    run_dir: Path,
) -> None:
    """A resumed suite run must be the one saved: the same suite text, corpus and data."""
    if saved["suite"]["sha256"] != config.suite.sha256:
        raise SuiteError(
            f"{run_dir}: the suite file changed since the run; resume with the saved one"
        )

    def identity(pin: dict[str, Any] | None) -> tuple:  # a moved file is still the same corpus
        pin = pin or {}
        return pin.get("kind"), pin.get("sha256"), pin.get("url")

    if identity(saved.get("corpus")) != identity(corpus):
        raise SuiteError(
            f"{run_dir}: the corpus is not the run's ({saved.get('corpus')} then, {corpus} now)"
        )
    for name, pin in data.items():
        was = saved["data"].get(name)
        if was is None:
            raise SuiteError(
                f"{run_dir / SUITE_FILE}: expected data.{name} (the checksum of the column's data "
                f"file), got none: the run cannot be checked against its data; restore the file, "
                "or rerun the suite"
            )
        if was["sha256"] != pin["sha256"]:
            raise SuiteError(f"{run_dir}: {name}'s data file changed since the run ({pin['path']})")


def check_pins(config: SuiteConfig, run_dir: str | Path) -> None:
    """For a re-run (``--from-run``): the corpus and data files must be the ones the saved run
    read, checksum for checksum."""
    saved = read_suite_protocol(run_dir)
    _check_same(saved, config, corpus_pin(config), data_pins(config), Path(run_dir))
