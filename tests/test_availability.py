"""Availability models: long-run statistics, trace replay, stragglers, clock and config errors."""

from __future__ import annotations

import pickle
import types

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayfl import config
from rayfl.availability import make_sampler
from rayfl.availability.plots import plot_online
from rayfl.runtime.local import LocalSpec
from rayfl.schema import ConfigError

SPEC = LocalSpec(epochs=1, batch_size=10)


class FakeHandle:
    """A DataHandle look-alike: clients with a dominant label (70 %) and uneven sizes."""

    def __init__(self, n: int, classes: int = 10, per: int = 20, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.num_clients, self.num_classes = n, classes
        size = rng.integers(per // 2, 3 * per // 2, size=n)
        self.offsets = np.concatenate([[0], np.cumsum(size)]).astype(np.int64)
        self.dom = rng.integers(classes, size=n)
        y = np.repeat(self.dom, size)
        noise = rng.random(len(y)) < 0.3
        y[noise] = rng.integers(classes, size=int(noise.sum()))
        self.y = y.astype(np.int32)

    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def open(self):
        return types.SimpleNamespace(y=self.y, offsets=self.offsets)


def avail(**kw):
    return config.load({"availability": kw}).availability


def sampler(handle, k=10, seed=0, model_bytes=0, **kw):
    return make_sampler(avail(**kw), handle, k, seed, SPEC, model_bytes=model_bytes)


def _plans(s, rounds, now=None):
    return [s.plan(t) if now is None else s.plan(t, now(t)) for t in range(rounds)]


# ----- determinism ------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [{"model": "always"}, {"model": "bernoulli"},
                                {"model": "diurnal", "interval_s": 3600.0},
                                {"model": "always", "dropout": 0.3, "overcommit": 1.5,
                                 "deadline_policy": "partial"}])
def test_same_seed_same_participants(kw):
    h = FakeHandle(300)
    a, b, c = (_plans(sampler(h, seed=s, **kw), 8) for s in (1, 1, 2))
    for pa_, pb in zip(a, b):
        assert np.array_equal(pa_.clients, pb.clients)
        assert np.array_equal(pa_.dropped, pb.dropped)
        assert pa_.metrics == pb.metrics
    assert any(not np.array_equal(x.clients, y.clients) for x, y in zip(a, c))
    for p in a:
        assert np.all(np.diff(p.clients) > 0)
        assert p.metrics["completed"] + p.metrics["dropped"] == p.metrics["sampled"]


# ----- bernoulli --------------------------------------------------------------------------------
def test_bernoulli_long_run_rates():
    h = FakeHandle(2000)
    s = sampler(h, model="bernoulli", mean=0.3, spread=0.15)
    p = s.model.p.astype(np.float64)
    assert abs(p.mean() - 0.3) < 0.015 and abs(p.std() - 0.15) < 0.01
    on = np.array([s.model.online(t, 0.0) for t in range(500)])
    assert abs(on.mean() - 0.3) < 0.01
    rate = on.mean(axis=0)  # each client's participation rate ≈ its own p_i
    assert np.abs(rate - p).max() < 5 * np.sqrt(0.25 / 500)
    assert np.corrcoef(rate, p)[0, 1] > 0.95


def test_bernoulli_correlated_with_label_creates_period_drift():
    h = FakeHandle(2000)
    corr = sampler(h, k=20, model="bernoulli", mean=0.3, spread=0.2, correlate="label")
    plain = sampler(h, k=20, model="bernoulli", mean=0.3, spread=0.2)
    dom = corr.stats.dominant()
    by_label = [corr.model.p[dom == c].mean() for c in range(h.num_classes)]
    assert max(by_label) - min(by_label) > 0.3  # propensity follows the dominant label
    assert np.allclose(np.sort(corr.model.p), np.sort(plain.model.p))  # same marginal
    tv = [np.mean([p.metrics["label_tv"] for p in _plans(s, 60)]) for s in (corr, plain)]
    assert tv[0] > tv[1] + 0.02


