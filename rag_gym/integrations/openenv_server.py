"""Serve any registered rag-gym env through OpenEnv (the ``openenv`` package, 0.4.1 tested).

Built on OpenEnv's own ``Environment`` and ``create_app``: every WebSocket connection to ``/ws``
is one session with its own env (``SUPPORTS_CONCURRENT_SESSIONS``), and every session's env is
made with the same data arguments, so all of them share one corpus and index in memory (the
read-only cache of :mod:`rag_gym.envs.base`; the server keeps one env alive for its lifetime so
the index is built once, at start-up). OpenEnv's HTTP ``/reset`` and ``/step`` build a fresh env
for every request and cannot play a multi-step episode: use the WebSocket client
(``GenericEnvClient(...).sync()`` or an async ``EnvClient``).

## Action (:class:`RagGymAction`, two forms)

| form | fields | what the env receives |
|---|---|---|
| Dict | ``{"type": "search" \\| "answer" \\| "backtrack" \\| "refuse" \\| "evaluate", "text": str}`` | the SearchEnv's Dict action |
| raw text | ``{"text": <the model's output>}`` (no ``type``) | the text, parsed by :class:`~rag_gym.wrappers.TextActions` with a tag preset |

An episode plays one form: the text form when it was reset with ``tags=<preset>`` (or the
server's ``tags`` default), else the Dict form (``reset(tags=None)``). An env whose reward
preset is already text-in (``when_to_search``) plays the text form only.

## Observation (:class:`RagGymObservation`)

``text`` (what the agent reads: the SearchEnv's rendered context in the Dict form, the
``<information>`` block or a message in the text form), ``reward`` (a float, ``None`` after
reset), ``done`` (terminated or truncated), ``truncated`` (Gymnasium's flag: the step limit
ended the episode), ``metadata`` (the step's Gymnasium ``info`` as JSON values, with
``reward_terms`` and ``terminated``).

## State (:class:`RagGymState`)

``episode_id``, ``step_count``, ``env_id``, ``reward_preset``, ``tags``, ``question_id``,
``question``, ``done``, ``truncated``, ``episode_return`` and ``return_terms`` (each reward
term summed over the episode).

## Errors

OpenEnv answers a malformed message on the session with an error frame and keeps the session:
``VALIDATION_ERROR`` for an action that does not fit :class:`RagGymAction` (an unknown field, an
unknown ``type``), ``EXECUTION_ERROR`` with the reason for a step before ``reset``, after the
episode ended, or in the other form than the episode plays; its client raises ``RuntimeError``
with the message and code. A well-formed but meaningless action (an empty query, text with no
action tag) is the env's invalid action: the step is spent, the observation says what was wrong,
and ``metadata["invalid_action"]`` or ``metadata["format_ok"]`` records it.

Over ``max_concurrent_envs`` sessions, a new connection is accepted, its first message answered
with an error frame ``CAPACITY_REACHED`` (with ``active_sessions`` and ``max_sessions``), and
closed with code 1013 (try again later); OpenEnv's own limit closes it before the client reads
the frame. With a token, a WebSocket handshake without it is refused with HTTP 401 and an HTTP
request (but ``/health``) answered 401; the client passes the token as ``Authorization: Bearer <token>`` or in the
URL's userinfo (``http://rag-gym:<token>@127.0.0.1:8000``, sent as HTTP Basic, which
OpenEnv's client does with no change).

## Configuration

:class:`ServerConfig` (and :func:`config_from_environ`, for a container) live in
:mod:`rag_gym.integrations.openenv_config`, which needs nothing but rag-gym; this module
re-exports both. Importing this module imports openenv (``pip install 'rag-gym[openenv]'``; an
``ImportError`` naming that extra without it).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hmac
import json
from typing import Any, Literal

import gymnasium as gym

try:
    import uvicorn
    from openenv.core.env_server.http_server import create_app as openenv_create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State
    from pydantic import Field
except ImportError as exc:
    raise ImportError(
        "the OpenEnv server needs the openenv package: pip install 'rag-gym[openenv]'"
    ) from exc

from rag_gym.envs.search import ActionType
from rag_gym.envs.tags import tag_set
from rag_gym.integrations._common import json_safe
from rag_gym.integrations.openenv_config import (  # noqa: F401  (config_from_environ re-exported)
    ServerConfig,
    config_from_environ,
)
from rag_gym.wrappers.presets import with_text_actions
from rag_gym.wrappers.text_actions import text_actions_of

_UNSET: Any = object()


def _import_openenv():
    """OpenEnv's ``create_app`` and base classes, which this module imports at its top (so that
    importing it without openenv raises the ``ImportError`` naming the extra)."""
    return openenv_create_app, Environment, Action, Observation, State


class RagGymAction(Action):
    """One action, in the Dict form (``type`` and ``text``) or raw model text (``text`` only)."""

    type: Literal["search", "answer", "backtrack", "refuse", "evaluate"] | None = Field(
        default=None,
        description="The Dict form's action; leave it out to send raw model text.",
    )
    text: str = Field(
        default="",
        max_length=65_536,
        description="The query, answer or note (Dict form), or the model's output (text form).",
    )


class RagGymObservation(Observation):
    """What the agent reads, with Gymnasium's truncated flag; ``metadata`` is the ``info``."""

    text: str = Field(default="", description="What the agent reads next.")
    truncated: bool = Field(default=False, description="The step limit ended the episode.")


