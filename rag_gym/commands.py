"""The work of the ``rag-gym`` commands: ``rag_gym.cli`` declares their options and wires them
here. ``evaluate`` on one env: the config from the options (new, resumed or replayed), the
backends, the run, and what is printed after it; on a suite; ``compare``; the listings."""

from __future__ import annotations

import shlex
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from rag_gym._options import Options
from rag_gym.evaluate import EvalConfig, EvalRunner

#: the options of ``rag-gym evaluate``: the run's config, and how it is run
RUN_OPTIONS = Options(
    EvalConfig,
    flags={"env_id": "env", "lm_spec": "lm", "out_dir": "out"},
    exclude=frozenset({"prompt"}),  # --prompt is a file, whose text is the field
)
RUNNER_OPTIONS = Options(EvalRunner)

#: the options that set a config's LLM backend (fields of those names)
LM_OPTIONS = ("n_ctx", "max_new_tokens", "temperature", "chat_template")


def fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def lm_options(config: Any) -> dict[str, Any]:
    """The LM options of a config, as :func:`~rag_gym.generation.backends.make_lm` takes them."""
    return {name: getattr(config, name) for name in LM_OPTIONS}


def read_prompt(path: Path | None) -> str | None:
    """The prompt template file's text; an unreadable file or one without ``{question}`` ends
    the command with the reason."""
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read --prompt {path}: {exc}")
    if "{question}" not in text:
        fail(f"expected --prompt {path} to hold {{question}} where the question goes, got none")
    return text


def _retriever_alias(run: dict[str, Any]) -> None:
    """``--retriever DIR``, the deprecated alias of ``--index DIR``, moved to ``index``."""
    retriever = run["retriever"]
    from rag_gym._http import is_server_url

    if retriever is None or is_server_url(retriever):
        return
    typer.secho(
        "warning: --retriever is deprecated: use --index DIR (a saved index directory, the "
        "env's index=; the env's retriever= is a server URL or a retriever object)",
        fg=typer.colors.YELLOW,
        err=True,
    )
    if run["index"] is not None and run["index"] != retriever:
        fail(
            f"expected one index directory, got --index {run['index']} and --retriever {retriever}"
        )
    run["index"], run["retriever"] = retriever, None


def config_of(
    run: dict[str, Any], runner: EvalRunner, prompt: str | None, given: Callable[[str], bool]
) -> EvalConfig:
    """The run's config: a new one from the options, a stopped run's (``--resume``: its own
    settings but for options given again) or a saved one (``--from-run``); its run folder is
    checked before anything slow."""
    from rag_gym.evaluate import check_run_dir

    _retriever_alias(run)
    try:
        if runner.resume is not None and runner.from_run is not None:
            raise ValueError("expected --resume or --from-run, got both: pick one")
        if runner.resume is not None and runner.overwrite:
            raise ValueError("expected resume or overwrite, got both: pick one")
        if runner.resume is not None:
            resume = Path(runner.resume)
            named = Path(run["out_dir"]) / (run["run_name"] or resume.name)
            if (given("out") or given("run_name")) and named.resolve() != resume.resolve():
                raise ValueError(
                    f"expected --out and --run-name to name the --resume folder {resume}, "
                    f"got {named}: drop them"
                )
            # the run's own settings, but for options given here (evaluate checks they match)
            overrides = {
                name: value
                for name, value in run.items()
                if given(RUN_OPTIONS.option(name)) and name not in ("out_dir", "run_name")
            }
            if given("retriever") and run["index"] is not None:  # the deprecated alias
                overrides["index"] = run["index"]
            if prompt is not None:
                overrides["prompt"] = prompt
            config = EvalConfig.resumed(resume, **overrides)
        elif runner.from_run is not None:
            config = EvalConfig.from_run(
                runner.from_run, out_dir=run["out_dir"], run_name=run["run_name"]
            )
        else:
            config = EvalConfig(**run, prompt=prompt)
        check_run_dir(config, resume=runner.resume is not None, overwrite=runner.overwrite)
    except (TypeError, ValueError, OSError) as exc:
        fail(str(exc))
    return config


def backends(config: EvalConfig) -> tuple[Any, Any]:
    """The LLM backend of the agents that need one and the judge (each ``None`` without)."""
    from rag_gym.generation.backends import make_lm

    judge = None
    try:
        backend = agents_lm(config, config.lm_spec)
        if config.judge is not None:
            from rag_gym.generation.judges import LLMAnswerJudge

            judge_lm = make_lm(config.judge)
            judge_lm.check_chat()  # the judge prompts with chats: no template, no run
            judge = LLMAnswerJudge(judge_lm)
    except (ImportError, FileNotFoundError, TypeError, ValueError) as exc:
        fail(str(exc))
    return backend, judge


