"""rayfl on a GPU: the checks docs/performance.md's "On a GPU" table reports, in one script.

Sections (``--sections``, in this order):

- ``env``: torch, CUDA, the GPU, Ray.
- ``quickstart``: ``configs/quickstart.yaml`` on 1, 2 and 4 actors sharing the GPU
  (``gpus_per_actor`` 1, 0.5, 0.25): accuracy, model bytes, seconds; then the same with
  ``runtime.deterministic_gpu`` (1 and 2 actors) and a repeat of the 1-actor run.
- ``paths``: two rounds of every built-in algorithm on the GPU (in-process executor), counting
  host↔device copies and host synchronisations per local step with torch's profiler; then on
  client actors: FedBN with a BatchNorm model, DP-FedAvg, top-k with error feedback, FedBuff,
  per-client evaluation with fine-tuning, MOON and Ditto.
- ``throughput``: ``benchmarks/bench_round.py``'s workloads: the plain one-process loop on the
  GPU against rayfl with 1, 2, 4, 8 actors sharing it: samples/s over the steady rounds, the
  GPU's busy share (``nvidia-smi`` sampled through those rounds) and its memory per actor.
- ``headline``: pfl-research's CIFAR-10 cross-device setting (1,000 clients, 50 a round,
  batch 10, one epoch; CIFAR-shaped synthetic data) and Shakespeare
  (``configs/shakespeare/reddi_gpu.yaml``): seconds a round.

    python benchmarks/gpu_checks.py [--sections env,quickstart,...] [--out DIR] [--budget-s S]

Each result is printed and appended to ``DIR/gpu_checks.jsonl`` as it comes; a section that
fails records its error and the next one runs; work that would start past the budget is skipped
(and recorded as such).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import torch

import rayfl
from rayfl import config, registry

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_round  # noqa: E402  (the plain loop and the workloads)

QUICKSTART = "configs/quickstart.yaml"
SECTIONS = ("env", "quickstart", "paths", "headline", "throughput")
START = time.perf_counter()
OUT: dict = {"path": None, "deadline": float("inf")}
SMOKE = os.environ.get("RAYFL_GPU_CHECKS_SMOKE") == "1"  # a quick pass without a GPU: the
# script's own check (fewer rounds and runs, no nvidia-smi)


def record(section: str, **fields) -> None:
    """Print one result line and append it to the output file."""
    row = {"section": section, "t_s": round(time.perf_counter() - START, 1), **fields}
    line = json.dumps(row, default=str)
    print(line, flush=True)
    if OUT["path"]:
        with open(OUT["path"], "a") as f:
            f.write(line + "\n")


def time_left() -> float:
    return OUT["deadline"] - time.perf_counter()


def enough(section: str, need_s: float, what: str) -> bool:
    """Whether ``need_s`` seconds are left for ``what`` (else it is recorded as skipped)."""
    if time_left() >= need_s:
        return True
    record(section, what=what, skipped=f"under {need_s:.0f} s of the budget left")
    return False


class GpuSampler:
    """``nvidia-smi`` polled every 100 ms in the background: (time, busy %, MiB used)."""

    def __init__(self):
        self.samples: list[tuple[float, float, float]] = []
        self.apps: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        if SMOKE:
            return
        proc = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used",
                                 "--format=csv,noheader,nounits", "-lms", "100"],
                                stdout=subprocess.PIPE, text=True)
        try:
            for line in proc.stdout:
                if self._stop.is_set():
                    break
                busy, mem = (float(v) for v in line.split(","))
                self.samples.append((time.perf_counter(), busy, mem))
        finally:
            proc.kill()

    def snapshot_apps(self) -> None:
        """GPU memory of each process using the GPU now (MiB by pid)."""
        if SMOKE:
            return
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True)
        self.apps = {p.strip(): float(m) for p, m in
                     (line.split(",") for line in out.stdout.strip().splitlines() if line)}

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=2)

    def busy(self, start: float, end: float) -> float | None:
        """Mean utilisation (%) over the samples taken in [start, end]."""
        inside = [b for t, b, _ in self.samples if start <= t <= end]
        return round(statistics.mean(inside), 1) if inside else None


def run_timed(cfg, sampler: GpuSampler | None = None, snapshot_round: int = 3):
    """Run ``cfg`` in a temporary directory; (result, wall s, each round's end time)."""
    ends: list[float] = []

    def on_round(row) -> bool:
        ends.append(time.perf_counter())
        if sampler is not None and row["round"] == snapshot_round:
            sampler.snapshot_apps()
        return False

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        result = rayfl.run(cfg, run_dir=f"{tmp}/run", quiet=True, on_round=on_round)
        placement = f"{tmp}/run/actors.json"
        actors = json.load(open(placement)) if os.path.exists(placement) else {}
    devices = sorted({f"{a['device']}{' det' if a.get('deterministic') else ''}"
                      for a in actors.values()}) or ["in-process"]
    return result, time.perf_counter() - start, ends, devices


def summary_fields(result, wall: float, devices) -> dict:
    s = result.summary
    return {"accuracy": s.get("final_accuracy"), "sha256": s.get("model_sha256", "")[:16],
            "wall_s": round(wall, 2), "mean_round_s": round(s.get("mean_round_s") or 0, 4),
            "devices": devices}


def section_env() -> None:
    import ray

    smi = "" if SMOKE else subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
        capture_output=True, text=True).stdout
    record("env", torch=torch.__version__, cuda=torch.version.cuda,
           gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
           nvidia_smi=smi.strip(), ray=ray.__version__, cpus=os.cpu_count(),
           python=sys.version.split()[0])


