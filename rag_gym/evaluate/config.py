"""What to evaluate and how (:class:`EvalConfig`), the run folder it names (checked before anything
slow, claimed when the run starts), and what a run gives back (:class:`EvalResult`)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import gymnasium as gym

from rag_gym import _names
from rag_gym.baselines import check_agent_name
from rag_gym.evaluate.run_folder import (
    atomic_write,
    check_out_dir,
    is_run_folder,
    protocol_text,
    read_protocol,
    run_dir_of,
)


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
    """Extra ``gym.make`` kwargs (``data_path``, ``corpus``, ``index``, ``k``…); plain JSON values."""
    batch_size: int = 8
    """Episodes stepped together (one batched agent call per step)."""
    lm_spec: str | None = None
    """The backend spec (``llama_cpp``, ``openai:model@url``…), recorded for re-runs."""
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
        if not isinstance(self.env_kwargs, dict):
            raise TypeError(
                f"expected env_kwargs to be a dict (a JSON object), got "
                f"{type(self.env_kwargs).__name__}"
            )
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
    def resumed(
        cls,
        run_dir: str | Path,
        env_kwargs: dict[str, Any] | None = None,
        env_options: dict[str, Any] | None = None,
        **overrides: Any,
    ) -> EvalConfig:
        """The config of the stopped run in ``run_dir``, to go on with it: the run's own
        settings but for ``overrides`` (fields given again, which :func:`evaluate
        <rag_gym.evaluate.runner.evaluate>` checks against the run's protocol). ``env_kwargs``
        replaces the run's env kwargs, and ``env_options`` (``data_path``, ``corpus``,
        ``index``, ``k``) are set on them."""
        run_dir = Path(run_dir)
        config = cls.from_run(
            run_dir, out_dir=str(run_dir.parent), run_name=run_dir.name, **overrides
        )
        if env_kwargs is not None or env_options:
            base = config.env_kwargs if env_kwargs is None else env_kwargs
            config.env_kwargs = {**base, **(env_options or {})}
        return config


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
