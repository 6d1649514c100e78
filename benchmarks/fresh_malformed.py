"""Try ~100 malformed inputs as a new user would (the CLI in a fresh process, with a time limit)
and count clear errors, tracebacks, silent acceptances and hangs.

The inputs are of kinds tests/test_malformed.py does not hold. A clear error is exit status 2,
one line on stderr, no traceback and nothing created under the output directory; exit 0 is a
silent acceptance; anything else (or a traceback) is a traceback; running past the time limit is
a hang. Usage (from the repository root, results as JSON lines on stdout, a tally at the end):

    PYTHONPATH=$PWD nice -n 19 python benchmarks/fresh_malformed.py [--timeout 90] [--only SUBSTR]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "test", "tiny.yaml")
BASE = ["rounds=1", "runtime.num_actors=1"]  # an accepted input must at least finish quickly


def _override_cases() -> list[tuple[str, list[str]]]:
    """(label, overrides after the tiny config)."""
    values = {
        "rounds": ["'3'", "~", "0"],
        "seed": ["1.5", "[]"],
        "clients_per_round": ["0", "-1", "2.5"],
        "local.lr": ["1e-400", "0.1.2", "1,5", "null", "-1e-3", "1e309", "nan", "NaN", "inf"],
        "local.batch_size": ["0", "-5", "1e10"],
        "local.epochs": ["0", "1e9"],
        "local.steps": ["0", "1.5"],
        "local.lr_decay": ["0", "-1", "nan"],
        "local.clip_norm": ["0", "-1"],
        "data.alpha": ["0", "1e-320"],
        "data.sigma": ["-1"],
        "data.min_samples": ["0", "100000"],
        "data.validation_clients": ["20", "-1"],
        "data.samples_per_client": ["0"],
        "data.test_samples": ["0"],
        "availability.mean": ["1.5"],
        "availability.dropout": ["1.0", "1.5"],
        "availability.overcommit": ["0.5", "1e9"],
        "availability.deadline_s": ["0"],
        "eval.every": ["0"],
        "eval.batch_size": ["0"],
        "eval.last_k": ["0"],
        "eval.target_accuracy": ["1.5"],
        "checkpoint.every": ["0"],
        "keep.last": ["-1", "1e9"],
        "runtime.actor_timeout_s": ["0", "nan"],
        "runtime.max_actor_restarts": ["-2"],
        "runtime.connect_timeout_s": ["0", "inf"],
        "runtime.storage": ["ftp://host/x", "s3://", "hdfs://"],
        "runtime.address": ["[::1]:6379", ":6379", "ray://", "host:-1"],
        "output_dir": ["/proc/1/nope", "/dev/null", "/" + "a" * 5000],
        "name": ["a\tb", "x" * 101],
        "loss_ceiling": ["0", "nan"],
    }
    cases = [(f"{k}={v}", [f"{k}={v}"]) for k, vs in values.items() for v in vs]
    cases += [
        ("override without =", ["rounds"]),
        ("override =5", ["=5"]),
        ("override key trailing dot", ["local.=1"]),
        ("override empty segment", ["local..lr=1"]),
        ("override upper case", ["LOCAL.LR=0.1"]),
        ("override python tag", ["local.lr=!!python/object/apply:os.system ['true']"]),
        ("override yaml tag float", ["rounds=!!float 3"]),
        ("privacy with bad sampling", ["privacy.sampling=sometimes"]),
        ("server_opt unknown name", ["server_opt.name=lamb"]),
        ("transforms not a list", ["aggregation.transforms=5"]),
        ("transforms unknown", ["aggregation.transforms=[{name: nosuch}]"]),
        ("transforms entry not a map", ["aggregation.transforms=[5]"]),
        ("model.groups not dividing", ["model.name=resnet18_gn", "model.groups=7"]),
        ("hidden empty", ["model.name=mlp", "model.hidden=[]"]),
        ("hidden zero", ["model.name=mlp", "model.hidden=[0]"]),
    ]
    return cases


def _files(tmp: str) -> list[tuple[str, list[str]]]:
    """(label, argv) of broken files and directories, written under ``tmp``."""
    def write(name, data):
        path = os.path.join(tmp, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())
        return path

    with open(TINY) as f:
        tiny = f.read()
    laughs = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi"))
    cifar = os.path.join(tmp, "cifar-gz", "cifar-10-batches-py")
    os.makedirs(cifar, exist_ok=True)
    blob = gzip.compress(pickle.dumps({b"data": [[0] * 3072], b"labels": [0]}))
    for n in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        write(os.path.join(cifar, n), blob)
    wrong_shape = os.path.join(tmp, "cifar-shape", "cifar-10-batches-py")
    os.makedirs(wrong_shape, exist_ok=True)
    for n in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        write(os.path.join(wrong_shape, n), pickle.dumps({b"data": [[0] * 100], b"labels": [0]}))
    loop = os.path.join(tmp, "loop")
    if not os.path.islink(loop):
        os.symlink(loop, loop)
    cifar_args = ["model.name=logreg", "data.partition=iid"]
    out = [
        ("config is a directory", ["run", tmp]),
        ("config with BOM", ["run", write("bom.yaml", b"\xef\xbb\xbf" + tiny.encode())]),
        ("config billion laughs", ["run", write("laughs.yaml", tiny + laughs)]),
        ("config python tag", ["run", write("tag.yaml", tiny + "x: !!python/object/apply:os.system"
                                            " ['touch /tmp/rayfl-pwned']\n")]),
        ("config utf16 without BOM", ["run", write("u16.yaml", tiny.encode("utf-16-le"))]),
        ("config gz", ["run", write("c.yaml.gz", gzip.compress(tiny.encode()))]),
        ("config json list", ["run", write("c.json", "[1, 2]")]),
        ("config unknown top key", ["run", write("k.yaml", tiny + "roundz: 3\n")]),
        ("config merge key", ["run", write("m.yaml", tiny + "<<: {rounds: 2}\n")]),
        ("config null section", ["run", write("n.yaml", tiny.replace("local:\n", "local: ~\nx:\n"))]),
        ("config huge line", ["run", write("h.yaml", tiny + "name: " + "a" * 2_000_000 + "\n")]),
        ("config is a fifo-less symlink loop", ["run", loop]),
        ("cifar gz pickle", ["run", TINY, "data.dataset=cifar10",
                             f"data.root={os.path.dirname(cifar)}", *cifar_args]),
        ("cifar wrong width", ["run", TINY, "data.dataset=cifar10",
                               f"data.root={os.path.dirname(wrong_shape)}", *cifar_args]),
        ("cifar root is a file", ["run", TINY, "data.dataset=cifar10", f"data.root={TINY}",
                                  *cifar_args]),
        ("cifar root loop", ["run", TINY, "data.dataset=cifar10", f"data.root={loop}",
                             *cifar_args]),
        ("fmnist empty dir", ["run", TINY, "data.dataset=fmnist",
                              f"data.root={os.path.join(tmp, 'empty-dir')}"]),
        ("trace csv BOM", ["run", TINY, "availability.model=trace", "availability.trace_path=" +
                           write("bom.csv", b"\xef\xbb\xbfclient_id,online_start,online_end\n"
                                 b"1,0,5\n")]),
        ("trace csv header only", ["run", TINY, "availability.model=trace",
                                   "availability.trace_path=" + write(
                                       "h.csv", "client_id,online_start,online_end\n")]),
        ("trace csv strings", ["run", TINY, "availability.model=trace",
                               "availability.trace_path=" + write(
                                   "s.csv", "client_id,online_start,online_end\na,b,c\n")]),
        ("trace csv all zero", ["run", TINY, "availability.model=trace",
                                "availability.trace_path=" + write(
                                    "z.csv", "client_id,online_start,online_end\n1,0,0\n")]),
        ("trace pickle list", ["run", TINY, "availability.model=trace",
                               "availability.trace_path=" + write("l.pkl", pickle.dumps([1]))]),
        ("trace pickle ragged", ["run", TINY, "availability.model=trace",
                                 "availability.trace_path=" + write("r.pkl", pickle.dumps(
                                     {1: {"active": [[1, 2], [3]], "inactive": [1],
                                          "finish_time": 3}}))]),
        ("trace pickle negative period", ["run", TINY, "availability.model=trace",
                                          "availability.trace_path=" + write(
                                              "n.pkl", pickle.dumps({1: {
                                                  "active": [0], "inactive": [1],
                                                  "finish_time": -3}}))]),
        ("trace pickle never online", ["run", TINY, "availability.model=trace",
                                       "availability.trace_path=" + write(
                                           "never.pkl", pickle.dumps({1: {
                                               "active": [], "inactive": [],
                                               "finish_time": 10}}))]),
        ("trace pickle end before start", ["run", TINY, "availability.model=trace",
                                           "availability.trace_path=" + write(
                                               "eb.pkl", pickle.dumps({1: {
                                                   "active": [5], "inactive": [1],
                                                   "finish_time": 10}}))]),
        ("trace parquet of strings", ["run", TINY, "availability.model=trace",
                                      "availability.trace_path=" + _parquet(tmp)]),
        ("capacity negative", ["run", TINY, "availability.capacity_path=" + write(
            "neg.pkl", pickle.dumps({1: {"computation": -1, "communication": 5}}))]),
        ("capacity strings", ["run", TINY, "availability.capacity_path=" + write(
            "str.pkl", pickle.dumps({1: {"computation": "fast", "communication": 5}}))]),
        ("capacity empty", ["run", TINY, "availability.capacity_path=" + write(
            "empty.pkl", pickle.dumps({}))]),
        ("resume a file", ["resume", TINY]),
        ("resume nonexistent", ["resume", os.path.join(tmp, "nope")]),
        ("resume max-rounds abc", ["resume", tmp, "--max-rounds", "abc"]),
        ("resume bad config.yaml", ["resume", _run_dir(tmp, "badcfg", {
            "config.yaml": "local: {lr: [\n"})]),
        ("resume truncated summary", ["resume", _run_dir(tmp, "sum", {
            "config.yaml": tiny, "summary.json": "{\"model_sha"})]),
        ("resume checkpoint garbage only", ["resume", _run_dir(tmp, "ck", {
            "config.yaml": tiny, "checkpoints/checkpoint.pt": b"\x80\x02garbage"})]),
        ("unknown command", ["fly"]),
        ("run without config", ["run"]),
        ("compare no algorithms", ["compare", TINY, "--algorithms", ""]),
        ("compare bad algorithm", ["compare", TINY, "--algorithms", "fedavg,nosuch"]),
        ("compare bad seeds", ["compare", TINY, "--algorithms", "fedavg", "--seeds", "a,b"]),
        ("analyze nonexistent", ["analyze", os.path.join(tmp, "nope")]),
        ("tune missing study", ["tune", os.path.join(tmp, "nope.yaml")]),
        ("tune garbage study", ["tune", write("study.yaml", "trials: [\n")]),
        ("keys unknown algorithm", ["keys", "--algorithm", "nosuch"]),
        ("data bad override", ["data", TINY, "data.alpha=-1"]),
        ("data bad max-clients", ["data", TINY, "--max-clients", "-5"]),
        ("data bad rounds", ["data", TINY, "--rounds", "-1"]),
    ]
    return out


def _parquet(tmp: str) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.path.join(tmp, "strings.parquet")
    pq.write_table(pa.table({"client_id": ["a"], "online_start": ["x"], "online_end": ["y"]}),
                   path)
    return path


def _run_dir(tmp: str, name: str, files: dict) -> str:
    path = os.path.join(tmp, name)
    for rel, data in files.items():
        full = os.path.join(path, rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())
    return path


def classify(argv: list[str], timeout: float, out_dir: str) -> dict:
    """Run ``python -m rayfl ARGV`` and say what a user saw."""
    env = {**os.environ, "PYTHONPATH": ROOT, "RAYFL_CACHE": os.path.join(out_dir, "cache")}
    tick = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-m", "rayfl", *argv], capture_output=True, text=True, check=False,
                           timeout=timeout, env=env, cwd=out_dir, errors="replace")
    except subprocess.TimeoutExpired:
        return {"outcome": "hang", "seconds": timeout}
    err = p.stderr.strip().splitlines()
    created = os.path.exists(os.path.join(out_dir, "runs"))
    if "Traceback" in p.stderr or p.returncode not in (0, 2):
        outcome = "traceback"
    elif p.returncode == 0:
        outcome = "accepted"
    elif len(err) == 1 and not created:
        outcome = "clear"
    else:
        outcome = "unclear"  # exit 2 but several lines, or something was created
    return {"outcome": outcome, "code": p.returncode, "seconds": round(time.monotonic() - tick, 1),
            "stderr": err[-1][:300] if err else "", "created": created}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=90.0)
    ap.add_argument("--only", default="")
    ap.add_argument("--start", type=int, default=0, help="skip the first cases (to continue)")
    args = ap.parse_args()
    tally: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = os.path.join(tmp, "files")
        os.makedirs(os.path.join(files, "empty-dir"))
        cases = [(lbl, ["run", TINY, *BASE, *o]) for lbl, o in _override_cases()] + \
            _files(files)
        for i, (label, argv) in enumerate(cases):
            if args.only not in label or i < args.start:
                continue
            work = os.path.join(tmp, f"case-{i}")
            os.makedirs(work)
            if argv[0] == "run" and argv[1:2] != [] and not any(a.startswith("output_dir=")
                                                                for a in argv):
                argv = [*argv[:2], f"output_dir={os.path.join(work, 'runs')}", *argv[2:]]
            res = {"case": label, **classify(argv, args.timeout, work)}
            tally[res["outcome"]] = tally.get(res["outcome"], 0) + 1
            print(json.dumps(res, ensure_ascii=True), flush=True)
    print(json.dumps({"total": sum(tally.values()), **tally}), flush=True)


if __name__ == "__main__":
    main()