def section_quickstart() -> None:
    runs = [(1, 1.0, False, "gpu"), (2, 0.5, False, "gpu"), (4, 0.25, False, "gpu"),
            (1, 1.0, False, "gpu, repeated"), (1, 1.0, True, "gpu, deterministic"),
            (2, 0.5, True, "gpu, deterministic")]
    for actors, gpus, det, label in runs:
        if not enough("quickstart", 40, f"{actors} actors {label}"):
            return
        cfg = config.load(QUICKSTART, [f"runtime.num_actors={actors}",
                                       f"runtime.gpus_per_actor={gpus}",
                                       "runtime.cpus_per_actor=2",
                                       f"runtime.deterministic_gpu={str(det).lower()}",
                                       *(["rounds=2"] if SMOKE else [])])
        result, wall, _, devices = run_timed(cfg)
        record("quickstart", actors=actors, gpus_per_actor=gpus, label=label,
               **summary_fields(result, wall, devices))


class StepCounter:
    """Counts local steps (backward passes of FlatModel, whatever the algorithm's loss) in this
    process."""

    def __init__(self):
        from rayfl.models.flat import FlatModel

        self.calls = 0
        self._original = FlatModel.backward
        counter = self

        def counted(model, *args, **kwargs):
            counter.calls += 1
            return counter._original(model, *args, **kwargs)

        FlatModel.backward = counted

    def close(self) -> None:
        from rayfl.models.flat import FlatModel

        FlatModel.backward = self._original


def host_device_events(prof) -> dict:
    """Counts of the CUDA runtime calls that copy or wait, from a profile."""
    names = {"cudaMemcpyAsync": "copies", "cudaMemcpy": "copies_sync",
             "cudaStreamSynchronize": "stream_syncs", "cudaDeviceSynchronize": "device_syncs",
             "cudaEventSynchronize": "event_syncs"}
    out = dict.fromkeys(names.values(), 0)
    for e in prof.key_averages():
        if e.key in names:
            out[names[e.key]] += e.count
    return out


ALGORITHM_SETTINGS = {  # what an algorithm needs beyond the quickstart's settings
    "fedbn": ["model.name=examples.bn_model:BNNet", "data.dataset=synthetic",
              "data.features=16", "data.classes=4", "data.samples_per_client=30",
              "data.num_clients=20", "data.alpha=0.5", "data.min_samples=5",
              "local.batch_size=16"],
    "moon": ["model.projection=64"],
}


def algorithm_overrides(name: str) -> list[str]:
    return [f"algorithm.name={name}", *ALGORITHM_SETTINGS.get(name, [])]


SMALL = ["rounds=2", "clients_per_round=4", "eval.every=1", "runtime.gpus_per_actor=1",
         "local.momentum=0", "local.weight_decay=0"]  # (fedmim, pfedme refuse them)


def sync_sources(name: str) -> None:
    """Where the host waits for the GPU in a run of ``name``: torch's sync debug mode warns at
    each synchronising call; the Python lines that made them, with counts."""
    import collections
    import warnings

    cfg = config.load(QUICKSTART, [*SMALL, "runtime.executor=inprocess",
                                   *algorithm_overrides(name)])
    steps = StepCounter()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run_timed(cfg)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        steps.close()
    where = collections.Counter(f"{os.path.relpath(w.filename)}:{w.lineno}" for w in caught
                                if "synchroniz" in str(w.message))
    record("paths", what=f"synchronising calls, {name}", local_steps=steps.calls,
           sources=dict(where.most_common(12)))


