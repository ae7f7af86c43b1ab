"""The pass registry: passes by name, in pipeline order; the CLI's choices come from here."""

from __future__ import annotations

from modelpress.errors import OptionError
from modelpress.passes.base import GraphPass
from modelpress.passes.pipeline import PIPELINE

REGISTRY: dict[str, type[GraphPass]] = {cls.name: cls for cls in PIPELINE}
assert len(REGISTRY) == len(PIPELINE) and "" not in REGISTRY, "pass names must be unique and set"


def get(name: str) -> type[GraphPass]:
    try:
        return REGISTRY[name]
    except KeyError:
        raise OptionError(
            f"unknown pass {name!r}; known passes: {', '.join(sorted(REGISTRY))}"
        ) from None


def for_level(level: int) -> list[type[GraphPass]]:
    """The passes that run at ``level``, in pipeline order."""
    if level not in (0, 1, 2, 3):
        raise OptionError(f"`level` {level}: levels are 0 (nothing), 1, 2 (default) and 3")
    return [cls for cls in PIPELINE if cls.level <= level]
