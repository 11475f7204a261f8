"""``rag-gym openenv serve``: the OpenEnv server of :mod:`rag_gym.integrations.openenv_server`."""

from __future__ import annotations

import json
import os
from typing import Annotated

import typer

openenv_app = typer.Typer(
    no_args_is_help=True,
    help="Serve rag-gym envs through OpenEnv (needs the openenv extra).",
)


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def _json_object(value: str | None, name: str) -> dict:
    if value is None:
        return {}
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        _fail(f"expected {name} to be a JSON object, got {value!r} ({exc})")
    if not isinstance(parsed, dict):
        _fail(f"expected {name} to be a JSON object, got {value!r}")
    return parsed


@openenv_app.command("serve")
def serve(
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
            reward_kwargs=_json_object(reward_kwargs, "--reward-kwargs"),
            env_kwargs=_json_object(env_kwargs, "--env-kwargs"),
            tags=tags,
            max_concurrent_envs=max_sessions,
            token=token if token is not None else os.environ.get("RAG_GYM_TOKEN"),
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
