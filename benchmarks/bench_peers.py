"""rayfl against its peers on the reference workload, interleaved, side by side in one run.

Every system trains the same thing (``benchmarks/peers/workload.py``): Fashion-MNIST in 100
clients with Dirichlet(0.1) label mixes, the same 10 clients each round (rayfl's own plan),
the FMNIST CNN in channels-last layout, one epoch of SGD (lr 0.01, momentum 0.9, weight decay
0.001) in batches of 50, sample-weighted averaging — each on the same 2 workers × 1 thread:

- rayfl: ``configs/quickstart.yaml`` as a user runs it (2 Ray actors, a checkpoint a round),
  and the same on its thread-pool executor (``runtime.executor: threads``, 2 threads);
- plain loop: two single-thread processes and nothing else (the floor, ``plain_peer.py``);
- Flower, pfl and BlazeFL (2 threads, as its README recommends, and 2 processes), each
  installed into its own environment under ``.venv-peers/`` (never into rayfl's) from
  ``benchmarks/peers/requirements-NAME.txt`` and rayfl's torch release (the same kernels).

Each pass runs every system once, in a rotated order; a system's speed is samples trained per
second over the steady rounds (the first two and the last are left out). Printed: each pass,
and each rayfl executor's ratio to each system as the median and min–max over the passes. Each peer's final
model is compared with the plain loop's (max |Δw|): the same workload gives the same weights up
to float rounding, which shows every peer trained what the others did.

    python benchmarks/bench_peers.py [--passes 3] [--rounds 22] [--systems rayfl,plain,...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = os.path.join(HERE, "peers")
ROOT = os.path.dirname(HERE)
VENVS = os.path.join(ROOT, ".venv-peers")
sys.path.insert(0, PEERS)

# environment name → extra pip flags; it is .venv-peers/NAME, from requirements-NAME.txt
INSTALLED = {
    "flower": [],
    "pfl": [],
    # BlazeFL 3.0 needs Python ≥ 3.14 and 2.0.3 declares ≥ 3.12; 2.0.3's code runs on 3.11,
    # rayfl's Python.
    "blazefl": ["--ignore-requires-python"],
}
# system → (peer script NAME_peer.py, its environment or None for rayfl's, extra arguments)
RUNS = {
    "rayfl": ("rayfl", None, []),
    "rayfl-threads": ("rayfl", None, ["--executor", "threads"]),
    "plain": ("plain", None, []),
    "flower": ("flower", "flower", []),
    "pfl": ("pfl", "pfl", []),
    "blazefl": ("blazefl", "blazefl", ["--mode", "threads"]),
    "blazefl-processes": ("blazefl", "blazefl", ["--mode", "processes"]),
}
SYSTEMS = list(RUNS)


def command(system: str) -> list[str]:
    """The interpreter and script of a system: rayfl's own Python for rayfl and the plain loop,
    the peer's environment for a peer."""
    script, venv, extra = RUNS[system]
    python = sys.executable if venv is None else os.path.join(VENVS, venv, "bin", "python")
    return [python, os.path.join(PEERS, f"{script}_peer.py"), *extra]


def same_torch() -> str:
    """The torch release of rayfl's environment, as a requirement: every peer is installed with
    it, so every system runs the same kernels (two builds of torch differ in speed by more than
    the systems do)."""
    from importlib.metadata import version

    return f"torch=={version('torch')}"


def install(name: str) -> str | None:
    """Create or refresh .venv-peers/NAME from its requirements and rayfl's torch; None, or why
    it failed."""
    requirements = os.path.join(PEERS, f"requirements-{name}.txt")
    if not os.path.exists(requirements):
        return f"{os.path.relpath(requirements, ROOT)} is missing"
    venv = os.path.join(VENVS, name)
    with open(requirements, "rb") as f:
        digest = hashlib.sha256(f.read() + repr([*INSTALLED[name], same_torch()]).encode()
                                ).hexdigest()
    stamp = os.path.join(venv, ".installed")
    if os.path.exists(stamp) and open(stamp).read() == digest:
        return None
    print(f"installing {name} into {os.path.relpath(venv, ROOT)} …", flush=True)
    steps = [[sys.executable, "-m", "venv", "--clear", venv],
             [os.path.join(venv, "bin", "pip"), "install", "-q", "-r", requirements,
              same_torch(), *INSTALLED[name]]]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode:
            return (done.stderr.strip().splitlines() or ["(no message)"])[-1]
    with open(stamp, "w") as f:
        f.write(digest)
    return None


def run_system(system: str, workload: str, rounds: int, workers: int, out: str) -> dict:
    """One run of one system; its report (rounds of (samples, seconds)) or an ``error``."""
    cmd = [*command(system), "--workload", workload, "--out", out, "--rounds", str(rounds),
           "--workers", str(workers)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode or not os.path.exists(out):
        tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-3:]
        return {"error": f"exit {done.returncode}: " + " | ".join(tail)}
    with open(out) as f:
        result = json.load(f)
    result["wall_s"] = time.perf_counter() - start
    return result


