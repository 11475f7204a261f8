"""The layering of ``rag_gym``: no module imports a package above its own.

Every ``import`` and ``from … import`` of every module is read with :mod:`ast`, wherever it
sits (module level, inside a function, under ``if TYPE_CHECKING``), so the lazy imports of heavy
optional dependencies count as edges too. The order, lowest first (``docs/architecture.md`` says
what each layer owns):

====================  ===============================================================
layer                 modules
====================  ===============================================================
foundation            ``_names``, ``metrics``, ``stats``, ``traces``: pure functions, no
                      rag_gym import
data                  ``data``
retrieval             ``retrieval`` (``server``, ``http`` and ``persist`` included)
envs                  ``envs``
rewards               ``rewards``
wrappers              ``wrappers``
generation            ``generation``
agents                ``agents``
baselines             ``baselines``
train                 ``train``
evaluate              ``evaluate``, ``compare``
view                  ``view``
integrations          ``integrations``
cli                   ``cli``
====================  ===============================================================

A module may import its own layer and any layer below. The package root ``rag_gym/__init__``
runs before every submodule, so an edge *to* it adds nothing and is not checked; its own
module-level imports must stay at ``envs`` (it registers the envs), and the lazy import in
``rag_gym.make`` at ``wrappers``. ``checkpoints`` holds data files only. A module of a top-level
name missing from the table fails the test until it is given a layer here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LAYERS: tuple[tuple[str, ...], ...] = (
    ("_names", "metrics", "stats", "traces"),
    ("data",),
    ("retrieval",),
    ("envs",),
    ("rewards",),
    ("wrappers",),
    ("generation",),
    ("agents",),
    ("baselines",),
    ("train",),
    ("evaluate", "compare"),
    ("view",),
    ("integrations",),
    ("cli",),
)
#: The package root's own imports: module-level ones at most ``envs``, lazy ones ``wrappers``.
ROOT_LAYERS = {"module": "envs", "lazy": "wrappers"}
ROOT = Path(__file__).resolve().parents[1] / "rag_gym"


def layer_of(top: str, layers: tuple[tuple[str, ...], ...]) -> int | None:
    for rank, names in enumerate(layers):
        if top in names:
            return rank
    return None


def _module_name(path: Path, root: Path, package: str) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def _imports(tree: ast.Module, module: str, is_package: bool) -> list[tuple[str, int, bool]]:
    """``(imported module, line, lazy)`` for every import in ``tree``; relative imports are
    resolved against ``module``. ``lazy``: inside a function (not run at import time)."""
    out: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((alias.name, child.lineno, lazy) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = module.split(".")
                    base = base[: len(base) - child.level + (1 if is_package else 0)]
                    source = ".".join([*base, *([child.module] if child.module else [])])
                else:
                    source = child.module or ""
                # ``from pkg import sub`` imports the submodule ``pkg.sub`` when there is one
                out.extend((f"{source}.{alias.name}", child.lineno, lazy) for alias in child.names)
            visit(child, inner)

    visit(tree, False)
    return out


def upward_edges(
    root: Path, package: str, layers: tuple[tuple[str, ...], ...] = LAYERS
) -> list[str]:
    """Every import in the package at ``root`` that runs up the layers (or from a module with
    no layer), as readable lines."""
    problems: list[str] = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path, root, package)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        parts = module.split(".")
        is_root = len(parts) == 1
        if is_root:
            source_rank = None
        else:
            source_rank = layer_of(parts[1], layers)
            if source_rank is None:
                problems.append(
                    f"{module}: {parts[1]!r} has no layer; add it to LAYERS in tests/test_layering.py "
                    "and to docs/architecture.md"
                )
                continue
        for target, line, lazy in _imports(tree, module, path.name == "__init__.py"):
            tparts = target.split(".")
            if tparts[0] != package or len(tparts) == 1:
                continue  # another package, or the root itself
            target_rank = layer_of(tparts[1], layers)
            if target_rank is None:
                if (root / tparts[1]).exists() or (root / f"{tparts[1]}.py").exists():
                    problems.append(f"{module}:{line} imports {target}, which has no layer")
                continue  # a name defined in the root package (``from rag_gym import make``)
            if is_root:
                allowed = layer_of(ROOT_LAYERS["lazy" if lazy else "module"], layers)
                allowed = len(layers) if allowed is None else allowed
            else:
                allowed = source_rank
            if target_rank > allowed:
                kind = "lazily " if lazy else ""
                problems.append(
                    f"{module}:{line} {kind}imports {target}: layer "
                    f"{'/'.join(layers[target_rank])} is above {module}'s"
                )
    return problems


def test_no_import_runs_up_the_layers():
    problems = upward_edges(ROOT, "rag_gym")
    assert not problems, "upward imports:\n" + "\n".join(problems)


def test_every_top_level_name_has_a_layer():
    names = {p.stem for p in ROOT.glob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert {n for n in names if layer_of(n, LAYERS) is None} == set()


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "pkg"


SYNTHETIC = {
    "__init__.py": "from pkg.envs import core\n",
    "data/__init__.py": "",
    "data/load.py": "import json\nfrom pkg import metrics\n",
    "envs/__init__.py": "",
    "envs/core.py": "from pkg.data import load\nfrom . import other\n",
    "envs/other.py": "",
    "metrics.py": "",
}


def test_checker_passes_a_clean_tree(tmp_path):
    assert upward_edges(_write(tmp_path, SYNTHETIC), "pkg") == []


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("data/bad.py", "from pkg.envs import core\n", "pkg.data.bad:1 imports pkg.envs.core"),
        (
            "data/lazy.py",
            "def f():\n    import pkg.envs.core\n",
            "pkg.data.lazy:2 lazily imports pkg.envs.core",
        ),
        ("data/rel.py", "from ..envs import core\n", "pkg.data.rel:1 imports pkg.envs.core"),
        ("metrics.py", "from pkg import data\n", "pkg.metrics:1 imports pkg.data"),
        ("__init__.py", "from pkg.wrappers import x\n", "pkg:1 imports pkg.wrappers.x"),
        ("extra.py", "", "'extra' has no layer"),
    ],
)
def test_checker_fails_on_an_injected_upward_import(tmp_path, name, text, expected):
    files = {**SYNTHETIC, name: text}
    if name == "__init__.py":
        files["wrappers/__init__.py"] = ""
    problems = upward_edges(_write(tmp_path, files), "pkg")
    assert any(expected in p for p in problems), problems