# ----- diurnal ----------------------------------------------------------------------------------
def test_diurnal_peak_hour_per_zone():
    h = FakeHandle(4000)
    s = sampler(h, model="diurnal", zones=4, peak_hour=2.0, mean=0.5, amplitude=0.8)
    days, hour = 3, np.arange(24)
    on = np.array([s.model.online(t, t * 3600.0) for t in range(24 * days)])  # rounds × clients
    for z in range(4):
        frac = on[:, s.model.zone == z].mean(axis=1).reshape(days, 24).mean(axis=0)
        first = (frac * np.exp(2j * np.pi * hour / 24)).sum()  # first daily harmonic
        peak = (np.angle(first) * 24 / (2 * np.pi)) % 24
        want = (2 - 6 * z) % 24  # zone z's local time is UTC + 6z hours
        assert abs((peak - want + 12) % 24 - 12) < 0.25, (z, peak)
        assert abs(2 * abs(first) / 24 / frac.mean() - 0.8) < 0.05  # amplitude
        assert abs(frac.mean() - 0.5) < 0.02


def test_diurnal_zones_follow_labels_and_clock_drives_online():
    h = FakeHandle(1000)
    s = sampler(h, k=50, model="diurnal", zones=24, correlate="label", interval_s=1800.0)
    dom = s.stats.dominant()
    for c in range(h.num_classes):
        assert len(np.unique(s.model.zone[dom == c])) == 1
    plans = _plans(s, 48)
    assert np.isclose(plans[-1].metrics["virtual_time_s"],
                      sum(p.metrics["virtual_round_s"] for p in plans))
    start = 0.0  # online status is evaluated at each round's virtual start time
    for t, p in enumerate(plans):
        assert p.metrics["online"] == int(s.model.online(t, start).sum())
        start += p.duration
    # an explicit start time (the server's clock after a resume) gives the same plan
    again = sampler(h, k=50, model="diurnal", zones=24, correlate="label", interval_s=1800.0)
    starts = np.cumsum([0.0] + [p.duration for p in plans])
    replay = [again.plan(t, starts[t]) for t in (40, 7)]
    assert np.array_equal(replay[0].clients, plans[40].clients)
    assert np.array_equal(replay[1].clients, plans[7].clients)


# ----- trace ------------------------------------------------------------------------------------
TRACE = {10: {"active": [0, 50], "inactive": [20, 80], "finish_time": 100},
         20: {"active": [30], "inactive": [60], "finish_time": 100},
         30: {"active": [0], "inactive": [150], "finish_time": 200}}
# (time, online clients) worked out by hand; times beyond finish_time loop
EXPECTED = [(0, {0, 2}), (10, {0, 2}), (25, {2}), (40, {1, 2}), (55, {0, 1, 2}), (70, {0, 2}),
            (90, {2}), (110, {0, 2}), (135, {1, 2}), (160, {0, 1}), (199, set()), (215, {0, 2}),
            (1000.5, {0, 2})]


# at 160, client 1's interval [30, 60] ends at the dispatch instant (160 mod 100 = 60): it is
# offline when it would report (a fraction of a second later), so it is lost
LOST = {160: {1}}


def _check_trace(path):
    h = FakeHandle(3)
    s = sampler(h, k=3, model="trace", trace_path=str(path), speed_sigma=0.0)
    for t, (now, want) in enumerate(EXPECTED):
        plan = s.plan(t, now)
        assert set(np.flatnonzero(s.model.online(t, now)).tolist()) == want, now
        assert plan.metrics["online"] == len(want)
        assert set(plan.clients.tolist()) == want - LOST.get(now, set()), now
        assert plan.metrics["dropped"] == len(LOST.get(now, ()))
    wide = sampler(FakeHandle(7), k=7, model="trace", trace_path=str(path))
    assert wide.model.online(0, 40.0).tolist() == [False, True, True] * 2 + [False]


def test_trace_fedscale_pickle_replays_exactly(tmp_path):
    path = tmp_path / "client_behave_trace.pkl"
    path.write_bytes(pickle.dumps(TRACE))
    _check_trace(path)


