"""Communication transforms: SecAgg's modular arithmetic, QSGD, top-k / random-k with error
feedback (persistent client state), the bytes a client uploads and the virtual clock."""

from __future__ import annotations

import math

import pytest
import torch

from rayfl import config as config_mod
import rayfl
from rayfl.algorithms.fedavg import FedAvg
from rayfl.algorithms.scaffold import Scaffold
from rayfl.algorithms.server_opt import sgd
from rayfl.assemble import stack as build
from rayfl.layers import Facts, Stack
from rayfl.runtime.harness import quadratic_client, simulate
from rayfl.runtime.local import LocalSpec
from rayfl.schema import ConfigError
from rayfl.transforms.compress import QSGD, QSGDParams, RandK, SparseParams, TopK
from rayfl.transforms.secagg import SecAgg, SecAggParams
from tests.conftest import TINY

DT = torch.float64


def _secagg_sum(agg: SecAgg, deltas: list[torch.Tensor], t: int = 0) -> torch.Tensor:
    """Encode every client, sum the integers as the runtime does, decode."""
    return agg.decode(sum(agg.client(d, t, i) for i, d in enumerate(deltas)))


@pytest.mark.parametrize("randomized", [True, False])
@pytest.mark.parametrize("bits", [8, 12, 16, 20])
def test_secagg_decode_error_is_within_the_fixed_point_bound(bits, randomized):
    g = torch.Generator().manual_seed(bits)
    m, s = 10, 1.0
    agg = SecAgg(SecAggParams(bits=bits, clip_norm=s, max_clients=m,
                              randomized_rounding=randomized), Facts(seed=3))
    deltas = [torch.randn(200, generator=g, dtype=DT) for _ in range(m)]
    clipped = [d * min(1.0, s / float(d.norm())) for d in deltas]
    err = (_secagg_sum(agg, deltas) - sum(clipped)).abs().max().item()
    f = math.floor(math.log2((2 ** (bits - 1) - 1) / (m * s)))  # the fractional bits
    assert agg.frac_bits == f
    assert err <= m * 2.0 ** -f * (1.0 if randomized else 0.5) + 1e-12
    assert err > 0  # real inputs do lose precision


def test_secagg_is_exact_for_integer_inputs_and_wraps_modulo_2_to_the_b():
    agg = SecAgg(SecAggParams(bits=16, clip_norm=10.0, max_clients=4), Facts(seed=0))
    assert agg.frac_bits == 9  # 32767 / 40 = 819.2 → 2^9
    ints = [torch.tensor(v, dtype=DT) for v in
            ([3, -4, 0, 5], [-7, 1, 2, 0], [0, 0, -9, 1], [6, 6, 1, -2])]
    assert all(float(v.norm()) <= 10 for v in ints)
    assert torch.equal(_secagg_sum(agg, ints), sum(ints))
    # two clients at 9 each where the range holds only one: the sum wraps to a negative value
    one = SecAgg(SecAggParams(bits=8, clip_norm=10.0, max_clients=1, randomized_rounding=False))
    assert one.frac_bits == 3  # 127 / 10 → 2^3
    wrapped = _secagg_sum(one, [torch.tensor([9.0], dtype=DT)] * 2)
    assert float(wrapped) == (2 * 9 * 8 - 256) / 8  # 144 mod 256 → −112, /2^3


def test_secagg_needs_uniform_weights_and_counts_b_bits_a_coordinate():
    with pytest.raises(ConfigError) as e:
        config_mod.load(TINY, ["aggregation.transforms=[{name: secagg, bits: 16}]",
                               "aggregation.weighting=samples"])
    assert e.value.key == "aggregation.weighting"
    assert ("uniform with aggregation.transforms[0] = secagg (secure aggregation reveals only "
            "the sum of the updates)") in str(e.value)
    cfg = config_mod.load(TINY, ["aggregation.transforms=[{name: secagg, bits: 12}]",
                                 "aggregation.weighting=uniform"])
    stack = build(cfg, 20)
    assert stack.transforms[0].p.max_clients == cfg.clients_per_round
    assert stack.upload_bytes(1000) == 1500


def test_qsgd_is_unbiased_and_takes_its_levels():
    v = torch.tensor([0.9, -0.05, 0.3, 0.0, -1.7, 0.01], dtype=DT)
    norm = float(v.norm())
    for bits in (2, 4):
        q = QSGD(QSGDParams(bits=bits), Facts(seed=11))
        s = 2 ** (bits - 1) - 1
        draws = torch.stack([q.compress(v, t, 5) for t in range(20_000)])
        levels = draws * s / norm
        assert torch.allclose(levels, levels.round(), atol=1e-9) and levels.abs().max() <= s
        # E[Q(v)] = v: each coordinate's mean within 5 standard errors of the truth
        se = draws.std(0) / math.sqrt(len(draws))
        assert ((draws.mean(0) - v).abs() <= 5 * se + 1e-12).all()
        assert draws.std(0)[0] > 0  # genuinely random
        assert torch.equal(q.compress(v, 7, 5), q.compress(v, 7, 5))  # keyed by (round, client)
        assert not torch.equal(q.compress(v, 7, 5), q.compress(v, 7, 6))


