"""When a run has diverged: a NaN/inf model or loss, or a loss above ``loss_ceiling``.

The server calls :func:`flag` once per round, before the round's metrics row is written, so the
row itself says whether the run stopped there (``diverged``) and why (``diverged_reason``).
"""

from __future__ import annotations

import math

import torch

LOSSES = ("train_loss", "test_loss", "val_loss")


def reason(row: dict, deployed: torch.Tensor, ceiling: float | None) -> str | None:
    """Why the run must stop after this round's ``row`` (None: it goes on)."""
    if not bool(torch.isfinite(deployed).all()):
        return "the model holds NaN/inf"
    for key in LOSSES:
        value = row.get(key)
        if value is None or (key == "train_loss" and not row.get("completed")):
            continue  # no client finished: no training loss, not a divergence
        if not math.isfinite(value):
            return f"{key} is {value}"
        if ceiling is not None and value > ceiling:
            return f"{key} = {value:.4g} > loss_ceiling = {ceiling:g}"
    return None


def flag(row: dict, deployed: torch.Tensor, ceiling: float | None) -> bool:
    """Mark ``row`` with ``diverged`` (and ``diverged_reason``); True when the run must stop."""
    why = reason(row, deployed, ceiling)
    row["diverged"] = why is not None
    if why is not None:
        row["diverged_reason"] = why
    return row["diverged"]
