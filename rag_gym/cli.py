"""The ``rag-gym`` command line: ``evaluate``, ``compare``, ``view``, ``agents``, ``envs``,
``synth``, ``index build``, ``serve``, ``train`` (``sft``, ``grpo``, ``pipeline``, ``export``) and
``openenv serve``."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

import typer

from rag_gym.evaluate import EvalConfig
from rag_gym.evaluate.suite import SuiteConfig
from rag_gym.train.grpo import EnvGRPOConfig
from rag_gym.train.pipeline import PipelineConfig
from rag_gym.train.sft import SFTConfig

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="rag-gym: the Gymnasium of multi-hop retrieval QA.",
)


def _show_version(value: bool) -> None:
    if value:
        from rag_gym import __version__

        typer.echo(f"rag-gym {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_show_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """rag-gym: the Gymnasium of multi-hop retrieval QA."""


def _defaults(cls: type) -> SimpleNamespace:
    """The defaults of the config dataclass ``cls``'s fields, as attributes: the defaults of
    the options that set them, so that a run configured from the shell is the run configured
    from Python."""
    return SimpleNamespace(
        **{
            f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for f in dataclasses.fields(cls)
        }
    )


_EVAL = _defaults(EvalConfig)
_SFT = _defaults(SFTConfig)
_GRPO = _defaults(EnvGRPOConfig)
_PIPELINE = _defaults(PipelineConfig)


#: the config field each option sets, per command (the option's default is the field's; the
#: other options are the command's own: where to write, what to resume, JSON to parse)
OPTION_FIELDS: dict[str, dict[str, tuple[type, str]]] = {
    "evaluate": {
        "env": (EvalConfig, "env_id"),
        "split": (EvalConfig, "split"),
        "n": (EvalConfig, "n"),
        "seed": (EvalConfig, "seed"),
        "agents": (EvalConfig, "agents"),
        "batch_size": (EvalConfig, "batch_size"),
        "n_ctx": (EvalConfig, "n_ctx"),
        "max_new_tokens": (EvalConfig, "max_new_tokens"),
        "temperature": (EvalConfig, "temperature"),
        "chat_template": (EvalConfig, "chat_template"),
        "out": (EvalConfig, "out_dir"),
        "run_name": (EvalConfig, "run_name"),
        "data_root": (SuiteConfig, "data_root"),
        "datasets": (SuiteConfig, "datasets"),
    },
    "train sft": {
        name: (SFTConfig, field)
        for name, field in {
            "env": "env_id",
            "data_path": "data_path",
            "split_by_id": "split_by_id",
            "synthhop_ratio": "synthhop_ratio",
            "tags": "tags",
            "demos": "n_demos",
            "joint_rate": "joint_rate",
            "confirm_rate": "confirm_rate",
            "style": "style",
            "model": "model",
            "chat_template": "chat_template",
            "lora": "lora",
            "lr": "learning_rate",
            "epochs": "epochs",
            "max_steps": "max_steps",
            "batch_size": "batch_size",
            "micro_batch_size": "micro_batch_size",
            "max_length": "max_length",
            "eval_n": "eval_n",
            "eval_before": "eval_before",
            "seed": "seed",
            "track": "track",
        }.items()
    },
    "train grpo": {
        name: (EnvGRPOConfig, field)
        for name, field in {
            "env": "env_id",
            "tags": "tags",
            "reward_preset": "reward_preset",
            "algorithm": "algorithm",
            "steps": "max_steps",
            "num_generations": "num_generations",
            "prompts_per_step": "prompts_per_step",
            "balance_answerable": "balance_answerable",
            "unanswerable_per_step": "unanswerable_per_step",
            "micro_batch_size": "micro_batch_size",
            "lr": "learning_rate",
            "warmup_steps": "warmup_steps",
            "max_completion_tokens": "max_completion_tokens",
            "beta": "beta",
            "temperature": "temperature",
            "step_cost": "step_cost",
            "refusal": "refusal",
            "refusal_verifier": "refusal_verifier",
            "judge": "judge",
            "judge_weight": "judge_weight",
            "model": "model",
            "chat_template": "chat_template",
            "save_steps": "save_steps",
            "max_minutes": "max_minutes",
            "gradient_checkpointing": "gradient_checkpointing",
            "seed": "seed",
            "track": "track",
        }.items()
    },
    "train pipeline": {
        **{
            name: (SFTConfig, field)
            for name, field in {
                "env": "env_id",
                "data_path": "data_path",
                "split_by_id": "split_by_id",
                "synthhop_ratio": "synthhop_ratio",
                "max_length": "max_length",
                "tags": "tags",
                "demos": "n_demos",
                "model": "model",
                "chat_template": "chat_template",
                "sft_lr": "learning_rate",
                "seed": "seed",
                "track": "track",
            }.items()
        },
        **{
            name: (PipelineConfig, field)
            for name, field in {
                "algorithm": "algorithm",
                "steps": "grpo_steps",
                "lr": "grpo_learning_rate",
                "num_generations": "num_generations",
                "prompts_per_step": "prompts_per_step",
                "step_cost": "step_cost",
                "refusal": "refusal",
                "refusal_verifier": "refusal_verifier",
                "test_n": "test_n",
            }.items()
        },
    },
}


def _fields(command: str, cls: type, params: dict[str, Any]) -> dict[str, Any]:
    """The ``cls`` fields that ``command``'s options in ``params`` set (:data:`OPTION_FIELDS`)."""
    return {
        field: params[name]
        for name, (owner, field) in OPTION_FIELDS[command].items()
        if owner is cls and name in params
    }


#: the options of ``evaluate`` that configure its LLM backend (EvalConfig fields of those names)
LM_OPTIONS = ("n_ctx", "max_new_tokens", "temperature", "chat_template")


def _lm_options(config: EvalConfig) -> dict[str, Any]:
    """The LM options of an evaluation's config, as :func:`~rag_gym.generation.backends.make_lm`
    takes them."""
    return {name: getattr(config, name) for name in LM_OPTIONS}


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


