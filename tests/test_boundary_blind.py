"""Cases a blind probe of the boundary found (misbehaving components and privacy settings a new
user writes, tried without reading the suite): each is one line naming the component or key,
exit 2, nothing written — but for what only the server's round calls (a server optimiser's
step), refused in the round it happens, in the run directory already made."""

from __future__ import annotations

import os

import pytest

from rayfl.cli import main
from tests.conftest import ROOT, TINY

BAD = "tests.components_bad2"
DP = ["privacy.noise_multiplier=1.0", "privacy.clip_norm=0.5"]
PLATEAU = "wrappers=[{name: examples.plateau:ReduceOnPlateau}]"


@pytest.mark.parametrize("overrides, phrases", [
    ([f"model.name={BAD}:EditsInput"], [f"{BAD}:EditsInput.forward", "its input in place"]),
    ([*DP, "algorithm.name=examples.my_algo:MyAlgo"],
     ["'algorithm.name'", "Traits(dp_post_processing=True)", "does not declare it"]),
    (["privacy.public_reports=[loss]"], ["privacy.public_reports", "do not make one"]),
    (["privacy.audit_canaries=10"], ["privacy.audit_canaries", "do not make one"]),
    ([*DP, "privacy.public_reports=[loss]"], ["privacy.public_reports", "rayfl's own"]),
    ([*DP, PLATEAU, "privacy.public_reports=[loss, lossx, weight]"],
     ["privacy.public_reports", "nothing sent 'lossx'"]),
    ([*DP, "privacy.audit_canaries=35"], ["privacy.audit_canaries", "at most 34", "68 param"]),
])
def test_refused_in_one_line_with_nothing_written(overrides, phrases, tmp_path, capsys,
                                                  monkeypatch):
    _refused(overrides, phrases, tmp_path, capsys, monkeypatch)
    assert not os.path.exists(tmp_path / "runs")


def test_a_server_optimiser_editing_its_direction_is_named_not_the_algorithm(
        tmp_path, capsys, monkeypatch):
    _refused([f"server_opt.name={BAD}:edits_direction"],
             ["edits_direction.<locals>.update (round 1)", "edited its direction in place"],
             tmp_path, capsys, monkeypatch)


def _refused(overrides, phrases, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    code = main(["run", TINY, f"output_dir={tmp_path / 'runs'}",
                 f"data.cache_dir={tmp_path / 'cache'}", "runtime.executor=inprocess",
                 "rounds=2", *overrides])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and err and err[0].startswith("rayfl: error: "), err
    assert "Traceback" not in "\n".join(err)
    for phrase in phrases:
        assert phrase in err[0], err[0]


def test_a_client_state_file_copied_over_another_clients_is_refused(tmp_path, capsys):
    import glob
    import shutil

    run_dir = str(tmp_path / "run")
    assert main(["run", TINY, f"data.cache_dir={tmp_path / 'cache'}", "algorithm.name=scaffold",
                 "runtime.executor=inprocess", "--run-dir", run_dir, "--max-rounds", "2"]) == 0
    files = sorted(glob.glob(os.path.join(run_dir, "state", "*", "*.npz")))
    shutil.copy(files[0], files[1])
    capsys.readouterr()
    assert main(["resume", run_dir]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("rayfl: error: client state ") and len(err) == 1
    assert "a file copied over another" in err[0] and os.path.basename(files[1]) in err[0]