def test_a_trace_client_offline_when_it_would_report_is_lost_in_sync_and_async_rounds(
        tmp_path):
    """FedScale's rule: a dispatched client must still be online when it reports. Each local
    step takes 10 s (1 s per sample, batches of 10, no transfer), so a client of 10..29 samples
    reports 10, 20 or 30 s after dispatch."""
    from rayfl.runtime.async_loop import Dispatcher

    path = tmp_path / "trace.pkl"
    path.write_bytes(pickle.dumps({  # A: [0, 100], B: [0, 5], C: [0, 1000]; period 2000
        1: {"active": [0], "inactive": [100], "finish_time": 2000},
        2: {"active": [0], "inactive": [5], "finish_time": 2000},
        3: {"active": [0], "inactive": [1000], "finish_time": 2000}}))
    s = sampler(FakeHandle(3), k=3, model="trace", trace_path=str(path), speed_mean=1.0,
                speed_sigma=0.0)
    at0 = s.plan(0, 0.0)  # B leaves at 5, before its report at ≥ 10
    assert at0.clients.tolist() == [0, 2] and at0.dropped.tolist() == [1]
    at95 = s.plan(1, 95.0)  # B is offline; A leaves at 100, before its report at ≥ 105
    assert at95.metrics["online"] == 2 and at95.clients.tolist() == [2]
    assert at95.dropped.tolist() == [0]
    assert s.model.online_at(np.array([0, 0, 2]), np.array([100.0, 100.5, 2999.0])).tolist() \
        == [True, False, True]  # the end is inclusive; C loops with period 2000

    online, clients, seconds, failed = Dispatcher(s, seed=0, dropout=0.0).draw(
        0, 95.0, free=3, busy=np.zeros(0, dtype=np.int64))
    assert online == 2 and clients.tolist() == [0, 2]
    assert failed.tolist() == [True, False]  # A is lost, found out when it would have reported
    steps = np.ceil(s.sizes[clients] / 10)
    assert seconds.tolist() == (10.0 * steps).tolist()


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_trace_table_replays_exactly(tmp_path, suffix):
    rows = [(10, 0, 20), (10, 50, 80), (20, 30, 60), (30, 0, 150), (30, 200, 200)]
    table = pa.table({k: [r[i] for r in rows] for i, k in
                      enumerate(["client_id", "online_start", "online_end"])})
    path = tmp_path / f"trace.{suffix}"
    if suffix == "csv":
        path.write_text("client_id,online_start,online_end\n" +
                        "".join(f"{a},{b},{c}\n" for a, b, c in rows))
    else:
        pq.write_table(table, path)
    # one period for the whole table: max(online_end) = 200, so client 10/20 do not loop at 100
    h = FakeHandle(3)
    s = sampler(h, k=3, model="trace", trace_path=str(path))
    for now, want in [(10, {0, 2}), (40, {1, 2}), (110, {2}), (160, set()), (200, {0, 2}),
                      (255, {0, 1, 2})]:
        assert set(np.flatnonzero(s.model.online(0, now)).tolist()) == want, now


def test_trace_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError) as e:
        avail(model="trace", trace_path=str(tmp_path / "missing.pkl"))
    assert e.value.key == "availability.trace_path" and "existing file" in str(e.value)
    with pytest.raises(ConfigError, match="availability.trace_path"):
        avail(model="trace")
    (tmp_path / "t.json").write_text("{}")
    with pytest.raises(ConfigError, match="ending in"):
        avail(model="trace", trace_path=str(tmp_path / "t.json"))
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(pickle.dumps({1: {"active": [0, 5], "inactive": [3], "finish_time": 9}}))
    with pytest.raises(ConfigError) as e:
        sampler(FakeHandle(3), model="trace", trace_path=str(bad))
    assert e.value.key == "availability.trace_path"
    table = tmp_path / "bad.csv"
    table.write_text("client,start,end\n1,0,5\n")
    with pytest.raises(ConfigError, match="online_start"):
        sampler(FakeHandle(3), model="trace", trace_path=str(table))


