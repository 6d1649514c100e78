"""Pre-flight: every component the user brings runs once before the run directory is made.

The checks before a run (:func:`rayfl.simulation.preflight`) build the model and run it on a
real batch (:func:`rayfl.models.check_fits`); this module runs the rest of the user's code once,
in this process, on the run's real data and population:

- a user's availability model or client selector plans round 1 (the selector's candidate
  losses, if it scores candidates, at the initial model), and the selector's state must fit in
  a checkpoint;
- a user's algorithm, server wrapper, server optimiser, model or dataset trains one client —
  the smallest that has rows — through the path a run trains clients in process (the server
  state it starts from built as a run builds it);
- a user's executor (one that runs in this process) is built once, and must answer every call
  of the runtime;
- under an executor that copies the run's parts (Ray sends them to its workers, the thread
  executor gives each thread its own), each of the user's components, and the layers built
  from them, must pickle.

A component that breaks its contract then fails as one line (a ComponentError or ConfigError)
with nothing written and nothing started, not inside Ray in round 1 after the run directory
exists. Built-in components are not run again here (the test suite holds them to their
contracts), so a run of built-ins starts as fast as before. The global random generators
(Python, NumPy, torch) and torch's thread count are restored afterwards: the run that follows
draws exactly what it would have drawn without a pre-flight.

The core it calls, kept to a few entry points: :func:`rayfl.availability.run_sampler` (the
planner the server makes) and ``Sampler.plan``; :class:`rayfl.runtime.client_actor.ClientWorker`
(its stack and ``client_losses``); :class:`rayfl.runtime.executors.InProcessExecutor`; and
:class:`rayfl.runtime.loop.RoundLoop` (``setup``, ``groups``, ``train``) with the stack's
``init``, ``broadcast`` and ``client_lr`` and the algorithm's ``aggregation_weights``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import tempfile
import traceback
from typing import Iterator

import numpy as np
import torch
from ray import cloudpickle

from rayfl import assemble, layer_list, registry, rng
from rayfl.availability import run_sampler
from rayfl.contract import ComponentError, _is_user_frame, user_frames
from rayfl.privacy.rules import check_sent
from rayfl.runtime import executor_kind
from rayfl.runtime.async_loop import refuse_uploads
from rayfl.runtime.client_actor import ClientWorker, WorkerParts
from rayfl.runtime.executors import Hosting, InProcessExecutor
from rayfl.runtime.loop import RoundLoop, merge
from rayfl.schema import ConfigError


def user_components(cfg) -> dict[str, bool]:
    """Which parts of the run come from the user: ``sampling`` (availability model, selector)
    and ``training`` (algorithm, server wrappers, aggregation transforms, server optimiser,
    model, dataset)."""
    def mine(section) -> bool:
        return not registry.is_builtin(section.KIND, section.component_name)

    return {"sampling": mine(cfg.availability) or mine(cfg.selection),
            "training": any(map(mine, (cfg.algorithm, cfg.model, cfg.data,
                                       *[s for s in (cfg.server_opt,) if s is not None])))
            or bool(layer_list.user_classes(cfg))}


def run(cfg, parts) -> None:
    """Run each of the user's components of ``cfg`` once on the data behind ``parts.handle``
    (:class:`rayfl.simulation.Parts`, the run's, built on the driver). The client trains on
    workers' parts of its own, built as the run's were, so that what the user's code keeps
    from it never reaches the run; the run's stack is only checked to pickle when the executor
    class copies the parts. A broken contract raises (ComponentError or ConfigError), nothing
    is written."""
    user, handle, executor = user_components(cfg), parts.handle, parts.executor
    if executor.on_ray or getattr(executor, "copies_parts", False):
        _sendable(cfg, parts.stack)
    own_executor = not executor_kind.is_builtin(executor) and not executor.on_ray
    runs_users_code = user["sampling"] or user["training"]
    if not (own_executor or runs_users_code):
        return
    own = assemble.worker_parts(cfg, handle.num_clients)
    if own_executor:
        _build_executor(cfg, handle, own, executor)
    if not runs_users_code:
        return
    place: dict = {"round": 0}  # where the user's code runs, for an error that names it
    with untouched_globals(), tempfile.TemporaryDirectory(prefix="rayfl-preflight-") as tmp, \
            _named_by_frames(place):
        worker = _worker(cfg, handle, own, tmp)
        if user["sampling"]:
            _plan_first_round(cfg, parts.sampling, handle, worker)
        if user["training"]:
            place["client"] = _smallest_client(handle.sizes())
            if place["client"] is not None and \
                    _train_one_client(cfg, handle, worker, place["client"]) and \
                    getattr(executor, "shares_torch_generator", False):
                raise ConfigError("runtime.executor", cfg.runtime.executor,
                                  f"ray or inprocess: training client {place['client']} drew "
                                  "from torch's random generator (a model's dropout, torch.rand "
                                  "in an algorithm or a layer), which this executor's workers "
                                  "share, so what each client drew would depend on their "
                                  "timing")


def _build_executor(cfg, handle, own: WorkerParts, executor) -> None:
    """A user's executor built once on the pre-flight's own workers' parts, its client state in
    a scratch directory: ``build`` must return an object answering every call of the
    runtime."""
    with untouched_globals(), tempfile.TemporaryDirectory(prefix="rayfl-preflight-") as tmp:
        executor_kind.built(executor, Hosting(own, handle, tmp, cfg.runtime, handle.sizes()))


def _worker(cfg, handle, own: WorkerParts, state_root: str):
    """A client worker of ``own`` parts on the CPU of this process, its client state under
    ``state_root``."""
    cpu = dataclasses.replace(own, gpus=0.0)
    return ClientWorker(cpu, handle, state_root, cfg.runtime.state_memory_mb * 2**20)


def _plan_first_round(cfg, sampling, handle, worker) -> None:
    """The availability model and the selector plan round 1 (t = 0) over the real population,
    from what the run's planner is made of (``sampling``); then the selector's state is
    checked to fit a checkpoint."""
    w = worker.model.w
    sampler = run_sampler(sampling, handle, worker.stack, w)
    losses = None
    if sampler.selector.scores_candidates:
        point = w.detach().cpu().numpy()
        buffers = worker.model.get_buffers().cpu().numpy() if worker.model.num_buffers \
            else None
        losses = lambda ids: worker.client_losses(point, ids, cfg.eval.batch_size,  # noqa: E731
                                                  buffers)
    sampler.plan(0, 0.0, losses)
    sampler.selector.state()


def _smallest_client(sizes: np.ndarray) -> int | None:
    """The client with the fewest rows but some (the lowest id of a tie); None: none has any."""
    if not (sizes > 0).any():
        return None
    return int(np.argmin(np.where(sizes > 0, sizes, np.iinfo(sizes.dtype).max)))


def _train_one_client(cfg, handle, worker, client_id: int) -> bool:
    """Round 1's client-side work for client ``client_id``: the algorithm's server state and
    broadcast, its client procedure, the client-side transforms; then what it sent beside the
    upload, held to the privacy mechanism's account. Whether the client's code drew from
    torch's generator (seeded for the client before it ran: drawing moved it on)."""
    sizes, client = handle.sizes(), np.array([client_id])
    stack, model = worker.stack, worker.model
    loop = RoundLoop(stack, InProcessExecutor(worker), sizes, 1, worker.messages)
    state = stack.init(model.w.detach().clone(), model.get_buffers() if model.num_buffers
                       else None)
    if stack.algorithm.traits.has("setup"):
        state = loop.setup(state)
    weights = stack.weights(state, client, sizes[client])
    lr = stack.client_lr(state, 0, cfg.local.lr, cfg.local.lr_decay)
    sums, _, _ = loop.train(0, stack.broadcast(state, 0), lr,
                            loop.groups(client, weights, None), None, client)
    after = torch.get_rng_state()
    rng.seed_torch(cfg.seed, 0, client_id, worker.device)
    drew = not torch.equal(after, torch.get_rng_state())
    for acc in sums.values():  # what the layers' client halves put in their payloads
        stack.payload_sums(acc.layer_sums(len(stack.layers)), 0)
    total = merge(sums[g] for g in sorted(sums))
    stack.check_payload(list(total.extras), list(total.rows), total.uploaded,
                        total.layer_sums(len(stack.layers)), 0)
    refuse_uploads(cfg.aggregation.mode, total.uploaded, stack.algorithm, 0)
    sent = [*(k for k in total.extras if k not in total.uploaded), *total.rows]
    if cfg.privacy is not None:
        check_sent(cfg.privacy, {*sent, *(k for own in total.layers for k in own)},
                   total.uploaded)
    return drew


def _sections(cfg) -> list[tuple[str, object]]:
    """(key, section) of every config section naming one of the user's components."""
    named = [("algorithm.name", cfg.algorithm), ("model.name", cfg.model),
             ("data.dataset", cfg.data), ("availability.model", cfg.availability),
             ("selection.name", cfg.selection), ("server_opt.name", cfg.server_opt)]
    return [(key, s) for key, s in named
            if s is not None and not registry.is_builtin(s.KIND, s.component_name)]


def _sendable(cfg, stack) -> None:
    """Ray sends the config (its sections carry the user's components) and the built layers
    to its workers: each of the user's must pickle, or a ConfigError names its key before
    the run directory exists (not a failure inside Ray after it)."""
    built = {"algorithm.name": stack.algorithm, "server_opt.name": stack.optimizer}
    objects = [(key, s.component_name, (("", s), (" once built", built.get(key))))
               for key, s in _sections(cfg)]
    layers = dict(zip(stack.where, stack.layers))
    objects += [(f"{e.where}.name", e.name, (("", e.cls), (" once built", layers[e.where])))
                for e in cfg.layer_entries() if not e.builtin]
    for key, name, forms in objects:
        for what, obj in forms:
            try:
                cloudpickle.dumps(obj)
            except Exception as e:  # noqa: BLE001 - whatever pickling the user's object raises
                raise ConfigError(key, name, f"a component the executor can copy to its workers "
                                             f"(pickling it{what} failed: {type(e).__name__}: "
                                             f"{e})") from None


@contextlib.contextmanager
def _named_by_frames(place: dict) -> Iterator[None]:
    """An exception raised in the user's code that no contract check named (a ComponentError
    or ConfigError passes as it is) becomes a ComponentError naming the user's function it was
    raised in (its innermost frame in the user's files), the ``place`` (round, client) and the
    user's frames; one with no frame of the user's is rayfl's own and passes unchanged."""
    try:
        yield
    except (ComponentError, ConfigError):
        raise
    except Exception as e:  # noqa: BLE001 - the user's code may raise anything
        frames = [(f, f.f_code) for f, _ in traceback.walk_tb(e.__traceback__)
                  if _is_user_frame(f.f_code.co_filename)]
        if not frames:
            raise
        frame, code = frames[-1]
        name = f"{frame.f_globals.get('__name__', '?')}:{code.co_qualname}"
        problem = f"raised {type(e).__name__}: {e}" if str(e) else f"raised {type(e).__name__}"
        raise ComponentError(name, problem, place.get("round"), place.get("client"),
                             user_frames(e.__traceback__)) from None


@contextlib.contextmanager
def untouched_globals() -> Iterator[None]:
    """Restore Python's, NumPy's and torch's CPU generators and torch's threads on exit."""
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        torch.set_num_threads(threads)
