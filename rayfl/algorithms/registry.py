"""Config name → algorithm class. Adding an algorithm = one module + one line here."""

from __future__ import annotations

import importlib

from rayfl.algorithms.base import Algorithm

_ALGORITHMS = {
    "fedavg": "rayfl.algorithms.fedavg:FedAvg",
    "fedavgm": "rayfl.algorithms.fedavgm:FedAvgM",
    "fedprox": "rayfl.algorithms.fedprox:FedProx",
    "scaffold": "rayfl.algorithms.scaffold:Scaffold",
    "feddyn": "rayfl.algorithms.feddyn:FedDyn",
    "fedadam": "rayfl.algorithms.fedopt:FedAdam",
    "fedyogi": "rayfl.algorithms.fedopt:FedYogi",
    "fedadagrad": "rayfl.algorithms.fedopt:FedAdagrad",
    "fednova": "rayfl.algorithms.fednova:FedNova",
    "adabest": "rayfl.algorithms.adabest:AdaBest",
    "fedeve": "rayfl.algorithms.fedeve:FedEve",
    "fedmim": "rayfl.algorithms.fedmim:FedMIM",
    "fedmsi": "rayfl.algorithms.fedmsi:FedMSI",
}


def names() -> list[str]:
    """All registered algorithm names."""
    return sorted(_ALGORITHMS)


def get(name: str) -> type[Algorithm]:
    """The algorithm class registered under ``name``."""
    module, cls = _ALGORITHMS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def summary(name: str) -> str:
    """One line on the algorithm: its module's docstring (paper and idea)."""
    import sys

    cls = get(name)
    doc = sys.modules[cls.__module__].__doc__ or cls.__doc__ or ""
    return " ".join(doc.strip().split("\n\n")[0].split())
