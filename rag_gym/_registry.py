"""Registries: the things of one kind that rag-gym looks up by name (LM backends, and in turn the
other extension points), open to code outside rag-gym.

A name is registered in one of three ways, all alike once registered:

* rag-gym's own, in code, by the module that owns the kind;
* the user's, by calling the kind's ``register_…`` function before the name is used;
* an installed package's, by an entry point in the kind's group, e.g. in its ``pyproject.toml``::

      [project.entry-points."rag_gym.lm_backends"]
      my_server = "my_package.rag:backend"

  The entry point's name is the registered name; it is imported the first time that name is
  looked up, so every process that looks it up (a Ray worker, an async env's subprocess) finds
  it without having run the user's registration code. Listing a kind names its entry points
  without importing them. ``RAG_GYM_NO_PLUGINS=1`` leaves installed packages' entry points
  unread.

A name registered twice is refused unless the second registration passes ``replace=True``; an
entry point never replaces a name registered in code (it is skipped with a warning naming its
package).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from rag_gym._names import unknown_name

T = TypeVar("T")

NO_PLUGINS_ENV = "RAG_GYM_NO_PLUGINS"


class RegistryError(ValueError):
    """A registration that cannot be made, or an entry point that cannot be loaded; the message
    names the problem and the fix."""


class Registry(Generic[T]):
    """The names of one kind (``what``, as error messages name it) and what each stands for.

    ``coerce(name, value)`` turns what is registered (by code or by an entry point's object) into
    the kind's value, raising ``TypeError`` or ``ValueError`` with the reason when it cannot."""

    def __init__(
        self,
        what: str,
        group: str,
        coerce: Callable[[str, Any], T] | None = None,
        normalise: Callable[[str], str] | None = None,
    ) -> None:
        self.what = what
        self.group = group
        self._coerce = coerce
        self._normalise = normalise or (lambda name: name)
        self._index: dict[str, str] = {}  # normalised name or alias -> the registered name
        self._aliases: list[str] = []  # as given, for "did you mean"
        self._items: dict[str, T] = {}
        self._origins: dict[str, str] = {}
        self._pending: dict[str, Any] = {}  # entry points not imported yet, by name
        self._loading: set[str] = set()  # entry points being imported
        self._plugins_read = False

    # ---- registering
    def register(
        self,
        name: str,
        value: Any,
        *,
        replace: bool = False,
        origin: str = "",
        aliases: Iterable[str] = (),
    ) -> T:
        """Register ``value`` under ``name`` (and its ``aliases``, other names that look it
        up); returns the registered value. ``replace=True`` replaces what ``name`` stands for
        (it keeps that name's aliases); an alias of another name is refused either way."""
        aliases = list(aliases)
        for given in (name, *aliases):
            self._check_name(given)
        held = self._index.get(self._normalise(name))
        if held is not None and held in self._items and not replace:
            raise RegistryError(
                f"a {self.what} named {name!r} is already registered ({self._origins[held]}): "
                "pick another name, or pass replace=True to replace it"
            )
        for alias in aliases:
            owner = self._index.get(self._normalise(alias))
            if owner is not None and owner not in (held, name):
                raise RegistryError(
                    f"{alias!r} already names the {self.what} {owner!r}: pick another alias"
                )
        item = self._coerce(name, value) if self._coerce is not None else value
        if held is not None and held in self._pending and held not in self._loading:
            warnings.warn(
                f"{_entry_point_origin(self._pending[held])}'s entry point {held!r} in group "
                f"{self.group!r} is skipped: a {self.what} of that name is registered in code "
                f"({origin or 'code'})",
                stacklevel=3,
            )
        if held is not None and held != name:  # the same name, spelt otherwise: it takes over
            self._items.pop(held, None)
            self._pending.pop(held, None)
            self._origins.pop(held, None)
            for key, value_name in list(self._index.items()):
                if value_name == held:
                    self._index[key] = name
        self._items[name] = item
        self._origins[name] = origin or "code"
        self._pending.pop(name, None)
        for given in (name, *aliases):
            self._index[self._normalise(given)] = name
        self._aliases.extend(a for a in aliases if a not in self._aliases)
        return item

    def _check_name(self, name: object) -> None:
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise RegistryError(
                f"expected a {self.what} name: a non-empty string without surrounding spaces, "
                f"got {name!r}"
            )
        if ":" in name:
            raise RegistryError(
                f"expected a {self.what} name without ':' (it separates a name from its "
                f"argument), got {name!r}"
            )

    # ---- looking up
    def key(self, name: str) -> str:
        """The registered name ``name`` stands for (however it is spelt, an alias resolved);
        ``ValueError`` (with "did you mean …") for an unknown name."""
        if not isinstance(name, str):
            raise TypeError(f"expected a {self.what} name (a string), got {name!r}")
        found = self._find(name)
        if found is None:
            raise unknown_name(self.what, name, self.names(), self._aliases)
        return found

    def _find(self, name: str) -> str | None:
        found = self._index.get(self._normalise(name))
        if found is None:
            self._read_plugins()
            found = self._index.get(self._normalise(name))
        return found

    def get(self, name: str) -> T:
        """The value registered as ``name``; ``ValueError`` (with "did you mean …") for an
        unknown name."""
        key = self.key(name)
        if key in self._items:
            return self._items[key]
        return self._load(key)

    def __getitem__(self, name: str) -> T:
        try:
            return self.get(name)
        except ValueError as exc:
            raise KeyError(str(exc)) from None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._find(name) is not None

    def names(self) -> list[str]:
        """Every name, code's first in registration order, then installed packages' (not
        imported)."""
        self._read_plugins()
        return [*self._items, *self._pending]

    def registered(self) -> dict[str, T]:
        """What is registered so far (by code, and the entry points loaded), by name; the
        entry points not loaded yet are left out."""
        return dict(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def origin(self, name: str) -> str:
        """Where ``name`` comes from: ``rag-gym``, a module that registered it, or an entry
        point's package."""
        name = self.key(name)
        if name in self._pending:
            return _entry_point_origin(self._pending[name])
        return self._origins[name]

    # ---- entry points
    def _read_plugins(self) -> None:
        if self._plugins_read:
            return
        self._plugins_read = True  # first: a plugin's import may look names up
        if os.environ.get(NO_PLUGINS_ENV, "").strip() not in ("", "0"):
            return
        try:
            points = list(_entry_points(self.group))
        except Exception:
            self._plugins_read = False
            raise
        for point in points:
            held = self._index.get(self._normalise(point.name))
            if held is not None:
                warnings.warn(
                    f"{_entry_point_origin(point)}'s entry point {point.name!r} in group "
                    f"{self.group!r} is skipped: a {self.what} of that name is already "
                    f"registered ({self.origin(held)}); the package must rename it",
                    stacklevel=3,
                )
                continue
            self._pending[point.name] = point
            self._index[self._normalise(point.name)] = point.name

    def _load(self, name: str) -> T:
        self._loading.add(name)
        try:
            return self._import(name)
        finally:
            self._loading.discard(name)

    def _import(self, name: str) -> T:
        point = self._pending[name]
        where = _entry_point_origin(point)
        try:
            value = point.load()
        except Exception as exc:
            raise RegistryError(
                f"the {self.what} {name!r} ({where}: {point.value}) failed to import: "
                f"{type(exc).__name__}: {exc}; fix or uninstall that package, or set "
                f"{NO_PLUGINS_ENV}=1 to leave installed packages' entry points unread"
            ) from exc
        if name in self._items:  # the package registered it itself while it was imported
            return self._items[name]
        try:
            return self.register(name, value, origin=where)
        except (TypeError, ValueError) as exc:
            self._pending.pop(name, None)
            self._index = {k: v for k, v in self._index.items() if v != name}
            raise RegistryError(
                f"the {self.what} {name!r} ({where}: {point.value}) cannot be used: {exc}"
            ) from exc


def _entry_points(group: str) -> Iterable[Any]:
    from importlib.metadata import entry_points

    return entry_points(group=group)


def _entry_point_origin(point: Any) -> str:
    name = getattr(getattr(point, "dist", None), "name", None)
    return f"package {name}" if isinstance(name, str) else f"entry point {point.value}"


def caller_origin() -> str:
    """Where the caller of the function that calls this was defined: ``rag-gym`` for rag-gym's
    own modules, else ``module <name>`` (what :meth:`Registry.origin` reports)."""
    import sys

    frame = sys._getframe(2)
    module = frame.f_globals.get("__name__", "?")
    return "rag-gym" if module == "rag_gym" or module.startswith("rag_gym.") else f"module {module}"
