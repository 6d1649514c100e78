"""Execute ``examples/tutorial.ipynb`` top to bottom in a fresh kernel and save it with its
outputs, which the repository commits and the documentation site shows (``make tutorial``).

The notebook is committed executed rather than executed while the site builds: the site then
builds in seconds without Ray or an Optuna study, a repository browser shows the same plots and
numbers, and no notebook plugin joins the docs dependencies. ``tests/test_notebook.py`` runs the
notebook again and checks the committed outputs are those of its current cells.

    python tools/run_tutorial.py [--check]   # --check: execute, compare, write nothing
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile

import nbformat
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "examples", "tutorial.ipynb")
TIMEOUT_S = 600  # per cell


def source_sha256(nb) -> str:
    """SHA-256 of the code cells' sources: outputs saved with another one are stale."""
    code = "\n\0".join(c.source for c in nb.cells if c.cell_type == "code")
    return hashlib.sha256(code.encode()).hexdigest()


def execute(path: str = NOTEBOOK, cwd: str | None = None, env: dict | None = None):
    """The notebook at ``path``, executed in a fresh ``python3`` kernel started in ``cwd`` (a
    scratch directory by default: the notebook must not depend on where Jupyter starts), with
    rayfl importable; plots are kept as the kernel's inline PNGs. Log lines on stderr are left
    out of the saved outputs (Ray's start-up messages differ from machine to machine)."""
    nb = nbformat.read(path, as_version=4)
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "MPLBACKEND", *(env or {}))}
    os.environ.pop("MPLBACKEND", None)  # the kernel's inline backend, which keeps the PNG
    os.environ.update({"PYTHONPATH": ROOT, **(env or {})})
    try:
        with tempfile.TemporaryDirectory() as scratch:
            NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                           resources={"metadata": {"path": cwd or scratch}}).execute()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    for cell in nb.cells:
        cell.metadata.pop("execution", None)  # timestamps
        if cell.cell_type == "code":
            cell.outputs = [o for o in cell.outputs
                            if not (o.output_type == "stream" and o.name == "stderr")]
    nb.metadata["rayfl"] = {"source_sha256": source_sha256(nb)}
    return nb


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="execute and compare, write nothing")
    args = p.parse_args(argv)
    nb = execute()
    if args.check:
        committed = nbformat.read(NOTEBOOK, as_version=4)
        fresh = committed.metadata.get("rayfl", {}).get("source_sha256") == source_sha256(nb)
        print("the committed outputs are " + ("those of the current cells" if fresh else
                                              "stale: run python tools/run_tutorial.py"))
        return 0 if fresh else 1
    nbformat.write(nb, NOTEBOOK)
    print(NOTEBOOK)
    return 0


if __name__ == "__main__":
    sys.exit(main())