class RagGymState(State):
    """The session's episode."""

    env_id: str = ""
    reward_preset: str | None = None
    tags: str | None = None
    question_id: str | None = None
    question: str | None = None
    done: bool = False
    truncated: bool = False
    episode_return: float = 0.0
    return_terms: dict[str, float] = Field(default_factory=dict)


class RagGymEnvironment(Environment):
    """One session's env (see :mod:`rag_gym.integrations.openenv_server`)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, config: ServerConfig) -> None:
        super().__init__()
        self.config = config
        self._env = config.make()
        self._played: gym.Env | None = None
        self._tags: str | None = None
        self._state = RagGymState(env_id=config.env_id, reward_preset=config.reward_preset)

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        options: dict[str, Any] | None = None,
        tags: str | None = _UNSET,
        **kwargs: Any,
    ) -> RagGymObservation:
        if kwargs:
            raise TypeError(
                f"reset got unknown arguments {sorted(kwargs)}; it takes seed, episode_id, "
                "options ({'question_index': i} or {'question_id': ...}) and tags"
            )
        tags = self.config.tags if tags is _UNSET else tags
        self._played, self._tags = self._env_for(tags)
        obs, info = self._played.reset(seed=seed, options=options)
        self._state = RagGymState(
            episode_id=episode_id,
            step_count=0,
            env_id=self.config.env_id,
            reward_preset=self.config.reward_preset,
            tags=self._tags,
            question_id=info.get("question_id"),
            question=info.get("question"),
        )
        return RagGymObservation(
            text=obs, reward=None, done=False, truncated=False, metadata=_metadata(info, False)
        )

    def step(
        self, action: RagGymAction, timeout_s: float | None = None, **kwargs: Any
    ) -> RagGymObservation:
        if self._played is None:
            raise RuntimeError("this session has no episode: send reset before step")
        if self._state.done:
            raise RuntimeError("the episode has ended (done was true): send reset to start one")
        if self._tags is not None:
            if action.type is not None:
                raise ValueError(
                    f"this episode plays the text form (tags={self._tags!r}): send "
                    '{"text": <model output>} with no type, or reset with tags=None for the '
                    "Dict form"
                )
            played = action.text
        else:
            if action.type is None:
                raise ValueError(
                    'this episode plays the Dict form: send {"type": "search"|"answer"|'
                    '"backtrack"|"refuse"|"evaluate", "text": ...}, or reset with tags='
                    "<preset> to send raw model text"
                )
            played = {"type": ActionType[action.type.upper()], "text": action.text}
        obs, reward, terminated, truncated, info = self._played.step(played)
        reward = float(reward)
        st = self._state
        st.step_count += 1
        st.done = bool(terminated or truncated)
        st.truncated = bool(truncated)
        st.episode_return += reward
        for key, value in info.get("reward_terms", {}).items():
            st.return_terms[key] = st.return_terms.get(key, 0.0) + float(value)
        return RagGymObservation(
            text=obs,
            reward=reward,
            done=st.done,
            truncated=bool(truncated),
            metadata=_metadata(info, bool(terminated)),
        )

    @property
    def state(self) -> RagGymState:
        return self._state

    def close(self) -> None:
        self._env.close()

    def _env_for(self, tags: str | None) -> tuple[gym.Env, str | None]:
        if tags is None:  # the Dict form, or the text form of a text-in preset's own tags
            own = text_actions_of(self._env)
            return self._env, own.tags.name if own is not None else None
        name = tag_set(tags).name
        if name != self._tags or self._played is self._env:
            return with_text_actions(self._env, name), name
        return self._played, name


def _metadata(info: dict[str, Any], terminated: bool) -> dict[str, Any]:
    meta = json_safe(info)
    meta.setdefault("reward_terms", {})
    meta["terminated"] = terminated
    return meta


def create_app(config: ServerConfig):
    """The FastAPI app of OpenEnv's ``create_app`` for ``config``, behind :class:`SessionGate`.

    Builds one env first (the shared data and index) and keeps it for the app's lifetime.
    """
    keep = RagGymEnvironment(config)  # loads the questions, corpus and index every session shares
    app = openenv_create_app(
        functools.partial(RagGymEnvironment, config),
        RagGymAction,
        RagGymObservation,
        env_name=config.env_id.split("/")[-1],
        max_concurrent_envs=config.max_concurrent_envs,
    )
    app.state.rag_gym_shared_env = keep
    count = SessionCount(config.max_concurrent_envs)

    @app.get("/rag_gym/sessions", tags=["Health"])
    def sessions() -> dict[str, int]:
        """WebSocket sessions open now, and the most allowed."""
        return {"active": count.active, "max": count.max_sessions}

    app.add_middleware(SessionGate, token=config.token or None, count=count)
    return app


def serve(config: ServerConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run :func:`create_app` with uvicorn on ``host:port`` (loopback by default)."""
    app = create_app(config)
    uvicorn.run(app, host=host, port=port, log_level="warning", ws="websockets")


