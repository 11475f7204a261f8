"""The OpenEnv server of rag-gym (see ../README.md)."""