def speed(rounds: list, steady: range) -> float:
    """Samples per second over the steady rounds."""
    kept = [rounds[t] for t in steady]
    return sum(n for n, _ in kept) / sum(s for _, s in kept)


def max_weight_gap(a_path: str, b_path: str) -> float:
    """max |a − b| over the parameters of two saved final models."""
    import torch

    a, b = torch.load(a_path), torch.load(b_path)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=22)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help=f"comma-separated, of {', '.join(SYSTEMS)}")
    parser.add_argument("--out", default=os.path.join(VENVS, "results.json"))
    args = parser.parse_args(argv)
    systems = args.systems.split(",")
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown or "rayfl" not in systems or args.rounds < 4 or args.passes < 1:
        parser.error(f"--systems: expected rayfl and some of {', '.join(SYSTEMS)}; "
                     f"--rounds ≥ 4, --passes ≥ 1 (got {args.systems}, {args.rounds}, "
                     f"{args.passes})")
    os.makedirs(VENVS, exist_ok=True)
    left_out = {}
    for name in dict.fromkeys(RUNS[s][1] for s in systems if RUNS[s][1]):
        why = install(name)
        if why:
            left_out[name] = why
            print(f"{name}: left out — {why}", flush=True)
    systems = [s for s in systems if RUNS[s][1] not in left_out]

    import workload as wl

    path = os.path.join(VENVS, f"workload-{args.rounds}.npz")
    facts = wl.export(path, args.rounds)
    steady = range(2, args.rounds - 1)
    print(f"workload: {facts['clients']} clients, {facts['per_round']} a round, "
          f"{facts['mean_client_rows']:.0f} rows and {facts['steps_per_client']:.1f} steps a "
          f"client, {facts['params']:,} parameters; {args.workers} workers × 1 thread; "
          f"samples/s over rounds {steady.start + 1}–{steady.stop} of {args.rounds}", flush=True)
    speeds: dict[str, dict[int, float]] = {s: {} for s in systems}  # system → pass → speed
    notes = {}
    for p in range(args.passes):
        order = systems[p % len(systems):] + systems[:p % len(systems)]
        for system in order:
            out = os.path.join(VENVS, f"result-{system}-{p}.json")
            for stale in (out, out + ".pt"):  # an earlier run's, never taken for this one's
                if os.path.exists(stale):
                    os.remove(stale)
            result = run_system(system, path, args.rounds, args.workers, out)
            if "error" in result:
                print(f"  pass {p + 1} {system}: failed — {result['error']}", flush=True)
                continue
            speeds[system][p] = speed(result["rounds"], steady)
            label = result["system"] + "".join(f" {a}" for a in RUNS[system][2][1:])
            notes[system] = (label, result.get("note", ""))
            print(f"  pass {p + 1} {system:8s} {speeds[system][p]:8,.0f} samples/s "
                  f"({result['wall_s']:.0f} s wall)", flush=True)
    ours = [s for s in speeds if RUNS[s][1] is None and s != "plain" and speeds[s]]
    print(f"\n{'system':32s} {'samples/s, each pass':>28s}   "
          + "   ".join(f"{notes[s][0]} ÷ it: median (min–max)" for s in ours))
    summary = {}
    for system, by_pass in speeds.items():
        if not by_pass:
            continue
        values = [by_pass.get(p) for p in range(args.passes)]  # None: that pass failed
        summary[system] = {"name": notes[system][0], "note": notes[system][1],
                           "samples_per_s": values}
        columns = []
        for mine in ours:  # each of rayfl's executors against each system, pass by pass
            ratios = [speeds[mine][p] / v for p, v in by_pass.items() if p in speeds[mine]]
            summary[system][f"{mine}_ratio"] = ratios
            columns.append(f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–"
                           f"{max(ratios):.2f})" if system not in ours and ratios else "")
        each = " ".join("—" if v is None else f"{v:,.0f}" for v in values)
        print(f"{notes[system][0]:32s} {each:>28s}   " + "   ".join(f"{c:32s}" for c in columns))
    def model_of(system: str) -> str | None:  # its final model, from its first pass that ran
        done = speeds.get(system)
        return os.path.join(VENVS, f"result-{system}-{min(done)}.json.pt") if done else None

    floor = model_of("plain")
    if floor and os.path.exists(floor):
        import torch

        import workload as wl

        start = {k: v for k, v in wl.build_model().state_dict().items()}
        moved = max(float((torch.load(floor)[k] - v).abs().max()) for k, v in start.items())
        print(f"\nsame workload — max |Δw| of the final model against the plain loop's (float "
              f"rounding, which SGD amplifies round after round; training moved the weights by "
              f"up to {moved:.2f}):")
        for system in speeds:
            model = model_of(system)
            if system != "plain" and system not in ours and model and os.path.exists(model):
                gap = max_weight_gap(model, floor)
                summary[system]["max_weight_gap"] = gap
                print(f"  {notes[system][0]:30s} {gap:.2e}")
    for name, why in left_out.items():
        print(f"{name}: left out — {why}")
    with open(args.out, "w") as f:
        json.dump({"workload": facts, "passes": args.passes, "systems": summary,
                   "left_out": left_out}, f, indent=1)


if __name__ == "__main__":
    main()