def section_paths() -> None:
    from torch.profiler import ProfilerActivity, profile

    small = SMALL
    for name in ("fedavg", "moon", "fedbabu"):
        if torch.cuda.is_available() and enough("paths", 15, f"sync sources {name}"):
            sync_sources(name)
    for name in registry.names("algorithm"):
        if not enough("paths", 15, f"in-process {name}"):
            break
        steps = StepCounter()
        try:
            cfg = config.load(QUICKSTART, [*small, "runtime.executor=inprocess",
                                           *algorithm_overrides(name)])
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                result, wall, _, _ = run_timed(cfg)
            events = host_device_events(prof)
            cuda_kernels = sum(e.count for e in prof.key_averages()
                               if e.device_type == torch.autograd.DeviceType.CUDA)
            record("paths", executor="inprocess", algorithm=name, ok=True,
                   accuracy=result.summary.get("final_accuracy"), wall_s=round(wall, 2),
                   local_steps=steps.calls, cuda_kernels=cuda_kernels,
                   **{k: v for k, v in events.items()},
                   per_step={k: round(v / max(steps.calls, 1), 2) for k, v in events.items()})
        except Exception as e:  # noqa: BLE001  (recorded; the sweep goes on)
            record("paths", executor="inprocess", algorithm=name, ok=False,
                   error=f"{type(e).__name__}: {e}"[:400])
        finally:
            steps.close()
    on_actors = {
        "fedbn, BatchNorm model": algorithm_overrides("fedbn"),
        "DP-FedAvg": ["privacy.noise_multiplier=1.0", "privacy.clip_norm=0.5"],
        "top-k + error feedback": ["compression.method=topk", "compression.fraction=0.05",
                                   "compression.error_feedback=true"],
        "FedBuff": ["aggregation.mode=fedbuff", "aggregation.concurrency=8",
                    "aggregation.buffer_size=4", "rounds=3"],
        "per-client evaluation": ["data.client_holdout=0.2", "eval.clients=20",
                                  "eval.finetune_steps=5"],
        "moon": algorithm_overrides("moon"),
        "ditto": algorithm_overrides("ditto"),
    }
    for label, extra in on_actors.items():
        if not enough("paths", 25, f"actors {label}"):
            break
        try:
            cfg = config.load(QUICKSTART, [*small, "runtime.num_actors=2",
                                           "runtime.gpus_per_actor=0.5", *extra])
            result, wall, _, devices = run_timed(cfg)
            record("paths", executor="ray, 2 actors × 0.5 GPU", what=label, ok=True,
                   **summary_fields(result, wall, devices))
        except Exception as e:  # noqa: BLE001
            record("paths", executor="ray", what=label, ok=False,
                   error=f"{type(e).__name__}: {e}"[:400])


def section_throughput() -> None:
    for workload, (what, extra, rounds) in bench_round.WORKLOADS.items():
        rounds = 4 if SMOKE else min(rounds, 8)
        cfg = config.load(QUICKSTART, [f"rounds={rounds}", f"eval.every={10**6}",
                                       "checkpoint.every=1", *extra,
                                       "runtime.gpus_per_actor=1"])
        steady = bench_round.window(cfg.rounds)
        if not enough("throughput", 30, f"{workload} plain loop"):
            return
        with GpuSampler() as sampler:
            per_round = bench_round.plain_rounds(cfg, 1, True)
            t_end = time.perf_counter()
        starts = [t_end - sum(s for _, s in per_round[i:]) for i in range(len(per_round))]
        busy = sampler.busy(starts[steady.start], starts[steady.stop])
        plain = bench_round.rate([per_round[t] for t in steady])
        record("throughput", workload=workload, what=what, line="plain loop, one process",
               samples_per_s=round(plain), gpu_busy_pct=busy)
        for actors in (1, 2) if SMOKE else (1, 2, 4, 8):
            if not enough("throughput", 30, f"{workload} rayfl {actors} actors"):
                return
            run_cfg = config.load(cfg, [f"runtime.num_actors={actors}",
                                        f"runtime.gpus_per_actor={1 / actors}",
                                        "runtime.cpus_per_actor=1"])
            with GpuSampler() as sampler:
                result, wall, ends, devices = run_timed(run_cfg, sampler)
            rows = result.metrics.to_pylist()
            for prev, row in zip(rows, rows[1:]):
                row["gap_s"] = row["elapsed_s"] - prev["elapsed_s"]
            kept = [rows[t] for t in steady]
            rate = bench_round.rate([(r["samples"], r["gap_s"]) for r in kept])
            round_s = statistics.mean(r["gap_s"] for r in kept)
            train_share = statistics.mean(r["actor_train_s_max"] / r["gap_s"] for r in kept)
            actor_mib = sorted(v for k, v in sampler.apps.items() if str(os.getpid()) != k)
            record("throughput", workload=workload, line=f"rayfl, {actors} actors × "
                   f"{1 / actors:g} GPU", samples_per_s=round(rate),
                   ratio_to_plain=round(rate / plain, 3), round_s=round(round_s, 3),
                   slowest_actor_training_share=round(train_share, 3),
                   between_rounds_s=round(statistics.mean(r["gap_s"] - r["train_s"]
                                                          for r in kept), 3),
                   gpu_busy_pct=sampler.busy(ends[steady.start - 1], ends[steady.stop - 1]),
                   gpu_mib_per_process=actor_mib, devices=devices)