@app.command()
def evaluate(
    ctx: typer.Context,
    env: Annotated[
        str, typer.Option(help="Registered env id (its dataset is used for every agent).")
    ] = _EVAL.env_id,
    split: Annotated[str, typer.Option(help="Split to sample questions from.")] = _EVAL.split,
    n: Annotated[int, typer.Option(help="Questions to sample (fixed by --seed).")] = _EVAL.n,
    seed: Annotated[
        int, typer.Option(help="Seed of the sample, resets and random agents.")
    ] = _EVAL.seed,
    agents: Annotated[
        str, typer.Option(help="Comma-separated agent names (rag-gym agents lists them).")
    ] = ",".join(_EVAL.agents),
    lm: Annotated[
        str,
        typer.Option(
            help="LLM backend: llama_cpp[:file.gguf], transformers[:id], vllm:id, openai:model@url."
        ),
    ] = "llama_cpp",
    n_ctx: Annotated[
        int | None,
        typer.Option(help="The LLM's context window in tokens (llama_cpp default 4096; vllm)."),
    ] = _EVAL.n_ctx,
    max_new_tokens: Annotated[
        int | None,
        typer.Option(help="Most new tokens of every LLM reply (default: each agent's own)."),
    ] = _EVAL.max_new_tokens,
    temperature: Annotated[
        float | None,
        typer.Option(help="Sampling temperature of every LLM agent (default: greedy)."),
    ] = _EVAL.temperature,
    chat_template: Annotated[
        str | None,
        typer.Option(
            help="Chat template for a model without one (or to replace its own): chatml, "
            "gemma, llama3 or a Jinja template file (default: the model's own)."
        ),
    ] = _EVAL.chat_template,
    data_path: Annotated[str | None, typer.Option(help="Dataset file for real-data envs.")] = None,
    corpus: Annotated[
        str | None, typer.Option(help="Corpus JSONL to search (required for Bamboogle).")
    ] = None,
    index: Annotated[
        str | None,
        typer.Option(
            help="A saved index directory to search (rag-gym index build), or an OpenSearch "
            "or Elasticsearch index (opensearch+http://127.0.0.1:9200/wiki18): the env's index=."
        ),
    ] = None,
    retriever: Annotated[
        str | None,
        typer.Option(
            help="A retrieval server's URL to search (rag-gym serve; Search-R1's /retrieve API)."
        ),
    ] = None,
    k: Annotated[int | None, typer.Option(help="Passages per search (env default 3).")] = None,
    env_kwargs: Annotated[
        str | None,
        typer.Option(
            help='More gym.make kwargs as a JSON object, e.g. \'{"dataset_kwargs": {"n_passages": 2000}}\'.'
        ),
    ] = None,
    batch_size: Annotated[
        int, typer.Option(help="Episodes stepped together per agent call.")
    ] = _EVAL.batch_size,
    judge: Annotated[
        str | None, typer.Option(help="LLM judge backend spec (e.g. openai:model@url).")
    ] = None,
    track: Annotated[
        bool, typer.Option(help="Log to Weights & Biases (offline unless configured).")
    ] = False,
    from_run: Annotated[
        Path | None, typer.Option(help="Re-run the protocol saved in this run folder.")
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            help="Go on with this stopped run folder: only its missing episodes are played "
            "(options given must match its protocol; --agents may add agents)."
        ),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option(help="Replace the run folder if it holds a run (--run-name).")
    ] = False,
    out: Annotated[Path, typer.Option(help="Parent folder of the run folder.")] = Path(
        _EVAL.out_dir
    ),
    run_name: Annotated[
        str | None, typer.Option(help="Run folder name (default: unique, by start time).")
    ] = _EVAL.run_name,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
    suite: Annotated[
        str | None,
        typer.Option(
            help="Run a suite instead of one env: a shipped suite (search_r1, multihop) or a suite "
            "file, every dataset against one corpus (--corpus, --index or --retriever)."
        ),
    ] = None,
    data_root: Annotated[
        Path, typer.Option(help="With --suite: the folder its datasets' files are under.")
    ] = Path("."),
    datasets: Annotated[
        str | None,
        typer.Option(help="With --suite: the comma-separated columns to run (default: all)."),
    ] = None,
    prompt: Annotated[
        Path | None,
        typer.Option(
            help="A prompt template file ({question} marks the question) for search_r1 agents: "
            "the prompt a checkpoint was trained on."
        ),
    ] = None,
    ray: Annotated[
        str | None,
        typer.Option(
            help="Play the episodes on workers of this Ray cluster ('auto', HOST:PORT, "
            "ray://HOST:PORT, or 'local' to start one here); the same leaderboard as a local run."
        ),
    ] = None,
    ray_workers: Annotated[
        int,
        typer.Option(help="With --ray: workers playing episodes (each loads its backend once)."),
    ] = 2,
    cpus_per_worker: Annotated[
        float, typer.Option(help="With --ray: CPUs each worker reserves, and its LLM threads.")
    ] = 1.0,
) -> None:
    """Run agents on an env's sampled questions; print and save a leaderboard, plots and the protocol.

    Episodes are saved as they end; a stopped run (Ctrl-C, SIGTERM, a crash) goes on with
    --resume RUN. With --suite, each of the suite's datasets is such a run, and one table of
    every dataset and their average is printed (docs/leaderboards.md)."""
    import shlex
    import warnings

    import rag_gym  # noqa: F401  (registers the envs)
    from rag_gym._text import shown
    from rag_gym.baselines import make_agent, needs_lm
    from rag_gym.evaluate import RunInterrupted, check_run_dir, sigterm_as_interrupt
    from rag_gym.evaluate import evaluate as run
    from rag_gym.evaluate.leaderboard import terminal_table
    from rag_gym.evaluate.runner import MissingResultsWarning, missing_results

    def given(name: str) -> bool:  # typer vendors click: compare the enum member by name
        return getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"

    if suite is not None or any(
        folder is not None and (folder / "suite.json").is_file() for folder in (from_run, resume)
    ):
        _evaluate_suite(ctx, given)
        return
    prompt_text = _read_prompt(prompt)
    extra = _json_option(env_kwargs, "--env-kwargs")
    server = None
    if retriever is not None and retriever.startswith(("http://", "https://")):
        server, retriever = retriever, None
    if retriever is not None:
        typer.secho(
            "warning: --retriever is deprecated: use --index DIR (a saved index directory, the "
            "env's index=; the env's retriever= is a server URL or a retriever object)",
            fg=typer.colors.YELLOW,
            err=True,
        )
        if index is not None and index != retriever:
            _fail(f"expected one index directory, got --index {index} and --retriever {retriever}")
        index = retriever
    options = {"data_path": data_path, "corpus": corpus, "index": index, "k": k}
    options["retriever"] = server
    env_kwargs_ = {**extra, **{key: val for key, val in options.items() if val is not None}}
    agent_names = tuple(a.strip() for a in agents.split(",") if a.strip())
    try:
        if resume is not None and from_run is not None:
            raise ValueError("expected --resume or --from-run, got both: pick one")
        if resume is not None and overwrite:
            raise ValueError("expected resume or overwrite, got both: pick one")
        if resume is not None:
            named = out / (run_name or resume.name)
            if (given("out") or given("run_name")) and named.resolve() != resume.resolve():
                raise ValueError(
                    f"expected --out and --run-name to name the --resume folder {resume}, "
                    f"got {named}: drop them"
                )
            # the run's own settings, but for options given here (evaluate checks they match)
            given_ = {
                o: v for o, v in ctx.params.items() if given(o) and o not in ("out", "run_name")
            }
            overrides = _fields("evaluate", EvalConfig, given_)
            if "agents" in overrides:
                overrides["agents"] = agent_names
            env_options = {"data_path": "data_path", "corpus": "corpus", "index": "index", "k": "k"}
            env_options["retriever"] = "retriever" if server is not None else "index"
            config = EvalConfig.resumed(
                resume,
                env_kwargs=extra if given("env_kwargs") else None,
                env_options={key: options[key] for o, key in env_options.items() if given(o)},
                **overrides,
            )
            lm = lm if given("lm") else config.lm_spec or lm
        elif from_run is not None:
            config = EvalConfig.from_run(from_run, out_dir=str(out), run_name=run_name)
            lm = config.lm_spec or lm
        else:
            config = EvalConfig(
                **{
                    **_fields("evaluate", EvalConfig, ctx.params),
                    "agents": agent_names,
                    "env_kwargs": env_kwargs_,
                    "out_dir": str(out),
                }
            )
        check_run_dir(config, resume=resume is not None, overwrite=overwrite)
    except (TypeError, ValueError, OSError) as exc:
        _fail(str(exc))
    backend = judge_fn = None
    try:
        from rag_gym.generation.backends import make_lm

        if any(needs_lm(a) for a in config.agents):
            backend = make_lm(lm, seed=config.seed, **_lm_options(config))
            config.lm_spec = lm
        if judge is not None:
            from rag_gym.generation.judges import LLMAnswerJudge

            judge_lm = make_lm(judge)
            judge_lm.check_chat()  # the judge prompts with chats: no template, no run
            judge_fn = LLMAnswerJudge(judge_lm)
    except (ImportError, FileNotFoundError, TypeError, ValueError) as exc:
        _fail(str(exc))

    def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
        typer.secho(f"warning: {message}", fg=typer.colors.YELLOW, err=True)

    def resume_command(run_dir: Path) -> str:
        again = ["rag-gym", "evaluate", "--resume", str(run_dir)]
        again += ["--judge", judge] if judge is not None else []
        again += ["--track"] if track else []
        return shlex.join(again)

    bar, tick = _episode_bar(progress)
    with bar, warnings.catch_warnings():
        warnings.showwarning = show_warning
        # printed below as the reason of the exit status, with the command that resumes
        warnings.simplefilter("ignore", MissingResultsWarning)

        episodes = None
        if ray is not None:
            from rag_gym.evaluate.distributed import AgentRecipe, RayEpisodes

            try:
                episodes = RayEpisodes(
                    AgentRecipe(config.lm_spec, config.seed, prompt_text, _lm_options(config)),
                    address=ray,
                    workers=ray_workers,
                    cpus_per_worker=cpus_per_worker,
                )
            except (ImportError, ConnectionError, ValueError) as exc:
                _fail(str(exc))
        try:
            with sigterm_as_interrupt():
                result = run(
                    config,
                    lambda name, e: make_agent(
                        name, lm=backend, seed=config.seed, env=e, prompt=prompt_text
                    ),
                    episodes=episodes,
                    progress=tick,
                    lm_description=backend.describe() if backend else None,
                    command=" ".join(["rag-gym", *sys.argv[1:]]),
                    judge=judge_fn,
                    track=track,
                    resume=resume is not None,
                    overwrite=overwrite,
                )
        except RunInterrupted as exc:
            bar.stop()
            typer.secho(
                f"interrupted ({exc.reason}): {exc.saved} finished episodes are saved in "
                f"{exc.run_dir}; partial leaderboard: {exc.run_dir / 'leaderboard.md'}",
                fg=typer.colors.YELLOW,
                err=True,
            )
            typer.echo(f"resume with: {resume_command(exc.run_dir)}", err=True)
            raise typer.Exit(143 if exc.reason == "SIGTERM" else 130) from None
        except KeyboardInterrupt:
            typer.secho("interrupted before the run folder was written", err=True)
            raise typer.Exit(130) from None
        except (TypeError, ValueError, OSError, ImportError) as exc:
            # a backend's text may hold control characters: shown escaped
            _fail(shown("\n".join([str(exc), *getattr(exc, "__notes__", [])]), 4000, keep="\n"))

    try:  # the run is complete: a signal now loses nothing
        with sigterm_as_interrupt():
            console = _console()
            if console.width < 80:  # the terminal wraps the lines: no figure is cut
                from rich.console import Console

                console = Console(width=80)
            console.print(
                terminal_table(
                    result.rows,
                    f"{config.env_id} · {config.split} · {result.protocol['n']} questions · "
                    f"seed {config.seed}",
                    console.width,
                )
            )
            typer.echo(f"results: {result.run_dir}")
            try:
                from rag_gym.view import build_report

                typer.echo(f"report: {build_report(result.run_dir)}")
            except ImportError as exc:
                typer.echo(f"report: {exc}; then run: rag-gym view {result.run_dir}", err=True)
    except KeyboardInterrupt as exc:
        reason = exc.args[0] if exc.args and isinstance(exc.args[0], str) else "SIGINT"
        typer.secho(
            f"interrupted ({reason}) while writing the report: the run is complete, its "
            f"{len(result.episodes)} episodes and leaderboard are saved in {result.run_dir}",
            fg=typer.colors.YELLOW,
            err=True,
        )
        typer.echo(f"write the report with: rag-gym view {result.run_dir}", err=True)
        raise typer.Exit(143 if reason == "SIGTERM" else 130) from None
    status = 0
    failed = [r["agent"] for r in result.rows if r["episodes"] and r["errors"] == r["episodes"]]
    if failed:  # a run in which an agent did nothing but fail is not a result
        first = next(e["error"] for e in result.episodes if e["agent"] == failed[0] and e["error"])
        typer.secho(
            f"error: every episode of {', '.join(failed)} failed (the first: {shown(first)}); "
            f"see {result.run_dir / 'episodes.jsonl'}",
            fg=typer.colors.RED,
            err=True,
        )
        status = 1
    missing = missing_results(result.episodes)
    if missing:  # failed for a backend or judge: figures missing until a resume
        typer.secho(f"error: {missing}", fg=typer.colors.RED, err=True)
        typer.echo(f"resume with: {resume_command(result.run_dir)}", err=True)
        status = 1
    if status:
        raise typer.Exit(status)


