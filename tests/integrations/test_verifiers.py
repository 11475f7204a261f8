"""rag-gym's verifiers taskset, run by verifiers' own eval entry point (``vf-eval``).

Upload (``--no-push``), the remote runtime (the taskset's seat runs in a subprocess runtime) and
the shell harness (rag-gym's in-process harness is the taskset's default) are off; every model
call goes to a server on 127.0.0.1, and ``HOME`` is the test's temporary folder. The tools
interaction's calls go through the rollout's MCP tool server (``RagGymToolset``, a subprocess
verifiers starts); the toolset is also tested in-process against ``RagGymToolEnv``.
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


def search_then_answer(messages: list[dict]):
    """Search the question, then answer with the first passage's title, then stop."""
    tools = [m for m in messages if m.get("role") == "tool"]
    question = next(m["content"] for m in messages if m["role"] == "user")
    if not tools:
        return "search", json.dumps({"query": question.removeprefix("Question: ")})
    if len(tools) == 1:
        found = re.search(r"Doc 1\(Title: ([^)]*)\)", tools[0]["content"])
        return "answer", json.dumps({"answer": found.group(1) if found else "unknown"})
    return None


def malformed_then_search(messages: list[dict]):
    """A wrong argument name, arguments that are not JSON, then searches until stopped."""
    tools = [m for m in messages if m.get("role") == "tool"]
    question = next(m["content"] for m in messages if m["role"] == "user")
    if not tools:
        return "search", json.dumps({"q": "anything"})
    if len(tools) == 1:
        return "search", "{not json"
    return "search", json.dumps({"query": question.removeprefix("Question: ")})


def search_then_answer_in_tags(messages: list[dict]):
    """The text interaction's tags: search the question, then answer "Nobody"."""
    users = [m["content"] for m in messages if m["role"] == "user"]
    if len(users) == 1:
        return f"<search>{users[0].removeprefix('Question: ')}</search>"
    return "<answer>Nobody</answer>"


