"""Round messages: what the server computed from round t, read by each of that round's clients
when it next takes part (an algorithm's ``round_message`` / ``client_settle`` pair).

A client's state file is immutable (``rayfl/runtime/state_store.py``), so a state update that
needs the round's aggregate (ProxSkip's h_i ← h_i + (p/γ)(x_{t+1} − x̂_i)) is applied when the
state is next loaded, from the message of the round that wrote it. Messages are files beside
the client states (``messages/r<t>.npz``, a few kept in memory per process), written by the
server after the round and deleted after a checkpoint once no client's state refers to the
round, so memory stays bounded and actors on other nodes read them too.
"""

from __future__ import annotations

import re
from collections import OrderedDict

import numpy as np
import torch

from rayfl.runtime.storage import Storage

PREFIX = "messages/"
CACHED = 4  # messages kept in memory per process (a round's clients read the same few)


def message_name(t: int) -> str:
    """The file (relative to the state root) of round ``t``'s message."""
    return f"{PREFIX}r{t}.npz"


class Messages:
    """Round messages under a state root (``None``: in memory only, for the math tests)."""

    def __init__(self, root: str | None):
        self.storage = None if root is None else Storage(root)
        self.memory: dict[int, dict[str, torch.Tensor]] = {}
        self.cache: OrderedDict[int, dict[str, torch.Tensor]] = OrderedDict()

    def save(self, t: int, message: dict[str, torch.Tensor]) -> None:
        """Store round ``t``'s message (replacing one a re-run of the round wrote)."""
        message = {k: v.detach().cpu() for k, v in message.items()}
        if self.storage is None:
            self.memory[t] = message
            return
        arrays = {k: v.numpy() for k, v in message.items()}
        self.storage.write_with(message_name(t), lambda f: np.savez(f, **arrays))
        self.cache.pop(t, None)

    def load(self, t: int) -> dict[str, torch.Tensor]:
        """Round ``t``'s message."""
        if self.storage is None:
            return self.memory[t]
        if t not in self.cache:
            with self.storage.open(message_name(t)) as f, np.load(f, allow_pickle=False) as z:
                self.cache[t] = {k: torch.from_numpy(z[k].copy()) for k in z.files}
            while len(self.cache) > CACHED:
                self.cache.popitem(last=False)
        return self.cache[t]

    def prune(self, keep: set[int], before: int | None = None) -> None:
        """Delete the messages of every round not in ``keep`` (rounds some state refers to),
        of rounds before ``before`` only when given (a checkpoint's, committed as later rounds
        ran)."""
        def gone(t: int) -> bool:
            return t not in keep and (before is None or t < before)
        if self.storage is None:
            self.memory = {t: m for t, m in self.memory.items() if not gone(t)}
            return
        for name in self.storage.files():
            round_ = message_round(name)
            if round_ is not None and gone(round_):
                self.storage.delete(name)


def message_round(name: str) -> int | None:
    """The round of a message file's name (None for any other file)."""
    match = re.fullmatch(r"messages/r(\d+)\.npz", name.replace("\\", "/"))
    return None if match is None else int(match.group(1))
