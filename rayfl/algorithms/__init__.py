"""Federated algorithms in flat-vector form; :mod:`registry` maps config names to classes (the
run's whole stack is built by :mod:`rayfl.assemble`)."""

from __future__ import annotations

from rayfl.algorithms.base import Algorithm

__all__ = ["Algorithm"]