def section_headline() -> None:
    pfl = ["data.dataset=benchmarks.cifar_shaped:CifarShaped", "data.num_clients=1000",
           "data.samples_per_client=50", "data.test_samples=1000", "data.partition=iid",
           "clients_per_round=50", "model.name=cifar_cnn", "local.batch_size=10",
           "local.epochs=1", "local.lr=0.1", "local.momentum=0", "local.weight_decay=0",
           "local.lr_decay=1", f"eval.every={10**6}", f"rounds={4 if SMOKE else 8}"]
    for actors in (1,) if SMOKE else (1, 4, 8):
        if not enough("headline", 45, f"pfl cifar10 setting, {actors} actors"):
            return
        cfg = config.load(QUICKSTART, [*pfl, f"runtime.num_actors={actors}",
                                       f"runtime.gpus_per_actor={1 / actors}",
                                       "runtime.cpus_per_actor=1"])
        with GpuSampler() as sampler:
            result, wall, ends, devices = run_timed(cfg, sampler)
        rows = result.metrics.to_pylist()
        gaps = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(rows, rows[1:])][1:-1]
        per_round = statistics.mean(gaps)
        record("headline", what="pfl CIFAR-10 cross-device (1,000 clients, 50 a round, batch "
               "10, 1 epoch; CIFAR-shaped synthetic)", actors=actors,
               seconds_per_round=round(per_round, 3),
               projected_1500_rounds_min=round(per_round * 1500 / 60, 1),
               gpu_busy_pct=sampler.busy(ends[1], ends[-2]), devices=devices)
    if not enough("headline", 90, "shakespeare reddi_gpu"):
        return
    cfg = config.load("configs/shakespeare/reddi_gpu.yaml", [f"rounds={4 if SMOKE else 12}",
                                                              "eval.every=1000000",
                                                              "eval.test_rows=2000"])
    # (the last round always evaluates, on the server's CPU: a sample of the test set keeps it
    # short; the run on an H100 did not finish 12 rounds with all of it in ~3 minutes)
    with GpuSampler() as sampler:
        result, wall, ends, devices = run_timed(cfg, sampler)
    rows = result.metrics.to_pylist()
    gaps = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(rows, rows[1:])][1:-1]
    record("headline", what="Shakespeare, configs/shakespeare/reddi_gpu.yaml", rounds=cfg.rounds,
           seconds_per_round=round(statistics.mean(gaps), 3),
           projected_1200_rounds_min=round(statistics.mean(gaps) * 1200 / 60, 1),
           gpu_busy_pct=sampler.busy(ends[1], ends[-2]), wall_s=round(wall, 1),
           devices=devices)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--out", default=".")
    parser.add_argument("--budget-s", type=float, default=540.0,
                        help="start no work that would end past this many seconds")
    parser.add_argument("--ray-cpus", type=int, default=None)
    args = parser.parse_args(argv)
    names = args.sections.split(",")
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        parser.error(f"--sections {','.join(unknown)}: expected some of {', '.join(SECTIONS)}")
    os.makedirs(args.out, exist_ok=True)
    OUT["path"] = os.path.join(args.out, "gpu_checks.jsonl")
    OUT["deadline"] = START + args.budget_s
    import ray

    ray.init(num_cpus=args.ray_cpus, num_gpus=1 if SMOKE else None, include_dashboard=False,
             logging_level="ERROR",
             log_to_driver=False)
    for name in names:
        try:
            globals()[f"section_{name}"]()
        except Exception as e:  # noqa: BLE001  (recorded; the next section runs)
            record(name, ok=False, error=f"{type(e).__name__}: {e}"[:600],
                   where=traceback.format_exc()[-1200:])
    record("done", seconds=round(time.perf_counter() - START, 1))


if __name__ == "__main__":
    main(sys.argv[1:])
