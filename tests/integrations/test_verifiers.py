"""rag-gym's verifiers taskset, run by verifiers' own eval entry point (``vf-eval``).

Upload (``--no-push``), the remote runtime (the taskset's seat runs in a subprocess runtime) and
the shell harness (rag-gym's in-process harness is the taskset's default) are off; every model
call goes to a server on 127.0.0.1, and ``HOME`` is the test's temporary folder.
"""

# no "from __future__ import annotations": FastAPI must see the scripted server's Request class

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1", reason="needs verifiers: pip install 'rag-gym[verifiers]'")

from tests.conftest import requires_llama

ROOT = Path(__file__).resolve().parents[2]
WORLD = {"dataset_kwargs": {"n_passages": 2000, "n_questions": [40, 10, 10]}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scripted_app():
    """An OpenAI-compatible chat server that answers with fixed tool calls: search the
    question, then answer with the first passage's title, then stop."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI()
    app.state.requests = []

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": "scripted", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        app.state.requests.append(body)
        messages = body["messages"]
        tools = [m for m in messages if m.get("role") == "tool"]
        question = next(m["content"] for m in messages if m["role"] == "user")
        if not tools:
            call = ("search", {"query": question.removeprefix("Question: ")})
        elif len(tools) == 1:
            found = re.search(r"Doc 1\(Title: ([^)]*)\)", tools[0]["content"])
            call = ("answer", {"answer": found.group(1) if found else "unknown"})
        else:
            call = None
        message = {"role": "assistant", "content": "Done." if call is None else None}
        if call:
            message["tool_calls"] = [
                {
                    "id": f"call_{uuid.uuid4().hex[:8]}",
                    "type": "function",
                    "function": {"name": call[0], "arguments": json.dumps(call[1])},
                }
            ]
        finish = "tool_calls" if call else "stop"
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        head = {"id": "cmpl-1", "created": int(time.time()), "model": body.get("model")}
        if not body.get("stream"):
            return JSONResponse(
                {
                    **head,
                    "object": "chat.completion",
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": usage,
                }
            )
        delta = dict(message)
        if "tool_calls" in delta:
            delta["tool_calls"] = [dict(tc, index=i) for i, tc in enumerate(delta["tool_calls"])]
        chunks = [
            {**head, "object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": delta, "finish_reason": finish}
            ]},
            {**head, "object": "chat.completion.chunk", "choices": [], "usage": usage},
        ]  # fmt: skip
        text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return StreamingResponse(iter([text]), media_type="text/event-stream")

    return app


@pytest.fixture
def scripted_server():
    import uvicorn

    app = scripted_app()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(100):
        if server.started:
            break
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/v1", app
    server.should_exit = True
    thread.join(timeout=30)


def vf_eval(tmp_path: Path, base_url: str, model: str, *args: str) -> list[dict]:
    """Run ``vf-eval rag-gym-verifiers`` (verifiers' own entry point) and read its traces."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "RAG_GYM_TEST_KEY": "unused",
        "NO_PROXY": "127.0.0.1",
    }
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-c",
        "from verifiers.v1.cli.eval.main import main; main()",
        "rag-gym-verifiers",
        "--env.taskset.env-kwargs",
        json.dumps(WORLD),
        "--model",
        model,
        "--client.base-url",
        base_url,
        "--client.api-key-var",
        "RAG_GYM_TEST_KEY",
        "--no-push",
        "--no-rich",
        "-o",
        str(out),
        *args,
    ]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (traces_file,) = out.glob("*/traces.jsonl")
    episodes = [json.loads(line) for line in traces_file.read_text().splitlines()]
    # nothing was written outside the temporary folder's HOME and outputs
    assert {p.name for p in tmp_path.iterdir()} <= {"home", "out"}
    return episodes


