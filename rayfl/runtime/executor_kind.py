"""An executor's contract once built (its class's declarations:
:mod:`rayfl.runtime.executor_declaration`): what ``build`` must return (an object answering the
four calls of :class:`~rayfl.runtime.loop.Executor`), and, for a user's executor, each call's
answer held to its shape — so a broken executor is one line naming it, where it is registered, named in a
config, built, or called."""

from __future__ import annotations

from typing import Any

import numpy as np

from rayfl import registry
from rayfl.contract import calling, describe, expect, name_of
from rayfl.runtime.aggregate import PartialSum
from rayfl.runtime.executor_declaration import CALLS
from rayfl.runtime.storage import CheckpointError

def built(kind: type, hosting) -> Any:
    """``kind.build(hosting)``, checked to answer every call; a user's executor comes back
    wrapped so that each call's error or malformed answer names it."""
    if is_builtin(kind):
        return kind.build(hosting)
    where = name_of(kind, "build")
    executor = as_users(where, kind.build, hosting)
    missing = [c for c in CALLS if not callable(getattr(executor, c, None))]
    expect(not missing, where, f"returned {describe(executor)}; expected an executor answering "
                               f"{', '.join(CALLS)} (it lacks {', '.join(missing)})")
    return Checked(executor)


def as_users(where: str, fn, *args, round: int | None = None):
    """``fn(*args)`` as a user's code named ``where``: its exception is a ComponentError naming
    it — but rayfl's own (a write that failed, a damaged client-state file), raised in rayfl's
    code the user's executor called, pass as they are."""
    own = None
    with calling(where, round):
        try:
            return fn(*args)
        except (OSError, CheckpointError) as e:
            own = e
    raise own


def is_builtin(kind: type) -> bool:
    """Whether ``kind`` is one of rayfl's own executors (trusted to answer in shape)."""
    return any(registry.resolve("executor", n) is kind for n in registry.BUILTINS["executor"])


#: what the round reads of each report an executor's ``run`` returns: key -> (check, expected)
REPORT_KEYS = {
    "sums": (lambda v: isinstance(v, list) and all(
        isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], int)
        and isinstance(p[1], PartialSum) for p in v), "a list of (group, PartialSum) pairs"),
    "written": (lambda v: isinstance(v, list) and all(isinstance(c, (int, np.integer))
                                                      for c in v), "a list of client ids"),
    "seconds": (lambda v: isinstance(v, (int, float)), "a number"),
    "peak_rss_mb": (lambda v: isinstance(v, (int, float)), "a number"),
    "private_mb": (lambda v: isinstance(v, (int, float)), "a number"),
}


def check_reports(where: str, reports, groups: list, t: int) -> None:
    """``run``'s answer: a list of reports holding what the round reads, with the sum of every
    group it was sent exactly once (a group lost or counted twice would change the model
    silently)."""
    expect(isinstance(reports, list) and all(isinstance(r, dict) for r in reports), where,
           f"returned {describe(reports)}; expected a list of reports, dicts with the keys "
           f"{', '.join(REPORT_KEYS)}", t)
    for i, report in enumerate(reports):
        for key, (ok, what) in REPORT_KEYS.items():
            expect(key in report and ok(report[key]), where,
                   f"returned a report (#{i}) whose {key!r} is "
                   f"{describe(report[key]) if key in report else 'missing'}; expected {what}",
                   t)
    sent = sorted(g for g, _ in groups)
    got = sorted(g for r in reports for g, _ in r["sums"])
    expect(got == sent, where, f"returned the sums of groups {got}; expected each group it "
                               f"was sent ({sent}) once", t)


class Checked:
    """A user's executor, each call run as the user's code (an exception names it) and each
    answer held to its shape."""

    def __init__(self, executor):
        self.executor = executor

    def _call(self, call: str, *args, round: int | None = None):
        return as_users(name_of(type(self.executor), call), getattr(self.executor, call), *args,
                        round=round)

    def _answer(self, call: str, out, n: int, shape_ok, shape: str) -> np.ndarray:
        """``out``, held to be a numeric array of the ``shape`` described (for ``n``
        clients)."""
        expect(isinstance(out, np.ndarray) and out.dtype.kind in "fiu" and shape_ok(out.shape),
               name_of(type(self.executor), call),
               f"returned {describe(out)}; expected a numeric array of shape {shape} for its "
               f"{n} clients")
        return out

    def run(self, t, bc, lr, groups, keep_dir, round_clients) -> list[dict]:
        reports = self._call("run", t, bc, lr, groups, keep_dir, round_clients, round=t)
        check_reports(name_of(type(self.executor), "run"), reports, groups, t)
        return reports

    def summaries(self, client_ids: np.ndarray) -> np.ndarray:
        n = len(client_ids)
        return self._answer("summaries", self._call("summaries", client_ids), n,
                            lambda s: len(s) == 2 and s[0] == n, f"({n}, any)")

    def client_scores(self, t, point, client_ids, finetune, batch_size,
                      buffers=None, versions=None) -> np.ndarray:
        out = self._call("client_scores", t, point, client_ids, finetune, batch_size, buffers,
                         versions, round=t)
        n = len(client_ids)
        return self._answer("client_scores", out, n, lambda s: s == (n, 6), f"({n}, 6)")

    def client_losses(self, point, client_ids, batch_size, buffers=None) -> np.ndarray:
        out = self._call("client_losses", point, client_ids, batch_size, buffers)
        n = len(client_ids)
        return self._answer("client_losses", out, n, lambda s: s == (n,), f"({n},)")
