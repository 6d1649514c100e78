"""rayfl.analysis without Ray: plane geometry, the decomposition's terms, drift tables, errors."""

from __future__ import annotations

import os

import numpy as np
import pytest

from rayfl import config as config_mod
from rayfl.analysis import drift, presets
from rayfl.analysis.decomposition import bias_terms, subsets
from rayfl.analysis.landscape import Plane, betas, grid_axes
from rayfl.analysis.rundir import RunDir
from rayfl.availability import make_sampler
from rayfl.data import prepare
from rayfl.runtime.local import spec_from_config
from rayfl.schema import ConfigError
from tests.conftest import TINY


def test_plane_places_the_three_models_exactly():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(3, 200)).astype(np.float32)
    p = Plane.through(*w)
    assert np.allclose(p.dirs @ p.dirs.T, np.eye(2), atol=1e-12)  # unit, orthogonal
    xy = np.array([p.coords(v) for v in w])
    assert np.allclose(xy[0], 0) and abs(xy[1, 1]) < 1e-12  # w1 origin, w2 on the a axis
    assert np.isclose(xy[1, 0], np.linalg.norm(w[1].astype(np.float64) - w[0]))
    for v, c in zip(w, xy):
        assert np.allclose(p.origin + c @ p.dirs, v, atol=1e-12)
        assert p.distance(v) < 1e-10
    off = w[0] + 3.0 * np.eye(200)[7]
    assert np.isclose(p.distance(off) ** 2 + np.sum(p.coords(off) ** 2), 9.0)


def test_plane_rejects_collinear_models():
    w1, w2 = np.zeros(5), np.ones(5)
    with pytest.raises(ConfigError, match="spanning a plane"):
        Plane.through(w1, w2, 2 * w2)


def test_grid_covers_the_models_with_margins():
    pts = np.array([[0.0, 0.0], [2.0, 0.0], [0.5, 1.0]])
    a, b = grid_axes(pts)
    assert len(a) == len(b) == 21
    assert np.isclose(a[0], -0.4) and np.isclose(a[-1], 2.4)
    assert np.isclose(b[0], -0.2) and np.isclose(b[-1], 1.2)


def test_betas_extrapolate_and_hold_both_endpoints():
    beta = betas(-0.5, 1.5, 41)
    assert beta[0] == -0.5 and beta[-1] == 1.5
    assert 0.0 in beta and 1.0 in beta and len(beta) == 41


def test_bias_terms_match_a_hand_computation():
    # two clients, two rows (row 0 held by client 0, row 1 by client 1), two classes
    probs = np.array([[[0.8, 0.2], [0.4, 0.6]],
                      [[0.3, 0.7], [0.1, 0.9]]])
    y, owner, p = np.array([0, 1]), np.array([0, 1]), np.array([0.25, 0.75])
    t = bias_terms(probs, y, owner, p)
    # TrainBias(x0) = .25·(.2,−.2), TrainBias(x1) = .75·(−.1,.1)
    assert t["train_bias"] == pytest.approx((0.005 + 0.01125) / 2)
    # HeterBias(x0) = .75·(.7,−.7), HeterBias(x1) = .25·(−.4,.4)
    assert t["heter_bias"] == pytest.approx((0.55125 + 0.02) / 2)
    assert t["bias"] == pytest.approx((0.66125 + 0.06125) / 2)
    assert t["own_mse"] == pytest.approx(0.25 * 0.08 + 0.75 * 0.02)
    assert t["other_mse"] == pytest.approx(0.25 * 0.32 + 0.75 * 0.98)
    assert t["diversity"] == pytest.approx((0.09375 + 0.03375) / 2)
    # ambiguity decomposition: mean client MSE on D = bias + diversity
    assert t["bias"] + t["diversity"] == pytest.approx(0.25 * 0.2 + 0.75 * 0.5)


def test_subsets_cover_every_model_count():
    picks = subsets(4, 3, seed=0)
    assert sorted({len(s) for s in picks}) == [1, 2, 3, 4]
    assert picks[-1] == [0, 1, 2, 3] and sum(len(s) == 2 for s in picks) == 3


def test_drift_table_and_summary():
    metrics = [{"round": 0, "update_norm": 1.0, "client_drift": 2.0, "label_tv": 0.3,
                "train_loss": 1.0},
               {"round": 1, "update_norm": 1.0, "client_drift": 4.0, "period_drift": 1.5,
                "label_tv": 0.1, "test_accuracy": 0.5}]
    rows = drift.drift_rows(metrics)
    assert rows[0] == {"round": 0, "update_norm": 1.0, "client_drift": 2.0,
                       "period_drift": None, "label_tv": 0.3, "test_accuracy": None}
    s = drift.drift_summary(rows)
    assert s["client_drift"] == 3.0 and s["period_drift"] == 1.5
    assert s["label_tv"] == pytest.approx(0.2) and s["period_over_client_drift"] == 0.5
    assert "label_tv" not in drift.drift_rows(metrics, label_key="label_js")[0]


