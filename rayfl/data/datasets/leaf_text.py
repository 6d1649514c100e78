"""LEAF's preprocessed text datasets (``train/*.json``, ``test/*.json`` with keys ``users``,
``num_samples``, ``user_data``): Shakespeare and Sent140, users sorted by id becoming clients.

Shakespeare: x an 80-character string, y the next character, both in LEAF's character
vocabulary (out-of-vocabulary characters as LEAF maps them, to the last entry). Sent140: x the
raw tweet row (its text at index 4), y 0/1; words (LEAF's tokenizer) map to ids in the training
tweets' vocabulary sorted by count (ties: the word), unknown words and padding to one more id,
25 words a tweet (LEAF's ``line_to_indices``).
"""

from __future__ import annotations

import collections
import re
import numpy as np

from rayfl.data.datasets import Arrays, natural_dataset
from rayfl.data.datasets.leaf import json_files, labels, read_users
from rayfl.data.datasets.text import LEAF_LETTERS, char_ids

MAX_WORDS = 25  # LEAF sent140 (models/sent140: line_to_indices)
SEQ_LEN = 80  # LEAF shakespeare: characters of x (models/shakespeare: SEQ_LEN)
TEXT = 4  # LEAF sent140: index of the tweet's text in a row of x
WORD = re.compile(r"[\w']+|[.,!?;]")  # LEAF's split_line
HINT = "run LEAF's data/{0}/preprocess.sh (https://github.com/TalwalkarLab/leaf) and set " \
       "data.root to its data/{0}/data folder"


def _splits(cfg, name: str, rows) -> tuple[dict, dict]:
    hint = HINT.format(name)
    return (read_users(cfg.root, "train", name, hint, rows),
            read_users(cfg.root, "test", name, hint, rows))


def _shakespeare_rows(x: list, y: list) -> dict:
    """One role's rows: x strings of :data:`SEQ_LEN` characters, y single characters."""
    for i, s in enumerate(x):
        if not isinstance(s, str) or len(s) != SEQ_LEN:
            found = f"{len(s)} characters" if isinstance(s, str) else f"a {type(s).__name__}"
            raise ValueError(f"x rows of {SEQ_LEN} characters (x[{i}] is {found})")
    for i, c in enumerate(y):
        if not isinstance(c, str) or len(c) != 1:
            raise ValueError(f"y labels of one character (y[{i}] is {c!r})")
    return {"x": x, "y": y}


def _sent140_rows(x: list, y: list) -> dict:
    """One user's rows: x rows holding the tweet's text at index 4, y labels 0 or 1."""
    for i, row in enumerate(x):
        if not isinstance(row, list) or len(row) <= TEXT or not isinstance(row[TEXT], str):
            raise ValueError(f"x rows of LEAF's tweet fields with the text at index {TEXT} "
                             f"(x[{i}] is {str(row)[:60]})")
    return {"x": x, "y": labels(y, 2)}


def _groups(train: dict, users: list[str]) -> np.ndarray:
    return np.repeat(np.arange(len(users)), [len(train[u]["y"]) for u in users])


def _chars(rows: list[str]) -> np.ndarray:
    if not rows:
        return np.zeros((0, 0), np.uint8)
    return char_ids("".join(rows)).reshape(len(rows), -1)


def load_shakespeare(cfg, seed: int) -> Arrays:
    """Rows of character ids (uint8), the next character's id as label."""
    train, test = _splits(cfg, "shakespeare", _shakespeare_rows)
    users, test_users = sorted(train), sorted(test)

    def arrays(d, us):
        x = _chars([s for u in us for s in d[u]["x"]])
        y = _chars([s for u in us for s in d[u]["y"]]).reshape(-1).astype(np.int64)
        return x, y

    (x, y), (xt, yt) = arrays(train, users), arrays(test, test_users)
    return Arrays(x, y, xt, yt, input_shape=(x.shape[1],), num_classes=len(LEAF_LETTERS),
                  kind="tokens", vocab=(len(LEAF_LETTERS),), groups=_groups(train, users))


def words(text: str) -> list[str]:
    """LEAF's tokenizer (``split_line``)."""
    return WORD.findall(text)


def word_ids(texts: list[str], vocab: dict[str, int]) -> np.ndarray:
    """(n, 25) ids: the first 25 words, unknown words and padding as ``len(vocab)``."""
    unk = len(vocab)
    out = np.full((len(texts), MAX_WORDS), unk, dtype=np.int64)
    for i, t in enumerate(texts):
        ids = [vocab.get(w, unk) for w in words(t)[:MAX_WORDS]]
        out[i, :len(ids)] = ids
    return out


def load_sent140(cfg, seed: int) -> Arrays:
    """Rows of 25 word ids, label 0 (negative) or 1 (positive)."""
    train, test = _splits(cfg, "sent140", _sent140_rows)
    users, test_users = sorted(train), sorted(test)
    texts = [row[TEXT] for u in users for row in train[u]["x"]]
    counts = collections.Counter(w for t in texts for w in words(t))
    vocab = {w: i for i, (w, _) in enumerate(sorted(counts.items(), key=lambda c: (-c[1], c[0])))}
    dtype = np.uint16 if len(vocab) < 2**16 else np.uint32
    x = word_ids(texts, vocab).astype(dtype)
    xt = word_ids([row[TEXT] for u in test_users for row in test[u]["x"]], vocab).astype(dtype)
    y = np.concatenate([train[u]["y"] for u in users])
    yt = np.concatenate([test[u]["y"] for u in test_users])
    return Arrays(x, y, xt, yt, input_shape=(MAX_WORDS,), num_classes=2, kind="tokens",
                  vocab=(len(vocab) + 1,), groups=_groups(train, users))


def sources(cfg) -> list[str]:
    """The json files the loaders read."""
    return json_files(cfg.root)


shakespeare = natural_dataset(
    load_shakespeare, "shakespeare",
    "Shakespeare in LEAF's preprocessed json: 80 characters → the next, one client per role.",
    sources)
sent140 = natural_dataset(
    load_sent140, "sent140",
    "Sent140 in LEAF's preprocessed json: tweets' first 25 words → sentiment, one client per "
    "Twitter user.", sources)
