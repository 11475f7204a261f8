"""What to evaluate and how (:class:`EvalConfig`), the run folder it names (checked before anything
slow, claimed when the run starts), and what a run gives back (:class:`EvalResult`)."""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import gymnasium as gym

from rag_gym import _names
from rag_gym.baselines import check_agent_name, needs_lm
from rag_gym.evaluate.run_folder import (
    atomic_write,
    check_out_dir,
    is_run_folder,
    protocol_text,
    read_protocol,
    run_dir_of,
)

#: the fields of :class:`EvalConfig` that are set on its ``env_kwargs`` (the env's arguments)
ENV_OPTIONS = ("data_path", "corpus", "index", "retriever", "k")


@dataclass
class EvalConfig:
    """What to evaluate and how."""

    env_id: str = "rag_gym/SynthHop-v0"
    """A registered rag-gym env id (its dataset and options apply to every agent)."""
    split: str = "validation"
    """The split to draw questions from."""
    n: int = 100
    """Questions to sample (all of them when the split is smaller)."""
    seed: int = 0
    """Seed of the question sample, of env resets and of stochastic agents."""
    agents: tuple[str, ...] = ("naive_rag", "random", "search_r1:synthhop")
    """Agent names (see :mod:`rag_gym.baselines`; ``search_r1:synthhop`` is the shipped trained
    agent)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra ``gym.make`` kwargs as a JSON object, e.g. ``{"dataset_kwargs": {"n_passages":
    2000}}``; the options below are set on them."""
    data_path: str | None = None
    """The dataset file of a real-data env (the env's ``data_path``)."""
    corpus: str | None = None
    """A corpus JSONL to search (the env's ``corpus``; Bamboogle needs one)."""
    index: str | None = None
    """A saved index folder to search (``rag-gym index build``), or an OpenSearch or
    Elasticsearch index (``opensearch+http://127.0.0.1:9200/wiki18``): the env's ``index``."""
    retriever: str | None = None
    """A retrieval server's URL to search (``rag-gym serve``; Search-R1's ``/retrieve`` API): the
    env's ``retriever``."""
    k: int | None = None
    """Passages per search (``None``: the env's, 3)."""
    batch_size: int = 8
    """Episodes stepped together (one batched agent call per step)."""
    lm_spec: str | None = None
    """The LLM backend of the agents that need one: ``llama_cpp[:file.gguf]``,
    ``transformers[:id]``, ``vllm:id`` or ``openai:model@url`` (``None``: ``llama_cpp``, the
    embedded model)."""
    n_ctx: int | None = None
    """The LLM's context window in tokens (llama.cpp, vLLM; ``None``: the backend's default,
    4,096 tokens for llama.cpp)."""
    max_new_tokens: int | None = None
    """Most new tokens of every LLM reply (``None``: each agent's own limit, e.g. 32 for
    naive_rag and 128 a turn for search_r1)."""
    temperature: float | None = None
    """Sampling temperature of every LLM agent (``None``: each agent's own, greedy)."""
    chat_template: str | None = None
    """The chat template of the LLM: ``chatml``, ``gemma``, ``llama3`` or a Jinja template file,
    for a model without one or to replace its own (``None``: the model's own; a model without
    one is refused). See :mod:`rag_gym.generation.chat_templates`."""
    judge: str | None = None
    """The backend spec of an LLM judge of the answers (``openai:model@url``…; ``None``: no
    judge), recorded so that ``--from-run`` and ``--resume`` judge again with it."""
    prompt: str | None = None
    """The prompt template's text for ``search_r1`` agents (``{question}`` marks the question;
    ``None``: each agent's own)."""
    out_dir: str = "runs"
    """Parent folder of the run folder."""
    run_name: str | None = None
    """Run folder name, a folder inside ``out_dir`` (default, unique and sortable:
    ``<env>__<split>__<seed>__<unix time>.<microseconds>-<random hex>``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"expected n >= 1, got {self.n!r}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"expected batch_size >= 1, got {self.batch_size!r}")
        if not self.agents:
            raise ValueError("expected at least one agent, got none")
        self.agents = tuple(check_agent_name(a) for a in self.agents)
        if self.env_id not in gym.registry:
            import difflib

            ids = [i for i in gym.registry if i.startswith("rag_gym/")]
            close = difflib.get_close_matches(self.env_id, ids, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"expected a registered env id (rag-gym envs lists them), got {self.env_id!r}{hint}"
            )
        from rag_gym.train.options import dict_option

        self.env_kwargs = dict(dict_option("env_kwargs", self.env_kwargs))
        for name in ENV_OPTIONS:
            value = getattr(self, name)
            if value is None:
                continue
            if self.env_kwargs.get(name, value) != value:
                raise ValueError(
                    f"expected {name} once, got {value!r} and env_kwargs {name} "
                    f"{self.env_kwargs[name]!r}: drop one"
                )
            self.env_kwargs[name] = value
        if "split" in self.env_kwargs and self.env_kwargs["split"] != self.split:
            raise ValueError(
                f"expected the split once, got split {self.split!r} and env_kwargs split "
                f"{self.env_kwargs['split']!r}: the questions come from split (--split); drop "
                "'split' from env_kwargs (--env-kwargs)"
            )
        if self.prompt is not None and (
            not isinstance(self.prompt, str) or "{question}" not in self.prompt
        ):
            raise ValueError(
                f"expected the prompt template to hold {{question}} where the question goes, "
                f"got {self.prompt!r:.80}"
            )
        self._check_lm_options()
        if self.lm_spec is None and any(needs_lm(a) for a in self.agents):
            self.lm_spec = "llama_cpp"
        check_out_dir(self.out_dir)
        if self.run_name is not None:
            run_dir_of(self.out_dir, self.run_name)

    def _check_lm_options(self) -> None:
        from rag_gym.generation.chat_templates import BUILTIN, chat_template

        for name in ("n_ctx", "max_new_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"expected {name} to be an integer, got {value!r}")
            if value is not None and value < 1:
                raise ValueError(f"expected {name} >= 1, got {value!r}")
        if self.temperature is not None and (
            isinstance(self.temperature, bool)
            or not isinstance(self.temperature, (int, float))
            or not self.temperature >= 0
        ):
            raise ValueError(f"expected temperature >= 0, got {self.temperature!r}")
        template = chat_template(self.chat_template)  # an unknown name or a bad file: now
        if template is not None and self.chat_template not in BUILTIN:
            self.chat_template = template.file  # absolute: a resume elsewhere finds it

    @classmethod
    def from_run(cls, run_dir: str | Path, **overrides: Any) -> EvalConfig:
        """The config saved in a run folder's ``protocol.json`` (to reproduce the run)."""
        saved = dict(read_protocol(run_dir)["config"])
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(saved) - names)
        if unknown:
            raise ValueError(
                f"{Path(run_dir) / 'protocol.json'}: its config has fields this rag-gym does not "
                f"know ({', '.join(unknown)}); run it with the rag-gym version that wrote it"
            )
        saved["agents"] = tuple(saved["agents"])
        return cls(**{**saved, **overrides})

    @classmethod
    def resumed(cls, run_dir: str | Path, **overrides: Any) -> EvalConfig:
        """The config of the stopped run in ``run_dir``, to go on with it: the run's own
        settings but for ``overrides`` (fields given again, which :func:`evaluate
        <rag_gym.evaluate.runner.evaluate>` checks against the run's protocol). ``env_kwargs``
        replaces the run's env kwargs; an env option (:data:`ENV_OPTIONS`) replaces the run's."""
        run_dir = Path(run_dir)
        saved = asdict(cls.from_run(run_dir, out_dir=str(run_dir.parent), run_name=run_dir.name))
        if "env_kwargs" in overrides:
            saved.update(dict.fromkeys(ENV_OPTIONS), env_kwargs={})
        for name in ENV_OPTIONS:
            if overrides.get(name) is not None:
                saved["env_kwargs"].pop(name, None)
        return cls(**{**saved, **overrides})


