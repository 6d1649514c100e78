"""Model buffers (BatchNorm statistics) are part of the model: trained by clients, averaged,
checkpointed, used by every evaluation and covered by ``model_sha256``."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from examples.bn_model import BNNet
from rayfl import run
from rayfl.config import ConfigError, load
from rayfl.data import prepare
from rayfl.models import check_single_rows
from rayfl.models.flat import FlatModel
from tests.conftest import TINY

BN = ["model.name=examples.bn_model:BNNet", "data.partition=iid", "rounds=3"]


def _run(tiny, *overrides, **kw):
    return run(TINY, [*tiny, *BN, *overrides], quiet=True, **kw)


def _independent_accuracy(result) -> float:
    """A fresh torch module, the saved parameters and buffers copied in order, eval mode."""
    cfg = load(os.path.join(result.run_dir, "config.yaml"))
    reader = prepare(cfg.data, cfg.seed).open()
    x, y = reader.tensors(*reader.test(), "cpu")
    module = BNNet(tuple(x.shape[1:]), int(y.max()) + 1)
    w = torch.from_numpy(np.load(os.path.join(result.run_dir, "final_model.npy")))
    b = torch.from_numpy(np.load(os.path.join(result.run_dir, "final_buffers.npy")))
    for tensors, flat in ((list(module.parameters()), w), (list(module.buffers()), b)):
        assert sum(t.numel() for t in tensors) == len(flat)
        offset = 0
        for t in tensors:
            t.data.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()
    module.eval()
    with torch.no_grad():
        return float((module(x).argmax(1) == y).float().mean())


def test_buffers_travel_and_the_reported_accuracy_is_the_saved_models(ray_local, tiny):
    inproc = _run(tiny, "runtime.executor=inprocess")
    two = _run(tiny, "runtime.num_actors=2")
    assert two.summary["model_sha256"] == inproc.summary["model_sha256"]
    assert abs(_independent_accuracy(two) - two.summary["final_accuracy"]) < 1e-6
    b = np.load(os.path.join(two.run_dir, "final_buffers.npy"))
    fresh = FlatModel(BNNet((16,), 4)).get_buffers().numpy()
    assert b.shape == fresh.shape and not np.allclose(b, fresh)  # trained, not mean 0 / var 1
    assert b[-1] > 0 and b[-1] == round(b[-1])  # num_batches_tracked: a count


def test_a_paused_run_resumes_to_the_same_model_and_buffers(tiny, tmp_path):
    from rayfl.simulation import resume

    full = _run(tiny, "runtime.executor=inprocess")
    paused = _run(tiny, "runtime.executor=inprocess", run_dir=str(tmp_path / "p"), max_rounds=1)
    assert not os.path.exists(os.path.join(paused.run_dir, "final_buffers.npy"))
    done = resume(paused.run_dir, quiet=True)
    assert done.summary["model_sha256"] == full.summary["model_sha256"]


def test_hash_covers_the_buffers(tiny):
    from rayfl.models import sha256_of

    result = _run(tiny, "runtime.executor=inprocess")
    w = np.load(os.path.join(result.run_dir, "final_model.npy"))
    b = np.load(os.path.join(result.run_dir, "final_buffers.npy"))
    assert result.summary["model_sha256"] == sha256_of(np.concatenate([w, b])) != sha256_of(w)


@pytest.mark.parametrize("override, names", [
    (["privacy.noise_multiplier=0.5", "aggregation.weighting=uniform"], "privacy"),
    (["wrappers.ima.window=2"], "wrapper ima"),
    (["aggregation.mode=fedbuff"], "fedbuff"),
])
def test_combinations_that_cannot_carry_buffers_are_refused(tiny, tmp_path, override, names):
    with pytest.raises(ConfigError, match=f"model.name.*without buffers.*{names}"):
        _run(tiny, "runtime.executor=inprocess", *override, run_dir=str(tmp_path / "r"))
    assert not (tmp_path / "r").exists()


def test_integer_buffers_round_and_float_buffers_copy():
    model = FlatModel(BNNet((16,), 4))
    flat = model.get_buffers()
    flat[-1] = 2.6  # num_batches_tracked
    model.set_buffers(flat)
    assert int(model.buffers[-1]) == 3 and model.buffers[-1].dtype == torch.int64
    assert torch.equal(model.get_buffers()[:-1], flat[:-1])


def test_analysis_refuses_a_model_with_buffers_in_one_line(tiny, capsys):
    from rayfl.cli import main

    result = _run(tiny, "runtime.executor=inprocess", "keep.last=2")
    code = main(["analyze", "interpolate", result.run_dir])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "without buffers" in err[0]


def test_a_model_that_cannot_train_on_one_row_gets_a_config_error_first(tiny, tmp_path):
    """BatchNorm1d cannot train on a minibatch of one sample: with 30 rows a client and B = 29
    every last minibatch holds one row; that is named before anything starts (in a run and in
    --dry-run), not a failure mid-run. A model without BatchNorm trains on the same split."""
    from rayfl.cli import main

    one_row = "local.batch_size=29"
    plain = _run(tiny, one_row, "model.name=mlp", "runtime.executor=inprocess")
    assert plain.summary["rounds"] == 3
    # every client holds 30 rows: 30 mod 28 = 2 and 30 mod 30 = 0 leave no one-row batch
    with pytest.raises(ConfigError, match="local.batch_size.*one row.*cannot train on one.*"
                                          "batch size 28 or 30 leaves none"):
        _run(tiny, one_row, run_dir=str(tmp_path / "r"))
    assert not (tmp_path / "r").exists()
    assert main(["run", TINY, *tiny, *BN, one_row, "--dry-run"]) == 2


class _Sizes:
    """A partition handle with given client sizes, for the batch-size suggestion alone."""

    kind, input_shape = "dense", (4,)

    def __init__(self, sizes):
        self._sizes = np.asarray(sizes)

    def sizes(self):
        return self._sizes


@pytest.mark.parametrize("sizes, batch, works", [
    ([51, 103, 64], 50, "batch size 49 or 52 leaves none"),  # 51 mod 50 = 103 mod 51 = 1
    ([65, 131], 64, "batch size 63 or 66 leaves none"),  # 65 mod 64 = 131 mod 65 = 1
    ([3], 2, "batch size 3 leaves none"),  # below 2 only 1 (all one-row batches)
    ([1, 40], 13, "no batch size does: a client holds a single row"),
])
def test_the_refusal_names_the_nearest_batch_sizes_that_work(sizes, batch, works):
    import torch

    bn = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    with pytest.raises(ConfigError, match=works):
        check_single_rows(bn, _Sizes(sizes), batch)
