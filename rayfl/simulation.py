"""The user's side of a run: validate, prepare data, start Ray and the actors, follow progress.

:func:`run` and :func:`resume` are the Python API behind ``rayfl run`` / ``rayfl resume``.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray

from rayfl import assemble, compat, failures, layer_list, registry, rundir
from rayfl import config as config_mod
from rayfl import preflight as user_preflight
from rayfl.algorithms.checks import check_model
from rayfl.availability import Sampling, check_files
from rayfl.config import Config, ConfigError
from rayfl.contract import own_exits
from rayfl.data import prepare
from rayfl.data.regime import check_regime
from rayfl.failures import RunStopped
from rayfl.metrics import provenance
from rayfl.metrics.loggers import check_mlflow, end_run
from rayfl.metrics.progress import (Eta, empty_note, endpoints_line, hms, resume_hint,
                                    sigterm_as_interrupt)
from rayfl.models import check_fits, check_single_rows
from rayfl.models.flat import flat_spec
from rayfl.runtime import checkpoint, run_actors, run_state, storage
from rayfl.runtime.client_actor import WorkerParts
from rayfl.runtime.cluster import connect_ray, require_actor_resources
from rayfl.runtime.executors import ActorsLost
from rayfl.runtime.server import Server
from rayfl.runtime.storage import StorageError


@dataclass
class RunResult:
    """What a finished run leaves: its directory, metrics, summary and final parameters."""

    run_dir: str
    metrics: pa.Table
    summary: dict
    params: np.ndarray


def new_run_dir(cfg: Config) -> str:
    """``<output_dir>/<name>-<timestamp>`` (made unique)."""
    return rundir.new_path(cfg.output_dir, cfg.name)


def executor_of(cfg: Config):
    """The ``runtime.executor`` class the run trains on (:mod:`rayfl.runtime.executors`)."""
    return registry.resolve("executor", cfg.runtime.executor)


def _ensure_ray(cfg: Config) -> None:
    """Join or start Ray and check the run's actors fit it (before any file is written); an
    executor not ``on_ray`` needs no Ray."""
    if not executor_of(cfg).on_ray:
        return
    connect_ray(cfg)
    require_actor_resources(cfg)


def _check_local_ray(cfg: Config) -> None:
    """A local Ray cannot host absurd actor counts (each actor is a process): refused before
    anything starts."""
    rt = cfg.runtime
    local = rt.ray_num_cpus or os.cpu_count() or 1
    if not executor_of(cfg).on_ray or rt.address is not None:
        return
    if rt.cpus_per_actor > local:
        raise ConfigError("runtime.cpus_per_actor", rt.cpus_per_actor,
                          f"at most the {local} CPUs of a local Ray (an actor's torch threads "
                          "run on them); join a cluster with runtime.address")
    if rt.num_actors > 8 * local:
        raise ConfigError("runtime.num_actors", rt.num_actors,
                          f"at most 8 × the {local} CPUs of a local Ray (each actor is a "
                          "process); join a cluster with runtime.address")


def _cause(e: Exception) -> Exception:
    """The server's own exception, without the traceback Ray wraps around it."""
    return getattr(e, "cause", None) or e


def _write_failed(e: Exception, run_dir: str) -> RunStopped:
    return RunStopped(f"the run's files could not be written: {_cause(e)}; the last checkpoint is "
                      f"intact; once there is room (or write access), continue with: rayfl "
                      f"resume {run_dir}")