# ----- dropout, over-commitment, deadline -------------------------------------------------------
def _finish(s, clients):
    n_i = s.sizes[clients]
    steps = np.array([SPEC.num_steps(int(x)) for x in n_i])
    comm, step = s.devices.times(clients, n_i, SPEC.batch_size, s.model_bytes)
    return comm, step, steps, comm + steps * step


def test_overcommit_keeps_exactly_k_fastest():
    h = FakeHandle(500)
    s = sampler(h, k=20, overcommit=1.3, model_bytes=400_000)
    for t in range(20):
        p = s.plan(t)
        assert (p.metrics["sampled"], p.metrics["completed"], p.metrics["dropped"]) == (26, 20, 6)
        assert len(p.clients) == 20 and len(p.dropped) == 6
        f_kept, f_lost = _finish(s, p.clients)[3], _finish(s, p.dropped)[3]
        assert f_kept.max() <= f_lost.min()
        assert np.isclose(p.duration, f_kept.max())
    few = sampler(FakeHandle(15), k=20, overcommit=1.3).plan(0)
    assert few.metrics["sampled"] == 15 and few.metrics["completed"] == 15


def test_dropout_rate_and_accounting():
    s = sampler(FakeHandle(1000), k=50, dropout=0.3)
    plans = _plans(s, 200)
    for p in plans:
        assert p.metrics["completed"] + p.metrics["dropped"] == p.metrics["sampled"] == 50
        assert not set(p.clients.tolist()) & set(p.dropped.tolist())
    rate = np.mean([p.metrics["dropped"] for p in plans]) / 50
    assert abs(rate - 0.3) < 0.02


@pytest.mark.parametrize("policy", ["drop", "partial"])
def test_deadline_cuts_stragglers(policy):
    h = FakeHandle(400, per=200)  # 10-30 local steps: compute dominates the transfer
    free = sampler(h, k=40, model_bytes=100_000)
    full = free.plan(0)
    comm, step, steps, finish = _finish(free, full.clients)
    deadline = float(np.median(finish))
    s = sampler(h, k=40, model_bytes=100_000, deadline_s=deadline, deadline_policy=policy)
    p = s.plan(0)
    late = finish > deadline
    assert p.metrics["stragglers"] == late.sum() > 0 and p.duration == deadline
    if policy == "drop":
        assert np.array_equal(p.clients, full.clients[~late]) and p.step_budget is None
        return
    budget = np.floor((deadline - comm) / step).clip(0).astype(int)
    budget[~late] = steps[~late]
    keep = budget > 0
    assert (budget[keep] < steps[keep]).any() and not keep.all()  # some partial, some dropped
    assert np.array_equal(p.clients, full.clients[keep])
    assert np.array_equal(p.step_budget, budget[keep])
    assert (p.step_budget[late[keep]] < steps[keep][late[keep]]).all()
    assert p.metrics["completed"] + p.metrics["dropped"] == 40


@pytest.mark.parametrize("policy", ["drop", "partial"])
def test_fedprox_stragglers_do_whole_epochs_in_1_to_e_minus_1(policy):
    """FedProx's systems heterogeneity: round(0.5 · 10) = 5 stragglers a round, each with time
    for 1..E−1 of its E = 5 epochs (partial) or dropped (FedAvg's baseline); the others run
    fully and the round lasts as long as without stragglers."""
    h, spec = FakeHandle(300), LocalSpec(epochs=5, batch_size=10)

    def plan(t, **kw):
        return make_sampler(avail(**kw), h, 10, 0, spec).plan(t)

    full = plan(3)
    p = plan(3, stragglers=0.5, deadline_policy=policy)
    assert p.metrics["stragglers"] == 5 and p.duration == full.duration
    if policy == "drop":
        assert len(p.clients) == 5 and set(p.clients) < set(full.clients)
        assert p.step_budget is None and p.metrics["dropped"] == 5
        return
    assert np.array_equal(p.clients, full.clients)
    per_epoch = np.ceil(h.sizes()[full.clients] / 10).astype(int)
    assert p.step_budget.sum() < 5 * per_epoch.sum()
    epochs = p.step_budget / per_epoch
    assert (epochs == epochs.round()).all() and (epochs < 5).sum() == 5
    every = set()  # over rounds, every whole number of epochs 1..E−1 occurs, and nothing else
    for t in range(30):
        q = plan(t, stragglers=1.0, deadline_policy="partial")
        every |= set((q.step_budget / np.ceil(h.sizes()[q.clients] / 10)).tolist())
    assert every == {1.0, 2.0, 3.0, 4.0}


