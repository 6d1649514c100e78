"""What a client actor's answer costs: one group's sums (Σ w_i Δ_i and Σ Δ_i of a model) sent from
a Ray actor to its caller as torch tensors (pickled through a copy) against the same sums as
numpy arrays (sent as raw memory, what ``ClientWorker.train_arrays`` sends), alternating call by
call. Prints each way's median milliseconds a call (the call, the transfer and turning the arrays
back into tensors) and their ratio.

    python benchmarks/bench_report.py [--params 274026] [--calls 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import ray
import torch

from rayfl.runtime.aggregate import PartialSum, as_array
from rayfl.runtime.executors import tensors_of


@ray.remote(num_cpus=1)
class Sender:
    """An actor holding one group's sums of a model with ``params`` parameters."""

    def __init__(self, params: int):
        self.sums = PartialSum()
        self.sums.add_client(0, torch.randn(params), 1.0, 12, 600, 0.5, {}, [])

    def report(self, arrays: bool) -> dict:
        acc = PartialSum(**vars(self.sums))
        return {"sums": [(0, acc.map_values(as_array) if arrays else acc)]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=274_026, help="the FMNIST CNN's")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args(argv)
    if args.params < 1 or args.calls < 1:
        parser.error(f"--params, --calls: expected ≥ 1 (got {args.params}, {args.calls})")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        sender = Sender.remote(args.params)
        ray.get(sender.report.remote(False))
        times = {False: [], True: []}
        for i in range(2 * args.calls):
            arrays = bool(i % 2)
            tick = time.perf_counter()
            report = ray.get(sender.report.remote(arrays))
            if arrays:
                tensors_of(report)
            times[arrays].append(time.perf_counter() - tick)
    finally:
        ray.shutdown()
    tensors, arrays = (statistics.median(times[k]) * 1e3 for k in (False, True))
    print(f"{args.params:,} parameters, {args.calls} calls each, alternating")
    print(f"sums as torch tensors: {tensors:.2f} ms a call")
    print(f"sums as numpy arrays:  {arrays:.2f} ms a call ({tensors / arrays:.2f}× faster)")


if __name__ == "__main__":
    main()
