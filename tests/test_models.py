"""Model zoo shapes against the papers' architectures, the recommender and its metrics."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from rayfl import config
from rayfl.data.store import DataHandle
from rayfl.models import FlatModel, build_for, build_model, rec_metrics
from rayfl.schema import ConfigError


def n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def test_parameter_counts_match_the_published_architectures():
    # LeNet-5: 61,706 parameters (6-16-120-84-10 on a 32×32 canvas)
    assert n_params(build_model("lenet5", (1, 28, 28), 10)) == 61_706
    # FedDyn/AdaBest CIFAR-10 CNN: 4,864 + 102,464 + 614,784 + 73,920 + 1,930
    assert n_params(build_model("adabest_cnn", (3, 32, 32), 10)) == 797_962
    # IMA Table IV CIFAR CNN: conv 3→64→64 (5×5), FC 1600-384-128-10
    assert n_params(build_model("cifar_cnn", (3, 32, 32), 10)) == \
        4_864 + 102_464 + 614_784 + 49_280 + 1_290
    # IMA Table IV FMNIST CNN: conv 1→32→32, FC 512-384-128-10
    assert n_params(build_model("fmnist_cnn", (1, 28, 28), 10)) == \
        832 + 25_632 + 196_992 + 49_280 + 1_290
    # MLPs: AdaBest 784-100-100-C, fedmsi 784-128-C
    assert n_params(build_model("mlp", (1, 28, 28), 26)) == 78_500 + 10_100 + 2_626
    assert n_params(build_model("mlp", (784,), 10, hidden=(128,))) == 100_480 + 1_290
    assert n_params(build_model("logreg", (3072,), 10)) == 30_730


@pytest.mark.parametrize("name, shape, classes", [
    ("lenet5", (1, 28, 28), 62), ("cifar_cnn", (3, 32, 32), 10),
    ("adabest_cnn", (3, 32, 32), 100), ("resnet18_gn", (3, 32, 32), 100),
    ("resnet18_gn", (1, 28, 28), 62), ("mlp", (60,), 10)])
def test_models_map_a_batch_to_logits_and_flatten(name, shape, classes):
    model = FlatModel(build_model(name, shape, classes))
    out = model.module(torch.randn(2, *shape))
    assert out.shape == (2, classes)
    assert model.dim == n_params(model.module)


def papers_order(net: nn.Sequential) -> nn.Sequential:
    """The same layers (and weights) as the papers draw them: conv → ReLU → pool."""
    layers, out = list(copy.deepcopy(net)), []
    while layers:
        layer = layers.pop(0)
        if isinstance(layer, nn.MaxPool2d) and isinstance(layers[0], nn.ReLU):
            out += [nn.ReLU(), layer]
            layers.pop(0)
        else:
            out.append(nn.ReLU() if isinstance(layer, nn.ReLU) else layer)
    return nn.Sequential(*out)


@pytest.mark.parametrize("name, shape", [("fmnist_cnn", (1, 28, 28)), ("cifar_cnn", (3, 32, 32)),
                                         ("lenet5", (1, 28, 28))])
def test_cnns_pooling_before_relu_are_the_papers_conv_relu_pool_bit_for_bit(name, shape):
    """Max-pooling and ReLU commute: outputs and every gradient are identical, ties included
    (inputs rounded to a coarse grid make equal maxima and exact zeros common)."""
    torch.manual_seed(0)
    net = build_model(name, shape, 10)
    ref = papers_order(net)
    assert [type(m) for m in ref][:3] == [nn.Conv2d, nn.ReLU, nn.MaxPool2d]
    x, y = (torch.randn(16, *shape) * 4).round() / 4, torch.randint(0, 10, (16,))
    outs = []
    for m in (net, ref):
        out = m(x)
        nn.functional.cross_entropy(out, y).backward()
        outs.append(out.detach())
    assert torch.equal(outs[0], outs[1])
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(net.parameters(), ref.parameters()))


@pytest.mark.parametrize("name, shape", [("fmnist_cnn", (1, 28, 28)), ("resnet18_gn", (3, 32, 32)),
                                         ("mlp", (20,))])
def test_channels_last_flat_model_is_the_plain_module(name, shape):
    """model.channels_last keeps w and g in the usual parameter order; gradients and predictions
    are the plain module's (to float rounding), and gradients never accumulate across calls."""
    torch.manual_seed(0)
    plain = build_model(name, shape, 10)
    fm = FlatModel(copy.deepcopy(plain), channels_last=True)
    assert bool(fm.copied) == (name != "mlp")  # only 4-d (conv) weights get their own copy
    assert all(p.is_contiguous(memory_format=torch.channels_last) for p, _, _ in fm.copied)
    params = list(plain.parameters())
    assert torch.equal(fm.w, torch.cat([p.detach().reshape(-1) for p in params]))
    point = fm.w + 0.01 * torch.randn(fm.dim)
    x, y = torch.randn(4, *shape), torch.randint(0, 10, (4,))
    loss, g = fm.loss_and_grad(point, x, y, nn.CrossEntropyLoss())
    first = g.clone()
    torch.nn.utils.vector_to_parameters(point, params)
    ref_loss = nn.functional.cross_entropy(plain(x), y)
    ref_loss.backward()
    ref = torch.cat([p.grad.reshape(-1) for p in params])
    assert torch.allclose(loss, ref_loss, rtol=1e-5) and torch.allclose(g, ref, atol=1e-5)
    assert torch.equal(fm.loss_and_grad(point, x, y, nn.CrossEntropyLoss())[1], first)
    plain.eval()
    assert torch.allclose(fm.predict(point, x), plain(x), atol=1e-5)


