"""Any OpenAI-compatible server: vLLM's, llama.cpp's (``python -m llama_cpp.server``), hosted APIs.

Chat prompts go to ``POST {base_url}/chat/completions``, plain prompts to
``POST {base_url}/completions``. A batch is sent as concurrent requests (``max_concurrency``),
so a server that batches internally (vLLM, llama.cpp with several slots) sees them together.
Each request has a timeout and is retried with exponential backoff on connection errors,
timeouts and 429/5xx answers; a request that still fails raises ``ConnectionError`` or
``TimeoutError`` naming the URL. Any other failure of the server raises
:class:`~rag_gym.generation.lm.BackendError` naming the URL (and the status): another HTTP error
status, a reply that is not JSON in UTF-8 (an HTML page), a broken HTTP reply, a reply without a
usable choice or whose text is not a string. Text quoted from a reply is cut short and its
control characters escaped.

The key comes from an environment variable (``OPENAI_API_KEY`` by default), never from code. A
redirect is followed (a 307 or 308 sends the request again, a 301, 302 or 303 as a ``GET``, as
browsers do), and the key goes with it only to the same scheme, host and port.
Only the standard library is used.
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rag_gym._http import DEFAULT_PORTS, SameOriginCredentials
from rag_gym._text import shown
from rag_gym.generation.lm import (
    BackendError,
    Generation,
    GenerationConfig,
    LanguageModel,
    Prompt,
    check_prompts,
)

_RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


class _SameOriginKey(SameOriginCredentials):
    """Follows a redirect to ``http`` or ``https`` (a 307 or 308 of a ``POST`` with its body,
    which urllib refuses), and sends the ``Authorization`` header on only to the request's own
    scheme, host and port."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if urllib.parse.urlsplit(newurl).scheme.lower() not in DEFAULT_PORTS:
            return None  # an HTTP API is not on ftp://, file://…: the 3xx is the answer
        if req.get_method() == "POST" and code in (307, 308):
            new = urllib.request.Request(
                newurl,
                data=req.data,
                headers=dict(req.header_items()),
                method="POST",
                origin_req_host=req.origin_req_host,
                unverifiable=True,
            )
            return self.keep_credentials(req, new, newurl)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_SameOriginKey())


class OpenAICompatibleLM(LanguageModel):
    """Generation through an OpenAI-compatible HTTP API.

    Args:
        model: the model name the server expects.
        base_url: e.g. ``http://127.0.0.1:8000/v1``.
        api_key_env: environment variable holding the key (unset: no ``Authorization`` header).
        timeout: seconds per request.
        max_retries: retries after the first attempt.
        max_concurrency: requests in flight at once for a batch.
    """

    def __init__(
        self,
        model: str,
        base_url: str = "http://127.0.0.1:8000/v1",
        api_key_env: str = "OPENAI_API_KEY",
        timeout: float = 60.0,
        max_retries: int = 2,
        max_concurrency: int = 8,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError(f"expected a model name, got {model!r}")
        from rag_gym._http import is_server_url

        if not is_server_url(base_url):
            raise ValueError(
                f"expected base_url to start with http:// or https://, got {base_url!r}"
            )
        if timeout <= 0 or max_retries < 0 or max_concurrency < 1:
            raise ValueError(
                f"expected timeout > 0, max_retries >= 0, max_concurrency >= 1, got {timeout}, {max_retries}, "
                f"{max_concurrency}"
            )
        self.name = model
        self.base_url = base_url.rstrip("/")
        self.api_key_env = api_key_env
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_concurrency = max_concurrency

    def generate(
        self, prompts: Sequence[Prompt], config: GenerationConfig | None = None
    ) -> list[list[Generation]]:
        config = config or GenerationConfig()
        prompts = check_prompts(prompts)
        jobs = [(p, config.seed + i) for p in prompts for i in range(config.n)]
        if len(jobs) == 1:
            results = [self._one(*jobs[0], config)]
        else:
            with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(jobs))) as pool:
                results = list(pool.map(lambda job: self._one(*job, config), jobs))
        return [results[i * config.n : (i + 1) * config.n] for i in range(len(prompts))]

    def _one(self, prompt: Prompt, seed: int, config: GenerationConfig) -> Generation:
        body: dict[str, Any] = {
            "model": self.name,
            "max_tokens": config.max_tokens,
            "temperature": config.temperature,
            "top_p": config.top_p,
            "seed": seed,
        }
        if config.stop:
            body["stop"] = list(config.stop)
        if isinstance(prompt, str):
            body["prompt"] = prompt
            path = "/completions"
        else:
            body["messages"] = prompt
            path = "/chat/completions"
        return _generation(self._post(path, body), self.base_url + path, isinstance(prompt, str))

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        url = self.base_url + path
        data = json.dumps(body).encode()
        key = os.environ.get(self.api_key_env)
        last: Exception | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(min(0.5 * 2 ** (attempt - 1), 8.0))
            request = urllib.request.Request(
                url, data=data, headers={"Content-Type": "application/json"}, method="POST"
            )
            if key:
                request.add_header("Authorization", f"Bearer {key}")
            try:
                with _OPENER.open(request, timeout=self.timeout) as response:
                    raw = response.read()
                    kind = response.headers.get_content_type()
            except urllib.error.HTTPError as exc:
                detail = _body_text(exc)
                if exc.code not in _RETRY_STATUS:
                    raise BackendError(
                        f"{url} answered {exc.code}: {detail}", url, exc.code
                    ) from None
                last = ConnectionError(f"{url} answered {exc.code}: {detail}")
            except TimeoutError:
                last = TimeoutError(f"{url} did not answer within {self.timeout}s")
            except urllib.error.URLError as exc:
                if isinstance(exc.reason, TimeoutError):
                    last = TimeoutError(f"{url} did not answer within {self.timeout}s")
                else:
                    last = ConnectionError(
                        f"cannot reach {url}: {shown(exc.reason)}; is the server running?"
                    )
            except ConnectionError as exc:  # reset, or closed before the reply's status line
                last = ConnectionError(
                    f"{url} closed the connection without a reply ({type(exc).__name__}); "
                    "is the server running?"
                )
            except http.client.HTTPException as exc:  # a status line or header not HTTP's
                raise BackendError(
                    f"{url} answered a broken HTTP reply ({type(exc).__name__}: "
                    f"{shown(exc, 120)}): is this an OpenAI-compatible server?",
                    url,
                ) from None
            else:
                return _json_reply(raw, kind, url)
        assert last is not None
        raise last

    def describe(self) -> dict[str, object]:
        return {"backend": "openai_compatible", "model": self.name, "base_url": self.base_url}