@dataclass
class EvalRunner:
    """How an evaluation is run, which changes none of its results (not recorded in
    ``protocol.json``'s config)."""

    from_run: str | None = None
    """Re-run the protocol saved in this run folder (judged runs with their judge)."""
    resume: str | None = None
    """Go on with this stopped run folder: only its missing episodes are played (options given
    must match its protocol; agents may be added)."""
    overwrite: bool = False
    """Replace the run folder if it holds a run."""
    progress: bool = True
    """Show a progress bar."""
    track: bool = False
    """Log to Weights & Biases (offline unless configured)."""
    ray: str | None = None
    """Play the episodes on workers of this Ray cluster (``auto``, ``HOST:PORT``,
    ``ray://HOST:PORT``, or ``local`` to start one here); the same leaderboard as a local run."""
    ray_workers: int = 2
    """With ``ray``: workers playing episodes (each loads its backend once)."""
    cpus_per_worker: float = 1.0
    """With ``ray``: CPUs each worker reserves, and its LLM threads."""


@dataclass
class EvalResult:
    config: EvalConfig
    run_dir: Path
    rows: list[dict[str, Any]]
    episodes: list[dict[str, Any]]
    protocol: dict[str, Any]


def default_run_name(config: EvalConfig) -> str:
    """``<env>__<split>__<seed>__<unix time>.<microseconds>-<random hex>``
    (:func:`rag_gym._names.run_name`): sorts by start time, and two runs started in the same
    microsecond still differ."""
    return _names.run_name(config.env_id, config.split, config.seed)


