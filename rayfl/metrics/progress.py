"""Terminal progress: a smoothed ETA, the Ray endpoints line, the resume hint."""

from __future__ import annotations

import datetime as _dt
import signal
import sys
import threading
from collections import deque

import ray

ETA_WINDOW = 10  # rounds the ETA averages over


class Eta:
    """Seconds left from the mean duration of the last ``window`` items (rounds or trials).

    One slow round (an evaluation, a checkpoint, a straggler) moves the estimate by 1/window
    of its excess instead of replacing it.
    """

    def __init__(self, window: int = ETA_WINDOW):
        self.recent: deque[float] = deque(maxlen=window)

    def add(self, seconds: float) -> None:
        self.recent.append(float(seconds))

    def mean(self) -> float | None:
        return sum(self.recent) / len(self.recent) if self.recent else None

    def left(self, remaining: int) -> float | None:
        m = self.mean()
        return None if m is None else m * max(remaining, 0)


def empty_note(info: dict) -> str | None:
    """``no client completed (no client online) | 3 empty rounds`` for the metrics row of a
    round in which no client completed (None for any other row): the progress line shows it
    in place of the training loss, which such a round does not have."""
    if info.get("completed") != 0:
        return None
    note = f"no client completed ({info.get('empty_reason') or 'no update'})"
    count = info.get("empty_rounds")
    return note if count is None else f"{note} | {count} empty round{'s' * (count != 1)}"


def hms(seconds: float) -> str:
    """``0:01:38``."""
    return str(_dt.timedelta(seconds=round(seconds)))


def endpoints_line() -> str:
    """Where to watch the run: the Ray dashboard URL (if running) and Prometheus endpoints."""
    parts = []
    try:
        url = ray._private.worker.global_worker.node.webui_url
    except AttributeError:  # a Ray client connection: the dashboard is the cluster's
        url = None
    if url:
        parts.append(f"Ray dashboard http://{url} (token: `ray get-auth-token`)")
    ports = sorted({f"{n['NodeManagerAddress']}:{n['MetricsExportPort']}"
                    for n in ray.nodes() if n.get("Alive") and n.get("MetricsExportPort")})
    if ports:
        parts.append("Prometheus metrics (ray_rayfl_*) at " + ", ".join(
            f"http://{p}/metrics" for p in ports))
    return " | ".join(parts)


def resume_hint(run_dir: str) -> str:
    """What an interrupted run prints instead of a traceback."""
    return f"interrupted; continue with: rayfl resume {run_dir}"


def sigterm_as_interrupt():
    """Make SIGTERM raise KeyboardInterrupt, so it takes the Ctrl-C path (actors stopped,
    resume hint) instead of Ray's handlers (which exit mid-round with crash dumps). Called
    after ``ray.init``, which installs those handlers; returns the previous handler. Only in
    the user's process: off the main thread (signals cannot be handled there) and inside Ray
    tasks (a tuning trial, which Ray itself stops) it does nothing and returns None."""
    if threading.current_thread() is not threading.main_thread():
        return None
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized() and \
            ray.get_runtime_context().worker.mode == ray.WORKER_MODE:  # inside a task or actor
        return None

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, interrupt)
