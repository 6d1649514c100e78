"""Personalised parts of the model (FedPer, LG-FedAvg, FedRep, FedBABU, FedBN): each client's
round against torch's own optimiser on the same full batches, the parts that must never move,
the papers' limit cases, and the refusals."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch import nn

import rayfl
from rayfl.algorithms.base import ClientTask
from rayfl.algorithms.fedbabu import FedBABU, FedBABUParams
from rayfl.algorithms.fedper import FedPer
from rayfl.algorithms.fedrep import FedRep, FedRepParams
from rayfl.algorithms.lgfedavg import LGFedAvg
from rayfl.models.flat import FlatModel
from rayfl.runtime.context import ClientData, LocalContext
from rayfl.runtime.local import LocalSpec
from rayfl.schema import ConfigError
from tests.conftest import TINY

N, LR = 12, 0.3


def _net() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 3))


def _data():
    g = torch.Generator().manual_seed(4)
    return torch.randn(N, 5, generator=g), torch.randint(0, 3, (N,), generator=g)


def _client_round(algorithm, steps: int, state=None, x=None, spec_extra=None, bc_extra=None):
    """(the global model x, the upload y, the ClientResult, the context) of one client's round
    of ``algorithm`` on the full batch (every step sees all N rows)."""
    model = FlatModel(_net())
    inputs, labels = _data()
    loss_fn = nn.CrossEntropyLoss()

    def grad_fn(point, idx):
        return model.loss_and_grad(point, inputs[idx], labels[idx], loss_fn)

    data = ClientData(N, grad_fn, model, inputs, labels, loss_fn)
    x = model.w.clone() if x is None else x
    x0 = x.clone()
    task = ClientTask(0, 0, LR, 1.0, {"x": x, **(bc_extra or {})}, state)
    spec = LocalSpec(steps=steps, batch_size=N, **(spec_extra or {}))
    ctx = LocalContext(task, data, spec, np.random.default_rng(0), None)
    result = algorithm.client_train(task, ctx)
    y = result.model
    return x0, y, result, ctx  # the model's own vector is the last point evaluated


def _torch_sgd(start: torch.Tensor, trainable: list[int], steps: int, momentum=0.0,
               weight_decay=0.0) -> torch.Tensor:
    """``steps`` full-batch steps of torch.optim.SGD over the layers ``trainable`` (indices into
    the Sequential) from the flat vector ``start``; the flat result."""
    net = _net()
    nn.utils.vector_to_parameters(start.clone(), net.parameters())
    params = [p for i in trainable for p in net[i].parameters()]
    opt = torch.optim.SGD(params, lr=LR, momentum=momentum, weight_decay=weight_decay)
    inputs, labels = _data()
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(net(inputs), labels).backward()
        opt.step()
    return nn.utils.parameters_to_vector(net.parameters()).detach()


HEAD = slice(5 * 6 + 6, None)  # the last Linear's weight and bias: the flat vector's tail


def test_fedper_trains_everything_keeps_the_head_and_uploads_the_body():
    x, y, result, ctx = _client_round(FedPer(), steps=4)
    expected = _torch_sgd(x, [0, 2], 4)
    assert torch.allclose(result.state["personal"], expected[HEAD], atol=1e-6)
    assert torch.allclose(y[:HEAD.start], expected[:HEAD.start], atol=1e-6)
    assert torch.equal(y[HEAD], x[HEAD]) and ctx.steps == 4  # the head is not uploaded


def test_fedper_next_round_starts_from_the_clients_own_head():
    first = _client_round(FedPer(), steps=2)[2].state
    x, y, result, _ = _client_round(FedPer(), steps=3, state=first)
    start = x.clone()
    start[HEAD] = first["personal"]
    expected = _torch_sgd(start, [0, 2], 3)
    assert torch.allclose(result.state["personal"], expected[HEAD], atol=1e-6)
    assert torch.allclose(y[:HEAD.start], expected[:HEAD.start], atol=1e-6)


def test_lgfedavg_keeps_the_body_and_uploads_the_head():
    x, y, result, _ = _client_round(LGFedAvg(), steps=4)
    expected = _torch_sgd(x, [0, 2], 4)
    assert torch.allclose(result.state["personal"], expected[:HEAD.start], atol=1e-6)
    assert torch.allclose(y[HEAD], expected[HEAD], atol=1e-6)
    assert torch.equal(y[:HEAD.start], x[:HEAD.start])


@pytest.mark.parametrize("head_passes, body_passes", [(2, 1), (3, 0)])
def test_fedrep_trains_the_head_then_the_body_with_the_other_frozen(head_passes, body_passes):
    algorithm = FedRep(FedRepParams(head_passes=head_passes, body_passes=body_passes))
    x, y, result, ctx = _client_round(algorithm, steps=2)
    head_done = _torch_sgd(x, [2], 2 * head_passes)
    both_done = _torch_sgd(head_done, [0], 2 * body_passes)
    assert torch.allclose(result.state["personal"], head_done[HEAD], atol=1e-6)
    assert torch.allclose(y[:HEAD.start], both_done[:HEAD.start], atol=1e-6)
    assert ctx.steps == 2 * (head_passes + body_passes)
    if body_passes == 0:  # local head training: nothing shared moves
        assert torch.equal(y, x)


def test_fedbabu_never_moves_the_head_even_with_momentum_and_weight_decay():
    extra = {"momentum": 0.9, "weight_decay": 0.01}
    x, y, result, _ = _client_round(FedBABU(), steps=5, spec_extra=extra)
    expected = _torch_sgd(x, [0], 5, momentum=0.9, weight_decay=0.01)
    assert torch.equal(y[HEAD], x[HEAD]) and result.state is None
    assert torch.allclose(y, expected, atol=1e-6)
    frozen_body = FedBABU(FedBABUParams(frozen="body"))
    y_body = _client_round(frozen_body, steps=5, spec_extra=extra)[1]
    assert torch.equal(y_body[:HEAD.start], x[:HEAD.start])


MLP = ["model.name=mlp", "rounds=3", "runtime.executor=inprocess"]


def _initial(cfg_extra, tiny) -> np.ndarray:
    from rayfl import config as config_mod
    from rayfl.data import prepare
    from rayfl.models import build_for

    cfg = config_mod.load(TINY, tiny + cfg_extra)
    torch.manual_seed(cfg.seed)
    return FlatModel(build_for(cfg.model, prepare(cfg.data, cfg.seed))).w.numpy()


@pytest.mark.parametrize("name, fixed", [("fedper", "head"), ("fedrep", "head"),
                                         ("fedbabu", "head"), ("lgfedavg", "body"),
                                         ("fedproto", "all")])
def test_a_run_leaves_the_unshared_part_of_the_global_model_where_it_started(tiny, name, fixed):
    result = rayfl.run(TINY, tiny + MLP + [f"algorithm.name={name}"], quiet=True)
    fresh = _initial(MLP, tiny)
    head = np.zeros(len(fresh), dtype=bool)
    head[-(100 * 4 + 4):] = True  # mlp: the last Linear(100, 4)
    part = {"head": head, "body": ~head, "all": np.ones_like(head)}[fixed]
    assert np.array_equal(result.params[part], fresh[part])
    if not part.all():
        assert not np.array_equal(result.params[~part], fresh[~part])


def test_fedrep_without_body_passes_leaves_the_global_model_at_its_initialisation(tiny):
    result = rayfl.run(TINY, tiny + MLP + ["algorithm.name=fedrep", "algorithm.body_passes=0"],
                       quiet=True)
    assert np.array_equal(result.params, _initial(MLP, tiny))


@pytest.mark.parametrize("extra, key", [
    (["algorithm.name=fedbn"], "algorithm.personal"),  # logreg has no normalisation layer
    (["algorithm.name=fedper", "algorithm.personal=conv*"], "algorithm.personal"),
    (["algorithm.name=fedbabu", "algorithm.frozen=nothing.*"], "algorithm.frozen"),
])
def test_a_group_the_model_lacks_is_refused_before_anything_starts(tiny, extra, key):
    with pytest.raises(ConfigError, match=key):
        rayfl.run(TINY, tiny + ["runtime.executor=inprocess"] + extra, quiet=True)
    assert not os.path.exists(tiny[0].split("=", 1)[1])  # no run directory made


def test_fedbabu_is_personalised_by_finetuning_not_by_state():
    from rayfl import config as config_mod

    cfg = config_mod.load(TINY, ["algorithm.name=fedbabu", "data.client_holdout=0.25",
                                 "eval.clients=6", "eval.finetune_steps=3"])
    assert cfg.eval.finetune_steps == 3
    with pytest.raises(ConfigError, match="eval.finetune_steps.*fedper"):
        config_mod.load(TINY, ["algorithm.name=fedper", "data.client_holdout=0.25",
                               "eval.clients=6", "eval.finetune_steps=3"])


# ----- FedProto ---------------------------------------------------------------------------------
def _hidden(flat: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """The representation before the classifier of _net() at ``flat``, by hand."""
    w1, b1 = flat[:30].view(6, 5), flat[30:36]
    return torch.relu(inputs @ w1.T + b1)


def test_fedproto_without_the_prototype_term_trains_locally_and_sends_class_sums():
    from rayfl.algorithms.fedproto import FedProto, FedProtoParams

    algorithm = FedProto(FedProtoParams(lam=0.0))
    bc = {"protos": torch.zeros(0), "known": torch.zeros(0)}
    x, y, result, _ = _client_round(algorithm, steps=3, bc_extra=bc)
    own = result.state["personal"]
    assert torch.allclose(own, _torch_sgd(x, [0, 2], 3), atol=1e-6)
    assert torch.equal(y, x)  # no parameter is uploaded
    inputs, labels = _data()
    z = _hidden(own, inputs)
    for c in range(3):
        assert torch.allclose(result.payload["proto_sum"][c], z[labels == c].sum(0), atol=1e-5)
        assert result.payload["proto_count"][c] == int((labels == c).sum())


def test_fedproto_pulls_each_representation_to_its_class_prototype():
    """One full-batch step of CE + λ·MSE(f(x), C̄_y) by autograd; class 2 has no prototype yet
    (its rows add no term)."""
    from rayfl.algorithms.fedproto import FedProto, FedProtoParams

    protos = torch.tensor([[0.5] * 6, [-0.2] * 6, [9.0] * 6])
    known = torch.tensor([1.0, 1.0, 0.0])
    x, _, result, _ = _client_round(FedProto(FedProtoParams(lam=0.7)), steps=1,
                                    bc_extra={"protos": protos, "known": known})
    inputs, labels = _data()
    net = _net()
    nn.utils.vector_to_parameters(x.clone(), net.parameters())
    z = net[1](net[0](inputs))
    target = torch.where((known[labels] > 0).unsqueeze(1), protos[labels], z.detach())
    loss = nn.functional.cross_entropy(net[2](z), labels) + 0.7 * nn.functional.mse_loss(z, target)
    loss.backward()
    expected = x - LR * torch.cat([p.grad.flatten() for p in net.parameters()])
    assert torch.allclose(result.state["personal"], expected, atol=1e-6)


def test_fedproto_server_averages_prototypes_by_class_counts_and_keeps_absent_classes():
    from rayfl.algorithms.base import Aggregate
    from rayfl.algorithms.fedproto import FedProto

    from tests.core_helpers import init, update

    algorithm = FedProto()
    state = init(algorithm, torch.zeros(4))
    a, b = torch.tensor([[1.0, 2.0], [0.0, 0.0]]), torch.tensor([[3.0, 3.0], [0.0, 0.0]])
    sums, counts = 2 * a + 1 * b, torch.tensor([3.0, 0.0])  # client a: 2 rows, b: 1 row
    agg = Aggregate(2, 2.0, 3, 3.0, torch.zeros(4), torch.zeros(4), 0.0,
                    {"proto_sum": sums, "proto_count": counts})
    state, metrics = update(algorithm, state, agg, 0)
    assert torch.allclose(state.algorithm.protos[0], (2 * a[0] + b[0]) / 3)
    assert state.algorithm.known.tolist() == [1.0, 0.0] and metrics == {"prototypes": 1.0}
    later = Aggregate(1, 1.0, 1, 1.0, torch.zeros(4), torch.zeros(4), 0.0,
                      {"proto_sum": torch.tensor([[0.0, 0.0], [4.0, 8.0]]),
                       "proto_count": torch.tensor([0.0, 2.0])})
    state, _ = update(algorithm, state, later, 1)
    protos = state.algorithm.protos
    assert torch.allclose(protos[0], (2 * a[0] + b[0]) / 3)  # kept: absent this round
    assert protos[1].tolist() == [2.0, 4.0] and state.algorithm.known.tolist() == [1.0, 1.0]
    assert torch.equal(state.x, torch.zeros(4))


def test_personal_models_put_the_clients_part_into_the_global_model():
    from examples.bn_model import BNNet
    from rayfl.algorithms.fedbn import FedBN

    layout = FlatModel(BNNet((4,), 3, width=5)).layout
    x = torch.arange(float(layout.offsets[-1]))
    norm = layout.mask("norm")
    own, stats = -torch.ones(int(norm.sum())), torch.tensor([7.0, 8.0])
    model, buffers = FedBN().personal_model({"personal": own}, x, layout.mask, stats)
    assert torch.equal(model[norm], own) and torch.equal(model[~norm], x[~norm])
    assert torch.equal(buffers, stats)
    model, buffers = FedBN().personal_model(None, x, layout.mask)  # never trained: global
    assert torch.equal(model, x) and buffers is None
    head = FlatModel(_net()).layout.mask("head")
    y = torch.zeros(len(head))
    model, buffers = FedPer().personal_model({"personal": torch.ones(int(head.sum()))}, y,
                                             FlatModel(_net()).layout.mask)
    assert torch.equal(model, head.float()) and buffers is None
