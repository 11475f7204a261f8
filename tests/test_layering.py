"""The layering of ``rag_gym``: no module imports a package above its own, and no import cycles.

Every ``import`` and ``from … import`` of every module is read with :mod:`ast`, wherever it
sits (module level, inside a function, under ``if TYPE_CHECKING``), so the lazy imports of heavy
optional dependencies count as edges too. The order, lowest first (``docs/architecture.md`` says
what each layer owns):

====================  ===============================================================
layer                 modules
====================  ===============================================================
foundation            ``_http``, ``_names``, ``_registry``, ``_text``, ``health``,
                      ``metrics``, ``stats``, ``traces``: pure helpers, each other's imports only
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

**Cycles.** No two modules may import each other, directly or through others, inside a package
as well as between packages. An import is an edge to the module it loads: ``from pkg import
name`` loads ``pkg.name`` where that is a module, else ``pkg`` (its ``__init__``); the parent
packages Python initialises on the way are not edges. The rule counts module-level imports (those
that run when the module is imported, class bodies and ``try`` blocks included): a cycle of them
is a module that runs with its partner half-initialised. Imports inside functions are the house
style for optional extras and run only when called, so the first check leaves them out; the
second adds them, except an edge to the package root (which every submodule finds complete), so
that a lazy import cannot hide a cycle either.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LAYERS: tuple[tuple[str, ...], ...] = (
    ("_http", "_names", "_options", "_registry", "_text", "health", "metrics", "stats", "traces"),
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
    ("cli", "commands"),
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


def import_graph(root: Path, package: str, lazy: bool = False) -> dict[str, set[str]]:
    """Each module of the package at ``root`` and the modules of the package it imports at module
    level (with ``lazy``, inside functions too, but for edges to the package root)."""
    paths = {_module_name(path, root, package): path for path in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {module: set() for module in paths}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for target, _, inner in _imports(tree, module, path.name == "__init__.py"):
            if inner and not lazy:
                continue
            while target and target not in paths:  # a name defined in a module: that module
                target = target.rpartition(".")[0]
            if not target or target == module or (inner and target == package):
                continue
            graph[module].add(target)
    return graph


def import_cycles(root: Path, package: str, lazy: bool = False) -> list[str]:
    """One cycle (``a -> b -> a``) for each group of modules that import each other, directly or
    through others (a strongly connected component of :func:`import_graph`), with the group's
    other members after it."""
    graph = import_graph(root, package, lazy)
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        order[node] = low[node] = len(order)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in order:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], order[nxt])
        if low[node] == order[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in order:
            visit(node)
    cycles = []
    for group in groups:  # the shortest way round from the group's first module
        start = min(group)
        paths = {start: [start]}
        queue = [start]
        while queue:
            node = queue.pop(0)
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    others = sorted(group - set(paths[node]))
                    also = f" (also in the group: {', '.join(others)})" if others else ""
                    cycles.append(" -> ".join([*paths[node], start]) + also)
                    queue = []
                    break
                if nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    queue.append(nxt)
    return sorted(cycles)


def test_no_import_cycles():
    cycles = import_cycles(ROOT, "rag_gym")
    assert not cycles, "import cycles (module-level imports):\n" + "\n".join(cycles)


def test_no_import_cycles_through_imports_in_functions():
    cycles = import_cycles(ROOT, "rag_gym", lazy=True)
    assert not cycles, "import cycles (imports in functions included):\n" + "\n".join(cycles)


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


def test_checker_finds_no_cycle_in_a_clean_tree(tmp_path):
    root = _write(tmp_path, SYNTHETIC)
    assert import_cycles(root, "pkg") == []
    assert import_cycles(root, "pkg", lazy=True) == []


@pytest.mark.parametrize(
    ("files", "module_level", "with_lazy"),
    [
        (  # two modules of one package
            {"envs/other.py": "from pkg.envs import core\n"},
            ["pkg.envs.core -> pkg.envs.other -> pkg.envs.core"],
            ["pkg.envs.core -> pkg.envs.other -> pkg.envs.core"],
        ),
        (  # three modules, one through a relative import and a package's __init__
            {
                "envs/__init__.py": "from .core import x\n",
                "data/load.py": "import json\nfrom pkg import metrics, envs\n",
            },
            ["pkg.data.load -> pkg.envs -> pkg.envs.core -> pkg.data.load"],
            ["pkg.data.load -> pkg.envs -> pkg.envs.core -> pkg.data.load"],
        ),
        (  # a name imported from a module is an edge to that module
            {"data/load.py": "from pkg.envs.core import thing\n"},
            ["pkg.data.load -> pkg.envs.core -> pkg.data.load"],
            ["pkg.data.load -> pkg.envs.core -> pkg.data.load"],
        ),
        (  # closed by an import inside a function: the second check only
            {"envs/other.py": "def f():\n    from pkg.envs import core\n"},
            [],
            ["pkg.envs.core -> pkg.envs.other -> pkg.envs.core"],
        ),
        (  # a function's import of the package root is no edge
            {"metrics.py": "def version():\n    from pkg import __version__\n"},
            [],
            [],
        ),
    ],
)
def test_checker_reports_a_planted_cycle(tmp_path, files, module_level, with_lazy):
    root = _write(tmp_path, {**SYNTHETIC, **files})
    assert import_cycles(root, "pkg") == module_level
    assert import_cycles(root, "pkg", lazy=True) == with_lazy
