"""Rounds in which no client completed: counted, shown, and a run made of them stopped.

A synchronous round can end with nobody to aggregate — nobody online, every sampled client
dropped out, went offline before reporting or missed ``availability.deadline_s``. The model
then does not move; such a round is counted (``empty_rounds`` in ``metrics.parquet`` and
``summary.json``; ``empty_reason`` says why) and shown in the progress line. When
``availability.max_empty_rounds`` rounds in a row are empty — or every round of a shorter run
is — the run stops with the reason instead of reporting "done" on the initial model. An
asynchronous server that finds no client online for about 69 virtual days stops the same way
(:class:`NobodyOnline`).
"""

from __future__ import annotations


class NobodyOnline(Exception):
    """An event-driven server waited a virtual eternity for a single client to come online: the
    run stops with this reason, as a run of empty synchronous rounds does."""


def is_empty(row: dict) -> bool:
    """Whether the metrics ``row`` is of a round in which no client completed."""
    return row.get("completed") == 0


class EmptyRounds:
    """The count of empty rounds so far and the current run of them, from the rows already
    written (a resumed run goes on counting)."""

    def __init__(self, max_empty_rounds: int, final_round: int, rows: list[dict]):
        self.max_empty_rounds, self.final_round = max_empty_rounds, final_round
        self.total = sum(map(is_empty, rows))
        self.streak = 0
        for row in reversed(rows):
            if not is_empty(row):
                break
            self.streak += 1

    def after(self, row: dict) -> str | None:
        """Count round ``row`` (sets its ``empty_rounds``); the reason the run must stop after
        it, or None."""
        empty = is_empty(row)
        self.total += empty
        self.streak = self.streak + 1 if empty else 0
        row["empty_rounds"] = self.total
        why = row.get("empty_reason", "")
        if self.streak >= self.max_empty_rounds:
            return (f"no client completed in {self.streak} rounds in a row "
                    f"(availability.max_empty_rounds = {self.max_empty_rounds}); last: {why}")
        if self.streak >= self.final_round:
            return f"no client completed in any of the {self.streak} rounds; last: {why}"
        return None
