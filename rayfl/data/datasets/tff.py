"""TFF's SQLite exports of Shakespeare and StackOverflow (``shakespeare.sqlite``,
``stackoverflow.sqlite``): clients are the file's client ids, sorted.

The file holds a table ``examples(split_name, client_id, serialized_example_proto)`` whose blobs
are serialized ``tf.train.Example`` protocol buffers, decoded here without TensorFlow. Rows of
split ``train`` train; rows of split ``test`` are the test set. With ``partition: natural`` only
the first ``data.num_clients`` clients are read (and only their test rows).

Shakespeare (feature ``snippets``): every snippet's characters, wrapped in begin/end tokens, are
joined per client and cut into 81-token chunks (the last padded) → input ``[:-1]``, target
``[1:]`` (TFF's char prediction; ids in :data:`~rayfl.data.datasets.text.TFF_CHARS`).
StackOverflow (feature ``tokens``, space-separated words): the first 20 words, ids by the 10,000
most frequent words of the training rows read (ties: the word; TFF counts the whole training
split), out-of-vocabulary, begin, end and
padding tokens as TFF's word prediction (pad 0, words 1..V, oov V+1, bos V+2, eos V+3; the end
token only when the sentence is shorter than 20), input ``[:-1]``, target ``[1:]``. Accuracy
leaves out padding and, for StackOverflow, out-of-vocabulary, begin and end tokens (TFF's
masked accuracy).
"""

from __future__ import annotations

import collections
import contextlib
import os
import pathlib
import sqlite3
from collections.abc import Iterator

import numpy as np

from rayfl.data.datasets import Arrays, natural_dataset
from rayfl.data.datasets.text import TFF_CHARS, char_ids, next_token_rows
from rayfl.schema import ConfigError

SHAKESPEARE_LEN = 80  # McMahan et al. 2017; TFF's SEQUENCE_LENGTH
SO_LEN, SO_VOCAB = 20, 10_000  # Reddi et al. 2021
TABLE = "examples(split_name, client_id, serialized_example_proto)"
#: what decoding a damaged example raises (a cut varint, a missing feature, not UTF-8 text)
PROTO_ERRORS = (IndexError, KeyError, ValueError, TypeError, AttributeError)
HINT = ("export TFF's {0} ClientData to SQLite (tff.simulation.datasets.{0}.load_data's "
        "{0}.sqlite) and set data.root to its folder or the file")


# ----- tf.train.Example, from its protocol-buffer wire format -----------------------------------

