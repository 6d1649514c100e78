"""What a run's ε says: the neighbouring relation it is stated under, what it covers, and what
leaves the clients outside it (summary.json's ``privacy`` entry, the progress line, the docs).

ε at the same number means different things under different relations: DP-FedAvg with
fixed-size sampling is accounted for replace-one neighbours (one client's data swapped for
another's), with Poisson sampling for add-or-remove-one; DP-FTRL and banded MF for zero-out
neighbours (a client's updates replaced by zeros, what their participation bound protects).
"""

from __future__ import annotations

from rayfl.privacy.fedavg import RELATIONS

ZERO_OUT = "zero-out"

#: the columns of metrics.parquet the simulator derives from the clients' unnoised reports, as
#: diagnostics of the simulation (nothing in the run reads them; a deployment would not
#: release them)
DIAGNOSTICS = ("train_loss", "samples", "local_steps", "completed", "dropped", "label_tv",
               "actor_samples", "actor_train_s", "actor_train_s_max")

NOISE_SEEDED = ("the noise is drawn from the run's seed, so anyone holding the seed can "
                "subtract it: the ε of a simulation assumes the noise is secret, as it is in a "
                "deployment")


def relation(privacy) -> str:
    """The neighbouring relation the ε of a ``privacy`` section is stated under."""
    if privacy.mechanism == "dp_fedavg":
        return RELATIONS[privacy.sampling]
    return ZERO_OUT


def epsilon_label(privacy) -> str:
    """``replace-one`` or ``zero-out, excludes loss``: what the progress line adds to ε."""
    excluded = list(privacy.public_reports)
    return relation(privacy) + (f", excludes {', '.join(excluded)}" if excluded else "")


def statement(privacy, client_metrics: bool) -> dict:
    """summary.json's ``privacy`` entry: the mechanism, the relation, the accountant, what ε
    covers and what it does not (``client_metrics``: per-client evaluation is on)."""
    outside = [f"metrics.parquet columns {', '.join(DIAGNOSTICS)}: the simulator's diagnostics "
               "from the clients' unnoised reports (nothing in the run reads them)"]
    if client_metrics:
        outside.append("per-client evaluation (eval.clients): computed at the server on each "
                       "client's held-out rows, for reporting")
    return {"mechanism": privacy.mechanism, "neighbouring_relation": relation(privacy),
            "sampling": privacy.sampling if privacy.mechanism == "dp_fedavg" else None,
            "accountant": privacy.accountant,
            "covers": "the models the server releases (every round's), and everything computed "
                      "from them alone",
            "excludes_public_reports": list(privacy.public_reports),
            "outside_guarantee": outside, "noise": NOISE_SEEDED}
