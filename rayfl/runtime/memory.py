"""A process's own memory, as a worker reports it with each round's training, and how the
actors' processes keep what they free."""

from __future__ import annotations

import ctypes
import ctypes.util
import resource

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 * 2**20  # the largest glibc takes on 64-bit (half its arena heap)


def reuse_freed_memory() -> bool:
    """Make glibc's malloc in this process keep the memory it frees for the next allocation,
    instead of handing it back to the kernel: blocks up to 32 MiB come from its heaps, and up to
    64 MiB free at a heap's top stay there (what glibc itself moves to once it has freed a 32 MiB
    block). A round's activations and copies then land on pages already mapped: a client actor
    took 10,000–20,000 page faults a second of its CPU time with glibc's defaults, each one a
    fresh zeroed page, against 200 for the same training on threads of one process. Called in
    the actors' processes only (rayfl owns them); False where the C library is not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD))


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
