"""Name -> factory registries for backends, judges, rewards and protocols.

Plain dictionaries with one helper: an unknown name raises a ``ConfigError`` that lists the close
matches and every known name, so a typo in a YAML file is a one-line fix.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from captionrl.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """A named table of factories; ``kind`` names the config field in error messages."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._items[name] = obj
            return obj

        return deco

    def add(self, name: str, obj: T) -> None:
        self.register(name)(obj)

    def get(self, name: str) -> T:
        if name not in self._items:
            raise ConfigError(self.kind, name, f"unknown {self.kind}", suggest(name, list(self._items)))
        return self._items[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))


def suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
    return f"{hint}known: {', '.join(sorted(known))}"
