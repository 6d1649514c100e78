"""The server: samples, runs the round loop on an executor, evaluates and checkpoints.

The run loop lives here, not in the user's process: with an executor ``on_ray`` (Ray's) the
user's process starts this class as an actor and polls :meth:`Server.progress`; with the others
(in-process, threads) it runs in the user's process. Per round the server asks the availability model for a plan and
hands the dispatched clients to :class:`~rayfl.runtime.loop.RoundLoop`, which is the round.
"""

from __future__ import annotations

import functools
import math
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import ray
import torch

from rayfl import privacy
from rayfl.availability import run_sampler
from rayfl.availability.empty import EmptyRounds, NobodyOnline
from rayfl.contract import own_exits
from rayfl.data.evaluators import test_metrics
from rayfl.metrics import divergence
from rayfl.metrics.log import MetricsLog, RunRecord
from rayfl.models.metrics import criterion
from rayfl.privacy import audit
from rayfl.runtime import async_loop, checkpoint, run_state, state_store, storage
from rayfl.runtime.async_config import Settings as AsyncSettings
from rayfl.runtime.client_actor import model_for
from rayfl.runtime.client_eval import ClientEvaluation, finetune_spec
from rayfl.runtime.commits import Commits
from rayfl.runtime.executor_kind import built
from rayfl.runtime.executors import Hosting
from rayfl.runtime.loop import RoundLoop
from rayfl.runtime.memory import peak_rss_mb, reuse_freed_memory
from rayfl.runtime.messages import Messages


@dataclass(frozen=True)
class ServerSettings:
    """What the server is told beside the run's parts, each from its own section, built on the
    driver (:func:`rayfl.assemble.server_settings`) and handed down by value."""

    rounds: int
    seed: int
    loss_ceiling: float | None
    model: Any  # the ``model`` section: the server's own copy evaluates
    local: Any  # the ``local`` section: the clients' learning rate, its decay, a fine-tune's
    evaluation: Any  # the ``eval`` section
    checkpoint: Any  # the ``checkpoint`` section
    keep: Any  # the ``keep`` section
    runtime: Any  # the ``runtime`` section: threads, logical shards, the executor's hosting
    max_empty_rounds: int  # availability.max_empty_rounds
    asynchronous: AsyncSettings | None  # the event loop's ``aggregation`` keys (None: sync)
    expected: run_state.Expected  # what the run's checkpoints hold
    location: str  # where checkpoints and client state live (the run directory or storage)
    identity: dict  # what each checkpoint says of its run
    record: RunRecord  # what the run's log states of its config


