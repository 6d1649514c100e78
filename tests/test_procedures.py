"""Client procedures: algorithms that own their local loop through a LocalContext, checked
against the flat-vector path, closed forms and an independent autograd computation."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from examples.bn_model import BNNet
from rayfl.algorithms.ditto import Ditto, DittoParams
from rayfl import run
from rayfl.contract import ComponentError
from rayfl.algorithms.base import Algorithm, ClientResult
from rayfl.config import load
from rayfl.data import prepare
from rayfl.models import build_model
from rayfl.models.flat import FlatModel
from rayfl.runtime.harness import quadratic_client, simulate
from rayfl.runtime.local import LocalSpec
from tests.conftest import TINY

MLP = ["model.name=mlp", "runtime.executor=inprocess"]


class ProcedureSGD(Algorithm):
    """Plain local SGD written as a client procedure."""

    def client_train(self, task, ctx):
        y, opt = ctx.x.clone(), ctx.optimizer()
        for batch in ctx.batches():
            opt.step(y, ctx.loss_grad(y, batch)[1])
        return ClientResult(y)


def _sha(result) -> str:
    return result.summary["model_sha256"]


def _run(tiny, *overrides):
    return run(TINY, [*tiny, *MLP, *overrides], quiet=True)


def test_a_procedure_running_sgd_gives_the_flat_paths_bytes(tiny):
    opts = ["local.momentum=0.9", "local.weight_decay=0.01", "local.clip_norm=1.0"]
    flat = _run(tiny, *opts)
    proc = _run(tiny, *opts, "algorithm.name=tests.test_procedures:ProcedureSGD")
    assert _sha(proc) == _sha(flat)
    assert proc.metrics.column("local_steps").to_pylist() == \
        flat.metrics.column("local_steps").to_pylist()


def test_moon_without_its_term_is_fedavg_and_with_it_is_not(tiny):
    fedavg = _run(tiny)
    assert _sha(_run(tiny, "algorithm.name=moon", "algorithm.mu=0")) == _sha(fedavg)
    assert _sha(_run(tiny, "algorithm.name=moon", "algorithm.mu=1")) != _sha(fedavg)


def test_moon_first_step_matches_an_independent_autograd_computation(tiny):
    """One full-batch step of client c in round 1: CE + μ·contrastive with z_prev = z_glob."""
    mu, tau, lr = 2.0, 0.5, 0.1
    x, y, start, got, classes = _first_full_batch_step(
        tiny, "algorithm.name=moon", f"algorithm.mu={mu}", f"algorithm.tau={tau}")
    net = build_model("mlp", (x.shape[1],), classes)
    offset = 0
    for p in net.parameters():
        p.data.copy_(start[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
    body, head = net[:-1], net[-1]
    assert isinstance(head, nn.Linear)
    with torch.no_grad():
        z_glob = body(x).flatten(1)
    z = body(x).flatten(1)
    sims = torch.stack([F.cosine_similarity(z, z_glob), F.cosine_similarity(z, z_glob)], 1) / tau
    loss = F.cross_entropy(head(z), y) + mu * F.cross_entropy(
        sims, torch.zeros(len(z), dtype=torch.long))
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    loss.backward()
    opt.step()
    expected = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    assert torch.allclose(got, expected, atol=1e-6)
    assert not torch.allclose(got, start, atol=1e-4)


def test_moon_second_step_differentiates_at_the_local_model_not_the_global_one(tiny):
    """Two full-batch steps of round 1: at the second, z_glob comes from w^t ≠ y, and the
    gradient must still be taken at y (evaluating another model must not leave its weights in
    the trained model's graph)."""
    mu, tau, lr = 2.0, 0.5, 0.1
    x, y, start, got, classes = _first_full_batch_step(
        tiny, "algorithm.name=moon", f"algorithm.mu={mu}", f"algorithm.tau={tau}", steps=2)
    net, glob = build_model("mlp", (x.shape[1],), classes), build_model("mlp", (x.shape[1],),
                                                                        classes)
    torch.nn.utils.vector_to_parameters(start, net.parameters())
    torch.nn.utils.vector_to_parameters(start, glob.parameters())
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    for _ in range(2):
        with torch.no_grad():
            z_glob = glob[:-1](x).flatten(1)
        z = net[:-1](x).flatten(1)
        sims = torch.stack([F.cosine_similarity(z, z_glob), F.cosine_similarity(z, z_glob)],
                           1) / tau
        loss = F.cross_entropy(net[-1](z), y) + mu * F.cross_entropy(
            sims, torch.zeros(len(z), dtype=torch.long))
        opt.zero_grad()
        loss.backward()
        opt.step()
    expected = torch.nn.utils.parameters_to_vector(net.parameters()).detach()
    assert torch.allclose(got, expected, atol=1e-6)


def _first_full_batch_step(tiny, *opts, steps: int = 1):
    """(x, y, start, end, classes) of the first kept client of a one-round, full-batch run of
    ``steps`` local steps: its rows, the round's start and its local model after them."""
    result = _run(tiny, *opts, f"local.steps={steps}", "local.batch_size=1000",
                  "keep.rounds=[1]", "rounds=1")
    folder = os.path.join(result.run_dir, "models", "round-00001")
    client = int(sorted(f for f in os.listdir(folder) if f.startswith("client-"))[0][7:-4])
    cfg = load(os.path.join(result.run_dir, "config.yaml"))
    reader = prepare(cfg.data, cfg.seed).open()
    x, y = reader.tensors(*reader.client(client), "cpu")
    start = torch.from_numpy(np.load(os.path.join(folder, "start.npy")))
    end = torch.from_numpy(np.load(os.path.join(folder, f"client-{client}.npy")))
    return x, y, start, end, int(cfg.data.classes)


def test_ditto_global_model_is_fedavg(tiny):
    assert _sha(_run(tiny, "algorithm.name=ditto", "algorithm.lam=0.5")) == \
        _sha(_run(tiny))


@pytest.mark.parametrize("lam", [0.0, 0.5])
def test_ditto_personal_model_follows_its_update_in_closed_form(lam):
    """Quadratic f(v) = ½ a v² − b v, full batch: K steps of v ← v − η(a v − b + λ(v − w))."""
    a, b = torch.tensor([1.0, 3.0]), torch.tensor([2.0, -1.0])
    spec, lr, k = LocalSpec(steps=4, batch_size=1), 0.1, 4
    state, _, states = simulate(Ditto(DittoParams(lam=lam)), torch.zeros(2),
                                [quadratic_client(a, b)], spec, rounds=1, lr0=lr)
    w = torch.zeros(2)  # the round's global model
    v = w.clone()
    for _ in range(k):
        v = v - lr * (a * v - b + lam * (v - w))
    assert torch.allclose(states[0].algorithm["v"], v, atol=1e-6)
    y = w.clone()
    for _ in range(k):
        y = y - lr * (a * y - b)
    assert torch.allclose(state.x, y, atol=1e-6)  # one client: the global step is its SGD


def test_fedbn_keeps_normalisation_local_on_any_actor_count(ray_local, tiny):
    common = [*tiny, "model.name=examples.bn_model:BNNet", "data.partition=iid", "rounds=2",
              "algorithm.name=fedbn", "clients_per_round=20"]
    one = run(TINY, [*common, "runtime.executor=inprocess"], quiet=True)  # one worker
    two = run(TINY, [*common, "runtime.num_actors=2"], quiet=True)
    assert _sha(one) == _sha(two)
    final = torch.from_numpy(np.load(os.path.join(two.run_dir, "final_model.npy")))
    fresh = FlatModel(BNNet((16,), 4))
    norm = fresh.layout.mask("norm")
    assert torch.equal(final[norm], fresh.w[norm])  # never uploaded: the initial γ = 1, β = 0
    assert not torch.equal(final[~norm], fresh.w[~norm])


def test_fedbn_client_state_holds_its_norm_layers_and_statistics():
    from rayfl.algorithms.fedbn import FedBN
    from rayfl.runtime.context import ClientData, LocalContext
    from rayfl.algorithms.base import ClientTask

    model = FlatModel(BNNet((4,), 2))
    inputs, labels = torch.randn(8, 4), torch.tensor([0, 1] * 4)
    loss_fn = nn.CrossEntropyLoss()

    def grad_fn(point, idx):
        return model.loss_and_grad(point, inputs[idx], labels[idx], loss_fn)

    data = ClientData(8, grad_fn, model, inputs, labels, loss_fn)
    task = ClientTask(0, 0, 0.1, 1.0, {"x": model.w.clone()}, None)
    ctx = LocalContext(task, data, LocalSpec(steps=3, batch_size=4), np.random.default_rng(0),
                       None)
    result = FedBN().client_train(task, ctx)
    y = result.model
    norm = model.layout.mask("norm")
    assert result.state["personal"].shape == (int(norm.sum()),)
    assert torch.equal(y[norm], task.bc["x"][norm]) and ctx.steps == 3
    assert set(result.state) == {"personal"}  # the runtime keeps the statistics (local_buffers)


def test_outputs_and_features_take_their_minibatch_through_the_clients_device_indices():
    """ctx.outputs and ctx.features index the rows through ``ClientData.indices`` (on a GPU:
    the minibatch cut from one upload of its epoch's order, as the gradient function's) rather
    than copying each minibatch to the device on every call, as MOON's three forwards a step
    did; the rows they select are the minibatch's."""
    from rayfl.algorithms.base import ClientTask
    from rayfl.runtime.context import ClientData, LocalContext
    from rayfl.runtime.local import DeviceIndices

    class Counted(DeviceIndices):
        calls = 0

        def __call__(self, idx):
            Counted.calls += 1
            return super().__call__(idx)

    model = FlatModel(BNNet((4,), 2))
    inputs, labels = torch.randn(12, 4), torch.tensor([0, 1] * 6)
    loss_fn = nn.CrossEntropyLoss()
    indices = Counted(inputs.device)
    data = ClientData(12, lambda p, i: model.loss_and_grad(p, inputs[indices(i)],
                                                           labels[indices(i)], loss_fn),
                      model, inputs, labels, loss_fn, indices)
    task = ClientTask(0, 0, 0.1, 1.0, {"x": model.w.clone()}, None)
    ctx = LocalContext(task, data, LocalSpec(steps=3, batch_size=4), np.random.default_rng(0),
                       None)
    for batch in ctx.batches():
        _, _, got = ctx.outputs(ctx.x, batch)
        assert torch.equal(got, labels[torch.from_numpy(batch)])
        ctx.features(ctx.x, batch)
    assert Counted.calls == 2 * 3 and data.indices is indices
    bare = ClientData(12, data.grad_fn, model, inputs, labels, loss_fn)  # one of its own
    LocalContext(task, bare, LocalSpec(steps=1, batch_size=4), np.random.default_rng(0),
                 None).outputs(ctx.x, np.arange(4))
    assert isinstance(bare.indices, DeviceIndices)


def test_parameter_groups_name_parts_of_the_model():
    layout = FlatModel(BNNet((4,), 3, width=5)).layout
    assert layout.params_in("head") == ["4.weight", "4.bias"]
    assert layout.params_in("norm") == ["2.weight", "2.bias"]
    assert layout.params_in("body") == ["1.weight", "1.bias", "2.weight", "2.bias"]
    assert int(layout.mask("*.bias").sum()) == 5 + 5 + 3
    with pytest.raises(ValueError, match="matches no parameter"):
        layout.mask("embedding")


def test_a_gradient_function_client_says_what_a_procedure_cannot_read():
    class Features(Algorithm):
        def client_train(self, task, ctx):
            for batch in ctx.batches():
                ctx.outputs(ctx.x, batch, ("repr",))
            return ClientResult(ctx.x)

    with pytest.raises(ComponentError, match="gradient function"):
        simulate(Features(), torch.zeros(2), [quadratic_client(torch.ones(2), torch.ones(2))],
                 LocalSpec(steps=1), rounds=1, lr0=0.1)


def test_proxskip_is_exact_under_partial_participation():
    """Hand-run Scaffnew rounds on quadratics, clients sampled 2 of 4 per round: each h_i is
    updated with the average of the round it trained in, even when it returns rounds later."""
    from examples.proxskip import ProxSkip

    torch.manual_seed(0)
    a = [torch.rand(3) + 0.5 for _ in range(4)]
    b = [torch.randn(3) for _ in range(4)]
    clients = [quadratic_client(ai, bi) for ai, bi in zip(a, b)]
    samples = [[0, 1], [2, 3], [1, 2], [0, 3], [0, 1], [1, 3]]
    lr, k = 0.1, 3
    state, _, states = simulate(ProxSkip(weighting="uniform"), torch.zeros(3), clients,
                                LocalSpec(steps=k, batch_size=1), rounds=len(samples), lr0=lr,
                                sample=lambda t: samples[t])
    x, h, x_hat = torch.zeros(3), [torch.zeros(3) for _ in range(4)], [None] * 4
    pending = {}  # client -> the round average its h still owes
    for ids in samples:
        for i in ids:  # settle first: the average of the client's last round
            if i in pending:
                h[i] = h[i] + (pending.pop(i) - x_hat[i]) / (lr * k)
        sent = []
        for i in ids:
            y = x.clone()
            for _ in range(k):
                y = y - lr * (a[i] * y - b[i] - h[i])
            x_hat[i] = y
            sent.append(y - lr * k * h[i])
        x = torch.stack(sent).mean(0)
        pending.update({i: x for i in ids})
    assert torch.allclose(state.x, x, atol=1e-5)
    for i in range(4):
        # the stored (unsettled) h_i
        assert torch.allclose(states[i].algorithm["h"], h[i], atol=1e-5)
    assert any(float(hi.norm()) > 0.1 for hi in h)  # the variates did move


def test_proxskip_round_messages_survive_a_pause_and_are_pruned(tiny, tmp_path):
    from rayfl.simulation import resume

    opts = ["algorithm.name=examples.proxskip:ProxSkip", "rounds=6", "checkpoint.every=1"]
    full = _run(tiny, *opts)
    paused = run(TINY, [*tiny, *MLP, *opts], quiet=True, run_dir=str(tmp_path / "p"),
                 max_rounds=3)
    done = resume(paused.run_dir, quiet=True)
    assert _sha(done) == _sha(full)
    state_dir = tmp_path / "p" / "state"
    kept = sorted(os.listdir(state_dir / "messages"))
    versions = {int(f.split(".r")[1][:-4]) for d in os.listdir(state_dir) if d != "messages"
                for f in os.listdir(state_dir / d)}
    assert kept == [f"r{v}.npz" for v in sorted(versions)]  # exactly the rounds states refer to


def test_a_settling_algorithm_is_refused_in_the_event_driven_modes(tiny, tmp_path):
    from rayfl.config import ConfigError

    with pytest.raises(ConfigError, match="sync with examples.proxskip:ProxSkip"):
        run(TINY, [*tiny, *MLP, "algorithm.name=examples.proxskip:ProxSkip",
                   "aggregation.mode=fedbuff"], quiet=True, run_dir=str(tmp_path / "r"))
    with pytest.raises(ConfigError, match="aggregation.mode.*client_settle"):
        run(TINY, [*tiny, *MLP, "algorithm.name=tests.test_procedures:AsyncProxSkip",
                   "aggregation.mode=fedbuff"], quiet=True, run_dir=str(tmp_path / "r"))
    assert not (tmp_path / "r").exists()


class AsyncProxSkip(__import__("examples.proxskip").proxskip.ProxSkip):
    """ProxSkip claiming asynchronous math: still refused, its settle reads a round."""

    traits = __import__("dataclasses").replace(
        __import__("examples.proxskip").proxskip.ProxSkip.traits, asynchronous=None)


def test_fedsam_without_perturbation_is_fedavg_and_with_it_is_not(tiny):
    opts = ["local.momentum=0.9", "local.weight_decay=0.01"]
    fedavg = _run(tiny, *opts)
    assert _sha(_run(tiny, *opts, "algorithm.name=fedsam", "algorithm.rho=0")) == _sha(fedavg)
    assert _sha(_run(tiny, *opts, "algorithm.name=fedsam", "algorithm.rho=0.05")) != _sha(fedavg)


def test_fedsam_first_step_matches_an_independent_autograd_computation(tiny):
    """One full-batch SAM step: ε = ρ g/‖g‖ at x, then x − η ∇f(x + ε), with torch's SGD."""
    rho, lr = 0.5, 0.1
    x, y, start, got, classes = _first_full_batch_step(tiny, "algorithm.name=fedsam",
                                                       f"algorithm.rho={rho}")
    net = build_model("mlp", (x.shape[1],), classes)
    params = list(net.parameters())

    def set_flat(v):
        offset = 0
        for p in params:
            p.data.copy_(v[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    set_flat(start)
    g = torch.autograd.grad(F.cross_entropy(net(x), y), params)
    norm = torch.sqrt(sum((t * t).sum() for t in g))
    set_flat(start + rho * torch.cat([t.reshape(-1) for t in g]) / norm)
    g_sam = torch.autograd.grad(F.cross_entropy(net(x), y), params)
    set_flat(start)
    for p, gs in zip(params, g_sam):
        p.grad = gs
    torch.optim.SGD(params, lr=lr).step()
    expected = torch.cat([p.detach().reshape(-1) for p in params])
    assert torch.allclose(got, expected, atol=1e-6)


def test_fedsam_updates_batchnorm_statistics_once_a_step(tiny):
    result = run(TINY, [*tiny, "model.name=examples.bn_model:BNNet", "data.partition=iid",
                        "rounds=1", "algorithm.name=fedsam", "runtime.executor=inprocess"],
                 quiet=True)
    buffers = np.load(os.path.join(result.run_dir, "final_buffers.npy"))
    assert buffers[-1] == 3  # 30 rows, batch 10: three steps, each counted once


class FeaturesBetween(Algorithm):
    """The documented order: outputs of the trained model, features of another, then backward."""

    def client_train(self, task, ctx):
        y, opt = ctx.x.clone(), ctx.optimizer()
        for batch in ctx.batches():
            logits, _, labels = ctx.outputs(y, batch)
            _, other, _ = ctx.features(ctx.x, batch, ("repr",))
            loss = ctx.loss(logits, labels) + 0.0 * other["repr"].sum()
            opt.step(y, ctx.backward(loss))
        return ClientResult(y)


def test_features_of_another_model_between_outputs_and_backward_on_a_batchnorm_model(tiny):
    """ctx.features between ctx.outputs and ctx.backward leaves the trained model's graph and
    statistics as they were: the same bytes as plain SGD on the BatchNorm model."""
    bn = ["model.name=examples.bn_model:BNNet", "local.batch_size=16",
          "runtime.executor=inprocess"]
    plain = run(TINY, [*tiny, *bn, "algorithm.name=tests.test_procedures:ProcedureSGD"],
                quiet=True)
    between = run(TINY, [*tiny, *bn, "algorithm.name=tests.test_procedures:FeaturesBetween"],
                  quiet=True)
    assert _sha(between) == _sha(plain)