def _follow(actors: run_actors.RunActors, run_dir: str, timeout_s: float | None, quiet: bool,
            max_rounds: int | None, on_round) -> dict:
    follow = on_round is not None  # the server waits for its verdict on each round
    server = actors.server[1]
    try:
        ray.get(actors.started)
    except ray.exceptions.RayActorError as e:
        raise failures.server_died(e, run_dir, 0) from None
    except ray.exceptions.RayTaskError as e:
        raise failures.server_not_started(e) from None
    ref = server.run.remote(max_rounds, follow=follow)
    seen, stopping, started, eta = 0, False, False, Eta()
    while True:
        done, _ = ray.wait([ref], timeout=0 if follow else 0.5)
        rows: list[dict] = []
        try:
            # the first answer waits for the server's start-up; later ones must be prompt
            rows = ray.get(server.progress.remote(seen, min(0.5, (timeout_s or 1) / 2)
                                                  if follow else 0.0),
                           timeout=timeout_s if started else None)
            started = True
            if done:
                summary = ray.get(ref)
        except ray.exceptions.GetTimeoutError:
            raise RunStopped(f"the server actor has not answered for {timeout_s:g} s "
                             f"(runtime.actor_timeout_s); {failures.continue_hint(run_dir)}"
                             ) from None
        except ActorsLost as e:
            raise RunStopped(f"{_cause(e)}; {failures.continue_hint(run_dir)}") from None
        except ray.exceptions.RayActorError as e:
            raise failures.server_died(e, run_dir, seen + len(rows)) from None
        except StorageError as e:
            raise _write_failed(e, run_dir) from None
        except ray.exceptions.RayTaskError as e:  # the user's own error, else one line
            raise failures.server_failed(e, run_dir, seen + len(rows)) from None
        seen += len(rows)
        for info in rows:
            if not quiet:
                print(progress_line(info, eta), flush=True)
            if follow:
                stopping = stopping or bool(on_round(info))
                server.decide.remote(info["round"], stopping)
        if done:
            return summary


def progress_line(info: dict, eta: Eta | None = None) -> str:
    """``round 3/20 | loss 0.53 | acc 81.2% | ε 1.7 (replace-one) | 1.4 s/round | ETA 0:00:23``.

    ``info`` is a metrics row (``round`` counts from 1) with ``rounds``. The s/round and the
    ETA are the mean over the last rounds seen by ``eta`` (this round only without one).
    """
    t, total = info["round"], info["rounds"]
    parts = [f"round {t}/{total}"]
    if (note := empty_note(info)) is not None:
        parts.append(note)
    elif "train_loss" in info:
        parts.append(f"loss {info['train_loss']:.4f}")
    if info.get("test_accuracy") is not None:
        parts.append(f"acc {100 * info['test_accuracy']:.2f}%")
    if "dp_epsilon" in info:
        label = f" ({info['dp_label']})" if info.get("dp_label") else ""
        parts.append(f"ε {info['dp_epsilon']:.3g}{label}")
    if "round_s" in info:
        eta = eta or Eta()
        eta.add(info["round_s"])
        parts.append(f"{eta.mean():.2f} s/round")
        parts.append(f"ETA {hms(eta.left(total - t))}")
    return " | ".join(parts)


def _run_here(parts, settings, run_dir: str, resume: bool, quiet: bool,
              max_rounds: int | None, on_round) -> dict:
    """The whole run in this process (an executor not ``on_ray``: in-process, threads): no
    Ray at all."""
    eta = Eta()

    def show(info: dict) -> bool:
        if not quiet:
            print(progress_line(info, eta), flush=True)
        return bool(on_round is not None and on_round(info))

    try:  # the caller's generators and torch threads as they were (a notebook's)
        with own_exits(), user_preflight.untouched_globals():
            return Server(parts, settings, run_dir, None, resume).run(max_rounds, show)
    except StorageError as e:
        raise _write_failed(e, run_dir) from None
    except KeyboardInterrupt:  # the last checkpoint stays
        print(resume_hint(run_dir), file=sys.stderr, flush=True)
        raise


def _check_max_rounds(max_rounds: int | None) -> None:
    if max_rounds is not None and (isinstance(max_rounds, bool) or max_rounds < 1):
        raise ConfigError("--max-rounds", max_rounds, "an integer >= 1 (rounds to run before "
                          "pausing)")


