"""Config rules shared by the algorithms' ``check_config``: combinations that cannot be faithful.

Each algorithm states in its own ``check_config`` *why* it refuses a local optimiser or IMA; these
helpers only turn that reason into the one-line :class:`ConfigError` (exit 2) every bad config
gets. The full decision matrix (algorithm × local optimiser × weighting × IMA) is in
``configs/README.md`` under "Option combinations".
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rayfl.schema import ConfigError


def reject_adam(name: str, cfg: Any, why: str) -> None:
    """ConfigError when ``local.optimizer`` is adam: ``name`` needs SGD steps because ``why``."""
    if cfg.local.optimizer == "adam":
        raise ConfigError("local.optimizer", "adam", f"sgd with {name} ({why})")


def reject_ima(name: str, cfg: Any, why: str) -> None:
    """ConfigError when an ``ima`` section is set: IMA around ``name`` is undefined because ``why``."""
    if cfg.ima is not None:
        raise ConfigError("ima", dataclasses.asdict(cfg.ima),
                          f"no ima section with {name} ({why})")
