"""docs/howto/saved-model.md's script scores a run's saved model with plain PyTorch as rayfl
scored it: parameters in NCHW order though the convolutions trained channels-last, BatchNorm
buffers with ``num_batches_tracked`` as float32, Fashion-MNIST's pixels as x / 255.

The run reads Fashion-MNIST-format IDX files made here (class k: a bright square at its own
place, plus noise), so the test needs no download and takes seconds; the script runs as printed
with only the run directory and the data directory swapped in.
"""

from __future__ import annotations

import gzip
import os
import re
import struct

import numpy as np
import torch

import rayfl
from tests.conftest import ROOT

PAGE = os.path.join(ROOT, "docs", "howto", "saved-model.md")
FMNIST = "/usr/share/datasets/fashion-mnist"


def _write_idx(path, array: np.ndarray) -> None:
    """An IDX file as Fashion-MNIST ships it: magic (0, 0, 8 = uint8, ndim), big-endian dims."""
    head = bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(head + array.astype(np.uint8).tobytes())


def _fake_fmnist(root, train: int = 300, test: int = 100) -> None:
    rng = np.random.default_rng(0)
    for stem, n in (("train", train), ("t10k", test)):
        y = rng.integers(10, size=n)
        x = rng.integers(0, 60, size=(n, 28, 28))
        for i, k in enumerate(y):
            r, c = 3 + 7 * (k // 4), 3 + 6 * (k % 4)
            x[i, r:r + 5, c:c + 5] = 255
        _write_idx(root / f"{stem}-images-idx3-ubyte.gz", x)
        _write_idx(root / f"{stem}-labels-idx1-ubyte.gz", y)


def _script() -> str:
    with open(PAGE) as f:
        blocks = re.findall(r"```py\n(.*?)```", f.read(), flags=re.S)
    assert len(blocks) == 1
    return blocks[0]


def test_the_documented_script_scores_a_saved_model_as_the_run_did(tmp_path, capsys):
    data = tmp_path / "fmnist"
    data.mkdir()
    _fake_fmnist(data)
    result = rayfl.run(os.path.join(ROOT, "configs", "quickstart.yaml"), [
        f"data.root={data}", "data.num_clients=10", "data.partition=iid", "clients_per_round=5",
        "rounds=3", "eval.every=1", "model.name=examples.bn_model:BNNet",
        "runtime.executor=inprocess", f"output_dir={tmp_path / 'runs'}",
        f"data.cache_dir={tmp_path / 'cache'}"], quiet=True)
    assert os.path.isfile(os.path.join(result.run_dir, "final_buffers.npy"))  # BatchNorm's
    capsys.readouterr()

    script = _script().replace("runs/quickstart-20261122-101500", result.run_dir)
    script = script.replace(FMNIST, str(data))
    scope = {"__name__": "__main__"}
    exec(compile(script, PAGE, "exec"), scope)  # its own assert checks model_sha256

    printed = capsys.readouterr().out
    acc = result.summary["final_accuracy"]
    assert printed.strip() == f"test accuracy {acc:.4f} (summary.json: {acc:.4f})"
    assert acc > 0.5  # learnt something: a wrong input scale or order would show
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(scope["model"](scope["x"]), scope["y"])
    assert abs(float(loss) - result.summary["final_test_loss"]) < 1e-5


def test_the_script_reads_the_real_data_set_where_rayfl_does():
    """The path the script names is the one rayfl's Fashion-MNIST loader reads by default."""
    from rayfl.data.datasets import fmnist

    assert fmnist.DEFAULT_ROOT == FMNIST and FMNIST in _script()
    assert {f"{stem}.gz" for stem in (fmnist.FILES["x_test"], fmnist.FILES["y_test"])} <= set(
        re.findall(r'"([\w-]+\.gz)"', _script()))
