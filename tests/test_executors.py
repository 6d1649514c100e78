"""Executors are registered components: the thread pool gives every other executor's bytes, a
user's executor is a class and a registry line, a bad name is one line."""

from __future__ import annotations

import os
import re
import threading

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import rayfl
from rayfl import registry
from rayfl.algorithms.fedavg import FedAvg
from rayfl.cli import main
from rayfl.contract import ComponentError
from rayfl.runtime.executors import InProcessExecutor
from tests.conftest import ROOT, TINY

CASES = {
    "scaffold": ["algorithm.name=scaffold"],  # client state, read back by whichever thread
    "topk_ef": ["compression.method=topk", "compression.fraction=0.25",
                "compression.error_feedback=true"],
    "fedmsi_setup": ["algorithm.name=fedmsi"],  # client_setup summaries, split over threads
    "power_of_choice": ["selection.name=power_of_choice", "selection.candidates=12"],
    "ditto_client_eval": ["algorithm.name=ditto", "data.client_holdout=0.25",
                          "eval.clients=6"],
    "fedbuff": ["aggregation.mode=fedbuff", "aggregation.concurrency=8",  # waves, stale sums
                "aggregation.buffer_size=3", "availability.dropout=0.2"],
}


def _run(tiny, executor: str, extra: list[str], name: str):
    return rayfl.run(TINY, tiny + ["rounds=3", f"runtime.executor={executor}", f"name={name}",
                                   *extra], quiet=True)


def _client_eval(result):
    path = os.path.join(result.run_dir, "client_eval.parquet")
    return pq.read_table(path).to_pylist() if os.path.exists(path) else None


@pytest.mark.parametrize("case", CASES)
def test_threads_give_the_in_process_bytes(tiny, case):
    base = _run(tiny, "inprocess", CASES[case], "base")
    for threads in (2, 3):  # an even and an uneven split of the groups
        got = _run(tiny, "threads", [*CASES[case], f"runtime.num_actors={threads}"],
                   f"threads{threads}")
        assert got.summary["model_sha256"] == base.summary["model_sha256"]
        assert _client_eval(got) == _client_eval(base)
        if case == "fedbuff":  # a row reports the waves trained since, not the buffer's
            continue
        rows = got.metrics.to_pylist()  # one report per thread that trained, as per actor
        assert all(1 <= len(r["actor_train_s"]) <= threads for r in rows)
        assert all(sum(r["actor_samples"]) == r["samples"] for r in rows)


def test_threads_give_the_ray_actors_bytes(tiny, ray_local):
    extra = ["algorithm.name=scaffold", "runtime.num_actors=2"]
    assert _run(tiny, "threads", extra, "threads").summary["model_sha256"] == \
        _run(tiny, "ray", extra, "ray").summary["model_sha256"]


class FailsOnEvenClients(FedAvg):
    """Raises on every even client from round 2 on (the pre-flight trains one client of round
    1, in this process): several groups fail at once, on every worker."""

    def client_train(self, task, ctx):
        if task.t >= 1 and task.client_id % 2 == 0:
            raise ValueError(f"client {task.client_id} refuses")
        return super().client_train(task, ctx)


def test_threads_and_actors_raise_the_error_the_in_process_executor_raises(tiny, ray_local):
    """Several groups fail at once, on every worker: each executor raises the lowest group's
    error, the one the in-process executor (groups in order) meets first."""
    registry.register_algorithm(FailsOnEvenClients, name="fails_on_even")
    try:
        errors = []
        for executor in ("inprocess", "threads", "ray"):
            with pytest.raises(ComponentError) as e:
                _run(tiny, executor, ["algorithm.name=fails_on_even", "clients_per_round=10",
                                      "runtime.num_actors=3", "runtime.cpus_per_actor=0.5"],
                     executor)
            errors.append(str(e.value))
    finally:
        registry.unregister("algorithm", "fails_on_even")
    assert errors[0] == errors[1] == errors[2] and "refuses" in errors[0]


