"""Per-client evaluation: held-out rows per client, the distribution of accuracy over clients,
fine-tuning that changes nothing persistent, and numbers independent of the actor count."""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import rayfl
from rayfl import config as config_mod
from rayfl.data import holdout, prepare, store
from rayfl.metrics.client_eval import distribution
from rayfl.models import build_for
from rayfl.schema import ConfigError
from tests.conftest import TINY

EVAL = ["data.client_holdout=0.25", "eval.clients=6", "rounds=3"]


def _run(tiny, extra, executor="inprocess"):
    return rayfl.run(TINY, tiny + [f"runtime.executor={executor}"] + extra, quiet=True)


def test_carve_holds_back_floor_h_n_of_each_training_client():
    offsets = np.array([0, 10, 13, 14, 30])  # sizes 10, 3, 1, 16; the last is validation
    order = np.arange(30)[::-1].copy()
    train, train_off, held, held_off = holdout.carve(order, offsets, 3, 0.25, seed=7)
    assert np.diff(held_off).tolist() == [2, 0, 0, 0]  # ⌊2.5⌋, ⌊0.75⌋, 1 row keeps 1, validation
    assert np.diff(train_off).tolist() == [8, 3, 1, 16]
    for i in range(4):  # a client's rows are split, none lost or shared, in stored order
        mine = order[offsets[i]:offsets[i + 1]]
        t, h = train[train_off[i]:train_off[i + 1]], held[held_off[i]:held_off[i + 1]]
        assert sorted(np.r_[t, h].tolist()) == sorted(mine.tolist())
        assert t.tolist() == [r for r in mine if r in set(t.tolist())]
    again = holdout.carve(order, offsets, 3, 0.25, seed=7)[2]
    assert again.tolist() == held.tolist()
    assert holdout.carve(order, offsets, 3, 0.25, seed=8)[2].tolist() != held.tolist() or \
        holdout.carve(order, offsets, 3, 0.25, seed=9)[2].tolist() != held.tolist()


def test_store_with_holdout_trains_on_the_rest(tmp_path):
    base = config_mod.load(TINY, [f"data.cache_dir={tmp_path}"])
    cut = config_mod.load(TINY, [f"data.cache_dir={tmp_path}", "data.client_holdout=0.25"])
    full, part = prepare(base.data, 0).open(), prepare(cut.data, 0).open()
    sizes = np.diff(np.asarray(full.offsets))
    k = part.holdout_sizes()
    assert k.tolist() == np.floor(0.25 * sizes).astype(int).tolist()
    assert prepare(cut.data, 0).sizes().tolist() == (sizes - k).tolist()
    for c in range(len(sizes)):
        rows = {r.tobytes() for r in np.asarray(full.client(c)[0])}
        tr, ho = np.asarray(part.client(c)[0]), np.asarray(part.holdout(c)[0])
        assert {r.tobytes() for r in tr} | {r.tobytes() for r in ho} == rows
        assert not {r.tobytes() for r in tr} & {r.tobytes() for r in ho}
    assert not full.holdout_sizes().any() and len(full.holdout(0)[1]) == 0


def test_holdout_off_keeps_the_partition_key(monkeypatch):
    """data.client_holdout = 0 leaves the cache key (so the store's bytes) as without the key."""
    cfg = config_mod.load(TINY)
    key = store.partition_key(cfg.data, 0)
    real = store.schema.to_dict
    without = SimpleNamespace(to_dict=lambda c: {k: v for k, v in real(c).items()
                                                 if k != "client_holdout"})
    monkeypatch.setattr(store, "schema", without)
    assert store.partition_key(cfg.data, 0) == key
    monkeypatch.undo()
    on = config_mod.load(TINY, ["data.client_holdout=0.1"])
    assert store.partition_key(on.data, 0) != key


def test_distribution_by_hand():
    acc = np.array([0.9, 0.1, 0.5, 0.7, 0.3, 1.0, 0.2, 0.8, 0.6, 0.4, 0.0])  # 11 clients
    d = distribution(acc)
    assert d["mean"] == pytest.approx(5.5 / 11)
    assert d["p50"] == pytest.approx(0.5)
    assert d["p10"] == pytest.approx(0.1)  # rank 1.0 of 0..10 in sorted order
    assert d["p90"] == pytest.approx(0.9)
    assert d["worst10"] == pytest.approx((0.0 + 0.1) / 2)  # ⌈11/10⌉ = 2 worst clients
    assert distribution(np.array([0.25]))["worst10"] == 0.25


def _module(cfg, handle, flat):
    torch.manual_seed(0)
    module = build_for(cfg.model, handle)
    torch.nn.utils.vector_to_parameters(torch.tensor(flat, dtype=torch.float32),  # a copy
                                        module.parameters())
    return module