def _execute(cfg: Config, parts, run_dir: str, resume: bool, quiet: bool,
             max_rounds: int | None, on_round) -> RunResult:
    settings = assemble.server_settings(cfg, parts.handle.num_clients, parts.x, run_dir)
    if not parts.executor.on_ray:
        summary = _run_here(parts, settings, run_dir, resume, quiet, max_rounds, on_round)
    else:
        sigterm_as_interrupt()
        if not quiet and (line := endpoints_line()):
            print(line, flush=True)
        actors = run_actors.start(cfg, parts, settings, run_dir, resume)
        ended = None  # the MLflow run's status when the driver stops the run
        try:
            summary = _follow(actors, run_dir, cfg.runtime.actor_timeout_s, quiet, max_rounds,
                              on_round)
        except KeyboardInterrupt:  # Ctrl-C / SIGTERM (rayfl.cli): actors go, the checkpoint stays
            ended = "KILLED"
            print(resume_hint(run_dir), file=sys.stderr, flush=True)
            raise
        except BaseException:  # a lost actor or server, the user's on_round: the run stopped
            ended = "FAILED"
            raise
        finally:
            actors.end(clean=ended is None)
            if ended is not None:
                end_run(cfg.loggers, run_dir, ended)
    if "paused_after_round" in summary:
        if not quiet:
            print(f"paused after round {summary['paused_after_round'] + 1}/{cfg.rounds}; "
                  f"continue with: rayfl resume {run_dir}")
        return RunResult(run_dir, pq.read_table(os.path.join(run_dir, "metrics.parquet")),
                         {"status": "paused", **summary}, None)
    if summary.get("diverged"):  # said even with --quiet: the run did not do what was asked
        print(f"rayfl: run diverged in round {summary['diverged_at_round']} "
              f"({summary.get('diverged_reason')}); stopped; see {run_dir}", file=sys.stderr)
    if summary.get("stopped"):  # the same: rounds without a client, not a result
        print(f"rayfl: run stopped in round {summary['stopped_at_round']}: "
              f"{summary['stopped']}; see {run_dir}", file=sys.stderr)
    return load_result(run_dir)


def _check_not_diverged(run_dir: str) -> None:
    """A diverged run has ended: resumed, its next round starts from the diverged model (and
    ``loss_ceiling`` cannot change), so it is refused, pointing at ``rayfl fork``."""
    path = os.path.join(run_dir, "summary.json")
    if not os.path.isfile(path):
        return
    with open(path) as f:
        summary = json.load(f)
    if isinstance(summary, dict) and summary.get("diverged"):
        raise ConfigError("run_dir", run_dir, f"a run that has not ended (this one diverged in "
                          f"round {summary.get('diverged_at_round')}: summary.json); to go on "
                          "from an earlier round with other settings, rayfl fork it")


def load_result(run_dir: str) -> RunResult:
    """A :class:`RunResult` read back from a finished run directory."""
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    return RunResult(run_dir, pq.read_table(os.path.join(run_dir, "metrics.parquet")), summary,
                     np.load(os.path.join(run_dir, "final_model.npy")))


def check_request(cfg: Config, max_rounds: int | None) -> None:
    """What a launch asks for that no config key holds: ``--max-rounds``, and actors a local
    Ray can host."""
    _check_max_rounds(max_rounds)
    _check_local_ray(cfg)


class Parts(NamedTuple):
    """What a launch hands down, built once on the driver and sent by value: the partition
    store's handle; the client workers' parts (:class:`WorkerParts`), the run's stack among
    them (algorithm, layers, server optimiser), the same in the server and every client actor;
    what the round planner is made of; the executor class the server trains on; and ``x``, what
    a checkpoint's model must be (its length and dtype)."""

    handle: Any
    worker: WorkerParts
    sampling: Sampling
    executor: Any
    x: tuple[int, Any]

    @property
    def stack(self):
        """The run's :class:`~rayfl.layers.Stack`."""
        return self.worker.stack