class SessionCount:
    """The WebSocket sessions open now (read by ``GET /rag_gym/sessions``)."""

    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self.active = 0


class SessionGate:
    """ASGI middleware: the token, and a session limit that answers with a protocol error.

    A WebSocket over ``max_sessions`` is accepted, its first message answered with an OpenEnv
    error frame (code ``CAPACITY_REACHED``), then closed with code 1013; a client that sends
    nothing within ``idle_s`` seconds gets the close alone.
    """

    def __init__(self, app, token: str | None, count: SessionCount, idle_s: float = 10.0) -> None:
        self.app = app
        self.token = token.encode() if token else None
        self.count = count
        self.idle_s = idle_s

    def authorised(self, headers: dict[bytes, bytes]) -> bool:
        if self.token is None:
            return True
        scheme, _, credentials = headers.get(b"authorization", b"").strip().partition(b" ")
        scheme, credentials = scheme.lower(), credentials.strip()
        if scheme == b"bearer":
            return hmac.compare_digest(credentials, self.token)
        if scheme == b"basic":
            try:
                _, _, password = base64.b64decode(credentials, validate=True).partition(b":")
            except ValueError:
                return False
            return hmac.compare_digest(password, self.token)
        return False

    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if not (kind == "http" and scope["path"] == "/health") and not self.authorised(
            dict(scope["headers"])
        ):
            await self._unauthorised(kind, scope, send)
            return
        if kind == "http":
            await self.app(scope, receive, send)
            return
        if self.count.active >= self.count.max_sessions:
            await self._over_capacity(receive, send)
            return
        self.count.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.count.active -= 1

    async def _unauthorised(self, kind: str, scope, send) -> None:
        body = json.dumps(
            {
                "error": "missing or wrong token (Authorization: Bearer <token>, or the URL's userinfo)"
            }
        ).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer"),
        ]
        if kind == "http":
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": body})
        elif "websocket.http.response" in scope.get("extensions", {}):
            await send({"type": "websocket.http.response.start", "status": 401, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body})
        else:
            await send({"type": "websocket.close", "code": 1008})

    async def _over_capacity(self, receive, send) -> None:
        message = await receive()  # websocket.connect
        if message["type"] != "websocket.connect":
            return
        await send({"type": "websocket.accept"})
        reason = (
            f"server at capacity: {self.count.active} of {self.count.max_sessions} sessions in use; "
            "close a session or try again later"
        )
        try:
            message = await asyncio.wait_for(receive(), self.idle_s)
        except asyncio.TimeoutError:
            message = {"type": "websocket.receive"}
        if message["type"] == "websocket.disconnect":
            return
        frame = {
            "type": "error",
            "data": {
                "message": reason,
                "code": "CAPACITY_REACHED",
                "active_sessions": self.count.active,
                "max_sessions": self.count.max_sessions,
            },
        }
        await send({"type": "websocket.send", "text": json.dumps(frame)})
        await send({"type": "websocket.close", "code": 1013, "reason": "server at capacity"})
