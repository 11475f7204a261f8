"""Every ```python block of the README and of the getting-started, landing and extending pages
runs on its own (what it registers is gone after it): a snippet that stops working (an API
change, a missing import, a wrong answer) fails here."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = ("README.md", "docs/getting-started.md", "docs/index.md", "docs/extending.md")

#: a module a snippet may import -> the extra that installs it
EXTRAS = {
    "llama_cpp": "llama",
    "torch": "train",
    "transformers": "hf",
    "trl": "train",
    "peft": "train",
    "sentence_transformers": "dense",
    "faiss": "dense",
    "stable_baselines3": "sb3",
    "vllm": "gpu",
    "wandb": "track",
    "datasets": "hub",
}
#: a rag_gym module a snippet may import -> the module it runs on
BACKENDS = {"rag_gym.generation.llama_cpp": "llama_cpp"}

_BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)


def snippets(file: str) -> list[tuple[str, str]]:
    """``(where, code)`` of each python block of ``file``; ``where`` is ``file:line``."""
    text = (ROOT / file).read_text(encoding="utf-8")
    return [
        (f"{file}:{text.count(chr(10), 0, m.start()) + 1}", m.group(1))
        for m in _BLOCK.finditer(text)
    ]


SNIPPETS = [s for file in FILES for s in snippets(file)]


def missing_modules(code: str) -> list[str]:
    """The top-level modules ``code`` imports that are not installed."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(BACKENDS.get(node.module, node.module.split(".")[0]))
    return sorted(n for n in names if importlib.util.find_spec(n) is None)


def run(where: str, code: str) -> dict:
    missing = missing_modules(code)
    if missing:
        extras = sorted({EXTRAS.get(m, "?") for m in missing})
        pytest.skip(
            f"{where} needs {', '.join(missing)}: pip install 'rag-gym[{','.join(extras)}]'"
        )
    namespace: dict = {"__name__": "__snippet__"}  # a fresh one: each block runs on its own
    exec(compile(code, where, "exec"), namespace)
    return namespace


def test_each_file_has_snippets():
    for file in FILES:
        assert snippets(file), f"no ```python block found in {file}"


@pytest.mark.parametrize("where, code", SNIPPETS, ids=[w for w, _ in SNIPPETS])
def test_snippet_runs_on_its_own(where, code, tmp_path, monkeypatch, isolated_registries):
    monkeypatch.chdir(tmp_path)  # anything a snippet writes lands here
    run(where, code)


@pytest.mark.parametrize("file", FILES[:2])
def test_the_first_episode_answers_right(file, tmp_path, monkeypatch):
    """The first snippet of each file is the first episode: it must earn reward 1, with the
    gold answer of the question it draws."""
    monkeypatch.chdir(tmp_path)
    where, code = snippets(file)[0]
    namespace = run(where, code)
    env, info = namespace["env"], namespace["info"]
    assert namespace["terminated"] and namespace["reward"] == 1.0, where
    assert info["scores"] == {"em": 1.0, "f1": 1.0, "cover_em": 1.0}, where
    assert info["prediction"] in env.unwrapped.current_example.answers, where
