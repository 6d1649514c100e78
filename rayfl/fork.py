"""``rayfl fork``: a new run that starts from a kept checkpoint of another run.

The fork copies what the source run had after round N (server state, the client-state versions
its checkpoint refers to, the metrics rows up to N, the virtual clock; the sampler is a function
of the seed and the round) into a new run directory and continues from round N + 1 under a
config with the user's overrides. Without overrides it finishes with the source's
``model_sha256``; with them it shares the source's first N rounds instead of recomputing them
(an IMA ablation branching at t_s saves t_s / R of the run). Keys that shape those first rounds'
state cannot change (:data:`FIXED`), and the algorithm must be able to continue from the
checkpoint's server state (:meth:`rayfl.algorithms.base.Algorithm.fork_state`). A kept
checkpoint written by another run (copied or linked into the source directory) is refused,
naming the key that differs.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rayfl import assemble, rundir
from rayfl import config as config_mod
from rayfl.config import ConfigError
from rayfl.metrics import tables
from rayfl.runtime import checkpoint, run_state, storage
from rayfl.runtime.messages import message_name
from rayfl.runtime.state_store import state_name
from rayfl.runtime.storage import Storage
from rayfl.simulation import RunResult, check_request, launch, new_run_dir, preflight

#: config keys a fork cannot change: they shape the data, the model and the state it inherits
FIXED = checkpoint.SHARED


def fork_config(source_dir: str, at: int, overrides: list[str] | None):
    """(source config, fork config) after the checks that need no data or Ray."""
    path = os.path.join(source_dir, "config.yaml")
    if not os.path.isfile(path):
        raise ConfigError("RUN_DIR", source_dir, "a run directory holding config.yaml")
    source = config_mod.load(path)
    if isinstance(at, bool) or not isinstance(at, int) or not 1 <= at < source.rounds:
        raise ConfigError("--at", at, f"a round in [1, {source.rounds - 1}] with a kept "
                                      "checkpoint (checkpoint.keep in the run's config)")
    overrides = list(overrides or [])
    if not any(o.split("=", 1)[0].strip() == "name" for o in overrides):
        overrides.append(f"name={source.name}-fork{at}")
    cfg = config_mod.load(config_mod.to_dict(source), overrides)
    old = rundir.result_keys(config_mod.to_dict(source))
    new = rundir.result_keys(config_mod.to_dict(cfg))
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k)
                     and any(k == f or k.startswith(f) for f in FIXED))
    if changed:
        more = f"; {len(changed) - 1} other such key(s) differ too" if len(changed) > 1 else ""
        raise ConfigError(changed[0], new.get(changed[0], "<unset>"),
                          f"the source run's value {old.get(changed[0], '<unset>')!r} (a fork "
                          f"keeps data, model, algorithm.name, privacy and seed; start a new run "
                          f"instead{more})")
    if cfg.rounds <= at:
        raise ConfigError("rounds", cfg.rounds, f"more than the fork round {at}")
    was, now = source.aggregation.mode, cfg.aggregation.mode
    if was != now:
        what = "synchronous rounds" if was == "sync" else \
            "event loop, with the clients in flight in it and what it kept for them"
        raise ConfigError("aggregation.mode", now, f"{was!r}, the source run's (a fork continues "
                                                   f"the source's {what})")
    return source, cfg


def fork(source_dir: str, at: int, overrides: list[str] | None = None,
         run_dir: str | None = None, quiet: bool = False, max_rounds: int | None = None,
         on_round=None) -> RunResult:
    """Branch a new run from ``source_dir``'s kept checkpoint of 1-based round ``at``.

    Every check (config, kept checkpoint, client-state files, the algorithm's ability to
    continue) runs before the new run directory is created; the source run is only read.
    """
    source_dir = os.path.abspath(source_dir)
    source, cfg = fork_config(source_dir, at, overrides)
    check_request(cfg, max_rounds)
    src_location = storage.run_location(source, source_dir)
    ck = checkpoint.load_kept(src_location, at)
    checkpoint.check_identity(ck, checkpoint.identity(source),
                              Storage(src_location).path(checkpoint.kept_name(at)))
    ck[checkpoint.IDENTITY] = checkpoint.identity(cfg)  # the copy belongs to the fork
    src_state = Storage(storage.state_root(source, source_dir))
    versions = ck["versions"]
    missing = [int(c) for c in np.flatnonzero(versions >= 0)
               if not src_state.exists(state_name(int(c), int(versions[c])))]
    if missing:
        raise storage.CheckpointError(
            src_state.path(state_name(missing[0], int(versions[missing[0]]))),
            f"the file the kept checkpoint refers to ({len(missing)} missing: deleted, or the "
            "run's storage moved)", what="client state")
    checkpoint.check_states(storage.state_root(source, source_dir), versions,
                            checkpoint.identity(source))
    run_dir = os.path.abspath(run_dir or new_run_dir(cfg))
    if os.path.realpath(run_dir).startswith(os.path.realpath(source_dir) + os.sep):
        raise ConfigError("--run-dir", run_dir, f"a directory outside the source run "
                          f"{source_dir} (a fork only reads its source)")
    rundir.check_new(run_dir)
    rundir.check_metrics(source_dir, at)
    storage.check_new_run(cfg, run_dir)
    parts = preflight(cfg)
    handle, stack = parts.handle, parts.stack
    source_stack = assemble.stack(source, handle.num_clients)
    state = checkpoint.server_state(source_stack, ck, checkpoint.path_of(src_location))
    try:
        ck["state"] = stack.fork(state, at, source_stack)
    except ValueError as e:
        raise ConfigError("--at", at, str(e)) from None
    ck.pop("transforms", None)  # rayfl 0.1 kept them beside the state
    ck.pop("buffers", None)
    if cfg.selection.name != source.selection.name:  # another selector learns from scratch
        ck["selection"] = None
    expect = run_state.expected(cfg.aggregation, cfg.privacy, handle.num_clients, parts.x)
    run_state.restored(ck, expect, Storage(src_location).path(checkpoint.kept_name(at)))
    return launch(cfg, parts, run_dir, resume=True, new=True, quiet=quiet,
                  max_rounds=max_rounds, on_round=on_round,
                  write=lambda d: _copy_prefix(source, source_dir, cfg, d, ck),
                  forked_from={"run_dir": source_dir, "round": at})


def _copy_prefix(source, source_dir: str, cfg, run_dir: str, ck: dict) -> None:
    """The source's client states of the checkpoint, its metrics and per-client evaluation rows
    and the checkpoint itself, written into the new run (the checkpoint last: it is what makes
    the directory resumable)."""
    src_state = Storage(storage.state_root(source, source_dir))
    dst_state = Storage(storage.state_root(cfg, run_dir))
    versions = ck["versions"]
    for c in np.flatnonzero(versions >= 0):
        name = state_name(int(c), int(versions[c]))
        dst_state.write(name, src_state.read(name))
    for round_ in sorted({int(v) for v in versions[versions >= 0]}):  # their rounds' messages
        if src_state.exists(message_name(round_)):
            dst_state.write(message_name(round_), src_state.read(message_name(round_)))
    for name in ("metrics.parquet", "client_eval.parquet"):  # rows of rounds 1..N
        path = os.path.join(source_dir, name)
        if os.path.isfile(path):
            table = tables.read_table(path)  # the source may be running
            pq.write_table(table.filter(pc.less_equal(table["round"], ck["round"] + 1)),
                           os.path.join(run_dir, name))
    checkpoint.save(storage.run_location(cfg, run_dir), ck)
