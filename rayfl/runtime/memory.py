"""A process's own memory, as a worker reports it with each round's training."""

from __future__ import annotations

import resource


def _status_mb(field: str) -> float | None:
    """A memory line of Linux's ``/proc/self/status`` in MiB (None elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def peak_rss_mb() -> float:
    """This process's own peak resident memory so far, in MiB: Linux's VmHWM (``getrusage``'s
    maximum also counts the parent's memory at fork time, which for a Ray worker is the raylet's
    or the driver's), else ``getrusage``. It includes pages of the memory-mapped data store
    this process has read (shared page cache, reclaimable)."""
    peak = _status_mb("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def private_mb() -> float:
    """This process's anonymous resident memory now, in MiB: what it allocated itself, without
    mapped files (NaN where Linux's ``/proc`` is missing)."""
    anon = _status_mb("RssAnon")
    return float("nan") if anon is None else anon
