"""Reading a run's Parquet tables while the run may be rewriting them."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq


def read_table(path: str | os.PathLike) -> pa.Table:
    """The table at ``path``, read through one open file: a run replaces its tables by rename
    after every round, and pyarrow's reader by path sizes the file before it opens it, so a
    replacement in between tears the read ("Page was smaller than expected")."""
    with open(path, "rb") as f:
        return pq.read_table(f)


def read_rows(path: str | os.PathLike) -> list[dict]:
    """The table at ``path`` as one dict per row (see :func:`read_table`)."""
    return read_table(path).to_pylist()