def _page_executor():
    """The executor of docs/concepts/executors.md, as written there (it registers itself; the
    page's run of it is the README test's)."""
    with open(os.path.join(ROOT, "docs", "concepts", "executors.md")) as f:
        (block,) = [b for b in re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)
                    if "class GroupsBackwards" in b]
    scope: dict = {}
    exec(block.split("\nresult = ")[0], scope)
    return scope["GroupsBackwards"]


def test_the_pages_executor_gives_the_in_process_bytes(tiny, monkeypatch):
    try:
        page = _page_executor()
        assert registry.resolve("executor", "backwards") is page
        order, run = [], page.run
        monkeypatch.setattr(page, "run", lambda self, t, bc, lr, groups, *rest: order.append(
            [g for g, _ in groups]) or run(self, t, bc, lr, groups, *rest))
        got = _run(tiny, "backwards", CASES["scaffold"], "mine")
    finally:
        registry.unregister("executor", "backwards")
    assert len(order) == 3 and all(len(o) > 1 for o in order)
    assert [len(r["actor_train_s"]) for r in got.metrics.to_pylist()] == \
        [len(o) for o in order]  # one report per group: it ran them one call each
    assert got.summary["model_sha256"] == \
        _run(tiny, "inprocess", CASES["scaffold"], "base").summary["model_sha256"]


class OneAtATime(InProcessExecutor):
    """A user's executor named by reference: each group in a call of its own."""

    def run(self, t, bc, lr, groups, keep_dir, round_clients):
        one_each = super().run
        return [r for g in groups for r in one_each(t, bc, lr, [g], keep_dir, round_clients)]


def test_an_executor_named_by_reference(tiny):
    got = _run(tiny, "tests.test_executors:OneAtATime", [], "mine")
    assert all(len(r["actor_train_s"]) > 1 for r in got.metrics.to_pylist())
    assert got.summary["model_sha256"] == _run(tiny, "inprocess", [], "base").summary[
        "model_sha256"]


class NotAnExecutor:
    """Has neither on_ray nor build."""


@pytest.mark.parametrize("value, expected", [
    ("thread", "expected one of inprocess, ray, threads, or a package.module:Name reference"),
    ("tests.test_executors:NotAnExecutor", "expected an executor: a class with on_ray (True or "
                                           "False) and a classmethod build(hosting)"),
])
def test_a_bad_executor_is_one_line_and_nothing_is_made(tmp_path, capsys, value, expected,
                                                       no_ray):
    code = main(["run", TINY, f"output_dir={tmp_path / 'runs'}",
                 f"data.cache_dir={tmp_path / 'cache'}", f"runtime.executor={value}"])
    err = capsys.readouterr().err.splitlines()
    assert code == 2
    assert err == [f"rayfl: error: config key 'runtime.executor' = '{value}': {expected}"]
    assert not (tmp_path / "runs").exists()


def test_every_builtin_executor_answers_every_call_the_runtime_makes():
    import inspect

    from rayfl.runtime.loop import Executor

    calls = [n for n, v in vars(Executor).items() if callable(v) and not n.startswith("_")]
    assert sorted(calls) == ["client_losses", "client_scores", "run", "summaries"]
    for name in registry.names("executor"):
        kind = registry.resolve("executor", name)
        assert isinstance(kind.on_ray, bool) and inspect.ismethod(kind.build), name
        for call in calls:
            assert list(inspect.signature(getattr(kind, call)).parameters) == \
                list(inspect.signature(getattr(Executor, call)).parameters), (name, call)


class LosesAGroup(InProcessExecutor):
    """Trains every group but the first: the round would be wrong without a word."""

    def run(self, t, bc, lr, groups, keep_dir, round_clients):
        return super().run(t, bc, lr, groups[1:], keep_dir, round_clients)


class ReportsNothing(InProcessExecutor):
    """Returns something that is not a list of reports."""

    def run(self, t, bc, lr, groups, keep_dir, round_clients):
        return {"sums": []}