def _body_text(exc: urllib.error.HTTPError) -> str:
    """An error reply's body as a message may quote it (see :func:`~rag_gym._text.shown`), or
    its reason when it has none."""
    try:
        raw = exc.read(4096) if exc.fp is not None else b""
    except (OSError, http.client.HTTPException):
        raw = b""
    return shown(raw.decode("utf-8", errors="replace") or exc.reason, 300)


def _json_reply(raw: bytes, kind: str, url: str) -> Any:
    """A 200 reply's body as JSON; :class:`BackendError` when it is not UTF-8 JSON."""
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        what = "not UTF-8" if isinstance(exc, UnicodeDecodeError) else "not JSON"
        raise BackendError(
            f"{url} answered 200 with a body that is {what} (Content-Type {kind}): "
            f"{shown(raw.decode('utf-8', errors='replace'), 200)}; is this an OpenAI-compatible "
            "server's URL?",
            url,
            200,
        ) from None
    except ValueError as exc:  # an integer longer than Python reads
        raise BackendError(
            f"{url} answered JSON Python cannot read: {shown(exc, 120)}", url, 200
        ) from None


def _generation(reply: Any, url: str, completion: bool) -> Generation:
    """The first choice of a reply: ``choices[0].text`` (a ``completion``) or
    ``choices[0].message.content`` (a chat completion); :class:`BackendError` naming what is
    missing or of the wrong type."""
    where = "choices[0].text" if completion else "choices[0].message.content"
    try:
        choice = reply["choices"][0]
        text = choice["text"] if completion else choice["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise BackendError(
            f"{url}: expected a reply with {where}, got {shown(json.dumps(reply), 200)}", url, 200
        ) from None
    if text is None:  # a model that said nothing (a refusal, a tool call)
        text = ""
    if not isinstance(text, str):
        raise BackendError(
            f"{url}: expected {where} to be a string, got {type(text).__name__} "
            f"{shown(json.dumps(text), 100)}",
            url,
            200,
        )
    usage = reply.get("usage")
    usage = {} if usage is None else usage
    counts = [usage.get(k) if isinstance(usage, dict) else "" for k in _USAGE]
    counts = [0 if c is None else c for c in counts]
    if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
        raise BackendError(
            f"{url}: expected usage to hold token counts (integers >= 0), got "
            f"{shown(json.dumps(usage), 100)}",
            url,
            200,
        )
    reason = choice.get("finish_reason")
    if reason is not None and not isinstance(reason, str):
        raise BackendError(
            f"{url}: expected choices[0].finish_reason to be a string, got "
            f"{shown(json.dumps(reason), 100)}",
            url,
            200,
        )
    return Generation(
        text=text,
        prompt_tokens=counts[0],
        completion_tokens=counts[1],
        finish_reason=reason or "stop",
    )


_USAGE = ("prompt_tokens", "completion_tokens")
