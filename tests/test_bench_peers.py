"""The peers' benchmark trains what rayfl trains: its model is rayfl's ``fmnist_cnn``, its local
loop is ``configs/quickstart.yaml``'s, and its floor (two single-thread processes) computes the
sample-weighted FedAvg of a sequential loop."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from rayfl import config
from rayfl.models.zoo import fmnist_cnn

PEERS = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", "peers")
sys.path.insert(0, PEERS)
import plain_peer  # noqa: E402
import workload as wl  # noqa: E402


def test_the_model_is_rayfls_fmnist_cnn():
    ours = wl.build_model()
    theirs = fmnist_cnn((1, 28, 28), 10)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(5, 1, 28, 28)
    assert torch.allclose(ours(x), theirs(x), atol=1e-6)


def test_the_loop_is_the_quickstarts():
    local = config.load("configs/quickstart.yaml").local
    assert (local.lr, local.momentum, local.weight_decay, local.batch_size, local.epochs) == (
        wl.LOOP["lr"], wl.LOOP["momentum"], wl.LOOP["weight_decay"], wl.LOOP["batch_size"],
        wl.LOOP["epochs"])


def test_split_puts_the_largest_client_on_the_least_loaded_worker():
    sizes = {0: 10, 1: 70, 2: 30, 3: 40, 4: 20}
    assert plain_peer.split([0, 1, 2, 3, 4], sizes, 2) == [[1, 4], [3, 2, 0]]


@pytest.fixture
def tiny(tmp_path):
    """6 clients of 7–40 random rows, 2 rounds of 4 clients."""
    gen = np.random.default_rng(0)
    sizes = [7, 40, 12, 25, 9, 30]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    path = str(tmp_path / "tiny.npz")
    np.savez(path, x=gen.standard_normal((offsets[-1], 1, 28, 28)).astype(np.float32),
             y=gen.integers(0, 10, offsets[-1]), offsets=offsets,
             plan=np.array([[0, 1, 3, 5], [2, 3, 4, 1]]))
    return path


def test_the_floor_is_fedavg_of_a_sequential_loop(tiny, tmp_path):
    out = str(tmp_path / "plain.json")
    subprocess.run([sys.executable, os.path.join(PEERS, "plain_peer.py"), "--workload", tiny,
                    "--out", out, "--workers", "2"], check=True, timeout=120)
    data = wl.Workload.load(tiny)
    model = wl.build_model()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for t, clients in enumerate(data.plan):
        trained, sizes = [], []
        for c in map(int, clients):
            model.load_state_dict(state)
            x, y = data.client(c)
            torch.set_num_threads(1)
            sizes.append(wl.train_client(model, x, y, wl.client_seed(t, c)))
            trained.append({k: v.clone() for k, v in model.state_dict().items()})
        state = wl.weighted_mean(trained, sizes)
    floor = torch.load(out + ".pt")
    assert max(float((floor[k] - state[k]).abs().max()) for k in state) < 1e-5
    moved = max(float((state[k] - wl.build_model().state_dict()[k]).abs().max()) for k in state)
    assert moved > 1e-4  # the rounds trained something