def _accuracy(module, reader, x, y):
    xt, yt = reader.tensors(x, y, "cpu")
    with torch.no_grad():
        return int((module(xt).argmax(1) == yt).sum()) / len(yt)


def _finetuned(module, reader, x, y, steps, lr, batch, rng):
    """``steps`` minibatch SGD steps with torch's own optimiser, batches reshuffled per epoch."""
    xt, yt = reader.tensors(x, y, "cpu")
    opt = torch.optim.SGD(module.parameters(), lr=lr)
    done = 0
    while done < steps:
        perm = rng.permutation(len(yt))
        for b in range(math.ceil(len(yt) / batch)):
            if done == steps:
                break
            idx = torch.from_numpy(perm[b * batch:(b + 1) * batch])
            opt.zero_grad()
            torch.nn.functional.cross_entropy(module(xt[idx]), yt[idx]).backward()
            opt.step()
            done += 1
    return module


def test_per_client_metrics_equal_a_hand_computation(tiny):
    result = _run(tiny, EVAL + ["eval.finetune_steps=3", "eval.finetune_lr=0.2"])
    cfg = config_mod.load(TINY, tiny + EVAL)
    handle = prepare(cfg.data, cfg.seed)
    reader = handle.open()
    rows = pq.read_table(os.path.join(result.run_dir, "client_eval.parquet")).to_pylist()
    last = [r for r in rows if r["round"] == 3]
    eligible = np.flatnonzero(reader.holdout_sizes() > 0)
    assert len(last) == 6 and {r["client"] for r in last} <= set(eligible.tolist())
    accs, personal = [], []
    for r in last:
        x, y = reader.holdout(r["client"])
        assert r["samples"] == len(y)
        accs.append(_accuracy(_module(cfg, handle, result.params), reader, x, y))
        rng = np.random.default_rng([cfg.seed, 2, r["client"], 0xF17E])
        tuned = _finetuned(_module(cfg, handle, result.params), reader,
                           *reader.client(r["client"]), 3, 0.2, cfg.local.batch_size, rng)
        personal.append(_accuracy(tuned, reader, x, y))
    assert [r["accuracy"] for r in last] == accs
    assert [r["personal_accuracy"] for r in last] == pytest.approx(personal)
    final = result.metrics.to_pylist()[-1]
    assert final["clients_evaluated"] == 6
    assert final["client_accuracy_mean"] == pytest.approx(np.mean(accs))
    assert final["client_accuracy_p10"] == pytest.approx(np.percentile(accs, 10))
    assert final["client_accuracy_p90"] == pytest.approx(np.percentile(accs, 90))
    assert final["client_accuracy_worst10"] == pytest.approx(min(accs))  # ⌈6/10⌉ = 1 client
    assert final["personal_accuracy_p50"] == pytest.approx(np.median(personal))
    assert os.path.isfile(os.path.join(result.run_dir, "client_accuracy.png"))


def test_evaluation_and_finetuning_leave_the_model_unchanged(tiny):
    """A stateful algorithm (SCAFFOLD's control variates): the same model bytes with per-client
    evaluation off, on, and on with fine-tuning; the sample changes with the round."""
    common = ["data.client_holdout=0.25", "rounds=3", "algorithm=scaffold"]
    off = _run(tiny, common)
    on = _run(tiny, common + ["eval.clients=6"])
    tuned = _run(tiny, common + ["eval.clients=6", "eval.finetune_steps=5"])
    assert off.summary["model_sha256"] == on.summary["model_sha256"] == \
        tuned.summary["model_sha256"]
    plain, ft = on.metrics.to_pylist(), tuned.metrics.to_pylist()
    assert [r["client_accuracy_mean"] for r in plain] == [r["client_accuracy_mean"] for r in ft]
    assert [r["personal_accuracy_mean"] for r in ft] != [r["client_accuracy_mean"] for r in ft]
    assert "personal_accuracy_mean" not in on.metrics.column_names
    rows = pq.read_table(os.path.join(on.run_dir, "client_eval.parquet")).to_pylist()
    by_round = [{r["client"] for r in rows if r["round"] == t} for t in (1, 2, 3)]
    assert len({frozenset(s) for s in by_round}) > 1


def test_eval_every_and_resume_keep_the_client_rows(tiny):
    extra = ["data.client_holdout=0.25", "eval.clients=4", "rounds=4", "eval.every=2"]
    whole = _run(tiny, extra)
    rows = pq.read_table(os.path.join(whole.run_dir, "client_eval.parquet")).to_pylist()
    assert sorted({r["round"] for r in rows}) == [2, 4]
    first = rayfl.run(TINY, tiny + ["runtime.executor=inprocess", "name=split"] + extra,
                      quiet=True, max_rounds=3)
    resumed = rayfl.resume(first.run_dir, quiet=True)
    again = pq.read_table(os.path.join(resumed.run_dir, "client_eval.parquet")).to_pylist()
    assert again == rows


