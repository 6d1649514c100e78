"""What starting a run costs before its first client trains: ``import rayfl`` in a fresh
interpreter, and a one-round run of the test config (``configs/test/tiny.yaml``: 20 clients of
logistic regression, 5 a round) on 2 Ray actors against the same run in process — their
difference is the launch (the client actors' and the server's processes starting, each
importing torch and rayfl, and their start-up calls); and the same run on 2 actors inside
``rayfl.actor_pool()``, after a first run there left its actors idle (no process starts).

Each pass runs in a fresh process that starts its own local Ray (2 CPUs), as ``rayfl run``
does; the runs alternate, ray then in process, over ``--passes`` passes. Per pass it prints
each time; then each one's min–max over the passes.

    python benchmarks/bench_startup.py [--passes 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "test", "tiny.yaml")

ONE_PASS = """
import sys, time
t = time.perf_counter()
import rayfl
imported = time.perf_counter() - t
import ray
ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR",
         log_to_driver=False)
seconds = {}


def timed(executor):
    t = time.perf_counter()
    rayfl.run(sys.argv[1], [f"output_dir={sys.argv[2]}/runs", f"data.cache_dir={sys.argv[2]}/cache",
                            "rounds=1", f"runtime.executor={executor}"], quiet=True)
    return time.perf_counter() - t


for executor in ("ray", "inprocess"):
    seconds[executor] = timed(executor)
with rayfl.actor_pool():
    timed("ray")  # its actors stay, idle
    pooled = timed("ray")
print("seconds:", imported, seconds["ray"], seconds["inprocess"], pooled)
"""


def one_pass(work: str) -> tuple[float, float, float, float]:
    """(import rayfl, a run on 2 actors, the same run in process, the same run on 2 pooled
    actors), in seconds, in a fresh process."""
    out = subprocess.run([sys.executable, "-c", ONE_PASS, TINY, work], check=True,
                         capture_output=True, text=True).stdout
    # its own line: Ray may print a line of its own on the same output
    [line] = [ln for ln in out.splitlines() if ln.startswith("seconds: ")]
    return tuple(float(x) for x in line.split()[1:])


def prepare_store(work: str) -> None:
    """The test config's partition store, written once under ``work``, outside the timings."""
    from rayfl import config
    from rayfl.data import prepare

    cfg = config.load(TINY, [f"data.cache_dir={work}/cache"])
    prepare(cfg.data, cfg.seed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=3)
    args = ap.parse_args()
    if args.passes < 1:
        print(f"--passes {args.passes}: expected ≥ 1", file=sys.stderr)
        sys.exit(2)
    rows = []
    with tempfile.TemporaryDirectory(prefix="rayfl-bench-startup-") as work:
        prepare_store(work)
        print("pass | import rayfl s | run on 2 actors s | in process s | launch s | "
              "on 2 pooled actors s")
        for p in range(args.passes):
            imported, on_ray, here, pooled = one_pass(work)
            rows.append((imported, on_ray, here, on_ray - here, pooled))
            print(f"{p + 1} | {imported:.2f} | {on_ray:.2f} | {here:.2f} | {on_ray - here:.2f} | "
                  f"{pooled:.2f}", flush=True)
    spread = [f"{min(c):.2f}–{max(c):.2f}" for c in zip(*rows)]
    print(f"min–max | {' | '.join(spread)}")


if __name__ == "__main__":
    main()
