"""The user's side of a run: validate, prepare data, start Ray and the actors, follow progress.

:func:`run` and :func:`resume` are the Python API behind ``rayfl run`` / ``rayfl resume``.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rayfl import config as config_mod
from rayfl.config import Config, ConfigError
from rayfl.data import prepare
from rayfl.metrics import provenance
from rayfl.metrics.log import write_json
from rayfl.metrics.progress import (Eta, endpoints_line, hms, resume_hint,
                                    sigterm_as_interrupt)
from rayfl.models import build_for
from rayfl.runtime import checkpoint


@dataclass
class RunResult:
    """What a finished run leaves: its directory, metrics, summary and final parameters."""

    run_dir: str
    metrics: pa.Table
    summary: dict
    params: np.ndarray


def new_run_dir(cfg: Config) -> str:
    """``<output_dir>/<name>-<timestamp>`` (made unique)."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = os.path.join(cfg.output_dir, f"{cfg.name}-{stamp}")
    path, i = base, 1
    while os.path.exists(path):
        path, i = f"{base}-{i}", i + 1
    return path


def _ensure_ray(cfg: Config) -> None:
    import ray

    rt = cfg.runtime
    if not ray.is_initialized():
        if rt.address:
            ray.init(address=rt.address, logging_level="WARNING")
        else:
            needed = math.ceil(rt.num_actors * rt.cpus_per_actor)
            cpus = rt.ray_num_cpus or max(os.cpu_count() or 1, needed)
            ray.init(address="local", num_cpus=cpus, num_gpus=rt.ray_num_gpus,
                     include_dashboard=rt.dashboard,
                     logging_level="WARNING", configure_logging=True)
    have = ray.cluster_resources()
    cpu_need = rt.num_actors * rt.cpus_per_actor
    gpu_need = rt.num_actors * rt.gpus_per_actor
    if have.get("CPU", 0) + 1e-9 < cpu_need:
        raise ConfigError("runtime.cpus_per_actor", rt.cpus_per_actor,
                          f"num_actors × cpus_per_actor ≤ the cluster's {have.get('CPU', 0):g} "
                          f"CPUs (asked for {cpu_need:g})")
    if gpu_need and have.get("GPU", 0) + 1e-9 < gpu_need:
        raise ConfigError("runtime.gpus_per_actor", rt.gpus_per_actor,
                          f"num_actors × gpus_per_actor ≤ the cluster's {have.get('GPU', 0):g} "
                          f"GPUs (asked for {gpu_need:g})")


def _start(cfg: Config, handle, run_dir: str, resume: bool):
    import ray

    from rayfl.runtime.client_actor import ClientActor
    from rayfl.runtime.server import ServerActor

    rt = cfg.runtime
    tag = os.path.basename(run_dir)
    names = [f"rayfl/{tag}/client-{i}" for i in range(rt.num_actors)]
    budget = rt.state_memory_mb * 2**20 / rt.num_actors
    state_root = os.path.join(run_dir, "state")
    actors = [ClientActor.options(name=n, num_cpus=rt.cpus_per_actor, num_gpus=rt.gpus_per_actor)
              .remote(cfg, handle, state_root, budget) for n in names]
    placement = ray.get([a.ready.remote() for a in actors])
    write_json({n: p for n, p in zip(names, placement)}, os.path.join(run_dir, "actors.json"))
    server = ServerActor.options(name=f"rayfl/{tag}/server").remote(
        cfg, handle, run_dir, names, resume)
    return server, actors


def _follow(server, quiet: bool, max_rounds: int | None, on_round) -> dict:
    import ray

    ref = server.run.remote(max_rounds)
    seen, stopping, eta = 0, False, Eta()
    while True:
        done, _ = ray.wait([ref], timeout=0.5)
        rows = ray.get(server.progress.remote(seen))
        seen += len(rows)
        for info in rows:
            if not quiet:
                print(progress_line(info, eta), flush=True)
            if on_round is not None and not stopping and on_round(info):
                server.request_stop.remote()
                stopping = True
        if done:
            return ray.get(ref)