def agents_lm(config: Any, spec: str | None) -> Any:
    """The LLM backend ``spec`` of a run's agents, made with the run's LM options; ``None``
    when no agent needs one."""
    from rag_gym.baselines import needs_lm
    from rag_gym.generation.backends import make_lm

    if not any(needs_lm(a) for a in config.agents):
        return None
    return make_lm(spec, seed=config.seed, **lm_options(config))


def resume_command(run_dir: Path, runner: EvalRunner) -> str:
    return shlex.join(
        ["rag-gym", "evaluate", "--resume", str(run_dir), *(["--track"] if runner.track else [])]
    )


def _ray_episodes(config: EvalConfig, runner: EvalRunner) -> Any:
    if runner.ray is None:
        return None
    from rag_gym.evaluate.distributed import AgentRecipe, RayEpisodes

    try:
        return RayEpisodes(
            AgentRecipe(config.lm_spec, config.seed, config.prompt, lm_options(config)),
            address=runner.ray,
            workers=runner.ray_workers,
            cpus_per_worker=runner.cpus_per_worker,
        )
    except (ImportError, ConnectionError, ValueError) as exc:
        fail(str(exc))


def agent_maker(config: Any, backend: Any) -> Callable[[str, Any], Any]:
    """``make(name, env)``: the agent ``name`` of a run's config, on its LLM ``backend``."""
    from rag_gym.baselines import make_agent

    return lambda name, env: make_agent(
        name, lm=backend, seed=config.seed, env=env, prompt=config.prompt
    )


def play(config: EvalConfig, runner: EvalRunner, backend: Any, judge: Any, bar: Any) -> Any:
    """The run (:func:`rag_gym.evaluate.evaluate`) with the progress ``bar``; a stop ends the
    command with the way to resume it."""
    from rag_gym._text import shown
    from rag_gym.evaluate import RunInterrupted, sigterm_as_interrupt
    from rag_gym.evaluate import evaluate as run
    from rag_gym.evaluate.runner import MissingResultsWarning

    def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
        typer.secho(f"warning: {message}", fg=typer.colors.YELLOW, err=True)

    progress, tick = bar
    with progress, warnings.catch_warnings():
        warnings.showwarning = show_warning
        # printed after the run as the reason of the exit status, with the command that resumes
        warnings.simplefilter("ignore", MissingResultsWarning)
        episodes = _ray_episodes(config, runner)
        try:
            with sigterm_as_interrupt():
                return run(
                    config,
                    agent_maker(config, backend),
                    episodes=episodes,
                    progress=tick,
                    lm_description=backend.describe() if backend else None,
                    command=" ".join(["rag-gym", *sys.argv[1:]]),
                    judge=judge,
                    track=runner.track,
                    resume=runner.resume is not None,
                    overwrite=runner.overwrite,
                )
        except RunInterrupted as exc:
            progress.stop()
            typer.secho(
                f"interrupted ({exc.reason}): {exc.saved} finished episodes are saved in "
                f"{exc.run_dir}; partial leaderboard: {exc.run_dir / 'leaderboard.md'}",
                fg=typer.colors.YELLOW,
                err=True,
            )
            typer.echo(f"resume with: {resume_command(exc.run_dir, runner)}", err=True)
            raise typer.Exit(143 if exc.reason == "SIGTERM" else 130) from None
        except KeyboardInterrupt:
            typer.secho("interrupted before the run folder was written", err=True)
            raise typer.Exit(130) from None
        except (TypeError, ValueError, OSError, ImportError) as exc:
            # a backend's text may hold control characters: shown escaped
            fail(shown("\n".join([str(exc), *getattr(exc, "__notes__", [])]), 4000, keep="\n"))


def print_results(result: Any, config: EvalConfig, console: Any) -> None:
    """The leaderboard in 80 columns at least, the run folder and its report; a signal now
    says that the run is saved."""
    from rag_gym.evaluate import sigterm_as_interrupt
    from rag_gym.evaluate.leaderboard import terminal_table

    try:  # the run is complete: a signal now loses nothing
        with sigterm_as_interrupt():
            if console.width < 80:  # the terminal wraps the lines: no figure is cut
                from rich.console import Console

                console = Console(width=80)
            title = f"{config.env_id} · {config.split} · {result.protocol['n']} questions · "
            console.print(terminal_table(result.rows, f"{title}seed {config.seed}", console.width))
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