def test_resnet18_gn_is_torchvisions_with_two_group_norm_groups():
    net = build_model("resnet18_gn", (3, 32, 32), 100)
    norms = [m for m in net.modules() if isinstance(m, nn.GroupNorm)]
    assert not any(isinstance(m, nn.BatchNorm2d) for m in net.modules())
    assert len(norms) == 20 and {m.num_groups for m in norms} == {2}
    assert net.conv1.kernel_size == (7, 7) and net.fc.in_features == 512
    # 11,689,512 for torchvision's 1000-class BN ResNet-18; the head shrinks to 100 classes
    assert n_params(net) == 11_689_512 - 513_000 + 51_300
    assert {m.num_groups for m in build_model("resnet18_gn", (3, 32, 32), 10, groups=32).modules()
            if isinstance(m, nn.GroupNorm)} == {32}


def handle(**kw):
    base = dict(path="/nowhere", input_shape=(2,), num_classes=2, scale=1.0, num_clients=3,
                kind="ids", vocab=(7, 11))
    return DataHandle(**{**base, **kw})


def test_build_for_passes_model_keys_and_checks_the_input_kind():
    cfg = config.from_dict({"model": {"name": "ncf", "embedding_dim": 8},
                            "clients_per_round": 1})
    net = build_for(cfg.model, handle())
    assert net.gmf_user.weight.shape == (7, 8) and net.mlp_item.weight.shape == (11, 8)
    with pytest.raises(ConfigError) as e:
        build_for(dataclasses.replace(cfg.model, name="lenet5"), handle())
    assert e.value.key == "model.name"
    dense = handle(input_shape=(1, 28, 28), num_classes=10, kind="dense", vocab=())
    with pytest.raises(ConfigError, match="dense"):
        build_for(cfg.model, dense)
    mlp = build_for(dataclasses.replace(cfg.model, name="mlp", hidden=[5]), dense)
    assert n_params(mlp) == 784 * 5 + 5 + 5 * 10 + 10


def test_model_keys_are_validated():
    for model, key in (({"groups": 3}, "model.groups"), ({"embedding_dim": 0},
                                                          "model.embedding_dim"),
                       ({"hidden": []}, "model.hidden"), ({"name": "vgg"}, "model.name")):
        with pytest.raises(ConfigError) as e:
            config.from_dict({"model": model})
        assert e.value.key == key


