"""The contract every loaded dataset meets before it is partitioned and stored.

Every loader, built-in or the user's, returns :class:`~rayfl.data.datasets.Arrays` through
:func:`rayfl.data.datasets.load`, which passes them here: numpy arrays of rows, as many labels
as rows, labels within the classes, row sizes matching the declared input shape, finite
features, token and id columns within their vocabularies, at least one training and one test
row. What :func:`problem` finds is said once, naming the loader's files or the user's component
— not later as a crash inside training or an accuracy computed on nothing.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from rayfl.contract import describe

KINDS = ("dense", "ids", "tokens")
CHUNK = 1 << 22  # values checked for finiteness at a time (bounds the boolean scratch)


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _first_bad(values: np.ndarray, bad: np.ndarray) -> str:
    """``'-3 (row 17)'``: the first offending value and where."""
    at = np.unravel_index(int(np.argmax(bad)), bad.shape)
    return f"{values[at].item()} (row {int(at[0])})"


def _arrays(a) -> str | None:
    for name in ("x_train", "y_train", "x_test", "y_test"):
        v = getattr(a, name)
        if not isinstance(v, np.ndarray):
            return f"{name} is {describe(v)}, not a numpy array"
    for split in ("train", "test"):
        x, y = getattr(a, f"x_{split}"), getattr(a, f"y_{split}")
        if x.ndim != 2:
            return (f"x_{split} has shape {x.shape}; expected (rows, values per row): flatten "
                    "each row and give its shape as input_shape")
        if x.dtype.kind not in "iuf":
            return (f"x_{split} is of dtype {x.dtype}; expected an integer or floating dtype "
                    "(e.g. uint8 pixels or float32 features)")
        if y.ndim not in (1, 2) or y.dtype.kind not in "iu":
            return (f"y_{split} is {y.dtype} of shape {y.shape}; expected integer class labels, "
                    "one per row (rows,) or one per position (rows, length)")
        if len(x) != len(y):
            return (f"x_{split} has {_count(len(x), 'row')} but y_{split} "
                    f"{_count(len(y), 'label')}")
        if not len(y):
            return (f"x_{split} and y_{split} are empty; expected at least one "
                    f"{'training' if split == 'train' else 'test'} row")
    if a.x_test.shape[1] != a.x_train.shape[1]:
        return (f"rows of {a.x_train.shape[1]} values in x_train but {a.x_test.shape[1]} in "
                "x_test")
    if a.y_train.shape[1:] != a.y_test.shape[1:]:
        return f"labels of shape {a.y_train.shape[1:]} per row in y_train but " \
               f"{a.y_test.shape[1:]} in y_test"
    return None


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _declared(a) -> str | None:
    shape = a.input_shape
    if not isinstance(shape, (tuple, list)) or not shape or \
            not all(_is_int(d) and d >= 1 for d in shape):
        return f"input_shape is {shape!r}; expected a tuple of positive integers"
    if math.prod(shape) != a.x_train.shape[1]:
        return (f"rows of {a.x_train.shape[1]} values, but input_shape {tuple(shape)} needs "
                f"{math.prod(shape)}")
    if not _is_int(a.num_classes) or a.num_classes < 1:
        return f"num_classes is {a.num_classes!r}; expected a positive integer"
    if not isinstance(a.scale, numbers.Real) or not math.isfinite(a.scale) or a.scale <= 0:
        return f"scale is {a.scale!r}; expected a positive finite number"
    if a.kind not in KINDS:
        return f"kind is {a.kind!r}; expected one of {', '.join(KINDS)}"
    if a.y_train.ndim == 2 and a.kind != "tokens":
        return (f"y_train has shape {a.y_train.shape} for kind {a.kind!r}; expected one class "
                "label per row, shape (rows,) (labels per position, (rows, length), are for "
                "kind 'tokens': next-token prediction)")
    if not _is_int(a.ignore_index) or not all(_is_int(u) for u in a.unscored):
        return (f"ignore_index is {a.ignore_index!r} and unscored {a.unscored!r}; expected "
                "integer labels")
    if not _is_int(a.eval_group) or a.eval_group < 0 or \
            (a.eval_group and len(a.y_test) % a.eval_group):
        return (f"eval_group is {a.eval_group!r}; expected 0, or a group size that divides the "
                f"{len(a.y_test)} test rows")
    return None


def _labels(a) -> str | None:
    c = a.num_classes
    for name in ("y_train", "y_test"):
        y = getattr(a, name)
        if 0 <= y.min() and y.max() < c:
            continue
        bad = (y < 0) | (y >= c)
        if y.ndim == 2:  # one label per position: padding is the ignore_index
            bad &= y != a.ignore_index
        if bad.any():
            return (f"{name} holds the label {_first_bad(y, bad)}; expected labels in "
                    f"0..{c - 1} (num_classes {c})")
    return None


def _nonfinite(name: str, x: np.ndarray) -> str | None:
    """The first NaN or infinity of float rows ``x``, checked a block of rows at a time (views:
    never a copy of the whole array)."""
    step = max(1, CHUNK // max(x.shape[1], 1))
    for lo in range(0, len(x), step):
        finite = np.isfinite(x[lo:lo + step])
        if not finite.all():
            r, c = np.unravel_index(int(np.argmin(finite)), finite.shape)
            return f"{name} holds {x[lo + r, c].item()} (row {lo + r}); expected finite values"
    return None


def _features(a) -> str | None:
    for name in ("x_train", "x_test"):
        x = getattr(a, name)
        if a.kind == "dense":
            found = _nonfinite(name, x) if x.dtype.kind == "f" else None
            if found:
                return found
            continue
        if x.dtype.kind not in "iu":
            return f"{name} is of dtype {x.dtype}; kind {a.kind!r} rows hold integer ids"
        sizes = a.vocab[:1] * x.shape[1] if a.kind == "tokens" else a.vocab
        if len(sizes) != x.shape[1] or not all(_is_int(v) and v >= 1 for v in sizes):
            return (f"vocab is {a.vocab!r}; expected " + (
                "(vocabulary size,)" if a.kind == "tokens" else
                f"one table size per id column ({x.shape[1]})"))
        top = np.asarray(sizes, dtype=np.int64)
        if (x.min(0) >= 0).all() and (x.max(0) < top).all():
            continue
        bad = (x < 0) | (x >= top)
        if bad.any():
            return f"{name} holds the id {_first_bad(x, bad)}; expected ids below vocab {a.vocab}"
    return None


def _groups(a, natural: bool) -> str | None:
    g = a.groups
    if g is None:
        return "groups is None; partition natural needs each training row's writer/user" \
            if natural else None
    if not isinstance(g, np.ndarray) or g.ndim != 1 or g.dtype.kind not in "iu" or \
            len(g) != len(a.y_train):
        return (f"groups is {type(g).__name__}; expected an integer array with one writer/user "
                f"index per training row ({len(a.y_train)})")
    if len(g) and g.min() < 0:
        return f"groups holds {int(g.min())}; expected writer/user indices 0..G-1"
    return None


def problem(arrays, natural: bool = False) -> str | None:
    """What is wrong with a loader's :class:`~rayfl.data.datasets.Arrays` (None: nothing);
    ``natural``: the partition splits by ``groups``, which must then be given."""
    for check in (_arrays, _declared, _labels, _features):
        found = check(arrays)
        if found:
            return found
    return _groups(arrays, natural)