def exit_status(result: Any, runner: EvalRunner) -> int:
    """1 when an agent did nothing but fail or figures are missing (each said, with the
    command that resumes), else 0."""
    from rag_gym._text import shown
    from rag_gym.evaluate.runner import missing_results

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
        typer.echo(f"resume with: {resume_command(result.run_dir, runner)}", err=True)
        status = 1
    return status


#: the options a suite sets itself (its datasets name their splits, k and metric)
_NOT_WITH_SUITE = ("env", "split", "data_path", "k", "env_kwargs", "judge", "track")


def suite_config(p: dict[str, Any], given: Callable[[str], bool]) -> Any:
    """The suite run's config: a new one from the options, or a saved suite run's
    (``--resume``, ``--from-run``: LM options may change only with the latter)."""
    from rag_gym.evaluate.suite import SuiteConfig, SuiteError, check_pins, load_suite

    if p["suite"] is not None:
        wrong = [o for o in _NOT_WITH_SUITE if given(o)]
        if wrong:
            fail(
                f"--{wrong[0].replace('_', '-')} has no meaning with --suite: the suite names its "
                "datasets, splits, k and metric (edit a copy of the suite file to change them)"
            )
    resume, from_run = (None if p[k] is None else Path(p[k]) for k in ("resume", "from_run"))
    try:
        if resume is not None or from_run is not None:
            if p["suite"] is not None and given("suite"):
                raise SuiteError(
                    "expected --suite or a saved suite run (--resume/--from-run), got both"
                )
            lm_given = {name: p[name] for name in LM_OPTIONS if given(name)}
            if resume is not None and lm_given:
                raise SuiteError(
                    f"--{next(iter(lm_given)).replace('_', '-')} has no meaning with "
                    "--resume: a resumed suite keeps its LM options (rerun it with "
                    "--from-run to change them)"
                )
            overrides = (
                {"out_dir": str(resume.parent), "run_name": resume.name}
                if resume is not None
                else {"out_dir": str(p["out"]), "run_name": p["run_name"], **lm_given}
            )
            config = SuiteConfig.from_run(resume or from_run, **overrides)
            if from_run is not None:
                check_pins(config, from_run)
        else:
            names = None if p["datasets"] is None else p["datasets"].split(",")
            config = SuiteConfig(
                suite=load_suite(p["suite"]),
                agents=tuple(a.strip() for a in p["agents"].split(",") if a.strip()),
                **{k: p[k] for k in ("corpus", "index", "retriever", "seed", "batch_size")},
                data_root=str(p["data_root"]),
                datasets=None if names is None else tuple(x.strip() for x in names if x.strip()),
                n=p["n"] if given("n") else None,
                prompt=read_prompt(p["prompt"]),
                prompt_file=None if p["prompt"] is None else str(p["prompt"]),
                **{name: p[name] for name in LM_OPTIONS},
                out_dir=str(p["out"]),
                run_name=p["run_name"],
            )
        EvalConfig(agents=config.agents)  # the agent names, checked before anything slow
    except (SuiteError, TypeError, ValueError, OSError) as exc:
        fail(str(exc))
    return config


def evaluate_suite(
    p: dict[str, Any], given: Callable[[str], bool], episode_bar: Callable, console: Callable
) -> None:
    """``rag-gym evaluate --suite``: every dataset of a suite against one corpus, one table."""
    config = suite_config(p, given)
    lm = p["lm"] if given("lm") else config.lm_spec or p["lm"] or "llama_cpp"
    try:
        backend = agents_lm(config, lm)
        if backend is not None:
            config.lm_spec = lm
    except (ImportError, FileNotFoundError, TypeError, ValueError) as exc:
        fail(str(exc))
    result = _play_suite(config, backend, episode_bar(p["progress"]), p["overwrite"], p["resume"])
    console().print(suite_table(config, result))
    typer.echo(f"results: {result.run_dir} (suite.md, suite.csv, suite.json)")