@pytest.mark.parametrize("executor, problem", [
    ("LosesAGroup", r"returned the sums of groups \[1, 2, 3, 4\]; expected each group it was "
                    r"sent \(\[0, 1, 2, 3, 4\]\) once"),
    ("ReportsNothing", r"returned a dict; expected a list of reports, dicts with the keys sums, "
                       r"written, seconds, peak_rss_mb, private_mb"),
])
def test_an_executor_that_breaks_its_contract_is_named(tiny, executor, problem):
    with pytest.raises(ComponentError, match=rf"^tests\.test_executors:{executor}\.run "
                                             rf"\(round 1\): {problem}$"):
        _run(tiny, f"tests.test_executors:{executor}", [], "broken")


class BuildRaises(InProcessExecutor):
    @classmethod
    def build(cls, hosting):
        raise ValueError("no workers today")


class BuildsNothing(InProcessExecutor):
    @classmethod
    def build(cls, hosting):
        return None


class BuildOnAnInstance(InProcessExecutor):
    def build(self, hosting):  # not a classmethod
        return self


class RunRaises(InProcessExecutor):
    def run(self, t, bc, lr, groups, keep_dir, round_clients):
        raise RuntimeError("lost the groups")


class SumsOfNothing(InProcessExecutor):
    def run(self, t, bc, lr, groups, keep_dir, round_clients):
        return [{**r, "sums": None} for r in super().run(t, bc, lr, groups, keep_dir,
                                                        round_clients)]


class LossesOfOthers(InProcessExecutor):
    def client_losses(self, point, client_ids, batch_size, buffers=None):
        return np.zeros(len(client_ids) + 3)


def _cli(tmp_path, capsys, *overrides):
    code = main(["run", TINY, f"output_dir={tmp_path / 'runs'}",
                 f"data.cache_dir={tmp_path / 'cache'}", "rounds=2", *overrides])
    return code, capsys.readouterr().err.splitlines()


REF = "tests.test_executors:"


@pytest.mark.parametrize("executor, line", [
    ("BuildRaises", f"{REF}BuildRaises.build: raised ValueError: no workers today"),
    ("BuildsNothing", f"{REF}BuildsNothing.build: returned None; expected an executor answering "
                      "run, summaries, client_scores, client_losses (it lacks run, summaries, "
                      "client_scores, client_losses)"),
    ("BuildOnAnInstance", f"config key 'runtime.executor' = '{REF}BuildOnAnInstance': expected "
                          "an executor: a class with on_ray (True or False) and a classmethod "
                          "build(hosting)"),
])
def test_an_executor_that_cannot_be_built_is_refused_before_anything_is_made(
        tmp_path, capsys, executor, line):
    code, err = _cli(tmp_path, capsys, f"runtime.executor={REF}{executor}")
    assert code == 2 and err[0] == f"rayfl: error: {line}", err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("executor, extra, line", [
    ("RunRaises", [], "RunRaises.run (round 1): raised RuntimeError: lost the groups"),
    ("SumsOfNothing", [], "SumsOfNothing.run (round 1): returned a report (#0) whose 'sums' is "
                          "None; expected a list of (group, PartialSum) pairs"),
    ("LossesOfOthers", ["selection.name=power_of_choice", "selection.candidates=12"],
     "LossesOfOthers.client_losses (round 1): returned a float64 array of shape (15,); expected a "
     "numeric array of shape (12,) for its 12 clients"),
])
def test_an_executor_that_answers_out_of_shape_is_named(tmp_path, capsys, executor, extra,
                                                        line):
    code, err = _cli(tmp_path, capsys, f"runtime.executor={REF}{executor}", *extra)
    assert code == 2 and err[0] == f"rayfl: error: {REF}{line}", err


def test_registering_something_that_is_not_an_executor_is_refused():
    with pytest.raises(ValueError, match=r"cannot be registered as 'executor': expected an "
                                         r"executor class \(got an int\)"):
        rayfl.register_executor(3, name="three")
    with pytest.raises(ValueError, match=r"register an executor with a name"):
        rayfl.register_executor(OneAtATime, name="")
    assert "three" not in registry.names("executor")


