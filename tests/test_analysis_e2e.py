"""rayfl.analysis on a real tiny run (local Ray): exact points, a hand-computed decomposition,
the ``rayfl analyze`` commands and the four drift regimes."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import rayfl
from rayfl import cli
from rayfl.analysis import decomposition, landscape, presets
from rayfl.analysis.evaluate import score, select_data
from rayfl.analysis.rundir import RunDir
from rayfl.runtime.client_actor import model_for
from tests.conftest import TINY


@pytest.fixture(scope="module")
def kept(ray_local, tmp_path_factory):
    """A tiny FedAvg+IMA run keeping rounds 1, 3 and the last three of six (rounds count from 1)."""
    tmp = tmp_path_factory.mktemp("kept")
    rayfl.run(TINY, [f"data.cache_dir={tmp / 'cache'}", "rounds=6", "keep.rounds=[1,3]",
                     "keep.last=3", "wrappers.ima.window=3", "wrappers.ima.start=3"],
              run_dir=str(tmp / "run"), quiet=True)
    return RunDir(str(tmp / "run"))


def _own_losses(run, data, vectors):
    """Each model's (loss, accuracy), evaluated in this process, one model at a time."""
    model = model_for(run.cfg.model, run.cfg.seed, run.handle, "cpu")
    reader = run.handle.open()
    x, y = reader.tensors(*data.arrays(reader), "cpu")
    return np.array([model.evaluate(torch.from_numpy(np.asarray(v, np.float32)), x, y,
                                    torch.nn.CrossEntropyLoss()) for v in vectors])


def test_plane_points_evaluate_to_the_models_own_loss(kept):
    data = select_data(kept.handle)
    name, models, marks = presets.clients_plane(kept, kept.rounds[-1])
    res = landscape.plane(kept.cfg, kept.handle, name, models, marks, data, size=5)
    own = _own_losses(kept, data, [w for _, w in [*models, *marks]])
    pts = [p for p in res.points if p["kind"] != "average"]
    assert np.allclose([p["loss"] for p in pts], own[:, 0], rtol=1e-5, atol=1e-6)
    assert np.allclose([p["error"] for p in pts], 1 - own[:, 1], atol=1e-9)
    # a grid node placed exactly on a model's projected point evaluates to that model
    p = landscape.Plane.through(*(w for _, w in models))
    xy = np.array([p.coords(w) for _, w in models])
    at = score(kept.cfg, kept.handle, data, p.origin, p.dirs, xy)
    assert np.allclose(at, own[:3], rtol=1e-5, atol=1e-6)
    avg = next(q for q in res.points if q["kind"] == "average")
    mean = np.mean([w.astype(np.float64) for _, w in models], axis=0)
    assert avg["loss"] == pytest.approx(_own_losses(kept, data, [mean])[0, 0], rel=1e-5)
    assert res.loss.shape == (5, 5) and marks[0][0].startswith("ima_inner")


def test_interpolation_endpoints_are_the_models(kept):
    data = select_data(kept.handle, "clients:0,1", max_samples=20)
    tag, w1, w2 = presets.interpolation(kept, "auto")
    assert tag == "wrapper" and w1[0] == "fedavg+ima r6"  # the last kept round, 1-based
    line = landscape.interpolate(kept.cfg, kept.handle, w1, w2, landscape.betas(-0.5, 1.5, 4),
                                 data)
    s = line.summary()
    own = _own_losses(kept, data, [w1[1], w2[1]])
    assert s["w1_loss"] == own[0, 0] and s["w2_loss"] == own[1, 0]
    assert s["w1_error"] == pytest.approx(1 - own[0, 1])
    assert len(line.beta) == 6 and line.data.endswith("(20 rows)")


def test_decomposition_matches_a_hand_computation(kept):
    """Logistic regression + MSE on one-hot targets, recomputed with explicit loops."""
    t = kept.rounds[-1]
    row, curve = decomposition.decompose_round(kept, t, select_data(kept.handle), count=2)
    reader = kept.handle.open()
    ids = kept.clients(t)
    C, F = kept.handle.num_classes, int(np.prod(kept.handle.input_shape))
    models = [kept.load(f"client-{i}", t).astype(np.float64) for i in ids]
    n = np.array([reader.offsets[i + 1] - reader.offsets[i] for i in ids], dtype=np.float64)
    p = n / n.sum()
    tb = hb = bias = fma_mse = 0.0
    fma = sum(pk * w for pk, w in zip(p, models))

    def softmax(w, x):
        z = w[:C * F].reshape(C, F) @ x + w[C * F:]
        e = np.exp(z - z.max())
        return e / e.sum()

    rows = 0
    for k, i in enumerate(ids):
        xs, ys = reader.tensors(*reader.client(i), "cpu")
        for x, y in zip(xs.reshape(len(xs), -1).double().numpy(), ys.numpy()):
            target = np.eye(C)[y]
            resid = [target - softmax(w, x) for w in models]
            tb_x = p[k] * resid[k]
            hb_x = sum(p[j] * resid[j] for j in range(len(ids)) if j != k)
            tb, hb = tb + tb_x @ tb_x, hb + hb_x @ hb_x
            bias += (tb_x + hb_x) @ (tb_x + hb_x)
            fma_mse += np.sum((target - softmax(fma, x)) ** 2)
            rows += 1
    assert row["rows"] == rows
    assert row["train_bias"] == pytest.approx(tb / rows, rel=1e-5)
    assert row["heter_bias"] == pytest.approx(hb / rows, rel=1e-5)
    assert row["bias"] == pytest.approx(bias / rows, rel=1e-5)
    assert row["fma_mse"] == pytest.approx(fma_mse / rows, rel=1e-5)
    assert row["locality"] == pytest.approx(max(np.linalg.norm(w - fma) for w in models))
    assert [c["models"] for c in curve] == list(range(1, len(ids) + 1))


def test_analyze_commands_write_their_figures(kept, capsys):
    run = kept.path
    assert cli.main(["analyze", "plane", run, "--preset", "paper", "--grid", "4"]) == 0
    assert cli.main(["analyze", "interpolate", run, "--models", "global@-1", "final",
                     "--steps", "3"]) == 0
    assert cli.main(["analyze", "decompose", run, "--rounds", "1,-1", "--subsets", "1",
                     "--cohort-samples", "50"]) == 0
    assert cli.main(["analyze", "drift", run]) == 0
    out = set(os.listdir(os.path.join(run, "analysis")))
    assert {"plane-paper.png", "plane-globals.json", "plane-clients-r00003.parquet",
            "interp-custom.png", "decomposition.png", "decomposition.json",
            "decomposition-models.parquet", "drift.png", "drift.json"} <= out
    assert cli.main(["analyze", "plane", run, "--preset", "clients", "--round", "2"]) == 2
    assert "keep.rounds" in capsys.readouterr().err


def test_regimes_command_runs_and_plots(ray_local, tmp_path):
    out = tmp_path / "drift"
    assert cli.main(["analyze", "regimes", TINY, f"data.cache_dir={tmp_path / 'cache'}",
                     "rounds=2", "runtime.num_actors=1", "--quiet", "--regimes=client_only",
                     f"--out={out}"]) == 0
    assert {"regimes.png", "regimes.json", "regimes.parquet", "client_only"} <= set(
        os.listdir(out))
