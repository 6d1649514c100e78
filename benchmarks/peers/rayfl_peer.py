"""rayfl on the reference workload: ``configs/quickstart.yaml`` as a user runs it (2 actors × 1
CPU, a checkpoint every round), without the learning-rate decay so the local loop is the
workload's, and no evaluation until the last round. Runs in rayfl's own environment.
``--executor threads`` trains on threads of one process instead of Ray actors.

    python benchmarks/peers/rayfl_peer.py --workload W.npz --out R.json [--rounds N] [--workers 2]
        [--executor ray|threads]
"""

from __future__ import annotations

import os
import sys
import tempfile

import ray

import rayfl
from rayfl import config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workload import arguments, LOOP, Workload, report  # noqa: E402

BASE = "configs/quickstart.yaml"


def main(argv=None) -> None:
    parser = arguments(__doc__)
    parser.add_argument("--executor", choices=["ray", "threads"], default="ray")
    args = parser.parse_args(argv)
    data = Workload.load(args.workload)
    rounds = args.rounds or len(data.plan)
    cfg = config.load(BASE, [f"rounds={rounds}", f"eval.every={10**6}", "local.lr_decay=1.0",
                             f"runtime.num_actors={args.workers}", "runtime.cpus_per_actor=1",
                             f"runtime.executor={args.executor}"])
    assert cfg.local.batch_size == LOOP["batch_size"] and cfg.local.lr == LOOP["lr"]
    if args.executor == "ray":
        ray.init(num_cpus=args.workers, include_dashboard=False, logging_level="ERROR",
                 log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            result = rayfl.run(cfg, run_dir=f"{tmp}/run", quiet=True)
            rows = result.metrics.to_pylist()
    finally:
        ray.shutdown()
    ends = [0.0] + [r["elapsed_s"] for r in rows]
    timed = [(int(r["samples"]), ends[i + 1] - ends[i]) for i, r in enumerate(rows)]
    planned = [int(sum(data.size(int(c)) for c in data.plan[t])) for t in range(rounds)]
    assert [n for n, _ in timed] == planned, "rayfl trained other clients than the plan"
    where = "Ray actors" if args.executor == "ray" else "threads of one process"
    report(args.out, f"rayfl {rayfl.__version__}", timed,
           note=f"{args.workers} {where} × 1 CPU; checkpoint every round")


if __name__ == "__main__":
    main()
