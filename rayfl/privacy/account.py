"""A run's privacy account, built once from its ``privacy`` section and the run's facts: the
accountant, the rounds ``privacy.target_epsilon`` allows, the label of its ε and the
participation schema its mechanism enforces. The mechanism's layer holds it
(:class:`rayfl.transforms.dp.GaussianDP`), so the server accounts for exactly the mechanism
that noised the rounds, built from the same numbers."""

from __future__ import annotations

from dataclasses import dataclass

from rayfl.privacy.accounting import (
    CorrelatedAccountant,
    FedAvgAccountant,
    accountant_of,
    schema_of,
)
from rayfl.privacy.participation import Participation, Schema
from rayfl.privacy.statement import epsilon_label

CORRELATED = ("dp_ftrl", "banded_mf")  # mechanisms whose guarantee bounds participation


@dataclass(frozen=True)
class Account:
    """What the server needs to account for a run's mechanism."""

    accountant: FedAvgAccountant | CorrelatedAccountant
    delta: float
    #: the rounds the run trains: ``rounds``, or fewer when ``privacy.target_epsilon`` binds
    final_round: int
    #: what the progress line adds to ε (its neighbouring relation, the reports it excludes)
    label: str
    #: the participation bound the mechanism enforces (None: it bounds none, dp_fedavg)
    schema: Schema | None

    @classmethod
    def of(cls, privacy, rounds: int, num_clients: int, clients_per_round: int) -> "Account":
        """The account of a ``privacy`` section for a run of ``rounds`` rounds."""
        acc = accountant_of(privacy, num_clients, clients_per_round)
        final = rounds if privacy.target_epsilon is None else \
            acc.rounds_within(privacy.target_epsilon, rounds)
        return cls(acc, privacy.delta, final, epsilon_label(privacy),
                   schema_of(privacy) if privacy.mechanism in CORRELATED else None)

    def participation(self, num_clients: int) -> Participation | None:
        """A fresh participation record (None when the mechanism bounds no participation)."""
        return None if self.schema is None else Participation(num_clients, self.schema)
