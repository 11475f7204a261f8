"""Any OpenAI-compatible server: vLLM's, llama.cpp's (``python -m llama_cpp.server``), hosted APIs.

Chat prompts go to ``POST {base_url}/chat/completions``, plain prompts to
``POST {base_url}/completions``. A batch is sent as concurrent requests (``max_concurrency``),
so a server that batches internally (vLLM, llama.cpp with several slots) sees them together.
Each request has a timeout and is retried with exponential backoff on connection errors,
timeouts and 429/5xx answers; a request that still fails raises ``ConnectionError`` or
``TimeoutError`` naming the URL, and a reply without a usable choice raises ``ValueError``.
The key comes from an environment variable (``OPENAI_API_KEY`` by default), never from code.
Only the standard library is used.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rag_gym.generation.lm import Generation, GenerationConfig, LanguageModel, Prompt, check_prompts

_RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


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
        if not base_url.startswith(("http://", "https://")):
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
            reply = self._post("/completions", body)
        else:
            body["messages"] = prompt
            reply = self._post("/chat/completions", body)
        try:
            choice = reply["choices"][0]
            text = choice["text"] if isinstance(prompt, str) else choice["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise ValueError(
                f"{self.base_url}: the reply has no usable choice: {str(reply)[:200]}"
            ) from None
        usage = reply.get("usage") or {}
        return Generation(
            text=text or "",
            prompt_tokens=int(usage.get("prompt_tokens", 0) or 0),
            completion_tokens=int(usage.get("completion_tokens", 0) or 0),
            finish_reason=choice.get("finish_reason") or "stop",
        )

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = self.base_url + path
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        data = json.dumps(body).encode()
        last: Exception | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(min(0.5 * 2 ** (attempt - 1), 8.0))
            request = urllib.request.Request(url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return json.loads(response.read().decode())
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode(errors="replace")[:300]
                if exc.code not in _RETRY_STATUS:
                    raise ValueError(f"{url} answered {exc.code}: {detail}") from None
                last = ConnectionError(f"{url} answered {exc.code}: {detail}")
            except TimeoutError:
                last = TimeoutError(f"{url} did not answer within {self.timeout}s")
            except urllib.error.URLError as exc:
                if isinstance(exc.reason, TimeoutError):
                    last = TimeoutError(f"{url} did not answer within {self.timeout}s")
                else:
                    last = ConnectionError(
                        f"cannot reach {url}: {exc.reason}; is the server running?"
                    )
            except json.JSONDecodeError as exc:
                raise ValueError(f"{url} answered with invalid JSON: {exc}") from None
        assert last is not None
        raise last

    def describe(self) -> dict[str, object]:
        return {"backend": "openai_compatible", "model": self.name, "base_url": self.base_url}
