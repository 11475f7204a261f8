"""The OpenEnv server, played by openenv's own client over WebSocket on 127.0.0.1.

The server runs as ``rag-gym openenv serve`` in a subprocess (with a token), so these tests
also cover the CLI verb.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import gymnasium as gym
import pytest

pytest.importorskip(
    "openenv.core.env_server", reason="needs openenv: pip install 'rag-gym[openenv]'"
)

from openenv.core.generic_client import GenericEnvClient

import rag_gym
from rag_gym.envs.search import ActionType
from rag_gym.integrations._common import json_safe
from rag_gym.integrations.openenv_server import ServerConfig
from rag_gym.wrappers.text_actions import TextActions

ROOT = Path(__file__).resolve().parents[2]
WORLD = {"dataset_kwargs": {"n_passages": 2000, "n_questions": [60, 30, 30]}}
ENV_ID = "rag_gym/SynthHop-v0"
PRESET = "eval_rar"
TOKEN = "s3cret-test-token"
MAX_SESSIONS = 64


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def get_json(url: str, token: str | None = TOKEN) -> dict:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def active_sessions(base: str, expected: int) -> int:
    """The server's open sessions, polled for up to 10 s until they are ``expected`` (a closed
    connection's session is destroyed just after the close)."""
    for _ in range(100):
        active = get_json(f"{base}/rag_gym/sessions")["active"]
        if active == expected:
            break
        time.sleep(0.1)
    return active


@pytest.fixture(scope="module")
def server():
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("RAG_GYM_TOKEN", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rag_gym.cli",
            "openenv",
            "serve",
            "--env",
            ENV_ID,
            "--reward-preset",
            PRESET,
            "--env-kwargs",
            json.dumps(WORLD),
            "--port",
            str(port),
            "--token",
            TOKEN,
            "--max-sessions",
            str(MAX_SESSIONS),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {proc.stderr.read().decode()[-3000:]}")
        try:
            get_json(f"{base}/health")
            break
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.5)
    else:
        proc.kill()
        raise AssertionError("server did not start in 180 s")
    yield {"base": base, "auth": f"http://rag-gym:{TOKEN}@127.0.0.1:{port}", "proc": proc}
    proc.terminate()
    proc.wait(timeout=30)


def local_env(tags: str | None = None) -> gym.Env:
    env = rag_gym.make(ENV_ID, reward_preset=PRESET, **WORLD)
    return TextActions(env, tags=tags) if tags else env


def expected_metadata(info: dict, terminated: bool) -> dict:
    meta = json_safe(info)
    meta.setdefault("reward_terms", {})
    meta["terminated"] = terminated
    return meta


DICT_SCRIPT = [
    {"type": "search", "text": None},  # None: the question
    {"type": "evaluate", "text": "the first hop names a person; the second hop is missing"},
    {"type": "search", "text": ""},  # invalid: an empty query
    {"type": "search", "text": "birthplace country"},
    {"type": "backtrack", "text": ""},
    {"type": "answer", "text": "Nowhere"},
]


@pytest.mark.slow
def test_dict_episodes_match_in_process(server):
    local = local_env()
    with GenericEnvClient(base_url=server["auth"]).sync() as client:
        for seed in (0, 1, 2):
            remote = client.reset(seed=seed, tags=None)
            obs, info = local.reset(seed=seed)
            assert remote.observation["text"] == obs
            assert remote.metadata == expected_metadata(info, False)
            assert remote.reward is None and remote.done is False
            for step in DICT_SCRIPT:
                text = info["question"] if step["text"] is None else step["text"]
                remote = client.step({"type": step["type"], "text": text})
                obs, reward, term, trunc, info = local.step(
                    {"type": ActionType[step["type"].upper()], "text": text}
                )
                assert remote.observation["text"] == obs
                assert remote.reward == reward
                assert remote.done == (term or trunc)
                assert remote.observation["truncated"] == trunc
                assert remote.metadata["reward_terms"] == info["reward_terms"]
                assert remote.metadata == expected_metadata(info, term)
            assert remote.done and remote.metadata["action_type"] == "ANSWER"
            state = client.state()
            assert state["step_count"] == len(DICT_SCRIPT)
            assert state["question_id"] == info["question_id"]
            assert state["done"] is True


