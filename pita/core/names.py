"""Registries chosen by name, with "did you mean" for unknown names."""

from __future__ import annotations

import difflib
from typing import Callable, Generic, Iterable, TypeVar

from pita.core.errors import ConfigError

T = TypeVar("T")


def suggest(name: str, choices: Iterable[str]) -> str:
    """Return ' (did you mean 'x'?)' for the closest choice, or '' when none is close; a choice
    that differs only in case is the closest (``pita`` -> ``PITA``)."""
    choices = list(choices)
    same = [c for c in choices if str(c).lower() == str(name).lower()]
    close = same or difflib.get_close_matches(str(name), choices, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def unknown_name(field: str, value: str, choices: Iterable[str]) -> str:
    choices = sorted(choices)
    return f"{field}={value!r} is not known{suggest(value, choices)}; choose one of: {', '.join(choices)}"


class Registry(Generic[T]):
    """Maps names to objects; lookups of unknown names raise ConfigError listing the choices."""

    def __init__(self, what: str):
        self.what = what
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.what} {name!r} is registered twice")
            self._items[name] = obj
            return obj

        return deco

    def unregister(self, name: str) -> None:
        self._items.pop(name, None)

    def get(self, name: str, field: str | None = None) -> T:
        if name not in self._items:
            raise ConfigError(unknown_name(field or self.what, name, self._items))
        return self._items[name]

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def names(self, ordered: bool = False) -> list[str]:
        """Sorted names, or in registration order with ``ordered``."""
        return list(self._items) if ordered else sorted(self._items)
