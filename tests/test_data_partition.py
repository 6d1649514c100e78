"""Partitioner invariants: every sample once, sizes and class counts as specified, seeded."""

from __future__ import annotations

import numpy as np
import pytest

from rayfl import config
from rayfl.data import partition as part
from rayfl.data import prepare
from rayfl.schema import ConfigError


def rng(seed=0):
    return np.random.default_rng(seed)


def labels_of(per_class, classes=10, seed=0):
    return rng(seed).permutation(np.repeat(np.arange(classes), per_class))


def clients_of(order, offsets):
    return [order[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]


def assert_every_sample_once(order, offsets, n):
    assert offsets[0] == 0 and offsets[-1] == n and (np.diff(offsets) >= 0).all()
    np.testing.assert_array_equal(np.sort(order), np.arange(n))


def test_iid_is_a_shuffled_near_equal_split():
    order, offsets = part.iid(1003, 10, rng())
    assert_every_sample_once(order, offsets, 1003)
    assert set(np.diff(offsets)) <= {100, 101}


def test_lognormal_sizes_sum_and_spread():
    sizes = part.lognormal_sizes(200_000, 2000, 0.3, rng())
    assert sizes.sum() == 200_000 and sizes.min() >= 1
    assert abs(np.log(sizes).std() - 0.3) < 0.02
    np.testing.assert_array_equal(sizes, part.lognormal_sizes(200_000, 2000, 0.3, rng()))
    assert (part.lognormal_sizes(50, 50, 2.0, rng()) == 1).all()


def test_dirichlet_unequal_sizes_respect_min_samples_and_seed():
    y = labels_of(100)
    order, offsets = part.dirichlet(y, 20, 0.3, rng(1), min_samples=5)
    assert_every_sample_once(order, offsets, len(y))
    assert np.diff(offsets).min() >= 5 and np.diff(offsets).std() > 5
    again = part.dirichlet(y, 20, 0.3, rng(1), min_samples=5)
    np.testing.assert_array_equal(again[0], order)
    assert not np.array_equal(part.dirichlet(y, 20, 0.3, rng(2), min_samples=5)[0], order)
    with pytest.raises(ConfigError) as e:
        part.dirichlet(y, 20, 0.01, rng(1), min_samples=50, max_tries=3)
    assert e.value.key == "data.min_samples"


@pytest.mark.parametrize("alpha", [0.01, 0.3, 1000.0])
def test_label_dirichlet_gives_exact_sizes_and_keeps_class_totals(alpha):
    y = labels_of(500)
    sizes = part.equal_sizes(len(y), 100)
    order, offsets = part.label_dirichlet(y, sizes, alpha, rng(3))
    assert_every_sample_once(order, offsets, len(y))
    np.testing.assert_array_equal(np.diff(offsets), sizes)
    mix = np.stack([np.bincount(y[c], minlength=10) for c in clients_of(order, offsets)]) / 50
    top = mix.max(1).mean()
    if alpha == 0.01:
        assert top > 0.8  # nearly one class per client
    elif alpha == 1000.0:
        assert top < 0.35  # close to the uniform 0.1 (sampling noise of 50 draws)


def test_label_dirichlet_with_lognormal_sizes_and_a_million_rows():
    y = labels_of(100_000)  # 1M rows
    sizes = part.lognormal_sizes(len(y), 200_000, 0.3, rng())
    order, offsets = part.label_dirichlet(y, sizes, 0.1, rng(4))
    np.testing.assert_array_equal(np.diff(offsets), sizes)
    assert_every_sample_once(order, offsets, len(y))


def test_shards_give_each_client_its_classes():
    y = labels_of(100)  # 10 classes × 100; 100 clients × 2 shards of 5 → aligned with classes
    order, offsets = part.shards(y, 100, 2, rng(5))
    assert_every_sample_once(order, offsets, len(y))
    assert set(np.diff(offsets)) == {10}
    classes = [len(np.unique(y[c])) for c in clients_of(order, offsets)]
    assert max(classes) <= 2 and np.mean(classes) > 1.5
    # unaligned sizes still assign every sample once, shards differing by at most one
    order, offsets = part.shards(labels_of(7, classes=13), 6, 3, rng(6))
    assert_every_sample_once(order, offsets, 91)


def test_natural_keeps_the_first_writers():
    groups = np.array([2, 0, 1, 2, 0, 3, 3, 3])
    order, offsets = part.natural(groups, 3)
    assert [sorted(c.tolist()) for c in clients_of(order, offsets)] == [[1, 4], [2], [0, 3]]
    with pytest.raises(ConfigError, match="at most the 4"):
        part.natural(groups, 5)


def run_cfg(tmp_path, **data):
    base = {"dataset": "synthetic", "num_clients": 40, "samples_per_client": 25, "features": 4,
            "classes": 5, "test_samples": 10, "alpha": 0.5, "cache_dir": str(tmp_path)}
    return config.from_dict({"data": {**base, **data}, "clients_per_round": 2}).data


@pytest.mark.parametrize("partition", ["iid", "dirichlet", "label_dirichlet", "shards"])
def test_same_seed_same_store_and_validation_clients_are_the_last(tmp_path, partition):
    extra = {"min_samples": 2} if partition == "dirichlet" else {}
    plain = prepare(run_cfg(tmp_path, partition=partition, **extra), 7)
    held = prepare(run_cfg(tmp_path, partition=partition, validation_clients=4, **extra), 7)
    assert held.path != plain.path and held.num_clients == held.num_train_clients == 36
    assert held.num_validation_clients == 4 and len(held.sizes()) == 36
    a, b = plain.open(), held.open()
    np.testing.assert_array_equal(held.sizes(), plain.sizes()[:36])
    end = int(a.offsets[36])
    np.testing.assert_array_equal(b.validation()[0], a.x[end:])
    np.testing.assert_array_equal(b.validation()[1], a.y[end:])
    assert len(b.y) == end  # training rows exclude validation rows
    assert prepare(run_cfg(tmp_path, partition=partition, **extra), 7).fingerprint == \
        plain.fingerprint
    other = prepare(run_cfg(tmp_path, partition=partition, **extra), 8)
    assert other.fingerprint != plain.fingerprint


@pytest.mark.parametrize("data, key", [
    ({"partition": "natural"}, "data.partition"),
    ({"partition": "dirichlet", "sizes": "lognormal"}, "data.sizes"),
    ({"validation_clients": 40}, "data.validation_clients"),
    ({"partition": "iid", "regime": "period_only"}, "data.regime"),
    ({"alpha": 0}, "data.alpha"),
    ({"sigma": -1}, "data.sigma"),
    ({"shards_per_client": 0}, "data.shards_per_client"),
    ({"dataset": "imagenet"}, "data.dataset"),
    ({"regime": "sometimes"}, "data.regime"),
])
def test_bad_data_keys_name_key_value_and_expectation(tmp_path, data, key):
    with pytest.raises(ConfigError) as e:
        run_cfg(tmp_path, **data)
    assert e.value.key == key and e.value.expected