@pytest.mark.parametrize("executor", ["inprocess", "threads"])
def test_a_run_in_this_process_leaves_its_torch_threads_and_generators_as_they_were(
        tiny, executor):
    import torch

    torch.set_num_threads(2)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    _run(tiny, executor, ["runtime.cpus_per_actor=1"], executor)
    assert torch.get_num_threads() == 2 and torch.equal(torch.get_rng_state(), before)


class DropNet(torch.nn.Module):
    """A user's model with dropout: its training forward draws from torch's generator."""

    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(input_shape[0], 32),
                                       torch.nn.ReLU(), torch.nn.Dropout(0.5),
                                       torch.nn.Linear(32, num_classes))

    def forward(self, x):
        return self.net(x)


DROPOUT = ["model.name=tests.test_executors:DropNet", "clients_per_round=10",
           "runtime.cpus_per_actor=0.5"]


def test_a_models_dropout_gives_the_same_bytes_on_any_number_of_actors(tiny, ray_local):
    hashes = {_run(tiny, "ray", [*DROPOUT, f"runtime.num_actors={n}"], f"ray{n}")
              .summary["model_sha256"] for n in (2, 3)}
    hashes.add(_run(tiny, "inprocess", DROPOUT, "here").summary["model_sha256"])
    assert len(hashes) == 1
    other = _run(tiny, "inprocess", [*DROPOUT, "seed=1"], "seed1").summary["model_sha256"]
    assert other not in hashes  # the draws follow the run's seed


class DrawsANumber(FedAvg):
    """An algorithm whose client draws from torch's generator (and uses nothing of it)."""

    def client_train(self, task, ctx):
        torch.rand(1)
        return super().client_train(task, ctx)


@pytest.mark.parametrize("draws", [DROPOUT, ["algorithm.name=tests.test_executors:DrawsANumber",
                                              "clients_per_round=10"]],
                         ids=["dropout", "algorithm"])
def test_threads_refuse_a_run_whose_clients_draw_from_torchs_generator(tmp_path, capsys, no_ray,
                                                                        draws):
    code, err = _cli(tmp_path, capsys, "runtime.executor=threads", *draws)
    assert code == 2 and err == [
        "rayfl: error: config key 'runtime.executor' = 'threads': expected ray or inprocess: "
        "training client 10 drew from torch's random generator (a model's dropout, torch.rand in "
        "an algorithm or a layer), which this executor's workers share, so what each client "
        "drew would depend on their timing"], err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name, shape", [
    ("logreg", (20,)), ("mlp", (20,)), ("fmnist_cnn", (1, 28, 28)), ("lenet5", (1, 28, 28)),
    ("cifar_cnn", (3, 32, 32)), ("adabest_cnn", (3, 32, 32)), ("resnet18_gn", (3, 32, 32))])
def test_a_builtin_models_training_forward_draws_nothing(name, shape):
    from rayfl.models import build_model

    model = build_model(name, shape, 10).train()
    x = torch.randn(4, *shape, generator=torch.Generator().manual_seed(0))
    outs = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        outs.append(model(x))
    assert torch.equal(*outs)


