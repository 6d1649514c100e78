"""Uniform selection: ``clients_per_round × overcommit`` of the online clients, each set equally
likely (McMahan et al., 2017)."""

from rayfl.selection.base import Selector


class Uniform(Selector):
    """Every online client equally likely."""

    name = "uniform"