def scripted_app(script):
    """An OpenAI-compatible chat server that answers with the tool call ``script(messages)``
    gives (``(name, arguments as a JSON string)``), with its text when it gives a string, or
    "Done." when it gives ``None``."""
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
        call = script(body["messages"])
        if call is None or isinstance(call, str):
            message = {"role": "assistant", "content": call or "Done."}
            call = None
        else:
            message = {"role": "assistant", "content": None}
        if call:
            message["tool_calls"] = [
                {
                    "id": f"call_{uuid.uuid4().hex[:8]}",
                    "type": "function",
                    "function": {"name": call[0], "arguments": call[1]},
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
def scripted_server(request):
    """The scripted server on 127.0.0.1; the test's ``script`` parameter picks its calls."""
    import uvicorn

    app = scripted_app(request.param)
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
    # nothing was written outside the temporary folder's HOME and outputs, and no file in HOME
    # (verifiers' subprocess runtimes remove their scratch folders, leaving empty parents)
    assert {p.name for p in tmp_path.iterdir()} <= {"home", "out"}
    assert [p for p in home.rglob("*") if not p.is_dir()] == []
    return episodes


def tool_messages(trace: dict) -> list[dict]:
    """The tool results the model was sent, in order (from the trace's transcript)."""
    return [n["message"] for n in trace["nodes"] if n["message"]["role"] == "tool"]


def without_titles(schema: dict) -> dict:
    """A JSON schema without pydantic's ``title`` keys, an empty ``required`` spelled out."""
    out = {k: without_titles(v) if isinstance(v, dict) else v for k, v in schema.items()}
    out.pop("title", None)
    if out.get("type") == "object" and "properties" in schema:
        out.setdefault("required", [])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("scripted_server", [search_then_answer], indirect=True)
def test_tool_interaction_through_the_mcp_toolset(tmp_path, scripted_server):
    from rag_gym.integrations.trl_env import make_env_class
    from rag_gym.integrations.verifiers_taskset import tool_schemas
    from rag_gym.metrics import exact_match, f1_score

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
    Env = make_env_class("rag_gym/SynthHop-v0", env_kwargs=WORLD)
    env = Env()
    # the tools offered to the model are the MCP server's, in TRL's order, with
    # RagGymToolEnv's names, arguments and descriptions
    offered = app.state.requests[0]["tools"]
    assert [t["function"]["name"] for t in offered] == ["answer", "backtrack", "refuse", "search"]
    assert [
        {
            **t,
            "function": {
                **t["function"],
                "parameters": without_titles(t["function"]["parameters"]),
            },
        }
        for t in offered
    ] == tool_schemas(env)
    # two model calls per episode: the third was refused by the task's @stop, not sent
    assert len(app.state.requests) == 4
    for episode in episodes:
        trace = episode["traces"][0]
        outcome = trace["info"]["rag_gym"]
        data = trace["task"]["data"]
        assert outcome["question_id"] == data["question_id"]
        assert [c[0] for c in outcome["calls"]] == ["search", "answer"]
        assert trace["stop_condition"] == "episode_over"
        # the search result the model read is the env's passages for that query: the call
        # reached an env reset to this question, through the MCP tool server
        env.reset(question_id=data["question_id"])
        query = data["prompt"].removeprefix("Question: ")
        assert outcome["calls"][0] == ["search", query]
        # (the answer's result is not in the transcript: the episode was over, so the turn
        # that would have carried it to the model was refused)
        assert [m["content"] for m in tool_messages(trace)] == [env.search(query)]
        # the rewards are EM and F1 of the scripted answer against the gold answers
        answer = outcome["calls"][1][1]
        assert trace["rewards"]["em"] == {
            "score": exact_match(answer, data["answers"]),
            "weight": 0.5,
        }
        assert trace["rewards"]["f1"] == {"score": f1_score(answer, data["answers"]), "weight": 0.5}
        env.answer(answer)
        assert trace["metrics"]["episode_return"] == env.episode_return
        # each step's reward, in order, for per-turn credit
        assert outcome["step_rewards"] == env.step_rewards and len(env.step_rewards) == 2
        assert sum(outcome["step_rewards"]) == pytest.approx(env.episode_return)
        assert trace["metrics"]["searches"] == 1.0 and trace["metrics"]["steps"] == 2.0
        assert trace["metrics"]["format_errors"] == 0.0
    # the scripted answers (the first passage's title) are right for one question and wrong
    # for the other: both reward values were seen
    assert {e["traces"][0]["rewards"]["em"]["score"] for e in episodes} == {0.0, 1.0}


@pytest.mark.slow
@pytest.mark.parametrize("scripted_server", [malformed_then_search], indirect=True)
def test_malformed_tool_calls_get_a_message_and_max_turns_stops(tmp_path, scripted_server):
    from rag_gym.integrations.trl_env import make_env_class
    from rag_gym.integrations.verifiers_taskset import NOT_AN_OBJECT
    from rag_gym.integrations.verifiers_tools import BAD_ARGUMENTS

    url, app = scripted_server
    (episode,) = vf_eval(
        tmp_path,
        url,
        "scripted",
        "--env.taskset.interaction",
        "tools",
        "--env.taskset.num-tasks",
        "1",
        "--env.taskset.max-turns",
        "4",
        "-n",
        "1",
    )
    assert episode["ok"] and not episode["errors"]
    trace = episode["traces"][0]
    bad_arguments, not_json, search = (m["content"] for m in tool_messages(trace))
    # the tool server refuses the wrong argument name with its message
    expected = '{"query": "<string>"}'
    assert bad_arguments == BAD_ARGUMENTS.format(
        name="search", expected=expected, got='{"q": "anything"}'
    )
    # the harness answers arguments that are not JSON (they cannot be sent over MCP)
    with pytest.raises(json.JSONDecodeError) as error:
        json.loads("{not json")
    assert not_json == NOT_AN_OBJECT.format(name="search", detail=error.value)
    # the malformed calls took no env step: the first real search is the env's first step
    env = make_env_class("rag_gym/SynthHop-v0", env_kwargs=WORLD)()
    data = trace["task"]["data"]
    env.reset(question_id=data["question_id"])
    assert search == env.search(data["prompt"].removeprefix("Question: "))
    # four model turns (max_turns), then the task's @stop refused the fifth
    assert len(app.state.requests) == 4
    assert trace["stop_condition"] == "turn_limit"
    outcome = trace["info"]["rag_gym"]
    assert outcome["format_errors"] == 1 and outcome["steps"] == 2 and not outcome["done"]
    assert trace["metrics"]["format_errors"] == 1.0
    assert trace["metrics"]["unsent_tool_calls"] == 1.0
    assert trace["metrics"]["searches"] == 2.0
    assert trace["rewards"]["em"]["score"] == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("scripted_server", [search_then_answer_in_tags], indirect=True)
def test_text_interaction_against_a_scripted_server(tmp_path, scripted_server):
    url, app = scripted_server
    (episode,) = vf_eval(
        tmp_path,
        url,
        "scripted",
        "--env.taskset.interaction",
        "text",
        "--env.taskset.num-tasks",
        "1",
        "-n",
        "1",
    )
    assert episode["ok"] and not episode["errors"]
    trace = episode["traces"][0]
    outcome = trace["info"]["rag_gym"]
    # each reply was one env step, played host-side: no tools offered, no tool server
    assert "tools" not in app.state.requests[0]
    assert len(app.state.requests) == 2 and outcome["steps"] == 2 and outcome["done"]
    assert outcome["prediction"] == "Nobody" and outcome["searches"] == 1
    # one reward per env step, in order, summing to the return
    assert len(outcome["step_rewards"]) == 2
    assert sum(outcome["step_rewards"]) == pytest.approx(outcome["episode_return"])
    users = [n["message"]["content"] for n in trace["nodes"] if n["message"]["role"] == "user"]
    assert users[1].startswith("<information>")
    assert trace["rewards"]["em"]["score"] == outcome["em"] == 0.0


def served_toolset(reward_preset=None, index=0):
    """A RagGymToolset set up for one task (as its server process does) and registered on an
    in-process MCP server; also the RagGymToolEnv it should match."""
    import asyncio

    from mcp.server.mcpserver import MCPServer

    from rag_gym.integrations.trl_env import make_env_class
    from rag_gym.integrations.verifiers_taskset import RagGymData
    from rag_gym.integrations.verifiers_tools import RagGymToolsConfig, RagGymToolset

    env = make_env_class("rag_gym/SynthHop-v0", reward_preset=reward_preset, env_kwargs=WORLD)()
    question_id = env.question_ids[index]
    env.reset(question_id=question_id)
    data = RagGymData(
        question_id=question_id,
        env_id="rag_gym/SynthHop-v0",
        env_kwargs=WORLD,
        reward_preset=reward_preset,
        interaction="tools",
    )
    toolset = RagGymToolset(RagGymToolsConfig())
    asyncio.run(toolset.setup_task(data))
    mcp = MCPServer("test")
    toolset.register(mcp)
    return toolset, mcp, env


@pytest.mark.parametrize("reward_preset", [None, "eval_rar"])
def test_toolset_tools_are_the_tool_envs(reward_preset):
    import asyncio

    from rag_gym.integrations.trl_env import tools_of
    from rag_gym.integrations.verifiers_taskset import tool_schemas

    _, mcp, env = served_toolset(reward_preset)
    listed = asyncio.run(mcp.list_tools())
    served = [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": without_titles(t.input_schema),
            },
        }
        for t in sorted(listed, key=lambda t: t.name)
    ]
    assert served == tool_schemas(env)
    names = [t.__name__ for t in tools_of(env)]
    assert names == (
        ["answer", "backtrack", "evaluate", "refuse", "search"]
        if reward_preset
        else ["answer", "backtrack", "refuse", "search"]
    )
    # the descriptions are the first lines of RagGymToolEnv's docstrings
    for tool, spec in zip(tools_of(env), served, strict=True):
        assert spec["function"]["description"] == tool.__doc__.strip().splitlines()[0]


