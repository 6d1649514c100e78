"""A generated corpus of malformed configs, overrides, files and run directories.

Every case goes through the CLI in this process and must end with exit status 2, exactly one
line on stderr naming the key, no run directory, and Ray never touched. Most cases are generated
from the schema itself (every typed key × values of the wrong kind, NaN/inf, out of range);
the rest are the files and directories a user gets wrong.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import types
from typing import Literal, Union, get_args, get_origin, get_type_hints

import pytest

from rayfl import config, rundir
from rayfl import registry as components
from rayfl.algorithms import registry
from rayfl.cli import main
from rayfl.config import Config
from tests.conftest import TINY

WRONG = {  # YAML text of values each type must refuse
    int: ["abc", "1.5", ".nan", ".inf", "-.inf", "[1, 2]", "{a: 1}", "true"],
    float: ["abc", ".nan", ".NaN", ".inf", "-.inf", "[1]", "{a: 1}", "false", "1e999"],
    bool: ["5", "abc", "[true]", "{a: 1}"],
    str: ["5", "[a]", "{a: 1}", "true"],
}


def _base(tp):
    if get_origin(tp) in (Union, types.UnionType):
        (inner,) = [a for a in get_args(tp) if a is not type(None)]
        return inner
    return tp


def _schema_cases(cls, prefix: str, extra: tuple[str, ...] = ()):
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        tp = _base(hints[f.name])
        if dataclasses.is_dataclass(tp):
            yield from _schema_cases(tp, key + ".", extra)
            continue
        if get_origin(tp) is Literal:
            values = ["not-a-choice", "5", "[x]"]
        elif get_origin(tp) is list:
            values = ["abc", "{a: 1}", "[abc]"]
        else:
            values = list(WRONG.get(tp, []))
        lo, hi = f.metadata.get("lo"), f.metadata.get("hi")
        if tp in (int, float) and lo is not None:
            values.append(repr(lo if f.metadata.get("lo_open") else lo - 1))
        if tp in (int, float) and hi is not None:
            above = hi + 1 if hi + 1 > hi else hi * 2  # a float too large for + 1 to move
            values.append(repr(hi if f.metadata.get("hi_open") else above))
        for v in values:
            yield pytest.param([*extra, f"{key}={v}"], key, id=f"{key}={v}")


def _algorithm_cases():
    for name in registry.names():
        for case in _schema_cases(registry.get(name).Params, "algorithm.",
                                  (f"algorithm.name={name}",)):
            yield case


def _wrapper_cases():
    """Each server wrapper's keys, set by its name (``wrappers.ima.window=...``), refused on its
    entry (``wrappers[0].window``)."""
    for name in components.names("wrapper"):
        params = components.resolve("wrapper", name).Params
        for case in _schema_cases(params, f"wrappers.{name}."):
            argv, key = case.values
            yield pytest.param(argv, key.replace(f"wrappers.{name}.", "wrappers[0]."),
                               id=case.id)


def _selector_cases():
    for name in components.names("selector"):
        params = components.params_class(components.resolve("selector", name))
        if params is not None:
            yield from _schema_cases(params, "selection.", (f"selection.name={name}",))


SCHEMA_CASES = [c for c in _schema_cases(Config, "") if not c.values[1].startswith(
    "algorithm.")] + list(_algorithm_cases()) + list(_wrapper_cases()) + list(_selector_cases())

HAND_CASES = [
    (["algorithm=5"], "algorithm"),
    (["algorithm=[scaffold]"], "algorithm"),
    (["algorithm=nosuch"], "algorithm.name"),
    (["algorithm.name=5"], "algorithm.name"),
    (["local.lr=[1,"], "local.lr"),
    (["local.lr={a: 1"], "local.lr"),
    (["local.lr=a: b: c"], "local.lr"),
    (["local.lr='unclosed"], "local.lr"),
    (["local.lr=*anchor"], "local.lr"),
    (["name=a/b"], "name"),
    (["name=../../escape"], "name"),
    (["name=.."], "name"),
    (["name=.hidden"], "name"),
    (["name=" + "x" * 300], "name"),
    (["name=a b"], "name"),
    (["name="], "name"),
    (["seed=18446744073709551616"], "seed"),
    (["seed=-1"], "seed"),
    (["data.num_clients=1e15"], "data.num_clients"),
    (["data.samples_per_client=1e12"], "data.samples_per_client"),
    (["data.features=1e9"], "data.features"),
    (["data.classes=1e10"], "data.classes"),
    (["data.test_samples=1e13"], "data.test_samples"),
    (["data.num_clients=1e9", "data.samples_per_client=1000"], "data.num_clients"),
    (["data.partition=shards", "data.shards_per_client=1e12"], "data.shards_per_client"),
    (["data.partition=iid", "data.num_clients=1e7", "data.dataset=digits"], "data.num_clients"),
    (["availability.model=diurnal", "availability.zones=1e12"], "availability.zones"),
    (["model.name=mlp", "model.hidden=[100, 1e9]"], "model.hidden"),
    (["runtime.num_actors=1e6", "runtime.logical_shards=1e6"], "runtime.num_actors"),
    (["runtime.num_actors=1000", "runtime.logical_shards=1000",
      "runtime.cpus_per_actor=0.001"], "runtime.num_actors"),
    (["runtime.address=http://head:6379"], "runtime.address"),
    (["runtime.address=head:99999"], "runtime.address"),
    (["runtime.address=two words"], "runtime.address"),
    (["runtime.address=head:port"], "runtime.address"),
    (["runtime.address=''"], "runtime.address"),
    (["wrappers.ima.start=4"], "wrappers[0].start"),
    (["wrappers.ima.start=100"], "wrappers[0].start"),
    (["wrappers=[{name: nope}]"], "wrappers[0].name"),
    (["wrappers=[ima, {name: ima, window: 0}]"], "wrappers[1].window"),
    (["wrappers.ima=3"], "wrappers.ima"),
    (["algorithm.name=fedmsi", "algorithm.dense_max_clients=0", "algorithm.knn=20"],
     "algorithm.knn"),
    (["algorithm.name=fedmsi", "algorithm.dense_max_clients=5", "algorithm.knn=500"],
     "algorithm.knn"),
    (["aggregation.weighting=degree"], "aggregation.weighting"),
    (["algorithm.name=scaffold", "aggregation.weighting=degree"], "aggregation.weighting"),
    (["clients_per_round=21"], "clients_per_round"),
    (["keep.rounds=[7]"], "keep.rounds"),
    (["model.hidden=[1000000000]", "model.name=mlp"], "model.hidden"),
    (["data.num_clients=100000", "data.dataset=digits"], "data.num_clients"),
    (["availability.model=trace"], "availability.trace_path"),
    (["availability.model=trace", "availability.trace_path=/nonexistent.csv"],
     "availability.trace_path"),
    (["availability.capacity_path=/etc/hostname"], "availability.capacity_path"),
    (["rounds=1", "--max-rounds", "0"], "--max-rounds"),
    (["--max-rounds=-3"], "--max-rounds"),
    (["nokey"], "nokey"),
    (["rounds.sub=1"], "rounds.sub"),
    (["local=5"], "local"),
    (["data=[1]"], "data"),
    (["wrappers=5"], "wrappers"),
    (["runtime.nonsense=1"], "runtime.nonsense"),
    (["local.lr=1e-3x"], "local.lr"),
    (["local.lr=\x00"], "local.lr"),
    (["output_dir=a\x00b"], "output_dir"),
    (["output_dir=/" + "a" * 300], "output_dir"),
    (["output_dir=/tmp/" + "/".join(["b" * 200] * 25)], "output_dir"),
    (["--run-dir=/tmp/" + "c" * 300], "--run-dir"),
    (["local.epochs=1e9"], "local.epochs"),
    (["local.steps=1e9"], "local.steps"),
    (["rounds=1e300"], "rounds"),
    (["model.name=fmnist_cnn"], "model.name"),  # an image CNN on 16 tabular features
    (["runtime.cpus_per_actor=1e6"], "runtime.cpus_per_actor"),
    (["data.cache_dir=/proc/rayfl-cache"], "data.cache_dir"),
    (["--run-dir=/proc/rayfl-run"], "--run-dir"),
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


def _refused(argv, key, tmp_path, capsys, cache, run_dir=None):
    runs = tmp_path / "runs"
    before = sorted(os.listdir(run_dir)) if run_dir and os.path.isdir(run_dir) else None
    try:
        code = main([*argv[:2], f"output_dir={runs}", f"data.cache_dir={cache}", *argv[2:]]
                    if argv[0] == "run" else argv)
    except SystemExit as e:  # argparse's own errors exit 2 as well
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1, err
    assert f"'{key}'" in err[0] or key in err[0], err
    assert not runs.exists()
    if run_dir is not None:
        assert (sorted(os.listdir(run_dir)) if os.path.isdir(run_dir) else None) == before
    return err[0]


@pytest.mark.parametrize("overrides, key", SCHEMA_CASES + [
    pytest.param(o, k, id=" ".join(o)[:60].encode("unicode_escape").decode())
    for o, k in HAND_CASES])
def test_malformed_override_is_refused(overrides, key, tmp_path, capsys, cache, no_ray):
    _refused(["run", TINY, *overrides], key, tmp_path, capsys, cache)


@pytest.mark.parametrize("argv, key", [
    (["fly"], "'fly'"), (["compare"], "config"), (["analyze", "nope"], "'nope'"),
    (["resume", "x", "--max-rounds", "abc"], "--max-rounds"),
    (["run", "c.yaml", "--nosuch"], "--nosuch"), (["data", "c.yaml", "--rounds", "x"], "--rounds")])
def test_command_line_usage_errors_are_one_line(argv, key, tmp_path, capsys, cache, no_ray):
    line = _refused(argv, key, tmp_path, capsys, cache)
    assert line.endswith("--help)") and not line.startswith("usage")


def test_corpus_holds_at_least_200_inputs():
    assert len(SCHEMA_CASES) + len(HAND_CASES) + len(FILE_CASES) >= 200


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(path)


FILE_CASES = [
    ("empty.yaml", b"", "config"),
    ("comments.yaml", "# only a comment\n\n# another\n", "config"),
    ("binary.yaml", bytes(range(256)) * 4, "config"),
    ("nul.yaml", b"rounds: 3\x00\n", "config"),
    ("deep.yaml", "a: " + "[" * 3000 + "]" * 3000 + "\n", "config"),
    ("deepmap.yaml", "".join(f"{' ' * i}k{i}:\n" for i in range(1500)) + " " * 1500 + "v: 1\n",
     "config"),
    ("dup.yaml", "rounds: 3\nrounds: 4\n", "rounds"),
    ("dupnested.yaml", "local:\n  lr: 0.1\n  lr: 0.2\n", "lr"),
    ("list.yaml", "- rounds: 3\n", "config"),
    ("scalar.yaml", "just a string\n", "config"),
    ("tabs.yaml", "local:\n\tlr: 0.1\n", "config"),
    ("unclosed.yaml", "local: {lr: 0.1\n", "config"),
    ("algo5.yaml", "algorithm: 5\n", "algorithm"),
    ("algolist.yaml", "algorithm: [scaffold]\n", "algorithm"),
    ("nan.yaml", "local:\n  lr: .nan\n", "local.lr"),
    ("inf.yaml", "runtime:\n  cpus_per_actor: .inf\n", "runtime.cpus_per_actor"),
    ("sci_bad.yaml", "local:\n  lr: 1e-3e\n", "local.lr"),
    ("latin1.yaml", "name: caf\xe9\n".encode("latin-1"), "config"),
    ("laughs.yaml", "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(  # 9^9 values by aliases
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi")), "config"),
    ("selfalias.yaml", "rounds: &a [*a]\n", "config"),
    ("intkey.yaml", "1: 2\nbogus: 3\n", "1"),  # a number key beside an unknown key
]


@pytest.mark.parametrize("name, data, key", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_malformed_config_file_is_refused(name, data, key, tmp_path, capsys, cache, no_ray):
    _refused(["run", _write(tmp_path, name, data)], key, tmp_path, capsys, cache)


def test_scientific_notation_and_scalar_algorithm_are_read_as_meant(tmp_path):
    from rayfl import config

    path = _write(tmp_path, "sci.yaml", open(TINY).read() + "algorithm: scaffold\n"
                  "loss_ceiling: 1e+4\n")
    cfg = config.load(path, ["local.lr=1e-3", "local.weight_decay=5E-4", "algorithm.server_lr=2e0"])
    assert (cfg.local.lr, cfg.local.weight_decay) == (0.001, 0.0005)
    assert cfg.algorithm.name == "scaffold" and cfg.algorithm.params.server_lr == 2.0
    assert cfg.loss_ceiling == 1e4


GARBAGE = [b"", b"not a pickle at all", pickle.dumps([1, 2, 3]), pickle.dumps({"x": 1}),
           bytes(range(256))]


@pytest.mark.parametrize("blob", GARBAGE, ids=range(len(GARBAGE)))
@pytest.mark.parametrize("dataset, folder, files", [
    ("cifar10", "cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]),
    ("cifar100", "cifar-100-python", ["train", "test"]),
])
def test_garbage_dataset_file_is_named(dataset, folder, files, blob, tmp_path, capsys, cache,
                                       no_ray):
    root = tmp_path / "data" / folder
    root.mkdir(parents=True)
    for f in files:
        (root / f).write_bytes(blob)
    line = _refused(["run", TINY, f"data.dataset={dataset}", f"data.root={tmp_path / 'data'}",
                     "model.name=logreg", "data.partition=iid"], "data.root", tmp_path, capsys,
                    cache)
    assert files[0] in line


@pytest.mark.parametrize("blob", GARBAGE + [b"client_id,online_start\n1,2\n",
                                            b"client_id,online_start,online_end\nx,y,z\n"],
                         ids=range(len(GARBAGE) + 2))
@pytest.mark.parametrize("suffix, key", [(".csv", "availability.trace_path"),
                                         (".pkl", "availability.trace_path"),
                                         (".parquet", "availability.trace_path"),
                                         (".pkl", "availability.capacity_path")])
def test_garbage_availability_file_is_named(suffix, key, blob, tmp_path, capsys, cache, no_ray):
    path = _write(tmp_path, "f" + suffix, blob)
    over = ["availability.model=trace", f"availability.trace_path={path}"] \
        if key.endswith("trace_path") else [f"availability.capacity_path={path}"]
    line = _refused(["run", TINY, *over], key, tmp_path, capsys, cache)
    assert path in line


def test_run_dir_that_is_a_file_or_holds_other_files_is_refused(tmp_path, capsys, cache, no_ray):
    a_file = tmp_path / "file"
    a_file.write_text("mine")
    _refused(["run", TINY, f"--run-dir={a_file}"], "--run-dir", tmp_path, capsys, cache)
    assert a_file.read_text() == "mine"
    theirs = tmp_path / "theirs"
    (theirs / "state").mkdir(parents=True)
    (theirs / "state" / "keep.txt").write_text("precious")
    (theirs / "metrics.parquet").write_text("not ours")
    _refused(["run", TINY, f"--run-dir={theirs}"], "--run-dir", tmp_path, capsys, cache,
             run_dir=str(theirs))
    assert (theirs / "state" / "keep.txt").read_text() == "precious"
    assert (theirs / "metrics.parquet").read_text() == "not ours"


def test_cache_dir_that_is_a_file_is_refused(tmp_path, capsys, cache, no_ray):
    a_file = tmp_path / "file"
    a_file.write_text("mine")
    line = _refused(["run", TINY, f"data.cache_dir={a_file}"], "data.cache_dir", tmp_path,
                    capsys, cache)
    assert str(a_file) in line and a_file.read_text() == "mine"


@pytest.mark.parametrize("flag, value", [("--max-clients", "-5"), ("--max-clients", "0"),
                                         ("--rounds", "-1"), ("--clients", "-2")])
def test_data_command_refuses_counts_below_range(flag, value, tmp_path, capsys, cache, no_ray):
    out = tmp_path / "data-out"
    _refused(["data", TINY, f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={cache}",
              "--out", str(out), flag, value], flag, tmp_path, capsys, cache)
    assert not out.exists()


def test_resume_of_a_directory_without_a_run_is_refused(tmp_path, capsys, cache, no_ray):
    (tmp_path / "empty").mkdir()
    _refused(["resume", str(tmp_path / "empty")], "run_dir", tmp_path, capsys, cache,
             run_dir=str(tmp_path / "empty"))


@pytest.mark.parametrize("blob", [b"", b"PAR1garbagePAR1", b"not parquet"])
def test_resume_with_garbage_metrics_is_refused(blob, tmp_path, capsys, cache, no_ray):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(open(TINY).read())
    rundir.write_fingerprint(str(run_dir), config.to_dict(config.load(TINY)))
    (run_dir / "metrics.parquet").write_bytes(blob)
    line = _refused(["resume", str(run_dir)], "run_dir", tmp_path, capsys, cache,
                    run_dir=str(run_dir))
    assert "metrics.parquet" in line


@pytest.mark.parametrize("address", ["127.0.0.1:1", "ray://127.0.0.1:1", "localhost:9"])
def test_unreachable_address_is_an_error_within_the_timeout(address, tmp_path, capsys, cache,
                                                            monkeypatch):
    import ray

    def no_init(*_a, **_k):
        raise AssertionError("ray.init was reached")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", no_init)
    line = _refused(["run", TINY, f"runtime.address={address}",
                     "runtime.connect_timeout_s=1"], "runtime.address", tmp_path, capsys, cache)
    assert "reachable" in line


VALID = {  # the smallest well-formed file of each pickled format
    "cifar10": {b"data": [[0] * 3072, [255] * 3072], b"labels": [0, 9]},
    "trace": {7: {"active": [0.0, 30.0], "inactive": [10.0, 40.0], "finish_time": 60.0}},
    "capacity": {7: {"computation": 12.0, "communication": 800.0}},
}


class _Calls:
    """Pickles as a call of ``fn(*args)``: what a pickle that runs code looks like."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def _broken_pickles(fmt: str, sentinel: str) -> list[bytes]:
    """Truncated copies of a valid file, and files that would create ``sentinel`` if loaded with
    ``pickle.load`` (at the top, nested in a value, through ``eval``)."""
    good = pickle.dumps(VALID[fmt], protocol=2)
    mkdir = _Calls(os.mkdir, sentinel)
    nested = {k: (mkdir if i == 0 else v) for i, (k, v) in enumerate(VALID[fmt].items())}
    return [good[:len(good) // 2], good[:-1], good[:3], pickle.dumps(mkdir),
            pickle.dumps(nested, protocol=0), pickle.dumps(nested, protocol=5),
            pickle.dumps(_Calls(eval, f"__import__('os').mkdir({sentinel!r})")),
            pickle.dumps([VALID[fmt], _Calls(os.mkdir, sentinel)])]


def _refused_pickle(fmt, blob, tmp_path, capsys, cache):
    """Run with ``blob`` as every CIFAR-10 batch, the trace or the capacity file: refused."""
    if fmt == "cifar10":
        root = tmp_path / "data" / "cifar-10-batches-py"
        root.mkdir(parents=True)
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            (root / name).write_bytes(blob)
        over, key = ["data.dataset=cifar10", f"data.root={tmp_path / 'data'}",
                     "model.name=logreg", "data.partition=iid"], "data.root"
    else:
        key = f"availability.{fmt}_path"
        over = [f"{key}={_write(tmp_path, 'f.pkl', blob)}"]
        if fmt == "trace":
            over.append("availability.model=trace")
    _refused(["run", TINY, *over], key, tmp_path, capsys, cache)


@pytest.mark.parametrize("case", range(8))
@pytest.mark.parametrize("fmt", ["cifar10", "trace", "capacity"])
def test_truncated_or_code_running_pickle_is_refused_unrun(fmt, case, tmp_path, capsys, cache,
                                                           no_ray):
    sentinel = str(tmp_path / "code-ran")
    blob = _broken_pickles(fmt, sentinel)[case]
    _refused_pickle(fmt, blob, tmp_path, capsys, cache)
    assert not os.path.exists(sentinel)


def test_the_safe_unpickler_reads_what_pickle_reads():
    import io

    import numpy as np

    from rayfl import safe_pickle

    data = {b"data": np.arange(6, dtype=np.uint8).reshape(2, 3), b"labels": [1, 2],
            "t": {"active": np.array([1.5]), "finish_time": np.float64(4.0)}, "s": {1, 2}}
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        back = safe_pickle.load(io.BytesIO(pickle.dumps(data, protocol=protocol)))
        assert back[b"data"].dtype == np.uint8 and back[b"data"].tolist() == [[0, 1, 2], [3, 4, 5]]
        assert back[b"labels"] == [1, 2] and back["s"] == {1, 2}
        assert back["t"]["active"].tolist() == [1.5] and back["t"]["finish_time"] == 4.0


NONSENSE = [  # readable pickles whose values are out of the format's range
    ("cifar10", {b"data": [[0] * 3072], b"labels": [10]}),
    ("cifar10", {b"data": [[0] * 3072], b"labels": [-1]}),
    ("cifar10", {b"data": [], b"labels": []}),
    ("trace", {7: {"active": [float("nan")], "inactive": [1.0], "finish_time": 5.0}}),
    ("trace", {7: {"active": [0.0], "inactive": [float("inf")], "finish_time": 5.0}}),
    ("trace", {7: {"active": [0.0], "inactive": [1.0], "finish_time": float("nan")}}),
    ("trace", {7: {"active": [0.0], "inactive": [1.0], "finish_time": float("inf")}}),
    ("trace", {7: {"active": [], "inactive": [], "finish_time": 10.0}}),  # never online
    ("trace", {7: {"active": [5.0], "inactive": [1.0], "finish_time": 10.0}}),  # ends first
    ("capacity", {7: {"computation": float("nan"), "communication": 800.0}}),
    ("capacity", {7: {"computation": 12.0, "communication": float("inf")}}),
]


@pytest.mark.parametrize("fmt, value", NONSENSE, ids=range(len(NONSENSE)))
def test_pickle_with_values_out_of_range_is_refused(fmt, value, tmp_path, capsys, cache, no_ray):
    blob = pickle.dumps(value)
    _refused_pickle(fmt, blob, tmp_path, capsys, cache)


@pytest.mark.parametrize("row", ["7,nan,1", "7,0,inf", "7,-inf,1"])
def test_trace_table_with_non_finite_times_is_refused(row, tmp_path, capsys, cache, no_ray):
    path = _write(tmp_path, "t.csv", f"client_id,online_start,online_end\n{row}\n8,0,5\n")
    _refused(["run", TINY, "availability.model=trace", f"availability.trace_path={path}"],
             "availability.trace_path", tmp_path, capsys, cache)