@pytest.mark.slow
def test_tool_interaction_against_a_scripted_server(tmp_path, scripted_server):
    from rag_gym.integrations.trl_env import make_env_class

    url, app = scripted_server
    episodes = vf_eval(
        tmp_path,
        url,
        "scripted",
        "--env.taskset.interaction",
        "tools",
        "--env.taskset.num-tasks",
        "2",
        "-n",
        "2",
    )
    assert len(episodes) == 2 and all(e["ok"] and not e["errors"] for e in episodes)
    # the tools were offered, in TRL's order
    offered = [t["function"]["name"] for t in app.state.requests[0]["tools"]]
    assert offered == ["answer", "backtrack", "refuse", "search"]
    Env = make_env_class("rag_gym/SynthHop-v0", env_kwargs=WORLD)
    for episode in episodes:
        trace = episode["traces"][0]
        outcome = trace["info"]["rag_gym"]
        assert [c[0] for c in outcome["calls"]] == ["search", "answer"]
        # the same calls in-process give the same scores
        env = Env()
        env.reset(question_id=outcome["question_id"])
        for name, arg in outcome["calls"]:
            getattr(env, name)(arg)
        em, f1 = env.info["scores"]["em"], env.info["scores"]["f1"]
        assert trace["rewards"]["em"] == {"score": em, "weight": 0.5}
        assert trace["rewards"]["f1"] == {"score": f1, "weight": 0.5}
        assert trace["metrics"]["episode_return"] == env.episode_return
        assert trace["metrics"]["searches"] == 1.0
    # the scripted answers (the first passage's title) are right for one question and wrong
    # for the other: both reward values were seen
    assert {e["traces"][0]["rewards"]["em"]["score"] for e in episodes} == {0.0, 1.0}


@pytest.fixture(scope="module")
def llama_server():
    from rag_gym.generation.llama_cpp import embedded_gguf_path

    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(embedded_gguf_path()),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            "4096",
            "--n_threads",
            "1",
            "--interrupt_requests",
            "False",
            "--model_alias",
            "smollm2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"{url}/models", timeout=1).read()
            break
        except OSError:
            if proc.poll() is not None:
                pytest.fail("the llama.cpp server exited at start")
            time.sleep(0.3)
    else:
        proc.kill()
        pytest.fail("the llama.cpp server did not start within 120 s")
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.llm
@requires_llama
def test_text_interaction_with_smollm2_on_llama_cpp(tmp_path, llama_server):
    pytest.importorskip("sse_starlette", reason="needs llama-cpp-python[server]")
    episodes = vf_eval(
        tmp_path,
        llama_server,
        "smollm2",
        "--env.taskset.interaction",
        "text",
        "--env.taskset.num-tasks",
        "2",
        "--env.taskset.max-turns",
        "2",
        "--sampling.max-tokens",
        "64",
        "-n",
        "2",
    )
    assert len(episodes) == 2 and all(e["ok"] and not e["errors"] for e in episodes)
    for episode in episodes:
        trace = episode["traces"][0]
        outcome = trace["info"]["rag_gym"]
        print(f"\n{outcome['question_id']}: rewards {trace['rewards']}, metrics {trace['metrics']}")
        assert outcome["steps"] >= 1  # the model's replies were played as text actions
        assert set(trace["rewards"]) == {"em", "f1"}
        assert trace["rewards"]["em"]["score"] == outcome["em"]
        assert outcome["searches"] + outcome["format_errors"] >= 1
        # each model reply was one env step; the user turns after the question are the env's
        # observations (passages or the format message) sent back between steps
        roles = [n["message"]["role"] for n in trace["nodes"]]
        users = [n["message"]["content"] for n in trace["nodes"] if n["message"]["role"] == "user"]
        assert roles.count("assistant") == outcome["steps"]
        assert users[0].startswith("Question: ")
        assert len(users) - 1 == outcome["steps"] - 1
        for obs in users[1:]:
            assert obs.startswith("<information>") or obs.startswith("The previous action")


def test_taskset_config_errors():
    from rag_gym.integrations.verifiers_taskset import RagGymTasksetConfig

    with pytest.raises(ValueError, match="did you mean 'rag_gym/SynthHop-v0'"):
        RagGymTasksetConfig(env_id="rag_gym/SynthHop-v9")
    with pytest.raises(ValueError, match="expected interaction 'text' or 'tools'"):
        RagGymTasksetConfig(interaction="chat")
    with pytest.raises(ValueError, match="expected a reward preset"):
        RagGymTasksetConfig(reward_preset="evorag")


def test_verifiers_loader_finds_the_taskset_env_and_harness():
    from verifiers.v1.utils.loaders import environment_class, harness_class, taskset_class

    assert taskset_class("rag-gym-verifiers").__name__ == "RagGymTaskset"
    assert environment_class("rag-gym-verifiers").__name__ == "RagGymEnv"
    assert harness_class("rag-gym-verifiers").__name__ == "RagGymHarness"