class Server:
    """Owns the algorithm's server state and the round loop (runs as a Ray actor)."""

    def __init__(self, parts, settings: ServerSettings, run_dir: str,
                 actors: list | None, resume: bool = False,
                 actors_started_at: float | None = None, binding: list | None = None):
        """``parts``: the run's parts as the driver built them (:class:`rayfl.simulation.Parts`:
        the data handle, the client workers' parts with the run's stack, what the round planner
        is made of, the executor class); ``settings``: the server's own
        (:class:`ServerSettings`); ``actors``: the client actors an ``on_ray`` executor
        trains on, ``actors_started_at`` when the driver started them (``time.time()``) and
        ``binding`` what their calls carry (:func:`rayfl.runtime.client_actor.bind`)."""
        rt = settings.runtime
        torch.set_num_threads(max(1, min(os.cpu_count() or 1,
                                         math.floor(rt.num_actors * rt.cpus_per_actor))))
        handle = parts.handle
        self.settings, self.handle, self.run_dir = settings, handle, run_dir
        self.location = settings.location  # checkpoints (and state) live here
        self.state_root = storage.state_root_of(settings.location)
        self.sizes = handle.sizes()
        self.stack = parts.stack
        self.algorithm = self.stack.algorithm
        self.model = model_for(settings.model, settings.seed, handle, "cpu")
        self.loss_fn = criterion(handle)
        #: the privacy mechanism's account, as its layer was built (None: no privacy)
        self.account = getattr(self.stack.privatiser, "account", None)
        self.final_round = settings.rounds if self.account is None else \
            self.account.final_round
        self.participation = None if self.account is None else \
            self.account.participation(len(self.sizes))  # dp_ftrl, banded_mf
        self.canaries = audit.canaries_of(self.stack)  # the privacy audit's, or None
        self.x0 = None if self.canaries is None else self.model.w.detach().cpu().double().clone()
        self.sampler = run_sampler(parts.sampling, handle, self.stack, self.model.w)
        executor = built(parts.executor, Hosting(parts.worker, handle, self.state_root, rt,
                                                 self.sizes, actors, actors_started_at,
                                                 binding))
        self.loop = RoundLoop(self.stack, executor, self.sizes, rt.logical_shards,
                              Messages(self.state_root))
        self.asynchronous = async_loop.for_server(
            settings.asynchronous, settings.local, settings.seed,
            parts.sampling.availability.dropout, self.loop, self.sampler)
        reader = handle.open()
        evaluation = settings.evaluation
        self.client_eval = ClientEvaluation(
            evaluation, finetune_spec(evaluation, settings.local), settings.seed,
            reader.holdout_sizes(), executor, run_dir) if evaluation.clients else None
        self.eval_sets = {"test": reader.tensors(*reader.test(evaluation.test_rows,
                                                              settings.seed), "cpu")}
        if handle.num_validation_clients:
            self.eval_sets["val"] = reader.tensors(*reader.validation(), "cpu")
        self.log = MetricsLog(run_dir, settings.record)
        # client-state versions a kept checkpoint refers to: never deleted (rayfl fork)
        self.pinned = checkpoint.pinned_versions(self.location) if resume else set()
        self.commits = Commits()  # each round's files, written while the next one trains
        self.progress_rows: list[dict] = []
        self.verdicts: queue.SimpleQueue = queue.SimpleQueue()  # the driver's, with follow
        self.new_row = threading.Condition()  # a progress row was added
        self.resume, self.begun = resume, False

    # ----- state -------------------------------------------------------------------------
    def _begin(self) -> None:
        """The run's state, fresh or from its checkpoint, once its run is asked for: building
        the server writes nothing, so a server the driver stops before that (an actor that
        failed to start, ``actors.json`` not written) leaves the run as it found it."""
        if self.begun:
            return
        if self.resume:
            self._restore(checkpoint.load(self.location))
        else:
            self._fresh()
        self.begun = True

    def _fresh(self) -> None:
        state_store.clear(self.state_root)  # leftovers of a run never checkpointed
        x0 = self.model.w.detach().clone()
        self.state = self.stack.init(x0, self.model.get_buffers() if self.model.num_buffers
                                     else None)
        self.prev_delta, self.virtual_time = None, 0.0
        self.next_round, self.elapsed_before = 0, 0.0
        if self.algorithm.traits.has("setup"):
            self.state = self.loop.setup(self.state)

    def _record(self, t: int, elapsed: float) -> run_state.RunState:
        """The run's state after round ``t``, as a checkpoint holds it."""
        return run_state.RunState(t, self.state, self.loop.versions, self.prev_delta,
                                  self.virtual_time, elapsed,
                                  None if self.asynchronous is None else
                                  self.asynchronous.snapshot(), self.sampler.selector.state(),
                                  None if self.participation is None else
                                  self.participation.state())

    def _restore(self, ck: dict) -> None:
        where = checkpoint.path_of(self.location)
        run = run_state.restored(ck, self.settings.expected, where, self.stack)
        self.state, self.loop.versions = run.state, run.versions
        self.prev_delta, self.next_round = run.prev_delta, run.round + 1
        self.virtual_time, self.elapsed_before = run.virtual_time, run.elapsed
        self.log.truncate(run.round)
        if self.client_eval is not None:
            self.client_eval.log.truncate(run.round + 1)
        checkpoint.prune_state(self.state_root, self.loop.versions, self.pinned)
        if self.asynchronous is not None:
            self.asynchronous.restore(run.asynchronous)
        if run.selection is not None:  # None: nothing learnt (or a fork changed the selector)
            self.sampler.selector.load_state(run.selection)
        if self.participation is not None:
            self.participation.load_state(run.participation)

    # ----- the loop ----------------------------------------------------------------------
    def progress(self, since: int = 0, wait_s: float = 0.0) -> list[dict]:
        """The metrics rows (as in ``metrics.parquet``, plus ``rounds``) of every round after
        the first ``since`` (polled by the driver), waiting at most ``wait_s`` for one."""
        with self.new_row:
            self.new_row.wait_for(lambda: len(self.progress_rows) > since, timeout=wait_s)
            return self.progress_rows[since:]

    def decide(self, round: int, stop: bool) -> None:
        """The driver's verdict on round ``round`` (from 1) of a run it follows round by round
        (``run(..., follow=True)``): ``stop`` pauses after it."""
        self.verdicts.put((round, stop))

    def _verdict(self, row: dict) -> bool:
        """Wait for the driver's verdict on the round of ``row``."""
        round, stop = self.verdicts.get()
        assert round == row["round"], (round, row["round"])  # one verdict a row, in order
        return stop

    def run(self, max_rounds: int | None = None, on_progress=None, follow: bool = False
            ) -> dict:
        """Run the remaining rounds (at most ``max_rounds`` now); returns the summary.

        A paused run returns ``{"paused_after_round": t}`` with a checkpoint of round t.
        ``on_progress(row)`` (in-process runs) sees each round's metrics row (round 1-based, as
        in ``metrics.parquet``, plus ``rounds``) as it comes; returning True pauses after that
        round. ``follow``: the driver reads each row (:meth:`progress`) and gives its verdict
        (:meth:`decide`) before the next round starts, so that its pause is as exact. A failed write of the run's files (here or in a client actor) raises
        :class:`~rayfl.runtime.storage.StorageError`.
        """
        try:
            with own_exits():  # the user's sys.exit or KeyboardInterrupt: their error
                self._begin()
                out = self._run(max_rounds, self._verdict if follow else on_progress)
        except OSError as e:
            self.commits.close()
            self.log.interrupt("FAILED")
            raise storage.StorageError.of(e) from None
        except (KeyboardInterrupt, SystemExit):
            self.commits.close()
            self.log.interrupt("KILLED")
            raise
        except BaseException:
            self.commits.close()
            self.log.interrupt("FAILED")
            raise
        self.commits.close()
        if "paused_after_round" in out:
            self.log.interrupt("KILLED")
        return out

    def _run(self, max_rounds: int | None, on_progress) -> dict:
        start = time.perf_counter()
        settings = self.settings
        final = self.final_round  # rounds, or fewer when privacy.target_epsilon binds
        end = final if max_rounds is None else min(final, self.next_round + max_rounds)
        every = settings.evaluation.every
        empty = EmptyRounds(settings.max_empty_rounds, final, self.log.rows)
        label = {} if self.account is None else {"dp_label": self.account.label}
        for t in range(self.next_round, end):
            try:
                row = self.round(t)
            except NobodyOnline as e:  # an event-driven server that waited in vain
                self.commits.wait()
                return self.log.finish(self._final_model(t - 1), final,
                                       buffers=self._final_buffers(), stopped=(t, str(e)),
                                       extra=self._privacy_report(t))
            row["checkpoint_s"] = self.commits.wait()  # the round before's, while this trained
            last = t == final - 1
            if t % every == every - 1 or t >= final - settings.evaluation.last_rounds or last:
                row.update(self.evaluate(t))
                if self.client_eval is not None:
                    row.update(self.client_eval.evaluate(
                        t, self.stack.deployed(self.state, t), self.state.buffers,
                        self.loop.versions if self.algorithm.traits.has("personal_model")
                        else None))
            row["elapsed_s"] = self.elapsed_before + time.perf_counter() - start
            diverged = divergence.flag(row, self.stack.deployed(self.state, t),
                                       settings.loss_ceiling)
            starved = empty.after(row)  # the reason a run of empty rounds stops here, or None
            self.log.append(row)
            pause = t == end - 1
            kept = settings.checkpoint
            due = t % kept.every == kept.every - 1 or last or pause or t + 1 in kept.keep
            shown = {**self.log.rows[-1], "rounds": settings.rounds, **label}
            self._commit(t, row["elapsed_s"], due, shown)
            tick = time.perf_counter()
            stop = on_progress is not None and on_progress(shown)
            start += time.perf_counter() - tick  # the caller's time is not the run's
            if stop:
                pause = True  # after this very round
                if not due:
                    self._commit(t, row["elapsed_s"], True)
            if diverged or starved or pause:
                self.commits.wait()
            if diverged or starved:
                return self.log.finish(self._final_model(t), final,
                                       diverged_at=t if diverged else None,
                                       buffers=self._final_buffers(),
                                       stopped=None if diverged else (t, starved),
                                       extra=self._privacy_report(t + 1))
            if pause and not last:
                return {"paused_after_round": t}
        return self.log.finish(self._final_model(end - 1), final,
                               buffers=self._final_buffers(), extra=self._privacy_report(end))

    def _privacy_report(self, rounds: int) -> dict:
        """``participation.parquet`` (mechanisms that bound participation) and
        ``privacy_audit.json`` (``privacy.audit_canaries``) with their summary entries, after
        ``rounds`` rounds."""
        out = {} if self.participation is None else \
            privacy.report(self.participation, self.account.accountant, rounds, self.run_dir)
        if self.canaries is not None:
            moved = self.stack.deployed(self.state, rounds - 1 if rounds else None).detach() \
                .cpu().double() - self.x0
            out.update(audit.write(self.run_dir, self.canaries, moved.numpy(), rounds,
                                   self.account.delta,
                                   self.account.accountant.epsilon(rounds)))
        return out

    def round(self, t: int) -> dict:
        """One communication round (in async modes: one server update); returns its row."""
        tick = time.perf_counter()
        local = self.settings.local
        lr = self.stack.client_lr(self.state, t, local.lr, local.lr_decay)
        if self.asynchronous is None:
            out, head = self._sync_round(t, lr)
        else:  # the event loop decides when the server steps; the round code is shared
            out, head = self.asynchronous.step(self.state, t), {"plan_s": 0.0}
            self.virtual_time = self.asynchronous.now
        self.state = out.state
        row = {**head, "round": t, "lr": lr, **out.row(self.prev_delta),
               "virtual_time_s": self.virtual_time, "server_peak_rss_mb": peak_rss_mb()}
        self.prev_delta = out.agg.delta_mean if out.agg.count else self.prev_delta
        return {**row, "round_s": time.perf_counter() - tick}

    def _sync_round(self, t: int, lr: float):
        """A synchronous round: the availability model's plan, then the round loop."""
        tick = time.perf_counter()
        plan = self.sampler.plan(t, self.virtual_time, self._candidate_losses(t),
                                 None if self.participation is None else
                                 self.participation.eligible(t))
        num_sampled = len(plan.clients) + len(plan.dropped)
        keep_dir = self._keep_dir(t)
        if keep_dir is not None:
            start = self.stack.start(self.state, t)
            np.save(os.path.join(keep_dir, "start.npy"), start.detach().cpu().numpy())
        plan_s = time.perf_counter() - tick
        out = self.loop.run(self.state, t, plan.clients, plan.step_budget, lr, num_sampled,
                            keep_dir)
        self.sampler.selector.observe(t, dict(out.total.client_losses))
        if self.participation is not None:
            self.participation.record(t, plan.clients)
        tick = time.perf_counter()
        self.virtual_time += plan.duration
        if keep_dir is not None:
            self._keep_global(keep_dir, out.state, t)
        out.aggregate_s += time.perf_counter() - tick
        return out, {**plan.metrics,
                     **({} if self.account is None else
                        {"dp_epsilon": self.account.accountant.epsilon(t + 1)}),
                     "sampled": num_sampled, "plan_s": plan_s}

    def _candidate_losses(self, t: int):
        """The selector's candidate scores: ids -> each one's training loss at the point round
        ``t``'s clients start from (None when the selector scores no candidates)."""
        if not self.sampler.selector.scores_candidates:
            return None
        start = self.stack.start(self.state, t).detach().cpu().numpy()
        buffers = None if self.state.buffers is None else self.state.buffers.cpu().numpy()
        bs = self.settings.evaluation.batch_size
        return lambda ids: self.loop.executor.client_losses(start, ids, bs, buffers)

    def _keep_dir(self, t: int) -> str | None:
        keep = self.settings.keep  # keep.rounds and the directory name count rounds from 1
        if t + 1 not in keep.rounds and t < self.settings.rounds - keep.last:
            return None
        path = os.path.join(self.run_dir, "models", f"round-{t + 1:05d}")
        os.makedirs(path, exist_ok=True)
        return path

    def _keep_global(self, path: str, state, t: int) -> None:
        """The new deployed model (and the algorithm's extra models) after round ``t``."""
        models = {"global": self.stack.deployed(state, t), **self.stack.extra_models(state, t)}
        for name, vec in models.items():
            np.save(os.path.join(path, f"{name}.npy"), vec.detach().cpu().numpy())
        if state.buffers is not None:
            np.save(os.path.join(path, "buffers.npy"), self._final_buffers())

    @torch.no_grad()
    def evaluate(self, t: int | None = None) -> dict:
        """Loss/accuracy of the deployed model on the test set (and on the validation clients,
        when the partition holds some); the algorithm's extra models on the test set (after
        round ``t``)."""
        tick = time.perf_counter()
        bs = self.settings.evaluation.batch_size
        deployed = self.stack.deployed(self.state, t)
        self.model.set_buffers(self.state.buffers)
        out = {}
        for split, (x, y) in self.eval_sets.items():
            out[f"{split}_loss"], out[f"{split}_accuracy"] = self.model.evaluate(
                deployed, x, y, self.loss_fn, bs)
        test_x, test_y = self.eval_sets["test"]
        out.update(test_metrics(self.handle, self.model, deployed, test_x, test_y, bs))
        for name, vec in self.stack.extra_models(self.state, t).items():
            out[f"{name}_test_loss"], out[f"{name}_test_accuracy"] = self.model.evaluate(
                vec, test_x, test_y, self.loss_fn, bs)
        out["eval_s"] = time.perf_counter() - tick
        return out

    def _commit(self, t: int, elapsed: float, checkpoint_due: bool,
                progress: dict | None = None) -> None:
        """Round ``t``'s files (:mod:`~rayfl.runtime.commits`), taken as they are now and
        written while the next round trains: the metrics rows, then (``checkpoint_due``) the
        checkpoint; then its ``progress`` row goes to the driver (:meth:`progress`), so a row
        the driver sees is a round it can resume after."""
        rows = list(self.log.rows)
        save, then = self._checkpoint(t, elapsed) if checkpoint_due else (None, None)

        def write() -> float | None:
            self.log.flush(rows)  # durable before the checkpoint that covers it commits
            seconds = None
            if save is not None:
                tick = time.perf_counter()
                save()
                seconds = time.perf_counter() - tick
            if progress is not None:
                with self.new_row:
                    self.progress_rows.append(progress)
                    self.new_row.notify_all()
            return seconds
        self.commits.start(write, then)

    def _checkpoint(self, t: int, elapsed: float) -> tuple[Callable[[], None],
                                                          Callable[[], None] | None]:
        """Round ``t``'s checkpoint as the state is now: (a function writing it, then deleting
        the client-state versions it superseded; what must follow its commit in this thread,
        if anything: pruning the round messages no state of it refers to)."""
        keep = t + 1 in self.settings.checkpoint.keep
        save_to = checkpoint.prepared({checkpoint.IDENTITY: self.settings.identity,
                                       **self._record(t, elapsed).payload()})
        v = self.loop.versions
        if keep:
            self.pinned.update((int(c), int(v[c])) for c in np.flatnonzero(v >= 0))
        superseded = [p for p in self.loop.superseded if p not in self.pinned]
        self.loop.superseded = []

        def save() -> None:
            save_to(self.location, keep)
            state_store.delete_versions(self.state_root, superseded)
        if not self.algorithm.traits.has("settle"):
            return save, None
        referred = {int(r) for r in v[v >= 0]} | {r for _, r in self.pinned}
        return save, functools.partial(self.loop.messages.prune, referred, before=t + 1)

    def _final_model(self, t: int) -> np.ndarray:
        """The model deployed after loop index ``t`` (−1: before the first round)."""
        return self.stack.deployed(self.state, t if t >= 0 else None).detach().cpu().numpy() \
            .astype(np.float32)

    def _final_buffers(self) -> np.ndarray | None:
        """The global model's buffers (None: the model has none)."""
        b = self.state.buffers
        return None if b is None else b.detach().cpu().numpy().astype(np.float32)


class ServerHost:
    """The server actor's process: the :class:`Server` of the run the driver started it for
    (``start``), so a process serves whichever run it is handed to
    (:mod:`rayfl.runtime.actor_pool`). The driver calls ``run`` once ``start`` has answered."""

    def __init__(self):
        reuse_freed_memory()
        self.server: Server | None = None
        self.token: str | None = None

    def ping(self) -> None:
        """An answer: the process is alive and not hung."""

    def start(self, token: str, *args) -> None:
        """The run ``token``'s server, from :class:`Server`'s arguments."""
        self.server, self.token = None, token  # the last run's is freed first
        self.server = Server(*args)

    def run(self, *args, **kwargs) -> dict:
        return self.server.run(*args, **kwargs)

    def progress(self, *args) -> list[dict]:
        return self.server.progress(*args)

    def decide(self, *args) -> None:
        self.server.decide(*args)

    def release(self, token: str) -> None:
        """The run ``token`` has ended: its server is freed."""
        if self.token == token:
            self.server, self.token = None, None


#: its run, and the driver's calls beside it: a progress poll that waits for a row, a verdict
ServerActor = ray.remote(num_cpus=0, max_concurrency=3)(ServerHost)
