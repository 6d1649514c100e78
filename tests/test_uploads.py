"""``Upload`` payload entries: sent with the client's update, so every layer treats them as part
of it.

The client halves see ``[Δ_i, v.flatten()]`` as one vector (clipping bounds its norm; top-k
chooses among all of it), the server halves act on the entries' sums (DP's noise at the
update's σ from a stream of their own, SecAgg's decode), ``upload_bytes`` counts them, and the
layers that cannot carry them refuse them. IFCA (``examples/ifca.py``) sends its per-cluster
sums this way: with one cluster it is FedAvg byte for byte; with two it gives the same bytes in
process, on 2 Ray actors and resumed, under top-k with error feedback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import rayfl
from rayfl import rng
from rayfl.algorithms.base import Algorithm, ClientResult, Rows, Traits, Upload
from rayfl.contract import ComponentError
from rayfl.layers import Facts, LayerTraits
from rayfl.runtime.aggregate import PartialSum
from rayfl.runtime.training import split
from rayfl.runtime.harness import quadratic_client, simulate
from rayfl.runtime.local import LocalSpec
from rayfl.transforms import Transform
from rayfl.transforms.base import ClipParams, ClipUpdate
from rayfl.transforms.compress import SparseParams, TopK
from rayfl.transforms.dp import GaussianDP, GaussianDPParams
from rayfl.transforms.robust import Median
from rayfl.transforms.secagg import SecAgg, SecAggParams
from tests.conftest import ROOT, TINY, three_ways

DT = torch.float64
D = 4
SPEC = LocalSpec(steps=1, batch_size=1)
LR = 0.1
IFCA = ["algorithm.name=examples.ifca:IFCA"]


class Echo(Algorithm):
    """FedAvg (uniform) whose client ``i`` also sends a 2 × 3 block of ``i + 1`` as an Upload
    entry; the server keeps every aggregate it is handed."""

    traits = Traits(weighting="uniform", dp_post_processing=True)

    def __init__(self, rows: bool = False, value=None):
        super().__init__(weighting="uniform")
        self.rows, self.value, self.seen = rows, value, []

    def client_train(self, task, ctx):
        y = ctx.train()
        block = torch.full((2, 3), float(task.client_id + 1), dtype=y.dtype)
        return ClientResult(y, {"v": Upload(block if self.value is None else self.value,
                                            self.rows)})

    def server_update(self, x, state, agg, srv):
        self.seen.append(agg)
        return srv.step(agg.delta_mean), state, {}


class Mixed(Echo):
    """Even clients send ``v`` as ``first``, odd ones as ``second`` (a kind made of a block)."""

    def __init__(self, first, second):
        super().__init__()
        self.first, self.second = first, second

    def client_train(self, task, ctx):
        y = ctx.train()
        block = torch.ones(2, 3, dtype=y.dtype)
        make = self.first if task.client_id % 2 == 0 else self.second
        return ClientResult(y, {"v": make(block)})


class TwoEntries(Echo):
    """Sends ``b`` before ``a`` (the dict's order), each a vector of its own constant."""

    def client_train(self, task, ctx):
        y = ctx.train()
        return ClientResult(y, {"b": Upload(torch.full((2,), 2.0, dtype=y.dtype)),
                                "a": Upload(torch.full((1,), 1.0, dtype=y.dtype))})


class Growing(Echo):
    """Round t's entry has t + 1 numbers."""

    def client_train(self, task, ctx):
        y = ctx.train()
        return ClientResult(y, {"v": Upload(torch.ones(task.t + 1, dtype=y.dtype))})


class Seen(Transform):
    """Keeps every upload its client half is handed."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def client(self, delta, t, client):
        self.seen.append(delta.clone())
        return delta


class Some(Echo):
    """Only even clients send their block; a plain report ``n`` from every client."""

    def client_train(self, task, ctx):
        y = ctx.train()
        block = {"v": Upload(torch.ones(2, 3, dtype=y.dtype))} if task.client_id % 2 == 0 else {}
        return ClientResult(y, {**block, "n": 1.0})


class Narrow(Echo):
    """Uploads its update in float32 beside a float64 model, and no entry."""

    def client_train(self, task, ctx):
        y = ctx.train()
        return ClientResult(y, upload=(task.bc["x"] - y).float())


class Privatiser(Transform):
    """Privatises the update's sum (its own way) and says nothing of Upload entries."""

    traits = LayerTraits(privatises=True)


class PrivatiserWithSums(Privatiser):
    """Says it acts on the Upload entries' sums (it does nothing to any sum)."""

    traits = LayerTraits(privatises=True, upload_sums=True)


class Uploader(Algorithm):
    """FedAvg whose clients also send an Upload entry ``u``; it allows asynchronous rounds."""

    traits = Traits(asynchronous=None, dp_post_processing=True)

    def client_train(self, task, ctx):
        y = ctx.train()
        return ClientResult(y, {"u": Upload(torch.ones(3, dtype=y.dtype))})


class LateUploader(Uploader):
    """Sends its Upload entry from round 2 on: past the pre-flight's round."""

    def client_train(self, task, ctx):
        return super().client_train(task, ctx) if task.t else ClientResult(ctx.train())


def _clients():
    """f_i(x) = ½‖x‖² − i·1ᵀx: one step of η from 0 gives Δ_i = −η·i·1."""
    return [quadratic_client(torch.ones(D, dtype=DT), torch.full((D,), float(i), dtype=DT))
            for i in range(3)]


def _round(algorithm, *layers):
    _, history, _ = simulate(algorithm, torch.zeros(D, dtype=DT), _clients(), SPEC, rounds=1,
                             lr0=LR, transforms=list(layers))
    return algorithm.seen[0], history[0]


def _deltas_and_blocks():
    return ([torch.full((D,), -LR * i, dtype=DT) for i in range(3)],
            [torch.full((2, 3), float(i + 1), dtype=DT) for i in range(3)])


def test_without_layers_an_upload_entry_is_summed_and_counted_in_the_bytes():
    agg, row = _round(Echo())
    deltas, blocks = _deltas_and_blocks()
    assert agg.uploaded == ("v",)
    assert torch.equal(agg.extras["v"], sum(blocks))
    assert torch.equal(agg.delta_sum, sum(deltas))
    assert row["upload_bytes"] == 3 * (D + 6) * 8  # float64: the update and the block


def test_upload_bytes_count_the_entries_of_the_clients_that_sent_them():
    _, row = _round(Some())
    assert row["upload_bytes"] == 8 * (2 * (D + 6) + D)  # clients 0 and 2 sent a block


def test_a_user_privatising_layer_refuses_reports_beside_the_update_in_one_line():
    with pytest.raises(ComponentError, match=r"Some\.client_train \(round 1\): sent 'n' to the "
                                             r"server beside the update that tests\.test_uploads:"
                                             r"PrivatiserWithSums privatises"):
        _round(Some(), PrivatiserWithSums())


def test_clipping_bounds_the_update_and_its_entries_as_one_vector():
    s = 1.0
    agg, _ = _round(Echo(), ClipUpdate(ClipParams(max_norm=s)))
    deltas, blocks = _deltas_and_blocks()
    scales = [min(1.0, s / (float(torch.cat([d, b.flatten()]).norm()) + 1e-6))
              for d, b in zip(deltas, blocks)]
    assert all(f < 1 for f in scales)  # every client's joint norm is over S
    assert torch.allclose(agg.extras["v"], sum(f * b for f, b in zip(scales, blocks)),
                          rtol=1e-12)
    assert torch.allclose(agg.delta_sum, sum(f * d for f, d in zip(scales, deltas)), rtol=1e-12)


def test_top_k_chooses_among_the_update_and_its_entries():
    # d + 6 = 10 numbers, k = 3: each client's block (|i + 1| ≥ 1) beats its update (0.1·i)
    agg, row = _round(Echo(), TopK(SparseParams(fraction=0.3)))
    first = torch.tensor([[6.0, 6.0, 6.0], [0.0, 0.0, 0.0]], dtype=DT)  # ties: lower index
    assert torch.equal(agg.extras["v"], first)
    assert torch.equal(agg.delta_sum, torch.zeros(D, dtype=DT))
    assert row["upload_bytes"] == 3 * 3 * (8 + 4)  # k (value, index) pairs per client


def test_dp_noises_the_entries_sums_at_the_update_s_sigma_and_leaves_its_noise_as_it_was():
    z, s, k, seed = 1.3, 0.5, 3, 7
    mech = GaussianDP(GaussianDPParams(noise_multiplier=z, clip_norm=s, expected_clients=k),
                      Facts(seed=seed))
    agg, _ = _round(Echo(), mech)
    deltas, blocks = _deltas_and_blocks()
    scales = [min(1.0, s / float(torch.cat([d, b.flatten()]).norm()))
              for d, b in zip(deltas, blocks)]
    entry_noise = rng.stream(seed, 0, rng.DP_UPLOAD_NOISE).standard_normal(6) * (z * s)
    expected = sum(f * b for f, b in zip(scales, blocks)) + torch.from_numpy(
        entry_noise).reshape(2, 3)
    assert torch.allclose(agg.extras["v"], expected, rtol=1e-12, atol=1e-14)
    # the update's noise is the draw it was without entries: N(0, z²S²) from its own stream
    clipped_sum = sum(f * d for f, d in zip(scales, deltas))
    assert torch.allclose(agg.delta_sum - clipped_sum, torch.from_numpy(mech.noise(0, D, s)),
                          rtol=1e-12, atol=1e-14)
    assert agg.delta_mean.equal(agg.delta_sum / k)


def test_dp_noises_two_entries_in_the_order_of_their_keys_whatever_the_dict_s():
    z, s, seed = 1.0, 100.0, 3  # S above every joint norm: nothing clipped
    mech = GaussianDP(GaussianDPParams(noise_multiplier=z, clip_norm=s, expected_clients=3),
                      Facts(seed=seed))
    agg, _ = _round(TwoEntries(), mech)
    noise = torch.from_numpy(rng.stream(seed, 0, rng.DP_UPLOAD_NOISE).standard_normal(3)
                             * (z * s))
    assert torch.allclose(agg.extras["a"], 3 * torch.ones(1, dtype=DT) + noise[:1], rtol=1e-12)
    assert torch.allclose(agg.extras["b"], 3 * torch.full((2,), 2.0, dtype=DT) + noise[1:],
                          rtol=1e-12)


def test_without_entries_a_layer_s_output_still_takes_the_model_s_dtype():
    agg, _ = _round(Narrow(), ClipUpdate(ClipParams(max_norm=100.0)))
    assert agg.delta_sum.dtype == DT


def test_an_entry_split_from_the_upload_holds_its_own_numbers_only():
    # a view would pickle (and ship to the server) the client's whole joined upload
    joint = torch.arange(10, dtype=DT)
    _, out = split(joint, 4, {"v": Upload(torch.zeros(2, 3, dtype=DT), rows=True)})
    part = out["v"].value
    assert torch.equal(part, torch.arange(4, 10, dtype=DT).reshape(2, 3))
    assert part.untyped_storage().nbytes() == 6 * 8


def test_groups_that_sent_one_key_as_two_kinds_are_refused_when_merged():
    # one group summed 'v', another sent it as an Upload (each alone looks fine)
    plain, sent = PartialSum(), PartialSum()
    one = torch.ones(2, dtype=DT)
    plain.add_client(0, one, 1.0, 1, 1, 0.0, {"v": one}, [], where="A.client_train")
    sent.add_client(1, one, 1.0, 1, 1, 0.0, {"v": Upload(one)}, [], where="A.client_train")
    with pytest.raises(ComponentError, match=r"A\.client_train \(round 1\): returned payload "
                                             r"entry 'v' as Upload, where an earlier client's "
                                             r"was summed"):
        plain.merge(sent)


def test_secagg_decodes_the_entries_sums_within_its_bound():
    layer = SecAgg(SecAggParams(bits=20, clip_norm=10.0, max_clients=3,
                                randomized_rounding=False), Facts())
    agg, _ = _round(Echo(), layer)
    deltas, blocks = _deltas_and_blocks()
    scales = [min(1.0, 10.0 / float(torch.cat([d, b.flatten()]).norm()))
              for d, b in zip(deltas, blocks)]
    assert all(f == 1.0 for f in scales)  # nothing clipped: the decode is the only change
    err = float((agg.extras["v"] - sum(blocks)).abs().max())
    assert err <= layer.bound(3)
    assert float((agg.delta_sum - sum(deltas)).abs().max()) <= layer.bound(3)


@pytest.mark.parametrize("layer, rows, says", [
    (Median(), False, r"rayfl\.transforms\.robust:Median\.aggregate: it replaces the round's "
                      r"mean update"),
    (SecAgg(SecAggParams(clip_norm=10.0), Facts(clients_per_round=3)), True,
     r"rayfl\.transforms\.secagg:SecAgg\.aggregate: the server reads an "
     r"Upload\(rows=True\) entry client by client"),
    (GaussianDP(GaussianDPParams(1.0, 1.0, 3), Facts()), True,
     r"rayfl\.transforms\.dp:GaussianDP\.aggregate: the server reads an "
     r"Upload\(rows=True\) entry client by client"),
    (Privatiser(), False, r"tests\.test_uploads:Privatiser\.aggregate: it privatises or "
                          r"transports the update's sum and does not say it does the same to "
                          r"the Upload entries' \(LayerTraits\.upload_sums\)"),
])
def test_a_layer_that_cannot_carry_an_entry_refuses_it_naming_client_train(layer, rows, says):
    with pytest.raises(ComponentError, match=r"Echo\.client_train \(round 1\): sent 'v' as "
                                             r"Upload payload beside " + says):
        _round(Echo(rows=rows), layer)


def test_rows_entries_are_clipped_with_the_update_and_collected_client_by_client():
    agg, _ = _round(Echo(rows=True), ClipUpdate(ClipParams(max_norm=1.0)))
    deltas, blocks = _deltas_and_blocks()
    scales = [min(1.0, 1.0 / (float(torch.cat([d, b.flatten()]).norm()) + 1e-6))
              for d, b in zip(deltas, blocks)]
    assert agg.extras["v"].ids == [0, 1, 2]
    assert torch.allclose(agg.extras["v"].rows, torch.stack([f * b for f, b in
                                                             zip(scales, blocks)]), rtol=1e-12)


@pytest.mark.parametrize("value", [torch.tensor([1, 2]), torch.ones(2, dtype=torch.float16),
                                   torch.ones(2, dtype=torch.float32)])
def test_an_upload_entry_that_is_not_a_tensor_of_the_model_s_dtype_is_refused(value):
    with pytest.raises(ComponentError, match=r"Echo\.client_train \(round 1, client 0\): "
                                             r"returned Upload payload entry 'v' that is "
                                             r".*not a tensor of the model's dtype float64"):
        _round(Echo(value=value))


@pytest.mark.parametrize("first, second, kinds", [
    (Upload, lambda v: v, "as summed, where an earlier client's was Upload"),
    (Upload, lambda v: Upload(v, rows=True), "as Upload\\(rows=True\\), where an earlier "
                                             "client's was Upload"),
    (Rows, lambda v: v, "as summed, where an earlier client's was Rows"),
])
def test_an_entry_sent_as_two_kinds_in_one_round_is_refused(first, second, kinds):
    # a plain value beside Upload ones would skip the layers (under privacy: unnoised)
    with pytest.raises(ComponentError, match=r"Mixed\.client_train \(round 1, client 1\): "
                                             r"returned payload entry 'v' " + kinds):
        _round(Mixed(first, second), ClipUpdate(ClipParams(max_norm=1.0)))


def test_entries_join_the_update_in_the_order_of_their_keys():
    seen = Seen()
    agg, _ = _round(TwoEntries(), seen)
    deltas, _ = _deltas_and_blocks()
    a, b = torch.ones(1, dtype=DT), torch.full((2,), 2.0, dtype=DT)
    assert all(torch.equal(s, torch.cat([d, a, b])) for s, d in zip(seen.seen, deltas))
    assert torch.equal(agg.extras["a"], 3 * a) and torch.equal(agg.extras["b"], 3 * b)


def test_an_upload_that_changes_size_under_error_feedback_is_one_line_on_the_residual():
    topk = TopK(SparseParams(fraction=0.5, error_feedback=True))
    with pytest.raises(ComponentError, match=r"TopK\.client_apply \(round 2, client 0\): "
                                             r".*client 0's residual holds 5 numbers and its "
                                             r"upload now 6: with error feedback the upload"):
        simulate(Growing(), torch.zeros(D, dtype=DT), _clients(), SPEC, rounds=2, lr0=LR,
                 transforms=[topk])


@pytest.mark.parametrize("overrides, says", [
    (["aggregation.mode=fedbuff", "aggregation.buffer_size=2"],
     r"Uploader\.client_train \(round 1\): sent 'u' as Upload payload under aggregation\.mode "
     r"fedbuff: the server discounts each update by its staleness"),
    (["privacy.noise_multiplier=1.0", "privacy.public_reports=[u]"],
     r"privacy\.public_reports.*'u' is sent as an Upload entry, clipped and noised with the "
     r"update"),
])
def test_uploads_refused_leave_nothing_behind(tiny, overrides, says):
    from rayfl.schema import ConfigError

    with pytest.raises((ComponentError, ConfigError), match=says):
        rayfl.run(TINY, tiny + ["runtime.executor=inprocess",
                                "algorithm.name=tests.test_uploads:Uploader", *overrides],
                  quiet=True)
    assert not os.path.exists(tiny[0].split("=", 1)[1])


def test_an_entry_first_sent_after_the_pre_flight_is_refused_in_its_round(tiny):
    with pytest.raises(ComponentError, match=r"LateUploader\.client_train \(round \d+\): sent "
                                             r"'u' as Upload payload under aggregation\.mode "
                                             r"fedasync"):
        rayfl.run(TINY, tiny + ["runtime.executor=inprocess", "aggregation.mode=fedasync",
                                "algorithm.name=tests.test_uploads:LateUploader", "rounds=12"],
                  quiet=True)


def _sha(result) -> str:
    return result.summary["model_sha256"]


def test_ifca_with_one_cluster_is_fedavg_with_uniform_weights_byte_for_byte(tiny):
    base = ["runtime.executor=inprocess", "rounds=3", "layers=[clip]"]
    fedavg = rayfl.run(TINY, tiny + base + ["aggregation.weighting=uniform", "name=f"],
                       quiet=True)
    ifca = rayfl.run(TINY, tiny + base + IFCA + ["algorithm.clusters=1", "name=i"], quiet=True)
    assert _sha(ifca) == _sha(fedavg)


def test_ifca_survives_a_round_nobody_completes(tiny):
    result = rayfl.run(TINY, tiny + IFCA + ["runtime.executor=inprocess", "rounds=3",
                                            "algorithm.clusters=2", "availability.dropout=0.8",
                                            "clients_per_round=2"], quiet=True)
    completed = [r["completed"] for r in result.metrics.to_pylist()]
    assert 0 in completed, completed  # the round the example must step over


def test_ifca_sums_through_top_k_with_error_feedback_same_bytes_three_ways(tiny, ray_local,
                                                                         tmp_path):
    topk = "layers=[{name: topk, fraction: 0.1, error_feedback: true}]"
    runs = three_ways(tiny, str(tmp_path / "paused"), *IFCA, "algorithm.clusters=2", topk)
    assert len({_sha(r) for r in runs}) == 1
    # d = 16·4 + 4 = 68; the update, cluster 1's part and 2 counts: 138 numbers, k = 14
    rows = runs[0].metrics.to_pylist()
    assert all(r["upload_bytes"] == 5 * 14 * (4 + 4) for r in rows)
    assert {r["cluster0_share"] for r in rows} - {0.0, 1.0}  # both clusters are chosen


def test_an_entry_beside_dp_ftrl_is_refused_before_anything_is_created(tmp_path):
    out = tmp_path / "runs"
    proc = subprocess.run(
        [sys.executable, "-m", "rayfl", "run", TINY, *IFCA, "algorithm.clusters=2",
         "runtime.executor=inprocess", "privacy.mechanism=dp_ftrl", f"output_dir={out}",
         f"data.cache_dir={tmp_path / 'cache'}"],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "examples.ifca:IFCA.client_train (round 1): sent 'clusters', " \
        "'members' as Upload payload beside rayfl.transforms.dp:CorrelatedDP.aggregate: its " \
        "noise is correlated across rounds" in lines[0], proc.stderr
    assert not out.exists()