@app.command()
def view(
    run_dir: Annotated[Path, typer.Argument(help="A run folder (rag-gym evaluate or train).")],
    out: Annotated[
        Path | None,
        typer.Option(
            help="Where to write the report (default RUN_DIR/report.html); never a file of the "
            "run folder."
        ),
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing file at --out.")] = False,
    serve: Annotated[
        bool, typer.Option(help="Then serve the report on http://127.0.0.1 until Ctrl-C.")
    ] = False,
    port: Annotated[int, typer.Option(help="Port for --serve (0: any free port).")] = 8000,
) -> None:
    """Write a self-contained HTML report of a run (leaderboard, episodes, training curves)."""
    from rag_gym.view import NotARunFolder, build_report
    from rag_gym.view import serve as serve_report

    if not 0 <= port <= 65535:
        _fail(f"expected --port in 0..65535, got {port}")
    try:
        path = build_report(run_dir, out, overwrite=overwrite)
    except (NotARunFolder, ImportError, OSError) as exc:
        _fail(str(exc))
    typer.echo(f"report: {path}")
    if serve:
        try:
            serve_report(path, port)
        except OSError as exc:  # the port is taken
            _fail(f"cannot serve on 127.0.0.1:{port} ({exc.strerror or exc}): pass another --port")


def _episode_bar(enabled: bool) -> tuple[Any, Callable[..., None]]:
    """A progress bar on stderr (off unless ``enabled``) and ``tick(key, done, total, em=None)``,
    which moves the bar's task ``key``, adding it the first time, and shows ``em``, the running
    EM of its finished episodes. Each task shows its count, elapsed time and time left."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[em]}"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not enabled,
    )
    tasks: dict[str, int] = {}

    def tick(key: str, done: int, total: int, em: float | None = None) -> None:
        shown_em = "EM  -   " if em is None else f"EM {em:.3f}"
        if key not in tasks:
            tasks[key] = bar.add_task(key, total=total, em=shown_em)
        bar.update(tasks[key], completed=done, em=shown_em)

    return bar, tick


def _read_prompt(path: Path | None) -> str | None:
    """The prompt template file's text; an unreadable file or one without ``{question}`` ends
    the command with the reason."""
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        _fail(f"cannot read --prompt {path}: {exc}")
    if "{question}" not in text:
        _fail(f"expected --prompt {path} to hold {{question}} where the question goes, got none")
    return text


def _evaluate_suite(ctx: typer.Context, given: Callable[[str], bool]) -> None:
    """``rag-gym evaluate --suite``: every dataset of a suite against one corpus, one table."""
    import shlex

    from rich.table import Table

    import rag_gym  # noqa: F401  (registers the envs)
    from rag_gym.baselines import make_agent, needs_lm
    from rag_gym.evaluate import RunInterrupted, sigterm_as_interrupt
    from rag_gym.evaluate.suite import SuiteConfig, SuiteError, cell_text, load_suite, run_suite

    p = ctx.params
    single = ("env", "split", "data_path", "k", "env_kwargs", "judge", "track")
    if p["suite"] is not None:
        wrong = [o for o in single if given(o)]
        if wrong:
            _fail(
                f"--{wrong[0].replace('_', '-')} has no meaning with --suite: the suite names its "
                "datasets, splits, k and metric (edit a copy of the suite file to change them)"
            )
    resume, from_run = p["resume"], p["from_run"]
    try:
        if resume is not None or from_run is not None:
            if p["suite"] is not None and given("suite"):
                raise SuiteError(
                    "expected --suite or a saved suite run (--resume/--from-run), got both"
                )
            source = resume if resume is not None else from_run
            lm_given = {name: p[name] for name in LM_OPTIONS if given(name)}
            if resume is not None:
                if lm_given:
                    raise SuiteError(
                        f"--{next(iter(lm_given)).replace('_', '-')} has no meaning with "
                        "--resume: a resumed suite keeps its LM options (rerun it with "
                        "--from-run to change them)"
                    )
                overrides = {"out_dir": str(resume.parent), "run_name": resume.name}
            else:
                overrides = {"out_dir": str(p["out"]), "run_name": p["run_name"], **lm_given}
            config = SuiteConfig.from_run(source, **overrides)
            if from_run is not None:
                from rag_gym.evaluate.suite import check_pins

                check_pins(config, from_run)
        else:
            retriever = p["retriever"]
            names = (
                None
                if p["datasets"] is None
                else tuple(x.strip() for x in p["datasets"].split(",") if x.strip())
            )
            prompt = _read_prompt(p["prompt"])
            config = SuiteConfig(
                suite=load_suite(p["suite"]),
                agents=tuple(a.strip() for a in p["agents"].split(",") if a.strip()),
                corpus=p["corpus"],
                index=p["index"],
                retriever=retriever,
                data_root=str(p["data_root"]),
                datasets=names,
                n=p["n"] if given("n") else None,
                seed=p["seed"],
                batch_size=p["batch_size"],
                prompt=prompt,
                prompt_file=None if p["prompt"] is None else str(p["prompt"]),
                **{name: p[name] for name in LM_OPTIONS},
                out_dir=str(p["out"]),
                run_name=p["run_name"],
            )
        from rag_gym.evaluate.config import EvalConfig

        EvalConfig(agents=config.agents)  # the agent names, checked before anything slow
    except (SuiteError, TypeError, ValueError, OSError) as exc:
        _fail(str(exc))
    lm = config.lm_spec or p["lm"] if not given("lm") else p["lm"]
    backend = None
    try:
        from rag_gym.generation.backends import make_lm

        if any(needs_lm(a) for a in config.agents):
            options = {name: getattr(config, name) for name in LM_OPTIONS}
            backend = make_lm(lm, seed=config.seed, **options)
            config.lm_spec = lm
    except (ImportError, FileNotFoundError, TypeError, ValueError) as exc:
        _fail(str(exc))
    bar, tick_key = _episode_bar(p["progress"])
    with bar:
        column = {"name": ""}

        def started(dataset) -> None:
            column["name"] = dataset.name

        def tick(agent: str, done: int, total: int, em: float | None = None) -> None:
            tick_key(f"{column['name']} · {agent}", done, total, em)

        try:
            with sigterm_as_interrupt():
                result = run_suite(
                    config,
                    lambda name, e: make_agent(
                        name, lm=backend, seed=config.seed, env=e, prompt=config.prompt
                    ),
                    progress=tick,
                    column_started=started,
                    lm_description=backend.describe() if backend else None,
                    command=" ".join(["rag-gym", *sys.argv[1:]]),
                    resume=resume is not None,
                    overwrite=p["overwrite"],
                )
        except RunInterrupted as exc:
            bar.stop()
            suite_dir = exc.run_dir.parent
            typer.secho(
                f"interrupted ({exc.reason}) in {exc.run_dir}; finished episodes are saved",
                fg=typer.colors.YELLOW,
                err=True,
            )
            typer.echo(
                f"resume with: {shlex.join(['rag-gym', 'evaluate', '--resume', str(suite_dir)])}",
                err=True,
            )
            raise typer.Exit(143 if exc.reason == "SIGTERM" else 130) from None
        except KeyboardInterrupt:
            typer.secho("interrupted before the run folder was written", err=True)
            raise typer.Exit(130) from None
        except (SuiteError, TypeError, ValueError, OSError, ImportError) as exc:
            _fail("\n".join([str(exc), *getattr(exc, "__notes__", [])]))
    names = [d.name for d in config.selected] + ["average"]
    table = Table(
        title=f"{config.suite.name} suite · {config.suite.metric.upper()} · k = "
        f"{config.suite.k} · seed {config.seed} · mean (95% interval)"
    )
    table.add_column("agent", justify="left")
    for name in names:
        n = next((r[name]["n"] for r in result.table.values() if name in r), None)
        table.add_column(name if n is None else f"{name} ({n})", justify="right")
    for agent, row in result.table.items():
        table.add_row(agent, *(cell_text(row.get(name)) for name in names))
    _console().print(table)
    typer.echo(f"results: {result.run_dir} (suite.md, suite.csv, suite.json)")


@app.command()
def compare(
    runs: Annotated[
        list[Path],
        typer.Argument(
            help="evaluate run folders holding the two agents; runs on different questions pool."
        ),
    ],
    a: Annotated[str, typer.Option("--a", help="Agent a (as in the leaderboard).")],
    b: Annotated[str, typer.Option("--b", help="Agent b, the reference.")],
    metrics: Annotated[
        str,
        typer.Option(
            help="Comma-separated episode metrics; refuse_unans and refuse_ans are the refusal "
            "rates on the unanswerable and the answerable questions."
        ),
    ] = "em,f1,recall,full_recall,searches",
    confidence: Annotated[float, typer.Option(help="Interval level.")] = 0.95,
    resamples: Annotated[int, typer.Option(help="Bootstrap resamples (1 to 1,000,000).")] = 10_000,
    seed: Annotated[int, typer.Option(help="Bootstrap seed.")] = 0,
    json_out: Annotated[
        Path | None,
        typer.Option("--json", help="Also write the comparison here (never a file of a run)."),
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing file at --json.")] = False,
    allow_mismatch: Annotated[
        bool,
        typer.Option(
            help="Pair episodes by question id alone, even across runs whose protocols differ "
            "(dataset, split, k...); the table lists the differences."
        ),
    ] = False,
) -> None:
    """Agent a against agent b, question by question (paired bootstrap intervals)."""
    import json

    from rag_gym.compare import CompareError, compare, comparison_markdown
    from rag_gym.evaluate.run_folder import OutputRefused, check_output, write_atomically
    from rag_gym.stats import MAX_RESAMPLES

    names = [m.strip() for m in metrics.split(",") if m.strip()]
    if not names:
        _fail(f"expected --metrics to name at least one metric (em,f1,...), got {metrics!r}")
    if not 1 <= resamples <= MAX_RESAMPLES:
        _fail(f"expected --resamples in 1..{MAX_RESAMPLES:,}, got {resamples}")
    if json_out is not None:
        if not json_out.parent.is_dir():
            _fail(
                f"expected --json in an existing folder, got {json_out} ({json_out.parent} is "
                "not a folder): create it, or pick another path"
            )
        try:
            check_output(json_out, runs, "--json", overwrite, ours=_is_comparison)
        except OutputRefused as exc:
            _fail(str(exc))
    try:
        result = compare(
            runs,
            a,
            b,
            metrics=names,
            confidence=confidence,
            n_resamples=resamples,
            seed=seed,
            allow_mismatch=allow_mismatch,
        )
    except CompareError as exc:
        _fail(str(exc))
    except ValueError as exc:  # bad confidence or resamples
        _fail(str(exc))
    typer.echo(comparison_markdown(result), nl=False)
    if json_out is not None:
        try:
            write_atomically(json_out, json.dumps(result, indent=2) + "\n")
        except OSError as exc:
            _fail(f"cannot write --json {json_out}: {exc}")
        typer.echo(f"wrote {json_out}")


def _is_comparison(path: Path) -> bool:
    """Whether ``path`` holds a comparison ``rag-gym compare --json`` wrote."""
    from rag_gym.traces import load_file

    try:
        if path.stat().st_size > 1 << 24:
            return False
        saved = load_file(path)
    except (OSError, ValueError):
        return False
    return isinstance(saved, dict) and {"a", "b", "metrics", "n_resamples"} <= saved.keys()


@app.command()
def agents() -> None:
    """List the agents (baselines and the papers' methods) and the shipped checkpoints."""
    from rich.table import Table

    from rag_gym.agents.provenance import read_record
    from rag_gym.agents.search_r1 import SHIPPED, checkpoint_path
    from rag_gym.baselines import AGENTS, agent_class

    table = Table(title="rag-gym agents")
    for col in ("name", "env", "needs an LM", "class"):
        table.add_column(col)
    for name in AGENTS:
        try:
            spec, cls = AGENTS.get(name), agent_class(name)
        except (
            ImportError,
            AttributeError,
            ValueError,
        ) as exc:  # a broken plugin: said, row by row
            table.add_row(name, "-", "-", f"cannot be loaded: {exc}")
            continue
        table.add_row(
            name,
            cls.env_kind,
            "yes" if spec.needs_lm else "no",
            f"{cls.__module__}.{cls.__qualname__}",
        )
    console = _console()
    console.print(table)
    shipped = Table(
        title="shipped checkpoints",
        caption="a training run of your own: --agents search_r1:RUN_DIR",
    )
    shipped.add_column("agent", no_wrap=True)  # whole, to copy into --agents
    shipped.add_column("base model", no_wrap=True)
    shipped.add_column("what it is", overflow="fold")
    for name in SHIPPED:
        try:
            meta = read_record(checkpoint_path(name) / "rag_gym.json") or {}
        except (FileNotFoundError, ValueError) as exc:  # a damaged install: said, not hidden
            shipped.add_row(f"search_r1:{name}", "-", str(exc))
            continue
        base = meta.get("base")
        what = str(meta.get("summary") or meta.get("name") or "-")
        if meta.get("env_id"):
            what += f" Trained on {meta['env_id']}."
        shipped.add_row(
            f"search_r1:{name}",
            "SmolLM2-135M (embedded)" if base == "embedded" else str(base or "-"),
            what,
        )
    console.print(shipped)


@app.command()
def envs() -> None:
    """List the registered rag-gym environments."""
    from rich.table import Table

    from rag_gym.envs.registration import ENTRIES, NAMESPACE

    table = Table(title="rag-gym environments")
    for col in ("id", "kind", "dataset", "max steps", "description"):
        table.add_column(col)
    for e in ENTRIES:
        steps = str(e.max_episode_steps) if e.max_episode_steps else "1 (one step)"
        table.add_row(f"{NAMESPACE}/{e.name}", e.kind, e.kwargs["dataset"], steps, e.description)
    _console().print(table)


def _console():
    from rich.console import Console

    console = Console()
    # piped output (CI logs, files) gets a fixed wide layout instead of rich's 80 columns
    return console if console.is_terminal else Console(width=200)


@app.command()
def synth(
    out: Annotated[Path, typer.Option(help="Output folder.")],
    preset: Annotated[str, typer.Option(help="World preset: default or hard.")] = "default",
    passages: Annotated[int | None, typer.Option(help="World size (passages).")] = None,
    seed: Annotated[int | None, typer.Option(help="World seed.")] = None,
    questions: Annotated[
        str | None,
        typer.Option(help="Questions per split as 'train,validation,test', e.g. 1000,200,200."),
    ] = None,
) -> None:
    """Write a SynthHop world (corpus.jsonl, train/validation/test.jsonl, config.json)."""
    import time

    from rag_gym.data.synthhop import world_for

    overrides: dict = {"n_passages": passages, "seed": seed}
    overrides = {key: val for key, val in overrides.items() if val is not None}
    if questions is not None:
        try:
            overrides["n_questions"] = tuple(int(x) for x in questions.split(","))
        except ValueError:
            _fail(
                f"expected --questions as three integers 'train,validation,test', got {questions!r}"
            )
    for above in (out, *out.parents):  # before the world is made: it takes a while
        if above.exists():
            if not above.is_dir():
                _fail(f"expected --out to be a folder, got {out}, where {above} is a file")
            break
    t0 = time.perf_counter()
    try:
        world = world_for(preset, **overrides)
    except (TypeError, ValueError) as exc:
        _fail(str(exc))
    try:
        path = world.save(out)
    except OSError as exc:
        _fail(f"cannot write the world to {out}: {exc}")
    sizes = ", ".join(f"{s} {len(q)}" for s, q in world.questions.items())
    typer.echo(
        f"wrote {len(world.corpus)} passages and questions ({sizes}) to {path} "
        f"in {time.perf_counter() - t0:.1f}s"
    )


index_app = typer.Typer(
    no_args_is_help=True, help="Build and inspect persistent retrieval indexes."
)
app.add_typer(index_app, name="index")


@index_app.command("build")
def index_build(
    out: Annotated[
        Path,
        typer.Option(
            help="Index directory to write, atomically; an existing one must be a rag-gym index "
            "(or empty) unless --force."
        ),
    ],
    corpus: Annotated[
        str | None, typer.Option(help="Corpus JSONL ({id, contents} or {id, title, text}).")
    ] = None,
    dataset: Annotated[
        str | None,
        typer.Option(
            help="Or dataset names, comma-separated: their split's passages pooled into one "
            "corpus (a suite's shared corpus from the samples' paragraphs)."
        ),
    ] = None,
    data_path: Annotated[
        str | None,
        typer.Option(help="The dataset files (with --dataset), comma-separated, one a dataset."),
    ] = None,
    split: Annotated[str, typer.Option(help="The split (with --dataset).")] = "validation",
    synthhop: Annotated[str | None, typer.Option(help="Or a SynthHop preset: its world.")] = None,
    kind: Annotated[str, typer.Option(help="bm25 or dense.")] = "bm25",
    model: Annotated[
        str | None, typer.Option(help="Dense encoder id or path (default: embedded MiniLM).")
    ] = None,
    force: Annotated[
        bool, typer.Option(help="Replace --out even if it is not a rag-gym index (deletes it).")
    ] = False,
    verify: Annotated[
        bool,
        typer.Option(
            help="Load the written index back, checking every file's full SHA-256 and every "
            "array's values."
        ),
    ] = False,
    memory: Annotated[
        str,
        typer.Option(
            help="BM25 from --corpus: the memory budget for postings ('4GB', '512MB'); the file "
            "is streamed and postings beyond the budget are spilled to disk, then merged."
        ),
    ] = "2GB",
    shards: Annotated[
        int | None,
        typer.Option(
            help="From --corpus: a sharded index of S consecutive passage ranges whose merged "
            "top-k equals one index (rag-gym serve --ray; docs/scale-out.md)."
        ),
    ] = None,
    ray: Annotated[
        str | None,
        typer.Option(
            help="With --shards: build the shards as tasks on this Ray cluster ('auto', "
            "HOST:PORT, or 'local' to start one here); default: one after another here."
        ),
    ] = None,
) -> None:
    """Build a BM25 or dense index over a corpus file, a dataset's passages or a SynthHop world."""
    from rag_gym.retrieval.persist import check_target

    if shards is not None or ray is not None:
        _index_build_sharded(
            out, corpus, dataset, synthhop, kind, model, force, memory, shards, ray
        )
        return
    try:  # before any work: never build for minutes, then refuse
        check_target(out, force)
    except FileExistsError as exc:
        _fail(str(exc))
    import time

    from rag_gym.data import Corpus, load, pooled_corpus

    sources = [x for x in (corpus, dataset, synthhop) if x is not None]
    if len(sources) != 1:
        _fail("expected exactly one of --corpus, --dataset and --synthhop")
    if kind not in ("bm25", "dense"):
        _fail(f"expected --kind bm25 or dense, got {kind!r}")
    t0 = time.perf_counter()
    if kind == "bm25" and corpus is not None:
        from rag_gym.data.types import iter_corpus_jsonl
        from rag_gym.retrieval.bm25_build import build_bm25_index, parse_memory

        try:
            budget = parse_memory(memory)
            path = build_bm25_index(
                (p for _, p in iter_corpus_jsonl(corpus)),
                out,
                memory=budget,
                corpus_name=Path(corpus).stem,
                force=force,
                source=corpus,
            )
            if verify:
                from rag_gym.retrieval.load import load_index

                load_index(path, verify=True)
        except (TypeError, ValueError, OSError, ImportError) as exc:
            _fail(str(exc))
        from rag_gym.retrieval.persist import read_params

        size = read_params(path)["corpus_size"]
        typer.echo(
            f"wrote a bm25 index of {size} passages to {path} in {time.perf_counter() - t0:.1f}s"
        )
        return
    try:
        if corpus is not None:
            passages = Corpus.from_jsonl(corpus)
        elif dataset is not None:
            names = [x.strip() for x in dataset.split(",")]
            paths: list[str | None] = (
                [None] * len(names)
                if data_path is None
                else [x.strip() for x in data_path.split(",")]
            )
            if len(paths) != len(names):
                _fail(
                    f"expected one --data-path a --dataset, got {len(names)} datasets and "
                    f"{len(paths)} paths"
                )
            examples = [
                ex for n, p in zip(names, paths, strict=True) for ex in load(n, split, path=p)
            ]
            passages, _ = pooled_corpus(examples, name=f"{'+'.join(names)}-{split}")
        else:
            from rag_gym.data.synthhop import world_for

            passages = world_for(synthhop).corpus
        if kind == "bm25":
            from rag_gym.retrieval import BM25Retriever

            retriever = BM25Retriever(passages, show_progress=True)
        else:
            from rag_gym.retrieval.dense import DenseConfig, DenseRetriever

            retriever = DenseRetriever(passages, DenseConfig(model=model), show_progress=True)
        path = retriever.save(out, force=force)
        if verify:
            from rag_gym.retrieval import load_index

            load_index(path, verify=True)
    except (TypeError, ValueError, OSError, ImportError) as exc:
        _fail(str(exc))
    typer.echo(
        f"wrote a {kind} index of {len(passages)} passages to {path} in {time.perf_counter() - t0:.1f}s"
    )


def _index_build_sharded(
    out: Path,
    corpus: str | None,
    dataset: str | None,
    synthhop: str | None,
    kind: str,
    model: str | None,
    force: bool,
    memory: str,
    shards: int | None,
    ray: str | None,
) -> None:
    """``rag-gym index build --shards S [--ray ADDRESS]``."""
    import time

    if shards is None:
        _fail("--ray builds a sharded index: give --shards S too")
    if corpus is None or dataset is not None or synthhop is not None:
        _fail(
            "a sharded index is built from a corpus file: give --corpus FILE (not --dataset or --synthhop)"
        )
    if kind not in ("bm25", "dense"):
        _fail(f"expected --kind bm25 or dense, got {kind!r}")
    from rag_gym.retrieval.shards import build_bm25_shards, build_dense_shards, local_map

    t0 = time.perf_counter()
    try:
        map_fn = local_map
        if ray is not None:
            from rag_gym.retrieval.ray_shards import ray_map

            map_fn = ray_map(ray)
        if kind == "bm25":
            path = build_bm25_shards(corpus, out, shards, memory=memory, force=force, map_fn=map_fn)
        else:
            from rag_gym.retrieval.dense import DenseConfig

            path = build_dense_shards(
                corpus, out, shards, DenseConfig(model=model), force=force, map_fn=map_fn
            )
    except (TypeError, ValueError, OSError, ImportError, ConnectionError) as exc:
        _fail(str(exc))
    from rag_gym.retrieval.shards import read_shards

    manifest = read_shards(path)
    typer.echo(
        f"wrote a {kind} index of {manifest['corpus_size']} passages in {shards} shards to "
        f"{path} in {time.perf_counter() - t0:.1f}s"
    )


@app.command()
def serve(
    index: Annotated[
        str | None,
        typer.Option(
            help="An index directory (rag-gym index build), or an OpenSearch or Elasticsearch "
            "index to search in place (opensearch+http://127.0.0.1:9200/wiki18)."
        ),
    ] = None,
    faiss_index: Annotated[
        Path | None,
        typer.Option(
            help="Or a FAISS index file written by faiss.write_index (FlashRAG, Search-R1's "
            "e5_Flat.index); needs --corpus and --encoder."
        ),
    ] = None,
    corpus: Annotated[
        Path | None,
        typer.Option(
            help="The {id, contents} corpus JSONL: with --faiss-index, one row per vector; with "
            "--index, the file it was built from, to serve its contents verbatim."
        ),
    ] = None,
    encoder: Annotated[
        str | None,
        typer.Option(
            help="Query encoder for --faiss-index: a sentence-transformers id or path "
            "(e5/bge get their query prefixes); 'minilm' is the embedded all-MiniLM-L6-v2."
        ),
    ] = None,
    host: Annotated[
        str, typer.Option(help="Address to bind; 127.0.0.1 keeps it local.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8000,
    token: Annotated[
        str | None,
        typer.Option(
            help="Bearer token (default: $RAG_GYM_TOKEN; none if unset or empty). Whitespace "
            "around it (a pasted space, a newline) is stripped with a warning."
        ),
    ] = None,
    max_queries: Annotated[int, typer.Option(help="Most queries per request.")] = 4096,
    max_topk: Annotated[int, typer.Option(help="Largest topk.")] = 100,
    head_timeout: Annotated[
        float, typer.Option(help="Seconds a request head may take (then the connection closes).")
    ] = 10.0,
    body_timeout: Annotated[
        float, typer.Option(help="Seconds a request body may take (then 408).")
    ] = 30.0,
    max_connections: Annotated[
        int, typer.Option(help="Open connections and requests in progress (then 503).")
    ] = 1024,
    batch_window_ms: Annotated[
        float,
        typer.Option(
            help="How long an idle server waits for more requests to batch (a busy one batches "
            "what queues while it retrieves)."
        ),
    ] = 0.0,
    ray: Annotated[
        str | None,
        typer.Option(
            help="Serve a sharded --index from replicas on this Ray cluster ('auto', HOST:PORT, "
            "ray://HOST:PORT, or 'local' to start one here); this process routes and merges."
        ),
    ] = None,
    shards: Annotated[
        int | None,
        typer.Option(help="With --ray: the shard count the index must have (checked)."),
    ] = None,
    replicas: Annotated[
        int, typer.Option(help="With --ray: replicas of each shard (throughput and failover).")
    ] = 1,
    cpus_per_replica: Annotated[
        float, typer.Option(help="With --ray: CPUs Ray reserves for each replica.")
    ] = 1.0,
) -> None:
    """Serve an index over HTTP (Search-R1's /retrieve API, micro-batched)."""

    from rag_gym.retrieval import load_index
    from rag_gym.retrieval.base import corpus_size
    from rag_gym.retrieval.persist import IndexWatch, read_params
    from rag_gym.retrieval.search_engine import SearchEngineRetriever, is_engine_url
    from rag_gym.retrieval.server import ServerLimits, VerbatimContents, create_app, run_server
    from rag_gym.retrieval.shards import ShardedRetriever, is_sharded, read_shards

    if (index is None) == (faiss_index is None):
        _fail("give --index DIR (rag-gym index build) or --faiss-index FILE, one of them")
    if faiss_index is not None and (corpus is None or encoder is None):
        _fail("--faiss-index needs --corpus (its {id, contents} JSONL) and --encoder (its model)")
    if faiss_index is None and encoder is not None:
        _fail("--encoder goes with --faiss-index (an index directory names its own encoder)")
    if is_engine_url(index) and corpus is not None:
        _fail("--corpus goes with an index directory (a cluster's index serves its own passages)")
    try:
        limits = ServerLimits(
            max_queries=max_queries,
            max_topk=max_topk,
            head_timeout=head_timeout,
            body_timeout=body_timeout,
            max_connections=max_connections,
        )
        index_id = None  # a random one per start: another index, as far as clients can tell
        watch = None
        if ray is None and (shards is not None or replicas != 1):
            _fail("--shards and --replicas go with --ray (a sharded index served on Ray)")
        if ray is not None:
            from rag_gym.retrieval.ray_shards import RayShardedRetriever

            if corpus is not None:
                _fail("--corpus goes with an unsharded index directory, not with --ray")
            if index is None or is_engine_url(index) or not is_sharded(index):
                _fail(
                    "--ray serves a sharded index folder: give --index DIR built by "
                    "rag-gym index build --shards S"
                )
            retriever = RayShardedRetriever(
                index, shards=shards, replicas=replicas, address=ray,
                cpus_per_replica=cpus_per_replica,
            )  # fmt: skip
            kind, source = retriever.manifest["kind"], f"{index} ({retriever!r})"
            index_id = retriever.manifest["manifest_sha256"][:16]
        elif faiss_index is not None:
            from rag_gym.retrieval.dense import DenseRetriever

            retriever = DenseRetriever.from_faiss(
                faiss_index, corpus, None if encoder == "minilm" else encoder
            )
            kind, source = "dense", faiss_index
        elif is_engine_url(index):
            retriever = SearchEngineRetriever(index)
            kind, source = retriever.flavor, retriever.url
        elif is_sharded(index):  # every shard in this process (--ray spreads them)
            retriever = ShardedRetriever.load(index)
            manifest = read_shards(index)
            kind, source = manifest["kind"], f"{index} ({retriever!r})"
            index_id = manifest["manifest_sha256"][:16]
            watch = IndexWatch(index)
        else:
            retriever, kind = load_index(str(index))
            source = index
            index_id = read_params(index)["params_sha256"][:16]
            watch = IndexWatch(index)  # files changed in place: 503 and a log line, not SIGBUS
        contents = VerbatimContents.from_jsonl(corpus, retriever.corpus) if corpus else None
        token = _token_option(token)
        app_ = create_app(
            retriever,
            token=token,
            limits=limits,
            batch_window_ms=batch_window_ms,
            kind=kind,
            contents=contents,
            index_id=index_id,
            watch=watch,
        )
    except (ValueError, TypeError, ImportError, OSError, RuntimeError) as exc:
        _fail(str(exc))
    typer.echo(
        f"serving {kind} index {source} ({corpus_size(retriever)} passages) on http://{host}:{port}"
    )
    run_server(app_, host=host, port=port, limits=limits)


train_app = typer.Typer(
    no_args_is_help=True,
    help="Train a search policy: SFT cold start on expert transcripts, then GRPO/DAPO.",
)
app.add_typer(train_app, name="train")

openenv_app = typer.Typer(
    no_args_is_help=True,
    help="Serve rag-gym envs through OpenEnv (needs the openenv extra).",
)
app.add_typer(openenv_app, name="openenv")


@openenv_app.command("serve")
def openenv_serve(
    env: Annotated[str, typer.Option(help="A registered id, e.g. rag_gym/SynthHop-v0.")],
    reward_preset: Annotated[
        str | None, typer.Option(help="A reward preset (evo_rag, eval_rar, ...).")
    ] = None,
    reward_kwargs: Annotated[
        str | None, typer.Option(help="The preset's options as a JSON object.")
    ] = None,
    env_kwargs: Annotated[
        str | None, typer.Option(help='gym.make keyword arguments as a JSON object ({"k": 5}).')
    ] = None,
    tags: Annotated[
        str | None,
        typer.Option(
            help="Default tag preset of the text form (search_r1, eval_rar, ...); "
            "unset: episodes play the Dict form unless reset with tags=."
        ),
    ] = None,
    host: Annotated[
        str, typer.Option(help="Address to bind; 127.0.0.1 keeps it local.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8000,
    token: Annotated[
        str | None,
        typer.Option(
            help="Token every request needs (default: $RAG_GYM_TOKEN; none if unset or empty)."
        ),
    ] = None,
    max_sessions: Annotated[int, typer.Option(help="Most WebSocket sessions at once.")] = 64,
) -> None:
    """Serve one env id over OpenEnv's WebSocket protocol (one env per session, one shared index)."""

    try:
        from rag_gym.integrations.openenv_server import ServerConfig, _import_openenv
        from rag_gym.integrations.openenv_server import serve as run

        _import_openenv()  # ImportError naming the extra, before anything is loaded

        config = ServerConfig(
            env_id=env,
            reward_preset=reward_preset,
            reward_kwargs=_json_option(reward_kwargs, "--reward-kwargs"),
            env_kwargs=_json_option(env_kwargs, "--env-kwargs"),
            tags=tags,
            max_concurrent_envs=max_sessions,
            token=_token_option(token),
        )
    except (TypeError, ValueError, ImportError) as exc:
        _fail(str(exc))
    typer.echo(
        f"serving {env} over OpenEnv on ws://{host}:{port}/ws (up to {max_sessions} sessions)",
        err=True,
    )
    try:
        run(config, host=host, port=port)
    except (TypeError, ValueError, OSError, ImportError) as exc:
        _fail(str(exc))


def _token_option(token: str | None) -> str | None:
    """``--token``, else ``$RAG_GYM_TOKEN``, as a server compares it
    (:func:`~rag_gym.retrieval.http.clean_token`: ``None`` for none, whitespace around it
    stripped with a warning printed here, a ``ValueError`` for one no header can carry)."""
    import os
    import warnings

    from rag_gym.retrieval.http import clean_token

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cleaned = (
            clean_token(token, "--token")
            if token is not None
            else clean_token(os.environ.get("RAG_GYM_TOKEN"), "$RAG_GYM_TOKEN")
        )
    for warning in caught:
        typer.secho(f"warning: {warning.message}", fg=typer.colors.YELLOW, err=True)
    return cleaned


def _json_option(value: str | None, name: str) -> dict:
    """The JSON object an option gives; anything else (invalid JSON, another JSON value, JSON
    too deep to parse or with an integer over 4,300 digits) fails naming the option."""
    import json

    from rag_gym.train.options import parse_json_text

    if value is None:
        return {}
    shown = repr(value) if len(value) <= 200 else repr(value[:200]) + f" (... {len(value)} chars)"
    try:
        parsed = parse_json_text(name, value)
    except json.JSONDecodeError as exc:
        _fail(f"expected {name} to be a JSON object, got {shown} ({exc})")
    except ValueError as exc:
        _fail(str(exc))
    if not isinstance(parsed, dict):
        _fail(f"expected {name} to be a JSON object, got {shown}")
    return parsed


def _run_dir(out: Path, run_name: str | None, env: str, stage: str, seed: int) -> Path:
    """``out/run_name``, by default named as every run folder is (:func:`rag_gym._names.run_name`);
    an existing folder that holds anything is refused."""
    from rag_gym._names import run_name as default_name

    name = run_name or default_name(env, stage, seed)
    path = out / name
    if path.exists() and any(path.iterdir()):
        _fail(f"expected a new run folder, got existing {path}: pick another --run-name")
    return path


#: the options ``train sft`` and ``train pipeline`` share (what the transcripts are made from)
_TrainEnvOption = Annotated[
    str,
    typer.Option(
        help="A search env id: SynthHop, or HotpotQA / 2WikiMultiHopQA / MuSiQue with "
        "--data-path; several, comma-separated, are mixed (RL plays the first)."
    ),
]
_TrainModelOption = Annotated[
    str,
    typer.Option(
        help="Base model: embedded, a .gguf file (dequantised once), a hub id or a model folder "
        "(what --lm takes), or tiny (smoke tests)."
    ),
]
_TrainTemplateOption = Annotated[
    str | None,
    typer.Option(
        help="Chat template of the transcripts, for a base model without one (or to replace "
        "its own): chatml, gemma, llama3 or a Jinja template file (default: the model's own; "
        "from --init, the one that run recorded)."
    ),
]


_DataPathOption = Annotated[
    str | None,
    typer.Option(
        help="Dataset file or folder of a real-data env (one per --env id, comma-separated)."
    ),
]
_SplitByIdOption = Annotated[
    bool,
    typer.Option(
        help="Split real-data files by question id (50/10/40 train/validation/test): train on "
        "the train share (the pipeline tests on the test share)."
    ),
]
_SynthHopRatioOption = Annotated[
    float,
    typer.Option(
        help="Share of SynthHop transcripts mixed into real-data ones (0.25: one per three)."
    ),
]


@train_app.command("sft")
def train_sft(
    ctx: typer.Context,
    env: _TrainEnvOption = _SFT.env_id,
    env_kwargs: Annotated[
        str | None, typer.Option(help="More gym.make kwargs as a JSON object.")
    ] = None,
    data_path: _DataPathOption = _SFT.data_path,
    split_by_id: _SplitByIdOption = _SFT.split_by_id,
    synthhop_ratio: _SynthHopRatioOption = _SFT.synthhop_ratio,
    tags: Annotated[str, typer.Option(help="TextActions tag preset.")] = _SFT.tags,
    demos: Annotated[
        int, typer.Option(help="Expert demonstrations per env (train split; 0: all of it).")
    ] = _SFT.n_demos,
    joint_rate: Annotated[
        float,
        typer.Option(
            help="Share of comparison demonstrations that search both names in one query."
        ),
    ] = _SFT.joint_rate,
    confirm_rate: Annotated[
        float,
        typer.Option(
            help="Share of demonstrations that search the last fact once more before "
            "answering (a redundant search a step cost can remove)."
        ),
    ] = _SFT.confirm_rate,
    style: Annotated[
        str,
        typer.Option(
            help="How SynthHop demonstrations read a search's results: plain, title_list (the "
            "titles listed against the entity searched first) or title_verdicts (each title "
            "marked (yes) or (no))."
        ),
    ] = _SFT.style,
    model: _TrainModelOption = _SFT.model,
    chat_template: _TrainTemplateOption = _SFT.chat_template,
    lora: Annotated[bool, typer.Option(help="LoRA adapters (else all weights).")] = _SFT.lora,
    lr: Annotated[float, typer.Option(help="Peak learning rate.")] = _SFT.learning_rate,
    epochs: Annotated[float, typer.Option(help="Passes over the demonstrations.")] = _SFT.epochs,
    max_steps: Annotated[
        int, typer.Option(help="Optimiser steps (-1: from --epochs).")
    ] = _SFT.max_steps,
    batch_size: Annotated[int, typer.Option(help="Transcripts per step.")] = _SFT.batch_size,
    micro_batch_size: Annotated[
        int, typer.Option(help="Transcripts per forward pass (memory grows with it).")
    ] = _SFT.micro_batch_size,
    max_length: Annotated[
        int,
        typer.Option(
            help="Longest transcript in tokens; longer ones are dropped (counted in results.json)."
        ),
    ] = _SFT.max_length,
    eval_n: Annotated[
        int, typer.Option(help="Held-out (validation) questions for EM.")
    ] = _SFT.eval_n,
    eval_before: Annotated[
        bool, typer.Option(help="Also evaluate the untrained model.")
    ] = _SFT.eval_before,
    seed: Annotated[int, typer.Option()] = _SFT.seed,
    out: Annotated[Path, typer.Option(help="Parent folder of the run folder.")] = Path("runs"),
    run_name: Annotated[str | None, typer.Option(help="Run folder name.")] = None,
    track: Annotated[bool, typer.Option(help="Log to W&B (offline).")] = _SFT.track,
) -> None:
    """Supervised cold start on expert transcripts: SynthHop's decompositions, or the
    annotations of HotpotQA, 2WikiMultiHopQA and MuSiQue."""
    from rag_gym.train.sft import train

    run_dir = _run_dir(out, run_name, env.split(",")[0], "sft", seed)
    try:
        cfg = SFTConfig(
            **{
                **_fields("train sft", SFTConfig, ctx.params),
                "env_kwargs": _json_option(env_kwargs, "--env-kwargs"),
                "n_demos": demos or None,  # 0: the whole split
                "run_dir": str(run_dir),
            }
        )
    except (TypeError, ValueError) as exc:
        _fail(str(exc))
    results = train(cfg)
    for row in (results.get("data") or {}).get("expert", []):
        typer.echo(f"expert transcripts: {row}")
    typer.echo(f"held-out EM before: {_em(results['before'])}, after: {_em(results['after'])}")
    typer.echo(f"checkpoint: {results['checkpoint']}")
    typer.echo(f"results: {run_dir}")


def _dynamic_sampling(choice: str) -> dict[str, Any]:
    """``--dynamic-sampling`` as EnvGRPOConfig fields."""
    if choice == "auto":
        return {}
    if choice == "off":
        return {"dynamic_sampling": False}
    if choice in ("return", "answer", "unsolved"):
        return {"dynamic_sampling": True, "dynamic_sampling_on": choice}
    raise ValueError(
        f"expected --dynamic-sampling to be auto, off, return, answer or unsolved, got {choice!r}"
    )


def _em(stats: dict | None) -> str:
    return "-" if not stats else f"{stats['em']:.3f} ({int(stats['n'])} questions)"


@train_app.command("grpo")
def train_grpo(
    ctx: typer.Context,
    init: Annotated[
        Path | None,
        typer.Option(help="Start from this SFT run folder (its final/ adapter) or adapter folder."),
    ] = None,
    env: Annotated[str, typer.Option(help="Registered env id.")] = _GRPO.env_id,
    env_kwargs: Annotated[
        str | None, typer.Option(help="More gym.make kwargs as a JSON object.")
    ] = None,
    data_path: Annotated[
        str | None,
        typer.Option(help="Dataset file or folder of a real-data env (the env's data_path)."),
    ] = None,
    split_by_id: Annotated[
        bool,
        typer.Option(
            help="Split the data file by question id (50/10/40 train/validation/test) and train "
            "on the train share, as train sft --split-by-id does."
        ),
    ] = False,
    tags: Annotated[
        str | None,
        typer.Option(
            help="TextActions tag preset (default: the reward preset's own, else search_r1)."
        ),
    ] = _GRPO.tags,
    reward_preset: Annotated[
        str, typer.Option(help="Reward preset (none: the env's reward, EM).")
    ] = _GRPO.reward_preset,
    algorithm: Annotated[str, typer.Option(help="grpo or dapo.")] = _GRPO.algorithm,
    steps: Annotated[int, typer.Option(help="Optimiser steps.")] = _GRPO.max_steps,
    num_generations: Annotated[
        int, typer.Option(help="Episodes per question (G).")
    ] = _GRPO.num_generations,
    prompts_per_step: Annotated[
        int, typer.Option(help="Questions per step.")
    ] = _GRPO.prompts_per_step,
    balance_answerable: Annotated[
        bool,
        typer.Option(
            help="Half of every step's questions answerable, half unanswerable (an even "
            "--prompts-per-step; a world with both kinds): with --refusal, no step's mix of "
            "kinds alone sets the refusal bias."
        ),
    ] = _GRPO.balance_answerable,
    unanswerable_per_step: Annotated[
        int | None,
        typer.Option(
            help="Exactly this many of every step's questions unanswerable, the rest answerable "
            "(1 to --prompts-per-step - 1; a world with both kinds): with --refusal, a mix "
            "that does not push the refusal bias either way (docs/training.md)."
        ),
    ] = _GRPO.unanswerable_per_step,
    micro_batch_size: Annotated[
        int | None,
        typer.Option(
            help="Episodes per forward/backward pass (memory grows with it; default: 1 on a "
            "CPU, the whole step on a GPU)."
        ),
    ] = _GRPO.micro_batch_size,
    lr: Annotated[float, typer.Option(help="Learning rate.")] = _GRPO.learning_rate,
    warmup_steps: Annotated[
        int,
        typer.Option(
            help="Steps of linear learning-rate warmup from 0 (0: the full rate at once; "
            "Adam's first step moves every weight by about the rate, whatever one group says)."
        ),
    ] = _GRPO.warmup_steps,
    max_completion_tokens: Annotated[
        int,
        typer.Option(
            help="Model + env tokens per episode (past it the episode is cut, unfinished): "
            "SynthHop-Hard's refusals after two misses need more than the default."
        ),
    ] = _GRPO.max_completion_tokens,
    beta: Annotated[float, typer.Option(help="KL coefficient.")] = _GRPO.beta,
    temperature: Annotated[
        float, typer.Option(help="Sampling temperature of the rollouts.")
    ] = _GRPO.temperature,
    step_cost: Annotated[float, typer.Option(help="EVO-RAG step cost weight.")] = _GRPO.step_cost,
    refusal: Annotated[
        float, typer.Option(help="EVO-RAG refusal reward weight (the paper's 0.5; 0: off).")
    ] = _GRPO.refusal,
    refusal_verifier: Annotated[
        str,
        typer.Option(
            help="Who judges a refusal: 'answerable' (the env's ground truth: refusing an "
            "answerable question is -1) or 'evidence' (the gold passages retrieved so far, "
            "which pays for refusing before searching)."
        ),
    ] = _GRPO.refusal_verifier,
    judge: Annotated[
        str | None,
        typer.Option(
            help="An LLM judge's backend spec (llama_cpp, openai:model@url): its yes on an "
            "answer the env scores below 1 is a reward term (JudgedAnswerReward)."
        ),
    ] = _GRPO.judge,
    judge_weight: Annotated[
        float, typer.Option(help="The judge term's weight.")
    ] = _GRPO.judge_weight,
    dynamic_sampling: Annotated[
        str,
        typer.Option(
            help="Refill groups that teach nothing: 'return' (returns all equal), 'answer' "
            "(answers all right or all wrong, DAPO's eq. 11), 'unsolved' (answers all wrong: "
            "use it with --step-cost), 'off', or 'auto' (return for dapo, off for grpo)."
        ),
    ] = "auto",
    model: _TrainModelOption = _GRPO.model,
    chat_template: _TrainTemplateOption = _GRPO.chat_template,
    eval_n: Annotated[int, typer.Option(help="Held-out (validation) questions for EM.")] = 100,
    save_steps: Annotated[
        int, typer.Option(help="Checkpoint every this many steps.")
    ] = _GRPO.save_steps,
    max_minutes: Annotated[
        float | None,
        typer.Option(
            help="Stop (and save) after the first step that ends this many minutes into "
            "training; --steps still sets the learning-rate schedule."
        ),
    ] = _GRPO.max_minutes,
    gradient_checkpointing: Annotated[
        bool,
        typer.Option(
            help="Recompute activations in the backward pass: less memory, about a third more "
            "compute (off: a 135M policy does not need it)."
        ),
    ] = _GRPO.gradient_checkpointing,
    resume: Annotated[
        Path | None,
        typer.Option(
            help="Go on with this stopped run from its newest checkpoint, with its own options "
            "(every other option is ignored)."
        ),
    ] = None,
    seed: Annotated[int, typer.Option()] = _GRPO.seed,
    out: Annotated[Path, typer.Option(help="Parent folder of the run folder.")] = Path("runs"),
    run_name: Annotated[str | None, typer.Option(help="Run folder name.")] = None,
    track: Annotated[bool, typer.Option(help="Log to W&B (offline).")] = _GRPO.track,
) -> None:
    """GRPO/DAPO in the env, optionally from an SFT checkpoint (--init)."""
    from rag_gym.train.grpo import resume_config, train_from

    try:
        if resume is not None:
            cfg, init, eval_n = resume_config(resume)
        else:
            extra = _json_option(env_kwargs, "--env-kwargs")
            if data_path is not None:
                extra["data_path"] = data_path
            if split_by_id:
                extra["dataset_kwargs"] = {**extra.get("dataset_kwargs", {}), "split_by_id": True}
            cfg = EnvGRPOConfig(
                **_fields("train grpo", EnvGRPOConfig, ctx.params),
                env_kwargs=extra,
                **_dynamic_sampling(dynamic_sampling),
                run_dir=str(_run_dir(out, run_name, env, algorithm, seed)),
            )
        results = train_from(cfg, init=init, eval_n=eval_n)
    except (TypeError, ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    typer.echo(f"held-out EM before: {_em(results['before'])}, after: {_em(results['after'])}")
    typer.echo(f"checkpoint: {results['checkpoint']}")
    typer.echo(f"results: {cfg.run_dir}")


@train_app.command("pipeline")
def train_pipeline(
    ctx: typer.Context,
    env: _TrainEnvOption = _SFT.env_id,
    env_kwargs: Annotated[
        str | None, typer.Option(help="More gym.make kwargs as a JSON object.")
    ] = None,
    data_path: _DataPathOption = _SFT.data_path,
    split_by_id: _SplitByIdOption = _SFT.split_by_id,
    synthhop_ratio: _SynthHopRatioOption = _SFT.synthhop_ratio,
    max_length: Annotated[
        int, typer.Option(help="SFT: longest transcript in tokens (longer ones are dropped).")
    ] = _SFT.max_length,
    tags: Annotated[str, typer.Option(help="TextActions tag preset.")] = _SFT.tags,
    demos: Annotated[
        int, typer.Option(help="SFT: expert demonstrations per env (train split; 0: all).")
    ] = _SFT.n_demos,
    model: _TrainModelOption = _SFT.model,
    chat_template: _TrainTemplateOption = _SFT.chat_template,
    sft_lr: Annotated[
        float, typer.Option(help="SFT: peak learning rate (LoRA).")
    ] = _SFT.learning_rate,
    algorithm: Annotated[str, typer.Option(help="RL: grpo or dapo.")] = _PIPELINE.algorithm,
    steps: Annotated[
        int, typer.Option(help="RL steps (0: ship the SFT adapter).")
    ] = _PIPELINE.grpo_steps,
    lr: Annotated[float, typer.Option(help="RL: learning rate.")] = _PIPELINE.grpo_learning_rate,
    num_generations: Annotated[
        int, typer.Option(help="RL: episodes per question (G).")
    ] = _PIPELINE.num_generations,
    prompts_per_step: Annotated[
        int, typer.Option(help="RL: questions per step.")
    ] = _PIPELINE.prompts_per_step,
    step_cost: Annotated[
        float, typer.Option(help="RL: EVO-RAG step cost weight.")
    ] = _PIPELINE.step_cost,
    refusal: Annotated[
        float, typer.Option(help="RL: EVO-RAG refusal reward weight (0: off).")
    ] = _PIPELINE.refusal,
    refusal_verifier: Annotated[
        str,
        typer.Option(
            help="RL: who judges a refusal: 'answerable' (the env's ground truth: refusing an "
            "answerable question is -1) or 'evidence' (the gold passages retrieved so far, "
            "which pays for refusing before searching)."
        ),
    ] = _PIPELINE.refusal_verifier,
    eval_n: Annotated[
        int,
        typer.Option(help="Validation questions for each stage's EM (transformers; 0: none)."),
    ] = 0,
    test_n: Annotated[
        int, typer.Option(help="Test questions for the final llama.cpp evaluation (0: none).")
    ] = _PIPELINE.test_n,
    seed: Annotated[int, typer.Option()] = _SFT.seed,
    out: Annotated[Path, typer.Option(help="Parent folder of the run folder.")] = Path("runs"),
    run_name: Annotated[str | None, typer.Option(help="Run folder name.")] = None,
    track: Annotated[bool, typer.Option(help="Log to W&B (offline).")] = _SFT.track,
) -> None:
    """SFT cold start, GRPO/DAPO from it, the shipped checkpoint, and its test evaluation."""
    import shlex
    import sys
    import time

    from rag_gym.train.pipeline import train_and_ship, write_report

    root = _run_dir(out, run_name, env.split(",")[0], "pipeline", seed)
    try:
        pipeline = PipelineConfig(**_fields("train pipeline", PipelineConfig, ctx.params))
        sft_cfg = SFTConfig(
            **{
                **_fields("train pipeline", SFTConfig, ctx.params),
                "env_kwargs": _json_option(env_kwargs, "--env-kwargs"),
                "n_demos": demos or None,  # 0: the whole split
                "eval_n": eval_n,
                "eval_before": False,
                "run_dir": str(root / "sft"),
            }
        )
    except (TypeError, ValueError) as exc:
        _fail(str(exc))
    command = "rag-gym " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    started = time.perf_counter()
    report = train_and_ship(sft_cfg, pipeline, root, command)
    if report["checkpoint"] and test_n:
        from rag_gym.evaluate import evaluate_checkpoint

        t0 = time.perf_counter()
        sources = sft_cfg.sources()
        for env_id, kwargs in sources:  # each env's test split, in a run folder of its own
            name = "test" if len(sources) == 1 else f"test-{env_id.split('/')[-1]}"
            row = evaluate_checkpoint(
                report["checkpoint"], env_id, test_n, root, name, seed=seed, env_kwargs=kwargs
            )
            report.setdefault("tests", {})[env_id] = row
            typer.echo(f"{env_id} test ({test_n} questions, llama.cpp): EM {row['em']:.3f}")
        report["test"] = report["tests"][sources[0][0]]
        report["seconds"]["test"] = round(time.perf_counter() - t0, 1)
    report["seconds"]["total"] = round(time.perf_counter() - started, 1)
    write_report(root, report)
    minutes = {k: f"{v / 60:.1f} min" for k, v in report["seconds"].items()}
    typer.echo(f"wall time: {minutes}")
    typer.echo(f"results: {root / 'results.json'}")


@train_app.command("export")
def train_export(
    adapter: Annotated[Path, typer.Argument(help="A PEFT LoRA adapter folder (or SFT/GRPO run).")],
    out: Annotated[
        Path | None, typer.Option(help="GGUF file (default: ADAPTER/adapter.gguf).")
    ] = None,
    base: Annotated[
        str | None,
        typer.Option(
            help="The base model the adapter goes on in llama.cpp: its .gguf file, 'embedded' "
            "or a model folder (default: the one the run recorded)."
        ),
    ] = None,
) -> None:
    """Convert a LoRA adapter to a llama.cpp GGUF adapter for its base model's architecture
    (for --lm llama_cpp:BASE.gguf and search_r1:RUN)."""
    from rag_gym.agents.provenance import recorded_base
    from rag_gym.generation.adapters import AdapterError, lora_to_gguf, resolve_adapter
    from rag_gym.generation.llama_cpp import embedded_gguf_path

    try:
        folder = resolve_adapter(adapter)
        base = base or recorded_base(adapter)
        where = embedded_gguf_path() if base == "embedded" else base
        path = lora_to_gguf(folder, out, base=where)
    except (AdapterError, FileNotFoundError) as exc:
        _fail(str(exc))
    typer.echo(f"wrote {path} (for {base or 'the base the adapter names'})")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