def _play_suite(config: Any, backend: Any, bar: Any, overwrite: bool, resume: Any) -> Any:
    from rag_gym.evaluate import RunInterrupted, sigterm_as_interrupt
    from rag_gym.evaluate.suite import SuiteError, run_suite

    progress, tick_key = bar
    column = {"name": ""}

    def started(dataset) -> None:
        column["name"] = dataset.name

    def tick(agent: str, done: int, total: int, em: float | None = None) -> None:
        tick_key(f"{column['name']} · {agent}", done, total, em)

    with progress:
        try:
            with sigterm_as_interrupt():
                return run_suite(
                    config,
                    agent_maker(config, backend),
                    progress=tick,
                    column_started=started,
                    lm_description=backend.describe() if backend else None,
                    command=" ".join(["rag-gym", *sys.argv[1:]]),
                    resume=resume is not None,
                    overwrite=overwrite,
                )
        except RunInterrupted as exc:
            progress.stop()
            typer.secho(
                f"interrupted ({exc.reason}) in {exc.run_dir}; finished episodes are saved",
                fg=typer.colors.YELLOW,
                err=True,
            )
            again = ["rag-gym", "evaluate", "--resume", str(exc.run_dir.parent)]
            typer.echo(f"resume with: {shlex.join(again)}", err=True)
            raise typer.Exit(143 if exc.reason == "SIGTERM" else 130) from None
        except KeyboardInterrupt:
            typer.secho("interrupted before the run folder was written", err=True)
            raise typer.Exit(130) from None
        except (SuiteError, TypeError, ValueError, OSError, ImportError) as exc:
            fail("\n".join([str(exc), *getattr(exc, "__notes__", [])]))


def suite_table(config: Any, result: Any) -> Any:
    """The suite's table: an agent a row, a dataset (and the average) a column."""
    from rich.table import Table

    from rag_gym.evaluate.suite import cell_text, column_heads, suite_title

    names = [d.name for d in config.selected] + ["average"]
    table = Table(title=suite_title(config))
    table.add_column("agent", justify="left")
    for head in column_heads(config, result.table):
        table.add_column(head, justify="right")
    for agent, row in result.table.items():
        table.add_row(agent, *(cell_text(row.get(name)) for name in names))
    return table


def episode_bar(enabled: bool) -> tuple[Any, Callable[..., None]]:
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


def is_comparison(path: Path) -> bool:
    """Whether ``path`` holds a comparison ``rag-gym compare --json`` wrote."""
    from rag_gym.traces import load_file

    try:
        if path.stat().st_size > 1 << 24:
            return False
        saved = load_file(path)
    except (OSError, ValueError):
        return False
    return isinstance(saved, dict) and {"a", "b", "metrics", "n_resamples"} <= saved.keys()


def console():
    from rich.console import Console

    console = Console()
    # piped output (CI logs, files) gets a fixed wide layout instead of rich's 80 columns
    return console if console.is_terminal else Console(width=200)


def token_option(token: str | None) -> str | None:
    """``--token``, else ``$RAG_GYM_TOKEN``, as a server compares it
    (:func:`~rag_gym.retrieval.http.clean_token`: ``None`` for none, whitespace around it
    stripped with a warning printed here, a ``ValueError`` for one no header can carry)."""
    import os

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


def json_option(value: str | None, name: str) -> dict:
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
        fail(f"expected {name} to be a JSON object, got {shown} ({exc})")
    except ValueError as exc:
        fail(str(exc))
    if not isinstance(parsed, dict):
        fail(f"expected {name} to be a JSON object, got {shown}")
    return parsed


def compare_runs(
    runs: list[Path],
    a: str,
    b: str,
    metrics: str,
    confidence: float,
    resamples: int,
    seed: int,
    json_out: Path | None,
    overwrite: bool,
    allow_mismatch: bool,
) -> None:
    """``rag-gym compare``: the paired comparison printed, and written to ``json_out``."""
    import json

    from rag_gym.compare import compare, comparison_markdown
    from rag_gym.evaluate.run_folder import OutputRefused, check_output, write_atomically
    from rag_gym.stats import MAX_RESAMPLES

    names = [m.strip() for m in metrics.split(",") if m.strip()]
    if not names:
        fail(f"expected --metrics to name at least one metric (em,f1,...), got {metrics!r}")
    if not 1 <= resamples <= MAX_RESAMPLES:
        fail(f"expected --resamples in 1..{MAX_RESAMPLES:,}, got {resamples}")
    if json_out is not None:
        if not json_out.parent.is_dir():
            fail(
                f"expected --json in an existing folder, got {json_out} ({json_out.parent} is "
                "not a folder): create it, or pick another path"
            )
        try:
            check_output(json_out, runs, "--json", overwrite, ours=is_comparison)
        except OutputRefused as exc:
            fail(str(exc))
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
    except ValueError as exc:  # a CompareError, or bad confidence or resamples
        fail(str(exc))
    typer.echo(comparison_markdown(result), nl=False)
    if json_out is not None:
        try:
            write_atomically(json_out, json.dumps(result, indent=2) + "\n")
        except OSError as exc:
            fail(f"cannot write --json {json_out}: {exc}")
        typer.echo(f"wrote {json_out}")


def agent_tables() -> list[Any]:
    """The agents' table (a broken plugin said on its row) and the shipped checkpoints'."""
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
    return [table, shipped]