def test_toolset_plays_the_env_and_answers_malformed_calls():
    import asyncio

    from rag_gym.integrations.verifiers_tools import BAD_ARGUMENTS, UNKNOWN_TOOL

    toolset, mcp, env = served_toolset(index=3)

    def call(name, arguments):
        result = asyncio.run(mcp.call_tool(name, arguments))
        return result.content[0].text, result.is_error

    assert call("search", {"query": "city founded"}) == (env.search("city founded"), False)
    bad = BAD_ARGUMENTS.format(name="search", expected='{"query": "<string>"}', got='{"query": 3}')
    assert call("search", {"query": 3}) == (bad, True)
    assert call("search", {"query": "x", "k": "5"})[0].startswith("error: search takes")
    assert call("refuse", {"why": "no"}) == (
        BAD_ARGUMENTS.format(name="refuse", expected="no arguments", got='{"why": "no"}'),
        True,
    )
    assert call("evaluate", {"note": "x"}) == (
        UNKNOWN_TOOL.format(name="evaluate", tools="answer, backtrack, refuse, search"),
        True,
    )
    assert call("answer", {"answer": "Nobody"}) == (env.answer("Nobody"), False)
    # a call after the end is the env's refusal, not a crash
    assert call("search", {"query": "more"}) == (
        "error: the episode has ended: no more tool calls",
        False,
    )
    # malformed calls took no env step
    assert toolset.env.calls == [("search", "city founded"), ("answer", "Nobody")]
    assert toolset.format_errors == 5


def test_toolset_config_errors():
    from verifiers.v1 import ToolsetError

    from rag_gym.integrations.verifiers_taskset import RagGymTasksetConfig
    from rag_gym.integrations.verifiers_tools import RagGymToolsConfig, RagGymToolset

    with pytest.raises(
        ValueError, match=re.escape("expected tools.runtime.type 'subprocess', got 'docker'")
    ):
        RagGymToolsConfig(runtime={"type": "docker"})
    with pytest.raises(ValueError, match=re.escape("expected tools.colocated false")):
        RagGymToolsConfig(colocated=True)
    with pytest.raises(ValueError, match=re.escape("expected no tools.url")):
        RagGymToolsConfig(url="http://example.com/mcp")
    with pytest.raises(
        ValueError, match=re.escape("expected no task.tools with interaction 'text'")
    ):
        RagGymTasksetConfig(interaction="text", task={"tools": {}})
    assert RagGymTasksetConfig(interaction="tools").task.tools == RagGymToolsConfig()
    assert RagGymTasksetConfig(interaction="text").task.tools is None
    with pytest.raises(ToolsetError, match="got no task"):
        RagGymToolset(RagGymToolsConfig()).register(None)


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
