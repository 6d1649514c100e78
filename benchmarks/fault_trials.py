"""Fault trials as a user would see them: SIGKILL or SIGSTOP a client actor, SIGKILL the server
actor or the driver, of a running ``rayfl run``, and count runs that end with the unfaulted bytes.

Each trial starts ``python -m rayfl run`` on a small config, waits for the progress line of a
round, sleeps a seeded random fraction of a second (so the signal lands anywhere in the next
round) and signals the process (client pids from ``actors.json``; the server is the
``ray::Server`` process under the run's own Ray). A client fault must be absorbed (exit 0, the
unfaulted ``model_sha256``); a dead server must end the run within ``--prompt`` seconds with the
``rayfl resume`` command, and that resume must give the unfaulted ``model_sha256``; after a
killed driver, ``rayfl resume`` must give it too. Extra overrides (e.g. an asynchronous mode)
follow the fault. Usage:

    PYTHONPATH=$PWD nice -n 19 python benchmarks/fault_trials.py client-kill [--trials 10]
    PYTHONPATH=$PWD python benchmarks/fault_trials.py driver-kill aggregation.mode=fedbuff \
        aggregation.concurrency=8 aggregation.buffer_size=3 availability.dropout=0.2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "test", "tiny.yaml")
# rounds of ~0.3 s, so a signal sent 0-0.5 s after a progress line lands mid-run
CONFIG = ["rounds=12", "algorithm.name=scaffold", "model.name=mlp", "local.epochs=100",
          "runtime.num_actors=2", "runtime.actor_timeout_s=20", "runtime.ray_num_cpus=2"]


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "rayfl", *args]


def _env(cache: str) -> dict:
    return {**os.environ, "PYTHONPATH": ROOT, "RAYFL_CACHE": cache}


def _sha(run_dir: str) -> str | None:
    try:
        with open(os.path.join(run_dir, "summary.json")) as f:
            return json.load(f).get("model_sha256")
    except (OSError, ValueError):
        return None


def _descendants(pid: int) -> list[int]:
    """Every process whose parent chain reaches ``pid`` (read from /proc)."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, frontier = [], [pid]
    while frontier:
        kids = [p for p, pp in parent.items() if pp in frontier]
        out += kids
        frontier = kids
    return out


def _server_pid(root_pid: int) -> int | None:
    for pid in _descendants(root_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().startswith(b"ray::Server"):
                    return pid
        except OSError:
            continue
    return None


def trial(fault: str, i: int, work: str, clean: str, prompt: float, limit: float,
          config: list[str]) -> dict:
    rng = random.Random(i)
    run_dir = os.path.join(work, f"trial-{i}")
    env = _env(os.path.join(work, "cache"))
    at = rng.randint(1, 4)  # the progress line after which the signal comes (1-based round)
    proc = subprocess.Popen(_cmd("run", TINY, *config, f"--run-dir={run_dir}"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    fired = threading.Event()
    fired_at: list[float] = []

    def fire():
        time.sleep(rng.uniform(0.0, 0.5))
        if fault.startswith("client"):
            with open(os.path.join(run_dir, "actors.json")) as f:
                pids = [a["pid"] for a in json.load(f).values()]
            target = pids[i % len(pids)]
        elif fault == "driver-kill":
            target = proc.pid
        else:
            target = _server_pid(proc.pid)
        if target is not None:
            os.kill(target, signal.SIGSTOP if fault == "client-stop" else signal.SIGKILL)
            fired_at.append(time.monotonic())
        fired.set()

    def read():
        for line in proc.stdout:
            lines.append(line.rstrip())
            if line.startswith(f"round {at}/") and not fired.is_set():
                threading.Thread(target=fire, daemon=True).start()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return {"trial": i, "fault": fault, "outcome": "hang", "tail": lines[-3:]}
    reader.join(5)
    ended = time.monotonic()
    fired.wait(5)
    res = {"trial": i, "fault": fault, "after_round": at, "fired": bool(fired_at), "exit": code,
           "tail": lines[-2:]}
    if not fired_at and any("did not start" in ln for ln in lines):
        res["outcome"] = "ray-did-not-start"  # an overloaded machine, not the fault: re-run
        return res
    if fault == "driver-kill" and code != 0:
        resume = subprocess.run(_cmd("resume", run_dir, "--quiet"), capture_output=True,
                                text=True, env=env, timeout=limit, check=False)
        res["resume_exit"] = resume.returncode
        res["resume_said"] = (resume.stderr.strip().splitlines() or [""])[-1][:200]
    if fault == "server-kill":
        res["stop_s"] = round(ended - fired_at[0], 1) if fired_at else None
        said = any("rayfl resume" in ln for ln in lines)
        if code == 0:  # the run finished before the kill landed
            res["outcome"] = "same" if _sha(run_dir) == clean else "different"
            return res
        if not said or res["stop_s"] is None or res["stop_s"] > prompt:
            res["outcome"] = "unclear-stop"
            return res
        resume = subprocess.run(_cmd("resume", run_dir, "--quiet"), capture_output=True,
                                text=True, env=env, timeout=limit, check=False)
        res["resume_exit"] = resume.returncode
        res["resume_said"] = (resume.stderr.strip().splitlines() or [""])[-1][:200]
    res["outcome"] = "same" if _sha(run_dir) == clean else "different"
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fault", choices=["client-kill", "client-stop", "server-kill",
                                          "driver-kill"])
    ap.add_argument("overrides", nargs="*", help="config overrides after the trials' own")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--prompt", type=float, default=30.0, help="seconds a dead server may take "
                    "to end the run")
    ap.add_argument("--limit", type=float, default=300.0, help="seconds a run may take")
    args = ap.parse_args()
    config = [*CONFIG, *args.overrides]
    with tempfile.TemporaryDirectory() as work:
        clean_dir = os.path.join(work, "clean")
        subprocess.run(_cmd("run", TINY, *config, "--quiet", f"--run-dir={clean_dir}"),
                       env=_env(os.path.join(work, "cache")), check=True, capture_output=True)
        clean = _sha(clean_dir)
        tally: dict[str, int] = {}
        for i in range(args.trials):
            res = trial(args.fault, i, work, clean, args.prompt, args.limit, config)
            tally[res["outcome"]] = tally.get(res["outcome"], 0) + 1
            print(json.dumps(res), flush=True)
    print(json.dumps({"fault": args.fault, "trials": args.trials, **tally}), flush=True)


if __name__ == "__main__":
    main()
