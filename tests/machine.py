"""What decides a run's floating-point bytes besides its config and seed: the PyTorch build, the
CPU kernel set it dispatches to (``ATEN_CPU_CAPABILITY`` can lower it), the processor
architecture and the thread settings. Bytes recorded on one machine are compared exactly only on
a machine with the same fingerprint; elsewhere a test compares values within a tolerance."""

from __future__ import annotations

import os
import platform

import torch

# the process's own thread settings, read before any run sets its threads (at collection)
_THREADS = torch.get_num_threads(), torch.get_num_interop_threads()


def fingerprint() -> dict:
    """This process's machine/software fingerprint (JSON-able)."""
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "machine": platform.machine(), "cpu_count": os.cpu_count(),
            "threads": _THREADS[0], "interop_threads": _THREADS[1]}


def recorded_here(records: list[dict]) -> dict | None:
    """The record among ``records`` (each with a ``machine`` fingerprint) made on a machine like
    this one, or None."""
    here = fingerprint()
    return next((r for r in records if r.get("machine") == here), None)