def test_a_groups_sums_cross_rays_object_store_bit_for_bit(ray_local):
    """What an actor sends (:meth:`ClientWorker.train_arrays`) is what it summed: every tensor
    comes back a tensor of its dtype with its bytes, writable; numpy's dtypes travel as arrays,
    the others (bfloat16, a tensor that requires grad) as tensors."""
    import ray

    from rayfl.runtime.aggregate import PartialSum, as_array
    from rayfl.runtime.executors import tensors_of

    gen = torch.Generator().manual_seed(0)
    delta = torch.randn(1000, generator=gen)
    delta[:3] = torch.tensor([-0.0, float("nan"), float("-inf")])
    acc = PartialSum(count=2, weight_sum=3.0, delta_w=delta * 3, delta=delta.clone(),
                     extras={"half": torch.randn(7, generator=gen).half(), "n": 5,
                             "brain": torch.randn(4, generator=gen).bfloat16(),
                             "grad": torch.ones(3, requires_grad=True)},
                     rows={"r": ([4, 9], [torch.randn(2, 3, dtype=torch.float64,
                                                      generator=gen).t(),
                                          torch.arange(6, dtype=torch.int64).reshape(3, 2)])},
                     layers=[{"mask": torch.tensor([True, False])}, {}],
                     buffers_w=torch.randn(5, generator=gen), updates=[delta.clone()])
    sent = {"sums": [(1, PartialSum(**vars(acc)).map_values(as_array))], "written": [4]}
    assert isinstance(sent["sums"][0][1].delta, np.ndarray)
    assert isinstance(sent["sums"][0][1].extras["brain"], torch.Tensor)
    got = tensors_of(ray.get(ray.put(sent)))["sums"][0][1]

    def same(a, b):
        if not isinstance(b, torch.Tensor):
            return a == b
        return isinstance(a, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape \
            and a.requires_grad == b.requires_grad and bytes(
                a.detach().contiguous().view(torch.uint8).numpy()) == bytes(
                b.detach().contiguous().view(torch.uint8).numpy())

    for name in ("delta_w", "delta", "buffers_w"):
        assert same(getattr(got, name), getattr(acc, name)), name
    assert all(same(got.extras[k], v) for k, v in acc.extras.items())
    assert got.rows["r"][0] == [4, 9] and all(map(same, got.rows["r"][1], acc.rows["r"][1]))
    assert same(got.layers[0]["mask"], acc.layers[0]["mask"]) and got.layers[1] == {}
    assert same(got.updates[0], acc.updates[0])
    got.delta_w += 1  # memory of its own, not the object store's read-only view


def test_a_one_client_sum_crosses_without_its_weighted_delta_and_arrives_bit_for_bit(ray_local):
    """An answer carries a one-client sum's Δ alone (half the bytes) and the server computes
    w Δ again: the same bits as the actor's, NaN, ±inf and -0.0 included, for weights that are
    not powers of two; a sum of two clients, or of a client of weight ±0, travels whole."""
    import pickle

    import ray

    from rayfl.runtime.aggregate import PartialSum, as_array
    from rayfl.runtime.executors import tensors_of

    gen = torch.Generator().manual_seed(1)
    delta = torch.randn(10_000, generator=gen) * 1e3
    delta[:4] = torch.tensor([-0.0, float("nan"), float("-inf"), 1e-42])

    def one(weight, clients=1):
        acc = PartialSum()
        for c in range(clients):
            acc.add_client(c, delta, weight, 3, 30, 0.5, {}, [])
        return acc

    for weight in (0.37, 1 / 3, 7e-5, 123.456, -2.5):
        acc = one(weight)
        sent = PartialSum(**vars(acc)).compact().map_values(as_array)
        assert sent.delta_w is None
        assert len(pickle.dumps(sent, protocol=5)) < 0.6 * len(
            pickle.dumps(PartialSum(**vars(acc)).map_values(as_array), protocol=5))
        got = tensors_of(ray.get(ray.put({"sums": [(0, sent)]})))["sums"][0][1]
        assert bytes(got.delta_w.numpy()) == bytes(acc.delta_w.numpy()), weight
        assert bytes(got.delta.numpy()) == bytes(acc.delta.numpy())
    for whole in (one(0.37, clients=2), one(0.0), one(-0.0)):
        assert whole.compact().delta_w is not None


def test_each_client_actor_is_given_its_next_group_before_it_answers(ray_local, free_cpus):
    """Until its speed is known, each actor gets a call in hand at once: an actor's first call
    waits for its second to arrive (two at once, as client actors run), which happens only if
    the executor sends the second before the first is answered; every group is trained once,
    by one actor."""
    import threading

    import ray

    from rayfl.runtime.executors import RayExecutor

    @ray.remote(max_concurrency=2)
    class WaitsForTheNext:
        def __init__(self):
            self.second, self.lock = threading.Event(), threading.Lock()
            self.calls = 0

        def train_arrays(self, binding, t, bc, lr, groups, *rest):
            with self.lock:
                self.calls += 1
                first = self.calls == 1
            if first and not self.second.wait(timeout=60):
                raise RuntimeError("no call in hand while the first trained")
            self.second.set()
            return {"sums": [], "written": [groups[0][0]], "seconds": 0.0, "store": {},
                    "peak_rss_mb": 0.0, "private_mb": 0.0}

    actors = [WaitsForTheNext.remote() for _ in range(2)]
    try:
        groups = [(g, [(g, 1.0, -1, None)]) for g in range(5)]
        reports = RayExecutor(actors, np.ones(5, dtype=np.int64)).run(
            0, {"x": torch.zeros(2)}, 0.1, groups, None, np.arange(5))
        assert sorted(g for r in reports for g in r["written"]) == list(range(5))
        assert len(reports) == 2  # both actors trained
    finally:
        for actor in actors:
            ray.kill(actor)


def test_the_pacer_expects_an_actor_to_finish_at_its_rate_so_far():
    """Before an actor has answered, its next group goes in hand at once; then ``LEAD_S``
    before the end its rate predicts: the ratio of its seconds to its samples, earlier calls
    weighed down by ``KEEP`` each call (so a small client's fixed costs do not make a large one
    look slow)."""
    from rayfl.runtime.executors import Pacer

    pacer = Pacer(2)
    assert pacer.due(0, 5.0, 1000) == 5.0
    pacer.learn(0, 2.0, 1000)
    assert pacer.due(0, 5.0, 500) == pytest.approx(5.0 + 1.0 - Pacer.LEAD_S)
    pacer.learn(0, 0.5, 10)  # 50 ms a sample, but only 10 samples
    rate = (Pacer.KEEP * 2.0 + 0.5) / (Pacer.KEEP * 1000 + 10)
    assert pacer.due(0, 5.0, 500) == pytest.approx(5.0 + 500 * rate - Pacer.LEAD_S)
    assert pacer.due(1, 7.0, 500) == 7.0  # each actor its own


def test_no_group_waits_in_the_hand_of_an_actor_still_training_a_long_one(ray_local, free_cpus):
    """An actor expected to train for long gets no group in hand: while it trains the
    heaviest group, the other actor trains every other one. (Were a group put in its hand at
    once, the other could train only three, and the first, waiting for four, would fail.)"""
    import ray

    from rayfl.runtime.executors import RayExecutor

    @ray.remote
    class Count:
        def __init__(self):
            self.n = 0

        def add(self):
            self.n += 1

        def get(self):
            return self.n

    @ray.remote(max_concurrency=2)
    class Worker:
        def __init__(self, count):
            self.count = count

        def train_arrays(self, binding, t, bc, lr, groups, *rest):
            g = groups[0][0]
            if g == 0:  # the heaviest: done once the other actor has trained the other four
                for _ in range(6000):
                    if ray.get(self.count.get.remote()) == 4:
                        break
                    threading.Event().wait(0.01)
                else:
                    raise RuntimeError("the other actor did not train the other four groups")
            else:
                ray.get(self.count.add.remote())
            return {"sums": [], "written": [g], "seconds": 0.0, "store": {},
                    "peak_rss_mb": 0.0, "private_mb": 0.0}

    count = Count.remote()
    actors = [Worker.remote(count) for _ in range(2)]
    try:
        groups = [(g, [(g, 1.0, -1, None)]) for g in range(5)]
        executor = RayExecutor(actors, np.array([100, 1, 1, 1, 1]))
        for a in range(2):
            executor.pacer.learn(a, 3600.0, 1)  # an hour a sample: nothing is due in hand
        reports = executor.run(0, {"x": torch.zeros(2)}, 0.1, groups, None, np.arange(5))
        assert [r["written"] for r in reports] == [[0], [1, 2, 3, 4]]
    finally:
        for actor in [*actors, count]:
            ray.kill(actor)