def test_capacity_pickle_sets_speed_and_bandwidth(tmp_path):
    path = tmp_path / "client_device_capacity.pkl"
    path.write_bytes(pickle.dumps({1: {"computation": 10.0, "communication": 8000.0},
                                   2: {"computation": 20.0, "communication": 2000.0}}))
    s = sampler(FakeHandle(5), k=1, capacity_path=str(path), model_bytes=1_000_000)
    assert np.allclose(s.devices.speed, [0.03, 0.06] * 2 + [0.03])  # 3 × ms / 1000
    assert np.allclose(s.devices.bandwidth, [8.0, 2.0] * 2 + [8.0])  # Mbit/s
    p = s.plan(0)
    (c,) = p.clients
    n = int(s.sizes[c])
    want = 2 * 8e6 / (s.devices.bandwidth[c] * 1e6) + SPEC.num_steps(n) * s.devices.speed[c] \
        * min(n, SPEC.batch_size)
    assert np.isclose(p.duration, want)
    with pytest.raises(ConfigError, match="capacity_path"):
        avail(capacity_path=str(tmp_path / "nope.pkl"))


# ----- metrics, config, plot --------------------------------------------------------------------
def test_label_tv_measures_distance_to_population():
    h = FakeHandle(200)
    s = sampler(h)
    assert s.stats.tv(np.arange(200)) < 1e-12
    c = 3
    hist = np.bincount(h.y[h.offsets[c]:h.offsets[c + 1]], minlength=10) / h.sizes()[c]
    pop = np.bincount(h.y, minlength=10) / len(h.y)
    assert np.isclose(s.stats.tv(np.array([c])), 0.5 * np.abs(hist - pop).sum())
    assert np.array_equal(s.stats.dominant(), [np.bincount(h.y[h.offsets[i]:h.offsets[i + 1]],
                                                           minlength=10).argmax()
                                               for i in range(200)])


@pytest.mark.parametrize("kw,key", [
    ({"model": "bernoulli", "mean": 0.5, "spread": 0.6}, "availability.spread"),
    ({"model": "diurnal", "mean": 0.7, "amplitude": 0.8}, "availability.amplitude"),
    ({"dropout": 1.0}, "availability.dropout"),
    ({"overcommit": 0.9}, "availability.overcommit"),
    ({"deadline_s": 0}, "availability.deadline_s"),
    ({"deadline_policy": "wait"}, "availability.deadline_policy"),
    ({"stragglers": 1.5}, "availability.stragglers"),
    ({"model": "dropout"}, "availability.model"),
    ({"correlate": "zone"}, "availability.correlate"),
    ({"speed_mean": -1}, "availability.speed_mean"),
])
def test_config_errors(kw, key):
    with pytest.raises(ConfigError) as e:
        avail(**kw)
    assert e.value.key == key


def test_plot_online_from_rows_and_parquet(tmp_path):
    s = sampler(FakeHandle(300), model="diurnal", interval_s=3600.0, dropout=0.2)
    rows = [{"round": t, **s.plan(t).metrics} for t in range(30)]
    plot_online(rows, tmp_path / "a.png")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "metrics.parquet")
    plot_online(str(tmp_path / "metrics.parquet"), tmp_path / "b.png")
    for name in ("a.png", "b.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
