"""The ``rag-gym`` command line: ``evaluate``, ``compare``, ``view``, ``agents``, ``envs``,
``synth``, ``index build``, ``serve``, ``train`` (``sft``, ``grpo``, ``pipeline``, ``curves``,
``export``) and ``openenv serve``."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from rag_gym import commands
from rag_gym._options import Options, with_options
from rag_gym.commands import RUN_OPTIONS, RUNNER_OPTIONS
from rag_gym.evaluate import EvalRunner
from rag_gym.integrations.openenv_config import ServerConfig as OpenEnvConfig
from rag_gym.retrieval.index_build import IndexBuild
from rag_gym.retrieval.serve import Serve
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


_fail = commands.fail


@app.command()
@with_options(run=RUN_OPTIONS, runner=RUNNER_OPTIONS)
def evaluate(
    ctx: typer.Context,
    run: dict[str, Any],
    runner: dict[str, Any],
    prompt: Annotated[
        Path | None,
        typer.Option(
            help="A prompt template file ({question} marks the question) for search_r1 agents: "
            "the prompt a checkpoint was trained on."
        ),
    ] = None,
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
) -> None:
    """Run agents on an env's sampled questions; print and save a leaderboard, plots and the protocol.

    Episodes are saved as they end; a stopped run (Ctrl-C, SIGTERM, a crash) goes on with
    --resume RUN. With --suite, each of the suite's datasets is such a run, and one table of
    every dataset and their average is printed (docs/leaderboards.md)."""
    import rag_gym  # noqa: F401  (registers the envs)

    def given(name: str) -> bool:  # typer vendors click: compare the enum member by name
        return getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"

    settings = EvalRunner(**runner)
    saved = [Path(f) for f in (settings.from_run, settings.resume) if f is not None]
    if suite is not None or any((folder / "suite.json").is_file() for folder in saved):
        commands.evaluate_suite(ctx.params, given, commands.episode_bar, commands.console)
        return
    config = commands.config_of(run, settings, commands.read_prompt(prompt), given)
    backend, judge = commands.backends(config)
    result = commands.play(
        config, settings, backend, judge, commands.episode_bar(settings.progress)
    )
    commands.print_results(result, config, commands.console())
    status = commands.exit_status(result, settings)
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
    commands.compare_runs(
        runs, a, b, metrics, confidence, resamples, seed, json_out, overwrite, allow_mismatch
    )


@app.command()
def agents() -> None:
    """List the agents (baselines and the papers' methods) and the shipped checkpoints."""
    console = commands.console()
    for table in commands.agent_tables():
        console.print(table)


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
    commands.console().print(table)


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
@with_options(build=Options(IndexBuild))
def index_build(build: dict[str, Any]) -> None:
    """Build a BM25 or dense index over a corpus file, a dataset's passages or a SynthHop world."""
    from rag_gym.retrieval.index_build import build_index

    try:
        typer.echo(build_index(IndexBuild(**build)))
    except (TypeError, ValueError, OSError, ImportError) as exc:
        _fail(str(exc))


@app.command()
@with_options(serving=Options(Serve))
def serve(serving: dict[str, Any]) -> None:
    """Serve an index over HTTP (Search-R1's /retrieve API, micro-batched)."""
    from rag_gym.retrieval.serve import open_app
    from rag_gym.retrieval.server import run_server

    try:
        config = Serve(**{**serving, "token": commands.token_option(serving["token"])})
        app_, limits, serving_line = open_app(config)
    except (ValueError, TypeError, ImportError, OSError, RuntimeError) as exc:
        _fail(str(exc))
    typer.echo(serving_line)
    run_server(app_, host=config.host, port=config.port, limits=limits)


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
@with_options(
    server=Options(OpenEnvConfig, flags={"env_id": "env", "max_concurrent_envs": "max_sessions"})
)
def openenv_serve(
    server: dict[str, Any],
    host: Annotated[
        str, typer.Option(help="Address to bind; 127.0.0.1 keeps it local.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8000,
) -> None:
    """Serve one env id over OpenEnv's WebSocket protocol (one env per session, one shared index)."""
    try:
        from rag_gym.integrations.openenv_server import _import_openenv
        from rag_gym.integrations.openenv_server import serve as run

        _import_openenv()  # ImportError naming the extra, before anything is loaded
        config = OpenEnvConfig(
            **{
                **server,
                "reward_kwargs": commands.json_option(server["reward_kwargs"], "--reward-kwargs"),
                "env_kwargs": commands.json_option(server["env_kwargs"], "--env-kwargs"),
                "token": commands.token_option(server["token"]),
            }
        )
    except (TypeError, ValueError, ImportError) as exc:
        _fail(str(exc))
    sessions = config.max_concurrent_envs
    typer.echo(
        f"serving {config.env_id} over OpenEnv on ws://{host}:{port}/ws (up to {sessions} sessions)",
        err=True,
    )
    try:
        run(config, host=host, port=port)
    except (TypeError, ValueError, OSError, ImportError) as exc:
        _fail(str(exc))


def _run_dir(fields: dict[str, Any], run_name: str | None, stage: str) -> Path:
    """The run folder of a training command: ``--run-name`` inside ``--out``, by default named
    as every run folder is (:func:`rag_gym._names.run_name`); one that holds anything is
    refused."""
    from rag_gym._names import run_name as default_name

    env = str(fields["env_id"]).split(",")[0]
    path = Path(fields["output_dir"]) / (run_name or default_name(env, stage, fields["seed"]))
    if path.exists() and any(path.iterdir()):
        _fail(f"expected a new run folder, got existing {path}: pick another --run-name")
    return path


def _config(cls: type, fields: dict[str, Any], **overrides: Any) -> Any:
    """``cls(**fields, **overrides)``, or the command's end with the config's reason."""
    try:
        return cls(**{**fields, **overrides})
    except (TypeError, ValueError) as exc:
        _fail(str(exc))


#: what the ``train`` commands take from the trainer configs: flags shorter than the fields'
#: names, and the fields a command sets itself
_SFT_OPTIONS = Options(
    SFTConfig,
    flags={"env_id": "env", "n_demos": "demos", "learning_rate": "lr", "output_dir": "out"},
    exclude=frozenset({"exp_name", "run_dir"}),
)
_GRPO_OPTIONS = Options(
    EnvGRPOConfig,
    flags={"env_id": "env", "max_steps": "steps", "learning_rate": "lr", "output_dir": "out"},
    exclude=frozenset(
        {"exp_name", "run_dir", "dynamic_sampling", "dynamic_sampling_on"}
        | {"resume_from_checkpoint"}
    ),
)
_PIPELINE_SFT_OPTIONS = Options(
    SFTConfig,
    flags={"env_id": "env", "n_demos": "demos", "learning_rate": "sft_lr", "output_dir": "out"},
    only=(
        *("env_id", "env_kwargs", "data_path", "split_by_id", "synthhop_ratio", "max_length"),
        *("tags", "n_demos", "model", "chat_template", "learning_rate", "seed", "track"),
        "output_dir",
    ),
)
_PIPELINE_OPTIONS = Options(
    PipelineConfig, flags={"grpo_steps": "steps", "grpo_learning_rate": "lr"}
)
_RunName = Annotated[
    str | None, typer.Option(help="Run folder name, inside --out (default: unique).")
]


@train_app.command("sft")
@with_options(sft=_SFT_OPTIONS)
def train_sft(sft: dict[str, Any], run_name: _RunName = None) -> None:
    """Supervised cold start on expert transcripts: SynthHop's decompositions, or the
    annotations of HotpotQA, 2WikiMultiHopQA and MuSiQue (--demos 0: the whole split)."""
    from rag_gym.train.sft import train

    run_dir = _run_dir(sft, run_name, "sft")
    cfg = _config(SFTConfig, sft, n_demos=sft["n_demos"] or None, run_dir=str(run_dir))
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
@with_options(grpo=_GRPO_OPTIONS)
def train_grpo(
    grpo: dict[str, Any],
    init: Annotated[
        Path | None,
        typer.Option(help="Start from this SFT run folder (its final/ adapter) or adapter folder."),
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
    dynamic_sampling: Annotated[
        str,
        typer.Option(
            help="Refill groups that teach nothing: 'return' (returns all equal), 'answer' "
            "(answers all right or all wrong, DAPO's eq. 11), 'unsolved' (answers all wrong: "
            "use it with --step-cost), 'off', or 'auto' (return for dapo, off for grpo)."
        ),
    ] = "auto",
    eval_n: Annotated[int, typer.Option(help="Held-out (validation) questions for EM.")] = 100,
    resume: Annotated[
        Path | None,
        typer.Option(
            help="Go on with this stopped run from its newest checkpoint, with its own options "
            "(every other option is ignored)."
        ),
    ] = None,
    run_name: _RunName = None,
) -> None:
    """GRPO/DAPO in the env, optionally from an SFT checkpoint (--init)."""
    from rag_gym.train.grpo import resume_config, train_from
    from rag_gym.train.options import dict_option

    try:
        if resume is not None:
            cfg, init, eval_n = resume_config(resume)
        else:
            extra = dict_option("--env-kwargs", grpo["env_kwargs"])
            extra.update({} if data_path is None else {"data_path": data_path})
            if split_by_id:
                extra["dataset_kwargs"] = {**extra.get("dataset_kwargs", {}), "split_by_id": True}
            run_dir = str(_run_dir(grpo, run_name, grpo["algorithm"]))
            sampling = _dynamic_sampling(dynamic_sampling)
            cfg = _config(EnvGRPOConfig, grpo, env_kwargs=extra, run_dir=run_dir, **sampling)
        results = train_from(cfg, init=init, eval_n=eval_n)
    except (TypeError, ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    typer.echo(f"held-out EM before: {_em(results['before'])}, after: {_em(results['after'])}")
    typer.echo(f"checkpoint: {results['checkpoint']}")
    typer.echo(f"results: {cfg.run_dir}")


@train_app.command("pipeline")
@with_options(sft=_PIPELINE_SFT_OPTIONS, rl=_PIPELINE_OPTIONS)
def train_pipeline(
    sft: dict[str, Any],
    rl: dict[str, Any],
    eval_n: Annotated[
        int,
        typer.Option(help="Validation questions for each stage's EM (transformers; 0: none)."),
    ] = 0,
    run_name: _RunName = None,
) -> None:
    """SFT cold start, GRPO/DAPO from it, the shipped checkpoint, and its test commands."""
    from rag_gym.train.pipeline import train_and_ship, write_report

    started = time.perf_counter()
    root = _run_dir(sft, run_name, "pipeline")
    pipeline = _config(PipelineConfig, rl)
    sft_cfg = _config(
        SFTConfig,
        sft,
        n_demos=sft["n_demos"] or None,  # 0: the whole split
        eval_n=eval_n,
        eval_before=False,
        run_dir=str(root / "sft"),
    )
    report = train_and_ship(sft_cfg, pipeline, root, "rag-gym " + shlex.join(sys.argv[1:]))
    if report["checkpoint"] and pipeline.test_n:
        _pipeline_tests(report, sft_cfg, pipeline.test_n, root)
    report["seconds"]["total"] = round(time.perf_counter() - started, 1)
    write_report(root, report)
    minutes = {k: f"{v / 60:.1f} min" for k, v in report["seconds"].items()}
    typer.echo(f"wall time: {minutes}")
    typer.echo(f"results: {root / 'results.json'}")


def _pipeline_tests(report: dict[str, Any], sft_cfg: SFTConfig, test_n: int, root: Path) -> None:
    """The pipeline checkpoint's test figures, on each training env's test split (llama.cpp),
    into ``report``."""
    from rag_gym.evaluate import evaluate_checkpoint

    t0 = time.perf_counter()
    sources = sft_cfg.sources()
    for env_id, kwargs in sources:  # each env's test split, in a run folder of its own
        name = "test" if len(sources) == 1 else f"test-{env_id.split('/')[-1]}"
        row = evaluate_checkpoint(
            report["checkpoint"], env_id, test_n, root, name, seed=sft_cfg.seed, env_kwargs=kwargs
        )
        report.setdefault("tests", {})[env_id] = row
        typer.echo(f"{env_id} test ({test_n} questions, llama.cpp): EM {row['em']:.3f}")
    report["test"] = report["tests"][sources[0][0]]
    report["seconds"]["test"] = round(time.perf_counter() - t0, 1)


@train_app.command("curves")
def train_curves(
    runs: Annotated[list[Path], typer.Argument(help="Training run folders, drawn on one plot.")],
    keys: Annotated[
        str, typer.Option(help="Logged values, one panel each, comma-separated.")
    ] = "episode/em,episode/num_searches,reward",
    out: Annotated[Path, typer.Option(help="The PNG to write.")] = Path("curves.png"),
) -> None:
    """Plot several training runs' per-step logs against the step on the same panels."""
    from rag_gym.train.tracking import learning_curve, run_log_history

    try:
        logs = {run.name: run_log_history(run) for run in runs}
    except (FileNotFoundError, KeyError, ValueError) as exc:
        _fail(str(exc))
    names = [k.strip() for k in keys.split(",") if k.strip()]
    if learning_curve(logs, out, names) is None:
        _fail(f"none of {names} is in the runs' logs: pass --keys with logged names")
    typer.echo(f"wrote {out}")


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
