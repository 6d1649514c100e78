"""A round's files written while the next round trains.

After round t the server hands its files — the metrics rows, then the checkpoint covering them,
then the client-state versions that checkpoint superseded, deleted, then the round's progress
row for the driver — to one background thread, and starts round t+1. It waits for them before it logs round t+1's row, so one round's files
are in flight at a time, in order: a crash at any point leaves the last committed checkpoint
and every row up to it (``rayfl resume`` truncates the rows after it), as a crash while the
server itself wrote them did. The writing thread's error (a full disk) is raised in the server
at that wait. What must follow the commit in the server's own thread (pruning round messages
the main thread may be writing) is handed back to it then.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable


class Commits:
    """One commit in flight at a time, on a thread of its own."""

    def __init__(self):
        self._pool: ThreadPoolExecutor | None = None
        self._pending: tuple[Future, Callable[[], None] | None] | None = None

    def start(self, write: Callable[[], float | None], then: Callable[[], None] | None = None
              ) -> None:
        """Begin ``write`` (it returns its checkpoint's seconds, or None when it wrote none);
        ``then`` runs in the caller's thread once it has succeeded (:meth:`wait`)."""
        self.wait()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rayfl-commit")
        self._pending = (self._pool.submit(write), then)

    def wait(self) -> float:
        """Once the commit in flight has ended: the seconds its checkpoint took (0.0 when it
        wrote none, or when none was in flight); its error is raised here."""
        if self._pending is None:
            return 0.0
        (future, then), self._pending = self._pending, None
        seconds = future.result()
        if then is not None:
            then()
        return seconds or 0.0

    def abandon(self) -> None:
        """Wait for the commit in flight, its error dropped: the run is already stopping with
        another."""
        try:
            self.wait()
        except Exception:  # noqa: BLE001 - the error the run stops with is the one to raise
            pass

    def close(self) -> None:
        """Wait for the commit in flight and end the thread."""
        self.abandon()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