def preflight(cfg: Config, run_dir: str | None = None) -> Parts:
    """The partition store, checked against the model, the layers and the availability files,
    the user's components run once (:mod:`rayfl.preflight`) and the tracking store (of the
    run in ``run_dir``, when it is resumed) reached, before anything is written; the run's
    :class:`Parts`."""
    # the user's sys.exit or KeyboardInterrupt: their error; the caller's generators and torch
    # threads as they were
    with own_exits(), user_preflight.untouched_globals():
        handle = prepare(cfg.data, cfg.seed)
        model = check_fits(cfg.model, handle)
        compat.check_model(cfg, model)
        check_model(cfg, model, handle)
        layer_list.check_data(cfg, handle)
        check_regime(cfg.data, handle)
        check_single_rows(model, handle, cfg.local.batch_size)
        check_files(cfg.availability, handle.num_clients)
        # the layers and the server optimiser build, once
        parts = Parts(handle, assemble.worker_parts(cfg, handle.num_clients),
                      assemble.sampling(cfg), executor_of(cfg), flat_spec(model))
        user_preflight.run(cfg, parts)  # the user's components once
    check_mlflow(cfg.loggers, run_dir)
    return parts


def launch(cfg: Config, parts, run_dir: str, *, resume: bool, new: bool, quiet: bool,
           max_rounds: int | None, on_round, write=None, forked_from: dict | None = None
           ) -> RunResult:
    """The launch every command shares once its own checks passed: Ray, the run directory (made
    here when ``new``: config, fingerprint, then ``write(run_dir)``, a fork's copied prefix),
    its lock, provenance, then the run (from the checkpoint in ``run_dir`` when ``resume``) on
    the :class:`Parts` the pre-flight built.

    A new run stopped by bad input before it recorded a round (a
    :data:`~rayfl.failures.CLEAR` error: a user's component breaking its contract, say in the
    server's half, which the pre-flight cannot run) leaves nothing behind: its directory, the
    directories made for it and its files in ``runtime.storage`` are removed."""
    created, recorded, existed = [], None, set()  # recorded: metrics.parquet's rows once written
    if new:  # Ray first: a cluster that cannot be joined leaves no directory behind
        _ensure_ray(cfg)
        rundir.check_new(run_dir)  # still free after the checks (a download can take minutes)
        storage.check_new_run(cfg, run_dir)
        existed = _storage_before(cfg, run_dir)
        created = rundir.make(run_dir)
    lock = rundir.Lock(run_dir)  # refused while another process writes the run
    try:
        if not new:
            _ensure_ray(cfg)
        if new:
            rundir.write_fingerprint(run_dir, config_mod.to_dict(cfg))  # first: config.yaml
            config_mod.dump(cfg, os.path.join(run_dir, "config.yaml"))   # then marks a run
            if write is not None:
                write(run_dir)
            recorded = rundir.rows_recorded(run_dir)  # a fork's copied rounds
        provenance.record(run_dir, cfg, **({"forked_from": forked_from} if forked_from
                                           else {}))
        return _execute(cfg, parts, run_dir, resume, quiet, max_rounds, on_round)
    except failures.CLEAR:
        if new and recorded in (None, rundir.rows_recorded(run_dir)):
            _remove_new_run(cfg, run_dir, created, existed)  # the lock still held
        raise
    finally:
        lock.release()


def _storage_before(cfg: Config, run_dir: str) -> set[str]:
    """The directories a new run's ``runtime.storage`` location has before it runs (kept if
    the run is removed)."""
    if cfg.runtime.storage is None:
        return set()
    return storage.Storage(storage.run_location(cfg, run_dir)).directories()