def _varint(buf: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        if b < 0x80:
            return out, i
        shift += 7


def _fields(buf: bytes):
    """(field number, wire type, value) of a message: ints for varints, bytes otherwise."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, wire, value


def parse_example(blob: bytes) -> dict[str, list]:
    """feature name -> its values (bytes for a BytesList, ints for an Int64List, floats for a
    FloatList) of a serialized ``tf.train.Example``."""
    out = {}
    for number, _, features in _fields(blob):  # Example.features = 1
        if number != 1:
            continue
        for n, _, entry in _fields(features):  # Features.feature = 1 (map entries)
            if n != 1:
                continue
            name, values = "", []
            for k, _, v in _fields(entry):
                if k == 1:
                    name = v.decode()
                elif k == 2:  # Feature: bytes_list 1, float_list 2, int64_list 3
                    for kind, _, lst in _fields(v):
                        values = _list_values(kind, lst)
            out[name] = values
    return out


def _list_values(kind: int, lst: bytes) -> list:
    values = []
    for _, wire, v in _fields(lst):
        if kind == 1:
            values.append(bytes(v))
        elif kind == 2:
            values += np.frombuffer(v, "<f4").tolist()
        elif wire == 0:
            values.append(v - (1 << 64) if v >= 1 << 63 else v)
        else:  # packed int64s
            i = 0
            while i < len(v):
                x, i = _varint(v, i)
                values.append(x - (1 << 64) if x >= 1 << 63 else x)
    return values


# ----- the SQLite file ---------------------------------------------------------------------------

def _path(root: str | None, name: str) -> str | None:
    if root is None:
        return None
    root = os.path.expanduser(root)
    return root if os.path.isfile(root) else os.path.join(root, f"{name}.sqlite")


def database(root: str | None, name: str) -> str:
    """``root`` itself when a file, else ``root/<name>.sqlite``."""
    if root is None:
        raise ConfigError("data.root", None, f"the folder of {name}.sqlite; {HINT.format(name)}")
    path = _path(root, name)
    if not os.path.isfile(path):
        raise ConfigError("data.root", os.path.expanduser(root), f"{name}.sqlite (TFF's SQLite "
                          f"export); {HINT.format(name)}")
    return path


@contextlib.contextmanager
def _reading(path: str, feature: str) -> Iterator[sqlite3.Connection]:
    """A read-only connection to ``path``; a file that is not TFF's SQLite export (not SQLite,
    truncated, another table or columns, an example without ``feature``) is a ConfigError
    naming it."""
    con = None
    try:
        con = sqlite3.connect(pathlib.Path(os.path.abspath(path)).as_uri() + "?mode=ro",
                              uri=True)
        yield con
    except ConfigError:
        raise
    except (sqlite3.Error, *PROTO_ERRORS) as e:
        raise ConfigError("data.root", path, f"TFF's SQLite export: a table {TABLE} whose "
                          f"serialized tf.train.Examples hold the feature {feature!r} "
                          f"({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None
    finally:
        if con is not None:
            con.close()


def read(path: str, split: str, feature: str, clients: list[str] | None):
    """client id -> the text of the ``feature`` of its examples of ``split`` (file order), for
    the given clients (default: all, sorted)."""
    with _reading(path, feature) as con:
        rows = con.execute("SELECT client_id, serialized_example_proto FROM examples WHERE "
                           "split_name = ? ORDER BY client_id, rowid", (split,))
        want = None if clients is None else set(clients)
        out = collections.defaultdict(list)
        for cid, blob in rows:
            if want is None or cid in want:
                out[cid].append(parse_example(blob)[feature][0].decode("utf-8"))
    if not out:
        whose = f" for its first {len(clients)} training clients" if clients else ""
        raise ConfigError("data.root", path, f"TFF's SQLite export with examples of split "
                          f"{split!r}{whose} (it has none)")
    return out


def _client_ids(path: str, cfg, feature: str) -> list[str] | None:
    """The first ``num_clients`` training client ids under partition natural, else None."""
    if cfg.stored_partition != "natural":
        return None
    with _reading(path, feature) as con:
        return [r[0] for r in con.execute("SELECT DISTINCT client_id FROM examples WHERE "
                                          "split_name = 'train' ORDER BY client_id LIMIT ?",
                                          (cfg.num_clients,))]


def _assemble(train: dict, test: dict, rows_fn, **kw) -> Arrays:
    users = sorted(train)
    per = [rows_fn(train[u]) for u in users]
    tests = [rows_fn(test[u]) for u in sorted(test)]
    return Arrays(np.concatenate([x for x, _ in per]), np.concatenate([y for _, y in per]),
                  np.concatenate([x for x, _ in tests]), np.concatenate([y for _, y in tests]),
                  groups=np.repeat(np.arange(len(users)), [len(y) for _, y in per]),
                  kind="tokens", ignore_index=0, **kw)


def load_shakespeare(cfg, seed: int) -> Arrays:
    """81-token chunks of each client's snippets → (80 input ids, 80 target ids)."""
    path = database(cfg.root, "shakespeare")
    clients = _client_ids(path, cfg, "snippets")
    oov, bos, eos = len(TFF_CHARS) + 1, len(TFF_CHARS) + 2, len(TFF_CHARS) + 3

    def rows(snippets):
        ids = [np.concatenate([[bos], char_ids(s, TFF_CHARS, 1, oov), [eos]])
               for s in snippets]
        stream = np.concatenate(ids).astype(np.uint8) if ids else np.zeros(0, np.uint8)
        return next_token_rows(stream, SHAKESPEARE_LEN)

    train = read(path, "train", "snippets", clients)
    test = read(path, "test", "snippets", clients)
    return _assemble(train, test, rows, input_shape=(SHAKESPEARE_LEN,), num_classes=eos + 1,
                     vocab=(eos + 1,))


def load_stackoverflow(cfg, seed: int) -> Arrays:
    """One row per sentence: (20 input ids, 20 target ids)."""
    path = database(cfg.root, "stackoverflow")
    clients = _client_ids(path, cfg, "tokens")
    train = read(path, "train", "tokens", clients)
    test = read(path, "test", "tokens", clients)
    counts = collections.Counter(w for sents in train.values() for s in sents
                                 for w in s.split())
    top = sorted(counts.items(), key=lambda c: (-c[1], c[0]))[:SO_VOCAB]
    vocab = {w: i + 1 for i, (w, _) in enumerate(top)}
    oov, bos, eos = SO_VOCAB + 1, SO_VOCAB + 2, SO_VOCAB + 3

    def rows(sentences):
        out = np.zeros((len(sentences), SO_LEN + 1), dtype=np.uint16)
        for i, s in enumerate(sentences):
            ids = [vocab.get(w, oov) for w in s.split()[:SO_LEN]]
            if len(ids) < SO_LEN:
                ids.append(eos)
            out[i, :len(ids) + 1] = [bos] + ids
        return np.ascontiguousarray(out[:, :-1]), out[:, 1:].astype(np.int64)

    return _assemble(train, test, rows, input_shape=(SO_LEN,), num_classes=eos + 1,
                     vocab=(eos + 1,), unscored=(oov, bos, eos))


def _sources(name: str):
    def sources(cfg) -> list[str]:
        """The SQLite file the loader reads."""
        path = _path(cfg.root, name)
        return [path] if path and os.path.isfile(path) else []
    return sources


shakespeare = natural_dataset(
    load_shakespeare, "shakespeare",
    "Shakespeare from TFF's SQLite export: 80 characters → the next 80, one client per client id.",
    _sources("shakespeare"))
stackoverflow = natural_dataset(
    load_stackoverflow, "stackoverflow",
    "StackOverflow from TFF's SQLite export: 20 words → the next 20 (10k vocabulary), one client "
    "per user.", _sources("stackoverflow"))