@pytest.mark.slow
def test_text_episodes_match_in_process(server):
    local = local_env(tags="search_r1")
    with GenericEnvClient(base_url=server["auth"]).sync() as client:
        for seed in (3, 4):
            remote = client.reset(seed=seed, tags="search_r1")
            obs, info = local.reset(seed=seed)
            assert remote.observation["text"] == obs
            turns = [
                f"<think>look it up</think><search>{info['question']}</search>",
                "I am not sure what to do.",  # no action tag: the format message
                "<answer>Nowhere</answer>",
            ]
            returns = 0.0
            for turn in turns:
                remote = client.step({"text": turn})
                obs, reward, term, trunc, info = local.step(turn)
                returns += reward
                assert remote.observation["text"] == obs
                assert remote.reward == reward
                assert remote.observation["truncated"] == trunc
                assert remote.metadata == expected_metadata(info, term)
            assert remote.done
            assert client.state()["episode_return"] == pytest.approx(returns)


def load_deploy_package():
    """deploy/openenv as the package its pyproject installs (``openenv_rag_gym``)."""
    import importlib.util

    folder = ROOT / "deploy" / "openenv"
    spec = importlib.util.spec_from_file_location(
        "openenv_rag_gym", folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["openenv_rag_gym"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("openenv_rag_gym", None)
    return module


@pytest.mark.slow
def test_typed_client_of_the_deploy_package_matches_in_process(server):
    """The typed client and models of deploy/openenv (``openenv init``'s client.py and
    models.py) play the same episodes as an in-process env, with typed results."""
    package = load_deploy_package()
    Action, Client = package.RagGymAction, package.RagGymEnvClient
    local = local_env()
    with Client(base_url=server["auth"]).sync() as client:
        remote = client.reset(seed=5, tags=None)
        obs, info = local.reset(seed=5)
        assert isinstance(remote.observation, package.RagGymObservation)
        assert remote.observation.text == obs
        assert remote.metadata == expected_metadata(info, False)
        for step in DICT_SCRIPT:
            text = info["question"] if step["text"] is None else step["text"]
            remote = client.step(Action(type=step["type"], text=text))
            obs, reward, term, trunc, info = local.step(
                {"type": ActionType[step["type"].upper()], "text": text}
            )
            assert remote.observation.text == obs
            assert remote.reward == remote.observation.reward == reward
            assert remote.done == remote.observation.done == (term or trunc)
            assert remote.observation.truncated == trunc
            assert remote.observation.metadata == expected_metadata(info, term)
        state = client.state()
        assert isinstance(state, package.RagGymState)
        assert state.step_count == len(DICT_SCRIPT) and state.done
        assert state.question_id == info["question_id"]
        # a dict action is checked by the model before it travels
        with pytest.raises(ValueError, match="type"):
            client.step({"type": "jump", "text": "x"})


@pytest.mark.slow
def test_malformed_actions_are_protocol_errors_and_the_session_goes_on(server):
    with GenericEnvClient(base_url=server["auth"]).sync() as client:
        with pytest.raises(RuntimeError, match=r"send reset before step.*EXECUTION_ERROR"):
            client.step({"type": "search", "text": "x"})
        client.reset(seed=0, tags=None)
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            client.step({"type": "jump", "text": "x"})
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            client.step({"type": "search", "query": "x"})
        with pytest.raises(RuntimeError, match=r"plays the Dict form.*EXECUTION_ERROR"):
            client.step({"text": "<search>x</search>"})
        with pytest.raises(RuntimeError, match=r"unknown arguments \['colour'\]"):
            client.reset(seed=0, colour="red")
        remote = client.step({"type": "search", "text": "Kreivrum"})  # still playing
        assert remote.done is False and remote.metadata["action_type"] == "SEARCH"
        remote = client.step({"type": "answer", "text": "x"})
        assert remote.done
        with pytest.raises(RuntimeError, match=r"episode has ended.*EXECUTION_ERROR"):
            client.step({"type": "answer", "text": "x"})


@pytest.mark.slow
def test_invalid_json_frame_gets_an_error_frame(server):
    from websockets.sync.client import connect

    ws_url = server["base"].replace("http://", "ws://") + "/ws"
    with connect(ws_url, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        ws.send("{not json")
        frame = json.loads(ws.recv(timeout=10))
        assert frame["type"] == "error" and frame["data"]["code"] == "INVALID_JSON"
        ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
        assert json.loads(ws.recv(timeout=10))["type"] == "observation"


@pytest.mark.slow
def test_token_is_required(server):
    with pytest.raises(ConnectionError, match="HTTP 401"):
        GenericEnvClient(base_url=server["base"]).sync().connect()
    with pytest.raises(urllib.error.HTTPError, match="401"):
        get_json(f"{server['base']}/schema", token=None)
    assert get_json(f"{server['base']}/health", token=None)["status"] == "healthy"
    wrong = server["auth"].replace(TOKEN, "wrong")
    with pytest.raises(ConnectionError, match="HTTP 401"):
        GenericEnvClient(base_url=wrong).sync().connect()


async def _play(url: str, steps: int, seed: int) -> tuple[int, int]:
    """``steps`` steps in one session (resetting at each episode's end): (steps, errors)."""
    done_steps = errors = 0
    async with GenericEnvClient(base_url=url) as client:
        result = await client.reset(seed=seed, tags=None)
        question = result.metadata["question"]
        for i in range(steps):
            kind = "answer" if i % 4 == 3 else "search"
            try:
                result = await client.step({"type": kind, "text": f"{question} {i}"})
            except Exception:
                errors += 1
                continue
            done_steps += 1
            if result.done:
                result = await client.reset(seed=seed + i)
                question = result.metadata["question"]
    return done_steps, errors


@pytest.mark.slow
def test_64_sessions_x_100_steps(server):
    pid = server["proc"].pid
    rss_before = rss_mb(pid)

    async def run():
        return await asyncio.gather(
            *(_play(server["auth"], 100, seed) for seed in range(MAX_SESSIONS))
        )

    t0 = time.perf_counter()
    results = asyncio.run(run())
    seconds = time.perf_counter() - t0
    rss_after = rss_mb(pid)
    steps = sum(r[0] for r in results)
    errors = sum(r[1] for r in results)
    print(
        f"\n64 sessions x 100 steps: {steps} steps, {errors} errors, {steps / seconds:.0f} steps/s; "
        f"server RSS {rss_before:.0f} MB before, {rss_after:.0f} MB after"
    )
    assert errors == 0 and steps == MAX_SESSIONS * 100
    # one shared index: 64 sessions cost far less than 64 copies of the data
    assert rss_after - rss_before < 0.5 * rss_before
    assert active_sessions(server["base"], 0) == 0


@pytest.mark.slow
def test_over_capacity_and_dropped_connections(server):
    async def run():
        clients = [GenericEnvClient(base_url=server["auth"]) for _ in range(MAX_SESSIONS)]
        await asyncio.gather(*(c.connect() for c in clients))
        await asyncio.gather(*(c.reset(seed=0) for c in clients))
        assert (
            await asyncio.to_thread(active_sessions, server["base"], MAX_SESSIONS) == MAX_SESSIONS
        )
        extra = GenericEnvClient(base_url=server["auth"])
        with pytest.raises(RuntimeError, match=r"server at capacity: 64 of 64.*CAPACITY_REACHED"):
            await extra.reset(seed=0)
        await extra.close()
        # drop 8 connections without a close frame: their sessions are freed
        for c in clients[:8]:
            c._ws.transport.abort()
        left = await asyncio.to_thread(active_sessions, server["base"], MAX_SESSIONS - 8)
        assert left == MAX_SESSIONS - 8
        # a dropped client's next step fails at once with a connection error, never hangs
        from websockets.exceptions import ConnectionClosed

        with pytest.raises((ConnectionError, ConnectionClosed)):
            await asyncio.wait_for(clients[0].step({"type": "search", "text": "x"}), 10)
        fresh = GenericEnvClient(base_url=server["auth"])
        result = await fresh.reset(seed=5)
        assert result.observation["text"].startswith("Question: ")
        await fresh.close()
        await asyncio.gather(*(c.close() for c in clients[8:]))

    asyncio.run(run())


def test_config_errors():
    with pytest.raises(ValueError, match="did you mean 'rag_gym/SynthHop-v0'"):
        ServerConfig("rag_gym/SynthHop-v9")
    with pytest.raises(ValueError, match="expected a reward preset"):
        ServerConfig(ENV_ID, reward_preset="evorag")
    with pytest.raises(ValueError, match="max_concurrent_envs to be an int >= 1"):
        ServerConfig(ENV_ID, max_concurrent_envs=0)
    with pytest.raises(TypeError, match="env_kwargs to be a dict"):
        ServerConfig(ENV_ID, env_kwargs=["k"])
    with pytest.raises(ValueError, match="tag"):
        ServerConfig(ENV_ID, tags="search_r2")
    with pytest.raises(ValueError, match="give reward_preset as its own option"):
        ServerConfig(ENV_ID, env_kwargs={"reward_preset": "none"})


def test_a_text_in_preset_plays_its_own_tags_only():
    from rag_gym.integrations.openenv_server import RagGymEnvironment

    env = RagGymEnvironment(ServerConfig(ENV_ID, reward_preset="when_to_search", env_kwargs=WORLD))
    for tags in (None, "when_to_search"):
        env.reset(seed=0, tags=tags)
        assert env.state.tags == "when_to_search"
    with pytest.raises(ValueError, match=r"expected tags 'when_to_search'.*got 'search_r1'"):
        env.reset(seed=0, tags="search_r1")
    plain = RagGymEnvironment(ServerConfig(ENV_ID, env_kwargs=WORLD))
    for tags in (None, "eval_rar", None):
        plain.reset(seed=0, tags=tags)
        assert plain.state.tags == tags


@pytest.mark.slow
def test_deploy_app_passes_openenv_runtime_validation(monkeypatch):
    """deploy/openenv/server/app.py (the container's entry point) against OpenEnv's own
    runtime validator (``openenv validate --url``)."""
    import importlib
    import threading

    import uvicorn
    from openenv.cli._validation import validate_running_environment

    monkeypatch.setenv("RAG_GYM_ENV_KWARGS", json.dumps(WORLD))
    monkeypatch.setenv("RAG_GYM_REWARD_PRESET", PRESET)
    monkeypatch.delenv("RAG_GYM_TOKEN", raising=False)
    monkeypatch.syspath_prepend(str(ROOT / "deploy" / "openenv"))
    app = importlib.import_module("server.app").app
    port = free_port()
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    try:
        for _ in range(100):
            if uv.started:
                break
            time.sleep(0.1)
        report = validate_running_environment(f"http://127.0.0.1:{port}")
        assert report["passed"], [c for c in report["criteria"] if not c["passed"]]
        assert report["summary"]["required_passed_count"] >= 6
    finally:
        uv.should_exit = True
        thread.join(timeout=30)
        sys.modules.pop("server.app", None)
        sys.modules.pop("server", None)


def test_config_from_environ():
    from rag_gym.integrations.openenv_server import config_from_environ

    cfg = config_from_environ(
        {
            "RAG_GYM_ENV": "rag_gym/SynthHop-Hard-v0",
            "RAG_GYM_REWARD_PRESET": "eval_rar",
            "RAG_GYM_ENV_KWARGS": '{"k": 5}',
            "RAG_GYM_TAGS": "search_r1",
            "RAG_GYM_TOKEN": "t",
        }
    )
    assert (cfg.env_id, cfg.reward_preset, cfg.env_kwargs, cfg.tags, cfg.token) == (
        "rag_gym/SynthHop-Hard-v0",
        "eval_rar",
        {"k": 5},
        "search_r1",
        "t",
    )
    with pytest.raises(ValueError, match="RAG_GYM_MAX_SESSIONS to be an int"):
        config_from_environ({"RAG_GYM_MAX_SESSIONS": "many"})
    with pytest.raises(ValueError, match="RAG_GYM_ENV_KWARGS to be a JSON object"):
        config_from_environ({"RAG_GYM_ENV_KWARGS": "[1]"})


def test_cli_errors_name_the_problem():
    from typer.testing import CliRunner

    from rag_gym.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["openenv", "serve", "--env", "rag_gym/SynthHop-v9"])
    assert result.exit_code == 2 and "did you mean 'rag_gym/SynthHop-v0'" in result.output
    result = runner.invoke(app, ["openenv", "serve", "--env", ENV_ID, "--env-kwargs", "{k"])
    assert result.exit_code == 2 and "expected --env-kwargs to be a JSON object" in result.output
    result = runner.invoke(app, ["openenv", "serve", "--env", ENV_ID, "--max-sessions", "0"])
    assert result.exit_code == 2 and "max_concurrent_envs to be an int >= 1" in result.output


def test_sessions_share_one_index():
    from rag_gym.integrations.openenv_server import RagGymEnvironment

    cfg = ServerConfig(ENV_ID, reward_preset=PRESET, env_kwargs=WORLD)
    a, b = RagGymEnvironment(cfg), RagGymEnvironment(cfg)
    assert a._env.unwrapped._shared is b._env.unwrapped._shared  # questions, corpus, index
    assert a._env is not b._env  # one env per session