def _remove_new_run(cfg: Config, run_dir: str, created: list[str], existed: set[str]) -> None:
    """A new run that recorded no round removed: its directory and those made for it
    (:func:`rundir.unmake`), and its files and folders under ``runtime.storage`` (held no
    files when it began; the folders that ``existed`` stay). A failure to remove is a warning:
    the error that stopped the run is the one raised."""
    try:
        rundir.unmake(run_dir, created)
        location = storage.run_location(cfg, run_dir)
        store = storage.Storage(location)
        if cfg.runtime.storage is None or store.is_local and _nested(store.location, run_dir):
            return  # the run directory or inside it: unmake's to remove
        store.remove_new(existed)
    except Exception as e:  # noqa: BLE001 - never hides why the run stopped
        print(f"rayfl: warning: the run stopped before its first round, and what it created "
              f"could not all be removed ({type(e).__name__}: {e})", file=sys.stderr)


def _nested(a: str, b: str) -> bool:
    """Whether local path ``a`` is ``b`` or lies inside it."""
    a, b = os.path.abspath(a), os.path.abspath(b)
    return os.path.commonpath([a, b]) == b


def run(source: Any, overrides: list[str] | None = None, run_dir: str | None = None,
        quiet: bool = False, max_rounds: int | None = None, on_round=None) -> RunResult:
    """Run one experiment from a config path, dict or :class:`Config`.

    ``max_rounds`` pauses after that many rounds (checkpointed; :func:`resume` continues).
    ``on_round(row)`` sees each round's full metrics row, as written to ``metrics.parquet``
    (``round`` from 1; every column in METRICS.md), plus ``rounds``; returning True pauses the
    run after that round.
    Every check that can fail runs before the run directory is created.
    """
    cfg = config_mod.load(source, overrides)
    check_request(cfg, max_rounds)
    key = "--run-dir" if run_dir else "output_dir"
    run_dir = os.path.abspath(run_dir or new_run_dir(cfg))  # actors may run in another cwd
    rundir.check_new(run_dir, key)
    storage.check_new_run(cfg, run_dir)
    parts = preflight(cfg)  # missing data or a mismatched model: an error, no run directory
    return launch(cfg, parts, run_dir, resume=False, new=True, quiet=quiet,
                  max_rounds=max_rounds, on_round=on_round)


def resume(run_dir: str, quiet: bool = False, max_rounds: int | None = None,
           on_round=None) -> RunResult:
    """Continue a run from its last checkpoint (from scratch if it never committed one).

    Refused while another process writes the run, and when ``config.yaml`` was edited in a key
    that can change results (see :mod:`rayfl.rundir`); a newest checkpoint or client-state file
    that is damaged, or missing though committed, is a :class:`CheckpointError` naming it."""
    run_dir = os.path.abspath(run_dir)
    path = os.path.join(run_dir, "config.yaml")
    if not os.path.isfile(path):
        raise ConfigError("run_dir", run_dir, "a run directory holding config.yaml")
    cfg = config_mod.load(path)
    check_request(cfg, max_rounds)
    location = storage.run_location(cfg, run_dir)
    # damaged, incomplete or lost though one was committed: a clear error before Ray starts
    has_checkpoint = checkpoint.resume_point(location, run_dir)
    if not has_checkpoint and not quiet:
        print("no round of this run was checkpointed: it starts over from round 1")
    rundir.check_fingerprint(run_dir, config_mod.to_dict(cfg))
    _check_not_diverged(run_dir)
    provenance.load(run_dir)
    parts = preflight(cfg, run_dir)
    done = 0
    if has_checkpoint:  # every piece of the checkpoint fits the run, before anything starts
        expect = run_state.expected(cfg.aggregation, cfg.privacy, parts.handle.num_clients,
                                    parts.x)
        done = 1 + run_state.restored(checkpoint.load(location), expect,
                                      checkpoint.path_of(location), parts.stack).round
    rundir.check_metrics(run_dir, done)
    return launch(cfg, parts, run_dir, resume=has_checkpoint, new=False, quiet=quiet,
                  max_rounds=max_rounds, on_round=on_round)
