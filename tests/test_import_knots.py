"""The package's imports stay untied: no import circle in rayfl or tune (counting imports inside
functions and the parent packages an import runs), and imports inside functions only for
optional or heavy packages a run may not need."""

from __future__ import annotations

import os
import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tools"))
from import_knots import knots  # noqa: E402

#: packages a module may import inside a function: optional, or heavy and rarely needed
DEFERRED = ("PIL", "sklearn", "tqdm", "matplotlib", "tensorboardX", "mlflow", "torchvision",
            "tune", "optuna")


@pytest.mark.parametrize("package", ["rayfl", "tune"])
def test_no_import_circle(package, monkeypatch):
    monkeypatch.chdir(ROOT)
    known, _, found = knots(package)
    assert len(known) > 5 and found == []


@pytest.mark.parametrize("package", ["rayfl", "tune"])
def test_imports_inside_functions_are_deferred_packages_only(package, monkeypatch):
    monkeypatch.chdir(ROOT)
    _, local, _ = knots(package)
    own = [(m, line, text) for m, line, text in local
           if text.split()[1].split(".")[0] not in DEFERRED]
    assert own == []


def test_the_counter_sees_a_circle_through_a_function_and_a_parent_package(tmp_path,
                                                                          monkeypatch):
    """A package whose function imports its child, which names the package: one circle."""
    pkg = tmp_path / "knotted"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("def build():\n    from knotted.child import x\n")
    (pkg / "child.py").write_text("from knotted import build\nx = 1\n")
    (pkg / "leaf.py").write_text("import os\n")
    monkeypatch.chdir(tmp_path)
    known, local, found = knots("knotted")
    assert sorted(known) == ["knotted", "knotted.child", "knotted.leaf"]
    assert local == [("knotted", 2, "from knotted.child import x")]
    assert found == [["knotted", "knotted.child"]]