def test_ncf_cross_entropy_is_the_logistic_loss_of_its_score():
    torch.manual_seed(0)
    net = build_model("ncf", (2,), 2, vocab=(5, 9), embedding_dim=4)
    x = torch.tensor([[0, 1], [4, 8], [2, 3]])
    y = torch.tensor([1, 0, 1])
    with torch.no_grad():
        out = net(x)
    assert (out[:, 0] == 0).all()
    bce = nn.functional.binary_cross_entropy_with_logits(out[:, 1], y.float())
    assert float(nn.functional.cross_entropy(out, y)) == pytest.approx(float(bce), rel=1e-6)


def test_rec_metrics_by_hand():
    # two users, groups of 4 candidates, positive first
    scores = [0.9, 0.1, 0.2, 0.3,   # rank 0: hit, ndcg 1
              0.2, 0.5, 0.1, 0.4]   # rank 2: hit@3, ndcg 1/log2(4) = 0.5
    labels = [1, 0, 0, 0, 1, 0, 0, 0]
    m = rec_metrics(scores, labels, group_size=4, k=3)
    assert m["hr@3"] == 1.0 and m["ndcg@3"] == pytest.approx(0.75)
    assert rec_metrics(scores, labels, 4, k=2)["hr@2"] == 0.5
    # AUC over all positives × negatives: 0.9 beats 6/6; 0.2 beats 2 of 6 and ties 1 (½)
    assert m["auc"] == pytest.approx((6 + 2.5) / 12)
    flat = rec_metrics(np.zeros(8), labels, 4, k=3)
    assert flat["hr@3"] == 0.0 and flat["auc"] == 0.5  # ties count against the positive


def test_rec_auc_equals_sklearns():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    labels = np.zeros((50, 100), dtype=int)
    labels[np.arange(50), rng.integers(0, 100, 50)] = 1
    scores = rng.normal(size=(50, 100)) + labels + np.round(rng.normal(size=(50, 100)), 1)
    m = rec_metrics(scores.ravel(), labels.ravel(), 100)
    assert m["auc"] == pytest.approx(roc_auc_score(labels.ravel(), scores.ravel()))
    assert 0 < m["ndcg@10"] < m["hr@10"] < 1


def test_projection_head_makes_repr_the_projection_output_and_is_the_trained_head():
    """model.projection: the classifier becomes Linear(d, d)–ReLU–Linear(d, p)–Linear(p, C);
    ``repr`` is the projection's output (computed here by hand from the trunk), not a ReLU
    output, and the head group is the output layer alone."""
    import types

    handle = types.SimpleNamespace(kind="dense", input_shape=(1, 28, 28), num_classes=10,
                                   vocab=(), label_len=0)
    cfg = config.load({"model": {"name": "fmnist_cnn", "projection": 16}})
    torch.manual_seed(0)
    module = build_for(cfg.model, handle)
    flat = FlatModel(module)
    x = torch.randn(5, 1, 28, 28)
    logits, feats = flat.outputs(flat.w.detach().clone(), x, ("repr",))
    trunk = module[:-1](x)
    proj = module[-1]
    expected = proj[2](torch.relu(proj[0](trunk)))
    assert feats["repr"].shape == (5, 16)
    torch.testing.assert_close(feats["repr"], expected)
    torch.testing.assert_close(logits, proj[3](expected))
    assert (feats["repr"] < 0).any()  # not a ReLU output: MOON's cosine is defined
    head = flat.layout.params_in("head")
    assert sorted(head) == ["11.3.bias", "11.3.weight"]
    tokens = types.SimpleNamespace(**{**vars(handle), "kind": "tokens"})
    with pytest.raises(ConfigError) as err:
        build_for(config.load({"model": {"name": "shakespeare_lstm", "projection": 16}}).model,
                  types.SimpleNamespace(**{**vars(tokens), "vocab": tuple(range(80)),
                                           "input_shape": (80,), "num_classes": 80}))
    assert err.value.key == "model.projection"
