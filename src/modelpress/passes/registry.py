"""The pass registry: passes are looked up by name; the CLI's choices come from here."""

from __future__ import annotations

from modelpress.errors import OptionError
from modelpress.passes.base import GraphPass

REGISTRY: dict[str, type[GraphPass]] = {}


def register(cls: type[GraphPass]) -> type[GraphPass]:
    """Class decorator: add a pass to the registry under ``cls.name``."""
    assert cls.name and cls.name not in REGISTRY, f"duplicate or empty pass name {cls.name!r}"
    REGISTRY[cls.name] = cls
    return cls


def get(name: str) -> type[GraphPass]:
    try:
        return REGISTRY[name]
    except KeyError:
        raise OptionError(
            f"unknown pass {name!r}; known passes: {', '.join(sorted(REGISTRY))}"
        ) from None


def for_level(level: int) -> list[type[GraphPass]]:
    """The passes that run at ``level``, in registration order (which is the intended order)."""
    if level not in (0, 1, 2, 3):
        raise OptionError(f"--level {level}: levels are 0 (nothing), 1, 2 (default) and 3")
    return [cls for cls in REGISTRY.values() if cls.level <= level]
