"""``rayfl data``'s per-client table: each client's size, held-out rows, class count and top
classes; the first clients printed, every client written to CSV or Parquet on request.

Built from the (clients × classes) label counts of :func:`rayfl.data.inspect.label_counts`, so
it costs arrays, not a Python object per client (except the rows printed or written as text).
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from rayfl.schema import ConfigError

TOP = 3  # classes named per client


def check_table_path(path: str | None) -> None:
    """``--table`` must name a ``.csv`` or ``.parquet`` file (checked before anything runs)."""
    if path is not None and not path.endswith((".csv", ".parquet")):
        raise ConfigError("--table", path, "a file path ending in .csv or .parquet")


def top_classes(row: np.ndarray, k: int = TOP) -> str:
    """``"3:40% 7:25% 1:10%"``: the client's k most frequent classes with their share of its
    samples (ties by class id)."""
    total = int(row.sum())
    order = np.lexsort((np.arange(len(row)), -row))[:k]
    return " ".join(f"{c}:{100 * row[c] / total:.0f}%" for c in order if row[c] > 0) \
        if total else "-"


def client_table(counts: np.ndarray, holdout_sizes: np.ndarray,
                 sizes: np.ndarray | None = None) -> pa.Table:
    """One row per training client: ``client``, ``samples`` (training rows; default the label
    counts' sums), ``holdout_samples``, ``classes`` (classes present), ``top_classes`` and
    ``class_<c>`` (labels of class c: rows, or tokens for next-token data)."""
    sizes = counts.sum(1) if sizes is None else sizes
    cols = {"client": np.arange(len(counts)), "samples": sizes,
            "holdout_samples": np.asarray(holdout_sizes, dtype=np.int64),
            "classes": (counts > 0).sum(1),
            "top_classes": [top_classes(r) for r in counts]}
    cols.update({f"class_{c}": counts[:, c] for c in range(counts.shape[1])})
    return pa.table(cols)


def head_lines(counts: np.ndarray, holdout_sizes: np.ndarray, first: int,
               sizes: np.ndarray | None = None) -> list[str]:
    """The printed table: the first ``first`` clients, then how many more there are."""
    sizes = counts.sum(1) if sizes is None else sizes
    n = min(first, len(counts))
    held = bool(np.any(holdout_sizes))
    head = f"{'client':>8} {'samples':>8}" + (f" {'held-out':>8}" if held else "") + \
        f" {'classes':>7}  top classes (share of the client's samples)"
    lines = [head]
    for i in range(n):
        lines.append(f"{i:>8} {int(sizes[i]):>8}" +
                     (f" {int(holdout_sizes[i]):>8}" if held else "") +
                     f" {int((counts[i] > 0).sum()):>7}  {top_classes(counts[i])}")
    if n < len(counts):
        lines.append(f"... {len(counts) - n} more clients (--clients N shows more, --table "
                     "PATH writes all)")
    return lines


def write_table(table: pa.Table, path: str) -> str:
    """``table`` to ``path`` as CSV or Parquet (by the extension)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if path.endswith(".csv"):
        pcsv.write_csv(table, path)
    else:
        pq.write_table(table, path)
    return path
