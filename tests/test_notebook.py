"""examples/tutorial.ipynb runs top to bottom as a researcher would run it (a fresh kernel started
in some directory), writes only under the directory it names, its cells print what they claim,
and the outputs committed with it — which the documentation site shows — are those its cells
print now."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys

import nbformat

from tests.conftest import ROOT, TINY

NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e-?\d+)?")


def _run_tutorial():
    spec = importlib.util.spec_from_file_location(
        "run_tutorial", os.path.join(ROOT, "tools", "run_tutorial.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _outputs(nb) -> list[list[tuple[str, str]]]:
    """Per code cell: (kind, printed text) of each output, a figure's kind being its PNG."""
    return [[("image/png", "") if "image/png" in o.get("data", {}) else
             (o.get("name", o.output_type), o.get("text", ""))
             for o in cell.outputs] for cell in nb.cells if cell.cell_type == "code"]


def _same_up_to_rounding(committed: str, fresh: str) -> bool:
    """Equal text, and numbers equal up to the last printed digit's rounding (a float summed in
    another order on another CPU may round the other way)."""
    if NUMBER.split(committed) != NUMBER.split(fresh):
        return False
    return all(math.isclose(float(a), float(b), rel_tol=1e-2, abs_tol=2e-3)
               for a, b in zip(NUMBER.findall(committed), NUMBER.findall(fresh)))


def test_tutorial_notebook_runs_anywhere_writes_under_its_directory_and_is_committed_fresh(
        tmp_path):
    run_tutorial = _run_tutorial()
    started_in = tmp_path / "jupyter-started-here"
    started_in.mkdir()
    # its directory lands in this test's temporary directory; Ray's own stays short (sockets)
    fresh = run_tutorial.execute(cwd=str(started_in),
                                 env={"TMPDIR": str(tmp_path), "RAY_TMPDIR": "/tmp"})

    printed = "".join(text for cell in _outputs(fresh) for kind, text in cell)
    assert re.search(r"fedavg: final accuracy 0\.\d+ after 6 rounds", printed)
    assert re.search(r"scaffold: final accuracy 0\.\d+ after 6 rounds", printed)
    assert "same model bytes on 2 actors as in-process: True" in printed
    assert "best local.lr:" in printed and "trials: {'COMPLETE': 3}" in printed
    assert ("image/png", "") in _outputs(fresh)[2]  # the comparison plot
    assert not os.listdir(started_in)
    (work,) = tmp_path.glob("rayfl-tutorial-*")  # the fresh folder the notebook made
    assert sorted(os.listdir(work)) == ["cache", "runs", "studies"]
    assert (work / "studies" / "tutorial_lr" / "trials.parquet").is_file()

    committed = nbformat.read(run_tutorial.NOTEBOOK, as_version=4)
    assert committed.metadata["rayfl"]["source_sha256"] == run_tutorial.source_sha256(committed)
    for old, new in zip(_outputs(committed), _outputs(fresh), strict=True):
        assert [kind for kind, _ in old] == [kind for kind, _ in new]
        for (_, a), (_, b) in zip(old, new):
            assert _same_up_to_rounding(a, b), (a, b)


def test_importing_and_running_rayfl_leaves_the_plotting_backend_alone(tmp_path):
    """A notebook's inline plots keep working after ``import rayfl`` and an in-process run, which
    writes its figures itself (here the backend is svg; in Jupyter it is the inline one)."""
    code = (f"import matplotlib, rayfl, rayfl.analysis.plots, tune.report\n"
            f"rayfl.run({TINY!r}, ['runtime.executor=inprocess', 'rounds=2', "
            f"'output_dir={tmp_path}', 'data.cache_dir={tmp_path / 'c'}'], quiet=True)\n"
            f"print(matplotlib.get_backend())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT, "MPLBACKEND": "svg"}, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "svg"
