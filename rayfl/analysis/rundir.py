"""A finished run directory as the analysis sees it: its config, metrics and kept models.

Kept models (config ``keep.rounds`` / ``keep.last``) live in ``models/round-NNNNN/``:
``start.npy`` (what clients started from), ``client-<id>.npy`` (each client's final local
model), ``global.npy`` (the deployed model after the round) and the algorithm's extra models
(``next.npy``: AdaBest's next model; a server wrapper's ``inner_model``, e.g. ``ima_inner.npy``:
the output of the algorithm inside it, before IMA averaged it).
A model is named ``NAME@ROUND`` (``global@19``, ``client-7@-1``: a negative round counts back
over the kept rounds), ``final`` (``final_model.npy``) or a path to a ``.npy`` file.
"""

from __future__ import annotations

import os
import re
from functools import cached_property

import numpy as np

from rayfl import config as config_mod
from rayfl.data import prepare
from rayfl.metrics.tables import read_rows
from rayfl.schema import ConfigError

ROUND_DIR = re.compile(r"round-(\d+)$")
CLIENT_FILE = re.compile(r"client-(\d+)\.npy$")


class RunDir:
    """Read-only access to one run directory (made by ``rayfl run``)."""

    def __init__(self, path: str):
        if not os.path.isfile(os.path.join(path, "config.yaml")):
            raise ConfigError("run_dir", path, "a run directory holding config.yaml (made by "
                                               "`rayfl run`)")
        self.path = path
        self.cfg = config_mod.load(os.path.join(path, "config.yaml"))

    @cached_property
    def handle(self):
        """The run's data store (prepared again if this machine's cache lacks it)."""
        return prepare(self.cfg.data, self.cfg.seed)

    @cached_property
    def rounds(self) -> list[int]:
        """The rounds whose models were kept, ascending."""
        root = os.path.join(self.path, "models")
        found = [ROUND_DIR.match(n) for n in os.listdir(root)] if os.path.isdir(root) else []
        return sorted(int(m.group(1)) for m in found if m)

    def metrics(self) -> list[dict]:
        """``metrics.parquet`` as one dict per round."""
        path = os.path.join(self.path, "metrics.parquet")
        if not os.path.isfile(path):
            raise ConfigError("run_dir", self.path, "a run directory holding metrics.parquet")
        return read_rows(path)

    def _dir(self, t: int) -> str:
        return os.path.join(self.path, "models", f"round-{t:05d}")

    def names(self, t: int) -> set[str]:
        """Model names kept at round ``t`` (``global``, ``start``, ``client-3``, ...)."""
        return {n[:-4] for n in os.listdir(self._dir(t)) if n.endswith(".npy")}

    def clients(self, t: int) -> list[int]:
        """Ids of the clients whose final local models were kept at round ``t``, ascending."""
        found = [CLIENT_FILE.match(n) for n in os.listdir(self._dir(t))]
        return sorted(int(m.group(1)) for m in found if m)

    def load(self, name: str, t: int) -> np.ndarray:
        """One kept model as a float32 vector."""
        path = os.path.join(self._dir(t), f"{name}.npy")
        if not os.path.isfile(path):
            raise ConfigError("model", f"{name}@{t}", f"one of {', '.join(sorted(self.names(t)))}"
                                                      f" (kept at round {t})")
        return np.load(path).astype(np.float32, copy=False)

    @cached_property
    def inner_model(self) -> str | None:
        """The kept model holding the output inside the outermost layer that keeps one (its
        ``inner_model``: IMA's ``ima_inner``); None without such a layer."""
        names = [e.cls.traits.inner_model for e in self.cfg.layer_entries()
                 if e.cls.traits.inner_model]
        return names[-1] if names else None

    def fma_name(self, t: int) -> str:
        """The model round ``t``'s algorithm produced: the wrapper's inner model when kept,
        else global (without a wrapper they are the same model)."""
        return self.inner_model if self.inner_model in self.names(t) else "global"

    def round_of(self, r: int, key: str = "--round") -> int:
        """A kept round from ``r`` (negative: counted back from the last kept round)."""
        kept = self.need_rounds(1, f"{key} {r}")
        if r < 0 and -r <= len(kept):
            return kept[r]
        if r in kept:
            return r
        raise ConfigError(key, r, f"a kept round ({', '.join(map(str, kept))}) or a negative "
                                  f"index into them; add it to keep.rounds")

    def need_rounds(self, n: int, what: str) -> list[int]:
        """The kept rounds, or a ConfigError saying which ``keep.*`` setting ``what`` needs."""
        if len(self.rounds) < n:
            keep = self.cfg.keep
            raise ConfigError("keep.last" if n > 1 else "keep.rounds",
                              keep.last if n > 1 else keep.rounds,
                              f"at least {n} kept round(s) for {what}, found {self.rounds}; rerun "
                              f"with keep.last={n} (or keep.rounds=[...] listing the rounds)")
        return self.rounds

    def model(self, spec: str) -> tuple[str, np.ndarray]:
        """(label, vector) for ``NAME@ROUND``, ``final`` or a ``.npy`` path."""
        if spec == "final":
            return "final", np.load(os.path.join(self.path, "final_model.npy"))
        if spec.endswith(".npy"):
            if not os.path.isfile(spec):
                raise ConfigError("--models", spec, "an existing .npy file")
            return os.path.basename(spec)[:-4], np.load(spec).astype(np.float32, copy=False)
        name, at, r = spec.partition("@")
        if not at or not re.fullmatch(r"-?\d+", r):
            raise ConfigError("--models", spec, "NAME@ROUND (e.g. global@-1, client-7@10, "
                                                "ima_inner@19), final, or a .npy path")
        t = self.round_of(int(r), "--models")
        return f"{name} r{t}", self.load(name, t)