def progress_line(info: dict, eta: Eta | None = None) -> str:
    """``round 3/20 | loss 0.53 | acc 81.2% | 1.4 s/round | ETA 0:00:23``.

    ``info["round"]`` is the server's 0-based loop index, printed 1-based. The s/round and the
    ETA are the mean over the last rounds seen by ``eta`` (this round only without one).
    """
    t, total = info["round"] + 1, info["rounds"]
    parts = [f"round {t}/{total}"]
    if "train_loss" in info:
        parts.append(f"loss {info['train_loss']:.4f}")
    if info.get("test_accuracy") is not None:
        parts.append(f"acc {100 * info['test_accuracy']:.2f}%")
    if "round_s" in info:
        eta = eta or Eta()
        eta.add(info["round_s"])
        parts.append(f"{eta.mean():.2f} s/round")
        parts.append(f"ETA {hms(eta.left(total - t))}")
    return " | ".join(parts)


def _prepare(cfg: Config):
    """The partition store, checked against the model, before anything else starts."""
    handle = prepare(cfg.data, cfg.seed)
    build_for(cfg.model, handle)
    return handle


def _execute(cfg: Config, handle, run_dir: str, resume: bool, quiet: bool,
             max_rounds: int | None, on_round) -> RunResult:
    import ray

    _ensure_ray(cfg)
    sigterm_as_interrupt()
    if not quiet and (line := endpoints_line()):
        print(line, flush=True)
    server, actors = _start(cfg, handle, run_dir, resume)
    try:
        summary = _follow(server, quiet, max_rounds, on_round)
    except KeyboardInterrupt:  # Ctrl-C / SIGTERM (rayfl.cli): actors go, the checkpoint stays
        print(resume_hint(run_dir), file=sys.stderr, flush=True)
        raise
    finally:
        for a in [server, *actors]:
            ray.kill(a)
    if "paused_after_round" in summary:
        if not quiet:
            print(f"paused after round {summary['paused_after_round'] + 1}/{cfg.rounds}; "
                  f"continue with: rayfl resume {run_dir}")
        return RunResult(run_dir, pq.read_table(os.path.join(run_dir, "metrics.parquet")),
                         {"status": "paused", **summary}, None)
    if summary.get("diverged_at_round") is not None and not quiet:
        print(f"run diverged (NaN/inf) at round {summary['diverged_at_round']}; stopped cleanly",
              file=sys.stderr)
    return load_result(run_dir)


def load_result(run_dir: str) -> RunResult:
    """A :class:`RunResult` read back from a finished run directory."""
    import json

    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    return RunResult(run_dir, pq.read_table(os.path.join(run_dir, "metrics.parquet")), summary,
                     np.load(os.path.join(run_dir, "final_model.npy")))


def run(source: Any, overrides: list[str] | None = None, run_dir: str | None = None,
        quiet: bool = False, max_rounds: int | None = None, on_round=None) -> RunResult:
    """Run one experiment from a config path, dict or :class:`Config`.

    ``max_rounds`` pauses after that many rounds (checkpointed; :func:`resume` continues).
    ``on_round(info)`` sees each round's headline numbers (round, train_loss, test/val
    accuracy when evaluated, round_s); returning True pauses the run after that round.
    """
    cfg = config_mod.load(source, overrides)
    handle = _prepare(cfg)  # missing data or a mismatched model: an error, no run directory
    run_dir = os.path.abspath(run_dir or new_run_dir(cfg))  # actors may run in another cwd
    if os.path.exists(os.path.join(run_dir, "config.yaml")):
        raise ConfigError("--run-dir", run_dir, "a new or empty directory (it holds a run; use "
                          "`rayfl resume` to continue it)")
    os.makedirs(run_dir, exist_ok=True)
    config_mod.dump(cfg, os.path.join(run_dir, "config.yaml"))
    provenance.record(run_dir, cfg)
    return _execute(cfg, handle, run_dir, False, quiet, max_rounds, on_round)


def resume(run_dir: str, quiet: bool = False, max_rounds: int | None = None,
           on_round=None) -> RunResult:
    """Continue a run from its last checkpoint (from scratch if it never wrote one)."""
    run_dir = os.path.abspath(run_dir)
    path = os.path.join(run_dir, "config.yaml")
    if not os.path.isfile(path):
        raise ConfigError("run_dir", run_dir, "a run directory holding config.yaml")
    cfg = config_mod.load(path)
    provenance.record(run_dir, cfg)
    return _execute(cfg, _prepare(cfg), run_dir, checkpoint.exists(run_dir), quiet, max_rounds,
                    on_round)
