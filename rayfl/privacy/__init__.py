"""User-level differential privacy: three mechanisms and their accounting (``privacy`` section).

- ``dp_fedavg`` (:mod:`rayfl.privacy.fedavg`): clients sampled uniformly, independent Gaussian
  noise every round; ε from amplification by sampling.
- ``dp_ftrl`` (:mod:`rayfl.privacy.tree`): tree-aggregation noise correlated across rounds;
  ε from a bound on participation, no sampling assumed.
- ``banded_mf`` (:mod:`rayfl.privacy.banded`): noise C⁻¹Z of a b-banded factorisation of the
  prefix sums; ε from the same kind of bound.

The clipping and the noise are the :class:`rayfl.transforms.dp.GaussianDP` transform and its
subclass; the participation bound of the last two is enforced and recorded by
:class:`~rayfl.privacy.participation.Participation`; :func:`accountant` gives a run's ε and
:class:`~rayfl.privacy.account.Account` what the server accounts for, built once.
"""

from __future__ import annotations

import numpy as np

from rayfl.privacy.account import CORRELATED, Account
from rayfl.privacy.accounting import (
    CorrelatedAccountant,
    FedAvgAccountant,
    accountant,
    accountant_of,
    bands_of,
    calibrate,
    schema_of,
)
from rayfl.privacy.fedavg import epsilon, round_event, rounds_within
from rayfl.privacy.participation import Participation, Schema


def bounds_participation(p) -> bool:
    """Whether a ``privacy`` section's mechanism bounds participation (its run keeps a record
    of every round's participants)."""
    return p is not None and p.mechanism in CORRELATED


def report(record: Participation, acc: CorrelatedAccountant, horizon: int,
           run_dir: str) -> dict:
    """Write ``participation.parquet`` (each client's rounds and individual ε after ``horizon``
    rounds) and return the summary's ``participation`` entry."""
    ids, rounds = record.by_client()
    eps = acc.individual(rounds, horizon)
    record.write(run_dir, eps)
    counts = np.array([len(r) for r in rounds], dtype=np.int64)
    return {"participation": {
        "mechanism": acc.mechanism, "min_separation": record.schema.min_separation,
        "max_participations": record.schema.bound(horizon),
        "sensitivity": float(np.sqrt(acc.sensitivity_squared(horizon))),
        "clients": len(ids),
        "participations_max": int(counts.max()) if len(counts) else 0,
        "participations_mean": float(counts.mean()) if len(counts) else 0.0,
        "epsilon_individual_max": float(eps.max()) if len(eps) else 0.0,
        "epsilon_individual_median": float(np.median(eps)) if len(eps) else 0.0}}


__all__ = ["CORRELATED", "Account", "CorrelatedAccountant", "FedAvgAccountant", "Participation",
           "Schema", "accountant", "accountant_of", "bands_of", "bounds_participation",
           "calibrate", "epsilon", "report", "round_event", "rounds_within", "schema_of"]