def test_regime_configs_share_the_seed_and_validate_first(tmp_path):
    cfgs = drift.regime_configs(TINY, ["seed=3"], drift.REGIMES)
    assert [c.data.regime for c in cfgs.values()] == list(drift.REGIMES)
    assert {c.seed for c in cfgs.values()} == {3}
    with pytest.raises(ConfigError, match="data.regime"):
        drift.regime_configs(TINY, ["data.partition=iid"], ["period_only"])


def test_regimes_draw_the_same_clients_from_different_partitions(tmp_path):
    plans, stores = [], set()
    for cfg in drift.regime_configs(TINY, [f"data.cache_dir={tmp_path}"], drift.REGIMES).values():
        handle = prepare(cfg.data, cfg.seed)
        stores.add(handle.path)
        sampler = make_sampler(cfg.availability, handle, cfg.clients_per_round, cfg.seed,
                               spec_from_config(cfg.local))
        plans.append([tuple(sampler.plan(t).clients) for t in range(5)])
    assert len(stores) == 2  # iid for iid/client_only, Dirichlet for period_only/both
    assert all(p == plans[0] for p in plans)


def _fake_run(tmp_path, rounds: dict[int, list[str]]) -> RunDir:
    tmp_path.mkdir(exist_ok=True)
    config_mod.dump(config_mod.load(TINY), str(tmp_path / "config.yaml"))
    for t, names in rounds.items():
        d = tmp_path / "models" / f"round-{t:05d}"
        d.mkdir(parents=True)
        for n in names:
            np.save(d / f"{n}.npy", np.zeros(3, np.float32))
    return RunDir(str(tmp_path))


def test_missing_kept_models_say_which_keep_setting_to_add(tmp_path):
    with pytest.raises(ConfigError, match="run_dir"):
        RunDir(str(tmp_path))
    run = _fake_run(tmp_path, {})
    with pytest.raises(ConfigError, match=r"'keep.rounds'.*keep.last=1"):
        presets.interpolation(run, "auto")
    run = _fake_run(tmp_path / "one", {4: ["global", "client-1", "client-2"]})
    with pytest.raises(ConfigError, match=r"'keep.last' = 0.*keep.last=3"):
        presets.planes(run, "globals")
    with pytest.raises(ConfigError, match=r"'wrappers'.*wrappers=\[ima\]"):
        presets.interpolation(run, "wrapper")
    with pytest.raises(ConfigError, match=r"'--clients'.*\[1, 2\]"):
        presets.planes(run, "clients")
    with pytest.raises(ConfigError, match=r"'--round' = 7.*keep.rounds"):
        presets.planes(run, "clients", t=7)
    with pytest.raises(ConfigError, match="'--models'"):
        run.model("global")
    with pytest.raises(ConfigError, match="'model' = 'next@4'"):
        run.model("next@-1")
    assert run.model("global@-1")[0] == "global r4"


@pytest.mark.parametrize("command, extra, key, rows", [
    ("drift", [], "run_dir", None), ("drift", [], "run_dir", []),
    ("interpolate", ["--data", "bogus"], "--data", None)],
    ids=["drift-without-metrics", "drift-of-no-round", "interpolate-bad-data"])
def test_a_refused_analysis_leaves_no_output_folder(command, extra, key, rows, tmp_path, capsys,
                                                    monkeypatch):
    from rayfl.cli import main
    from rayfl.metrics.files import write_parquet

    monkeypatch.setenv("RAYFL_CACHE", str(tmp_path / "cache"))
    run = _fake_run(tmp_path / "run", {4: ["global", "client-1"]})
    if rows is not None:
        write_parquet(rows, os.path.join(run.path, "metrics.parquet"))
    out = tmp_path / "out"
    assert main(["analyze", command, run.path, f"--out={out}", *extra]) == 2
    assert main(["analyze", command, run.path, *extra]) == 2  # the default <run_dir>/analysis
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(f"'{key}'" in line for line in err), err
    assert not out.exists() and not (tmp_path / "run" / "analysis").exists()


def test_analysis_out_that_is_a_file_is_refused(tmp_path, capsys):
    from rayfl.cli import main

    run = _fake_run(tmp_path / "run", {})
    (tmp_path / "taken").write_text("mine")
    assert main(["analyze", "drift", run.path, f"--out={tmp_path / 'taken'}"]) == 2
    assert "'--out'" in capsys.readouterr().err and (tmp_path / "taken").read_text() == "mine"


def test_refused_regimes_make_no_experiment_folder(tmp_path, capsys):
    from rayfl.cli import main

    out = tmp_path / "experiment"
    assert main(["analyze", "regimes", TINY, f"output_dir={tmp_path / 'runs'}",
                 f"data.cache_dir={tmp_path / 'cache'}",
                 "data.dataset=tests.test_data_boundary:NanFeature", "--out", str(out)]) == 2
    assert "NanFeature.load: x_train holds nan" in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "runs").exists()
    assert not (tmp_path / "cache").exists()