def _quadratic_population(d: int = 5, n: int = 4):
    g = torch.Generator().manual_seed(0)
    a = [torch.rand(d, generator=g, dtype=DT) + 0.5 for _ in range(n)]
    b = [3 * torch.randn(d, generator=g, dtype=DT) for _ in range(n)]
    optimum = sum(b) / sum(a)  # ∇ Σ f_i = 0 coordinate-wise
    return [quadratic_client(ai, bi) for ai, bi in zip(a, b)], optimum


def test_topk_with_error_feedback_reaches_the_optimum_and_without_it_does_not():
    """Full participation, one local step: FedAvg is gradient descent on Σ f_i with a step
    η_t = 0.2 · 0.997^t (so Σ η_t is large and the last steps small)."""
    clients, optimum = _quadratic_population()
    spec = LocalSpec(steps=1, batch_size=1)
    x0 = torch.zeros(5, dtype=DT)
    dist = {}
    for ef in (False, True):
        chain = [TopK(SparseParams(fraction=0.2, error_feedback=ef))]  # k = 1 of 5
        state, hist, latest = simulate(FedAvg(weighting="uniform"), x0, clients, spec,
                                       rounds=2000, lr0=0.2, lr_decay=0.997, transforms=chain)
        dist[ef] = float((state.x - optimum).norm())
        # FedAvg keeps no client state: with error feedback the residual is the only state
        assert bool(latest) == ef
        if ef:
            assert all(s.algorithm is None and set(s.layers[0]) == {"residual"}
                       for s in latest.values())
        assert hist[-1]["upload_bytes"] == 4 * 1 * (8 + 4)  # 4 clients × one (value, index)
    # top-1 alone settles where Σ top1(∇f_i) = 0, not at the optimum; with error feedback the
    # residuals deliver every dropped coordinate later, so x → x* as the step decays
    assert dist[True] < 0.02 and dist[False] > 1.0


def test_error_feedback_state_sits_next_to_the_algorithms_own_state():
    clients, _ = _quadratic_population()
    chain = [RandK(SparseParams(fraction=0.4, error_feedback=True), Facts(seed=2))]
    _, _, latest = simulate(Scaffold(), torch.zeros(5, dtype=DT), clients,
                            LocalSpec(steps=3, batch_size=1), rounds=3, lr0=0.1,
                            transforms=chain)
    assert all(set(s.algorithm) == {"c"} and set(s.layers[0]) == {"residual"}
               for s in latest.values())


def test_chain_composes_upload_bytes():
    d = 10_000
    q4 = QSGD(QSGDParams(bits=4))
    top = TopK(SparseParams(fraction=0.01))
    rand = RandK(SparseParams(fraction=0.01))
    def chain(*steps):
        return Stack(FedAvg(), sgd(1.0), transforms=list(steps))

    assert chain().upload_bytes(d) == 4 * d
    assert chain(q4).upload_bytes(d) == 4 + d * 4 / 8
    assert chain(top).upload_bytes(d) == 100 * (4 + 4)
    assert chain(rand).upload_bytes(d) == 100 * 4  # indices follow from the shared seed
    assert chain(q4, top).upload_bytes(d) == pytest.approx(100 * ((4 + d / 2) / d + 4))


def test_compression_section_shortens_the_virtual_upload_and_reports_bytes(tiny):
    base = tiny + ["runtime.executor=inprocess", "rounds=2", "availability.bandwidth_mean=0.01"]
    plain = rayfl.run(TINY, base, quiet=True)
    small = rayfl.run(TINY, base + ["compression.method=qsgd", "compression.bits=2"],
                      quiet=True)
    d = 16 * 4 + 4  # logreg on 16 features, 4 classes
    up_plain = plain.metrics.column("upload_bytes").to_pylist()
    up_small = small.metrics.column("upload_bytes").to_pylist()
    done = plain.metrics.column("completed").to_pylist()
    assert up_plain == [4.0 * d * c for c in done]
    assert up_small == [(4 + math.ceil(d * 2 / 8)) * c
                        for c in small.metrics.column("completed").to_pylist()]
    t_plain = plain.metrics.column("virtual_round_s").to_pylist()
    t_small = small.metrics.column("virtual_round_s").to_pylist()
    assert all(s < p for s, p in zip(t_small, t_plain))