def check_run_dir(config: EvalConfig, resume: bool = False, overwrite: bool = False) -> Path | None:
    """Check, before anything slow, that ``config``'s run folder may be used; return it (``None``
    for a default name, made unique when the run starts).

    A new or empty folder is used as it is; an existing run folder needs ``resume`` (go on) or
    ``overwrite`` (start over); any other existing folder is refused."""
    if resume and overwrite:
        raise ValueError("expected resume or overwrite, got both: pick one")
    if config.run_name is None:
        if resume:
            raise ValueError(
                "expected the name of the run to resume, got none: pass run_name (--resume RUN)"
            )
        return None
    run_dir = run_dir_of(config.out_dir, config.run_name)
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"expected {run_dir} to be a run folder, got a file: pick another name")
    used = run_dir.is_dir() and any(run_dir.iterdir())
    if resume:
        if not is_run_folder(run_dir):
            raise FileNotFoundError(
                f"expected a run folder to resume at {run_dir}, but it has no protocol.json: "
                "check the path, or drop --resume to start a new run"
            )
    elif used and not is_run_folder(run_dir):
        raise FileExistsError(
            f"{run_dir} exists and is not a rag-gym run folder (no protocol.json): "
            "pick another --run-name or --out; it is never deleted"
        )
    elif used and not overwrite:
        raise FileExistsError(
            f"{run_dir} already holds a run: pass --resume {run_dir} to go on with it, "
            "--overwrite to replace it, or another --run-name"
        )
    return run_dir


def claim_run_dir(
    config: EvalConfig, run_dir: Path | None, protocol: dict[str, Any], overwrite: bool
) -> Path:
    """Create the run folder of a new run and write its protocol; the folder is this run's alone
    (a unique default name, or ``protocol.json`` created exclusively)."""
    if run_dir is None:
        out = check_out_dir(config.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for _ in range(100):
            run_dir = out / default_run_name(config)
            try:
                run_dir.mkdir()
                break
            except FileExistsError:
                continue
        else:  # pragma: no cover (100 collisions of a random suffix)
            raise FileExistsError(f"could not create a new run folder in {out}")
    else:
        run_dir = check_run_dir(config, overwrite=overwrite)  # again: another run may have begun
        assert run_dir is not None
        if overwrite and is_run_folder(run_dir):
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
    try:
        with open(run_dir / "protocol.json", "x", encoding="utf-8"):
            pass
    except FileExistsError:
        raise FileExistsError(
            f"{run_dir} already holds a run (another run started there meanwhile): "
            "pick another --run-name"
        ) from None
    atomic_write(run_dir / "protocol.json", protocol_text(protocol))
    return run_dir
