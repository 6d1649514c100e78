"""Config name → algorithm class (built-ins live in :data:`rayfl.registry.BUILTINS`; a
``package.module:Name`` or a name given to ``rayfl.register_algorithm`` works as well)."""

from __future__ import annotations

from rayfl import registry
from rayfl.algorithms.base import Algorithm


def names() -> list[str]:
    """All built-in and registered algorithm names."""
    return registry.names("algorithm")


def get(name: str) -> type[Algorithm]:
    """The algorithm class for ``name`` (ConfigError on ``algorithm.name`` if there is none)."""
    return registry.resolve("algorithm", name)


def summary(name: str) -> str:
    """One line on the algorithm: its module's docstring (paper and idea)."""
    return registry.summary("algorithm", name)