def test_same_numbers_in_one_worker_and_on_two_actors(tiny, ray_local):
    """The clients split over two actors score as one worker (this process) scores them all."""
    extra = EVAL + ["eval.finetune_steps=4"]
    two = _run(tiny, extra + ["runtime.num_actors=2", "name=two"], executor="ray")
    one = _run(tiny, extra + ["name=inproc"])
    tables = [pq.read_table(os.path.join(r.run_dir, "client_eval.parquet")).to_pylist()
              for r in (one, two)]
    assert tables[0] == tables[1]
    assert one.summary["model_sha256"] == two.summary["model_sha256"]


def test_per_client_evaluation_needs_held_out_rows():
    with pytest.raises(ConfigError, match="eval.clients.*data.client_holdout"):
        config_mod.load(TINY, ["eval.clients=5"])
    with pytest.raises(ConfigError, match="eval.clients.*at most"):
        config_mod.load(TINY, ["eval.clients=21", "data.client_holdout=0.2"])
    with pytest.raises(ConfigError, match="data.client_holdout"):
        config_mod.load(TINY, ["data.client_holdout=1"])


DITTO = ["algorithm.name=ditto", "algorithm.lam=0.1", "clients_per_round=10"]
FEDPER = ["algorithm.name=fedper", "model.name=mlp", "clients_per_round=10"]


def _ditto_model(state, params):
    return state["algorithm.v"]  # the algorithm's entry v of the stored state tree


def _fedper_model(state, params):
    """The global body with the client's own head (mlp: the last Linear(100, 4), the flat
    vector's tail)."""
    own = params.copy()
    own[-(100 * 4 + 4):] = state["algorithm.personal"]
    return own


@pytest.mark.parametrize("algorithm, own_model", [(DITTO, _ditto_model),
                                                  (FEDPER, _fedper_model)])
def test_a_personalised_algorithm_scores_each_clients_own_model(tiny, algorithm, own_model):
    """The personal_* columns are each client's model built from its state file (Ditto's v_k;
    FedPer's head on the global body) and scored independently; a client that never trained
    is scored with the global model."""
    result = _run(tiny, EVAL + algorithm)
    cfg = config_mod.load(TINY, tiny + EVAL + algorithm)
    handle = prepare(cfg.data, cfg.seed)
    reader = handle.open()
    rows = [r for r in pq.read_table(os.path.join(result.run_dir, "client_eval.parquet"))
            .to_pylist() if r["round"] == 3]
    state_dir = os.path.join(result.run_dir, "state")
    trained = 0
    for r in rows:
        c, x, y = r["client"], *reader.holdout(r["client"])
        files = sorted(f for f in os.listdir(os.path.join(state_dir, str(c // 1000)))
                       if f.startswith(f"{c}.r")) if os.path.isdir(state_dir) else []
        if files:
            trained += 1
            with np.load(os.path.join(state_dir, str(c // 1000), files[-1])) as z:
                v = own_model(z, result.params)
        else:
            v = result.params
        assert r["personal_accuracy"] == _accuracy(_module(cfg, handle, v), reader, x, y)
        assert r["accuracy"] == _accuracy(_module(cfg, handle, result.params), reader, x, y)
    assert trained and [r["personal_accuracy"] for r in rows] != [r["accuracy"] for r in rows]
    final = result.metrics.to_pylist()[-1]
    assert final["personal_accuracy_mean"] == pytest.approx(
        np.mean([r["personal_accuracy"] for r in rows]))


@pytest.mark.parametrize("algorithm", [
    DITTO, ["algorithm.name=fedrep", "model.name=mlp", "clients_per_round=10"],
    ["algorithm.name=pfedme", "clients_per_round=10"],
    ["algorithm.name=apfl", "algorithm.alpha=0.5", "algorithm.adaptive=true",
     "clients_per_round=10"],
    ["algorithm.name=fedproto", "model.name=mlp", "clients_per_round=10"]],
    ids=lambda a: a[0].split("=")[1])
def test_personal_scores_do_not_depend_on_the_actor_count(tiny, ray_local, algorithm):
    """One worker (this process) and two actors: the same model and personal scores."""
    one = _run(tiny, EVAL + algorithm + ["name=one"])
    two = _run(tiny, EVAL + algorithm + ["runtime.num_actors=2", "name=two"], executor="ray")
    assert one.summary["model_sha256"] == two.summary["model_sha256"]
    tables = [pq.read_table(os.path.join(r.run_dir, "client_eval.parquet")).to_pylist()
              for r in (one, two)]
    assert tables[0] == tables[1]
    assert all(r["personal_accuracy"] is not None for r in tables[0])


def test_finetuning_is_refused_beside_a_personalised_algorithm():
    with pytest.raises(ConfigError, match="eval.finetune_steps.*ditto"):
        config_mod.load(TINY, [*EVAL, *DITTO, "eval.finetune_steps=3"])
