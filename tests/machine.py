"""What decides a run's floating-point bytes besides its config and seed: the PyTorch build, the
CPU kernel set it dispatches to (``ATEN_CPU_CAPABILITY`` can lower it), the processor
architecture and model, and the thread settings. Bytes recorded on one machine are compared exactly only on
a machine with the same fingerprint; elsewhere a test compares values within a tolerance."""

from __future__ import annotations

import os
import platform

import torch

# the process's own thread settings, read before any run sets its threads (at collection)
_THREADS = torch.get_num_threads(), torch.get_num_interop_threads()


def processor() -> str:
    """The processor's vendor, family and model (Linux's /proc/cpuinfo; else the platform's
    word): two processors with the same kernel set can still take different paths in oneDNN
    and MKL, which choose their code and blocking by the processor."""
    try:
        with open("/proc/cpuinfo") as f:
            first = f.read().split("\n\n")[0]  # the first processor's block
    except OSError:
        return platform.processor()
    fields = {k.strip(): v.strip() for k, v in
              (line.split(":", 1) for line in first.splitlines() if ":" in line)}
    return " ".join(fields.get(k, "?") for k in ("vendor_id", "cpu family", "model"))


def fingerprint() -> dict:
    """This process's machine/software fingerprint (JSON-able)."""
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "machine": platform.machine(), "processor": processor(),
            "cpu_count": os.cpu_count(), "threads": _THREADS[0], "interop_threads": _THREADS[1]}


def recorded_here(records: list[dict]) -> dict | None:
    """The record among ``records`` (each with a ``machine`` fingerprint) made on a machine like
    this one, or None."""
    here = fingerprint()
    return next((r for r in records if r.get("machine") == here), None)
