"""OpenEnv's entry point: ``app`` (``uvicorn server.app:app``) and ``main`` (``server``).

The env and its options come from environment variables (``RAG_GYM_ENV``,
``RAG_GYM_REWARD_PRESET``, ``RAG_GYM_ENV_KWARGS``, ``RAG_GYM_TAGS``, ``RAG_GYM_MAX_SESSIONS``,
``RAG_GYM_TOKEN``): :func:`rag_gym.integrations.openenv_server.config_from_environ`.
"""

from __future__ import annotations

import os

from rag_gym.integrations.openenv_server import config_from_environ, create_app

app = create_app(config_from_environ())


def main() -> None:
    import uvicorn

    uvicorn.run(
        app,
        host=os.environ.get("HOST", "127.0.0.1"),
        port=int(os.environ.get("PORT", "8000")),
        ws="websockets",
    )


if __name__ == "__main__":
    main()
