"""pytest's collection of the package's doctests (``--doctest-modules``): a module that imports
an optional extra at its top cannot be imported without it, so it is collected only where the
extra is installed (its tests in ``tests/`` skip with the reason)."""

import importlib.util

#: the modules that import an extra's package at their top, by that package
_EXTRA_MODULES = {
    "openenv": ("rag_gym/integrations/openenv_server.py", "rag_gym/integrations/openenv_client.py"),
    "verifiers": (
        "rag_gym/integrations/verifiers_taskset.py",
        "rag_gym/integrations/verifiers_tools.py",
    ),
}

collect_ignore = [
    path
    for package, paths in _EXTRA_MODULES.items()
    if importlib.util.find_spec(package) is None
    for path in paths
]
