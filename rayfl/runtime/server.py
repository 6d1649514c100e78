"""The server (driver) actor: samples, dispatches, aggregates, evaluates and checkpoints.

The round loop lives here, not in the user's process: the user's process starts this actor and
polls :meth:`Server.progress`. Per round the server asks the availability model for a plan,
splits the dispatched clients into ``runtime.logical_shards`` groups balanced by sample count
(groups depend only on the sampled set), hands whole groups to the least-loaded actors, and
merges the groups' partial sums in group order — so the model's bytes do not depend on how
many actors there are.
"""

from __future__ import annotations

import heapq
import math
import os
import shutil
import time

import numpy as np
import ray
import torch
from torch import nn

from rayfl import algorithms
from rayfl.availability import make_sampler
from rayfl.metrics.log import MetricsLog
from rayfl.models import rec_metrics
from rayfl.runtime import checkpoint
from rayfl.runtime.aggregate import PartialSum, drift_metrics
from rayfl.runtime.client_actor import model_for, peak_rss_mb
from rayfl.runtime.local import spec_from_config
from rayfl.runtime.state_store import delete_versions


PROGRESS_KEYS = ("train_loss", "test_accuracy", "test_loss", "val_accuracy", "val_loss",
                 "round_s")


def balance(loads: np.ndarray, bins: int) -> list[list[int]]:
    """Greedy LPT: item indices into ``bins`` bins, heaviest first; ties by lowest index."""
    out: list[list[int]] = [[] for _ in range(bins)]
    heap = [(0, b) for b in range(bins)]
    for i in sorted(range(len(loads)), key=lambda i: (-loads[i], i)):
        load, b = heapq.heappop(heap)
        out[b].append(i)
        heapq.heappush(heap, (load + int(loads[i]), b))
    return out


class Server:
    """Owns the algorithm's server state and the round loop (runs as a Ray actor)."""

    def __init__(self, cfg, handle, run_dir: str, actor_names: list[str], resume: bool = False):
        torch.set_num_threads(max(1, min(os.cpu_count() or 1,
                                         math.floor(cfg.runtime.num_actors
                                                    * cfg.runtime.cpus_per_actor))))
        self.cfg, self.handle, self.run_dir = cfg, handle, run_dir
        self.state_root = os.path.join(run_dir, "state")
        self.sizes = handle.sizes()
        self.spec = spec_from_config(cfg.local)
        self.algorithm = algorithms.build(cfg, handle.num_clients)
        self.model = model_for(cfg, handle, "cpu")
        self.loss_fn = nn.CrossEntropyLoss()
        self.sampler = make_sampler(
            cfg.availability, handle, cfg.clients_per_round, cfg.seed, self.spec,
            model_bytes=self.model.w.numel() * self.model.w.element_size())
        self.actors = [ray.get_actor(n) for n in actor_names]
        reader = handle.open()
        self.eval_sets = {"test": reader.tensors(*reader.test(), "cpu")}
        if handle.num_validation_clients:
            self.eval_sets["val"] = reader.tensors(*reader.validation(), "cpu")
        self.log = MetricsLog(run_dir, cfg)
        self.progress_rows: list[dict] = []
        self.pending_delete: list[tuple[int, int]] = []
        self.stop_requested = False
        if resume:
            self._restore(checkpoint.load(run_dir))
        else:
            self._fresh()

    # ----- state -------------------------------------------------------------------------
    def _fresh(self) -> None:
        shutil.rmtree(self.state_root, ignore_errors=True)  # leftovers of a run never checkpointed
        x0 = self.model.w.detach().clone()
        self.state = self.algorithm.server_init(x0)
        self.versions = np.full(self.handle.num_clients, -1, dtype=np.int32)
        self.prev_delta = None
        self.next_round = 0
        self.virtual_time = 0.0
        self.elapsed_before = 0.0
        if self.algorithm.needs_setup:
            self._setup()

    def _restore(self, ck: dict) -> None:
        self.state, self.versions = ck["state"], ck["versions"]
        self.prev_delta, self.next_round = ck["prev_delta"], ck["round"] + 1
        self.virtual_time, self.elapsed_before = ck["virtual_time"], ck["elapsed"]
        self.log.truncate(ck["round"])
        checkpoint.prune_state(self.state_root, self.versions)

    def _setup(self) -> None:
        ids = np.arange(self.handle.num_clients)
        chunks = np.array_split(ids, len(self.actors))
        rows = ray.get([a.setup_summaries.remote(c) for a, c in zip(self.actors, chunks)])
        self.state = self.algorithm.server_setup(self.state, ids,
                                                 torch.from_numpy(np.concatenate(rows)))

    # ----- the loop ----------------------------------------------------------------------
    def progress(self, since: int = 0) -> list[dict]:
        """Headline numbers of every round after the first ``since`` (polled by the user)."""
        return self.progress_rows[since:]

    def request_stop(self) -> None:
        """Pause after the current round (checkpointed; ``rayfl resume`` continues)."""
        self.stop_requested = True

    def run(self, max_rounds: int | None = None) -> dict:
        """Run the remaining rounds (at most ``max_rounds`` now); returns the summary.

        A paused run returns ``{"paused_after_round": t}`` with a checkpoint of round t.
        """
        start = time.perf_counter()
        cfg = self.cfg
        end = cfg.rounds if max_rounds is None else min(cfg.rounds, self.next_round + max_rounds)
        for t in range(self.next_round, end):
            row = self.round(t)
            last = t == cfg.rounds - 1
            if t % cfg.eval.every == cfg.eval.every - 1 or last:
                row.update(self.evaluate())
            row["elapsed_s"] = self.elapsed_before + time.perf_counter() - start
            self.log.append(row)
            pause = self.stop_requested or t == end - 1
            if t % cfg.checkpoint.every == cfg.checkpoint.every - 1 or last or pause:
                tick = time.perf_counter()
                self._checkpoint(t, row["elapsed_s"])
                row["checkpoint_s"] = time.perf_counter() - tick
            self.log.flush()
            self.progress_rows.append({"round": t, "rounds": cfg.rounds, **{
                k: v for k, v in row.items() if k in PROGRESS_KEYS}})
            if (row["completed"] and not np.isfinite(row["train_loss"])) or not torch.isfinite(
                    self.algorithm.deployed(self.state)).all():
                return self.log.finish(self._final_model(), diverged_at=t)
            if pause and not last:
                return {"paused_after_round": t}
        return self.log.finish(self._final_model())

    def round(self, t: int) -> dict:
        """One communication round; returns its metrics row."""
        tick = time.perf_counter()
        plan = self.sampler.plan(t, self.virtual_time)
        clients = plan.clients
        budgets = plan.step_budget
        weights = self.algorithm.aggregation_weights(self.state, clients, self.sizes[clients])
        bc = {k: v.detach().cpu().numpy() for k, v in self.algorithm.broadcast(self.state, t)
              .items()}
        lr = self.algorithm.local_lr(t, self.cfg.local.lr, self.cfg.local.lr_decay)
        groups = balance(self.sizes[clients], min(self.cfg.runtime.logical_shards, len(clients)))
        group_load = np.array([self.sizes[clients[g]].sum() for g in groups])
        per_actor = balance(group_load, len(self.actors))
        plan_s = time.perf_counter() - tick

        keep_dir = self._keep_dir(t)
        if keep_dir is not None:
            np.save(os.path.join(keep_dir, "start.npy"), bc["x"])
        tick = time.perf_counter()
        bc_ref = ray.put(bc)
        clients_ref = ray.put(clients) if self.cfg.data.regime else None
        calls = []
        for actor, gids in zip(self.actors, per_actor):
            if not gids:
                continue
            work = [(g, [(int(clients[i]), float(weights[i]), int(self.versions[clients[i]]),
                          None if budgets is None else int(budgets[i])) for i in groups[g]])
                    for g in sorted(gids)]
            calls.append(actor.train.remote(t, bc_ref, lr, work, keep_dir, clients_ref))
        results = ray.get(calls)
        train_s = time.perf_counter() - tick

        tick = time.perf_counter()
        by_group = dict(pair for r in results for pair in r["sums"])
        total = PartialSum()
        for g in sorted(by_group):
            total.merge(by_group[g])
        for r in results:
            for c in r["written"]:
                if self.versions[c] >= 0:
                    self.pending_delete.append((c, int(self.versions[c])))
                self.versions[c] = t
        if self.algorithm.needs_client_models and total.client_ids:
            self.state = self.algorithm.receive_client_models(
                self.state, total.client_ids, torch.stack(total.client_models))
        x = self.algorithm.deployed(self.state)
        agg = total.finalize(len(clients) + len(plan.dropped), self.handle.num_clients,
                             x.numel(), x.dtype)
        self.state, own = self.algorithm.server_update(self.state, agg, t)
        drift = drift_metrics(agg, self.prev_delta)
        self.prev_delta = agg.delta_mean if agg.count else self.prev_delta
        self.virtual_time += plan.duration
        if keep_dir is not None:
            self._keep_global(keep_dir)
        agg_s = time.perf_counter() - tick
        return {
            **plan.metrics,
            "round": t, "lr": lr, "sampled": len(clients) + len(plan.dropped),
            "completed": agg.count, "train_loss": total.loss_sum / max(total.count, 1)
            if total.count else float("nan"),
            "samples": total.samples, "local_steps": total.steps,
            "virtual_time_s": self.virtual_time, **drift, **own,
            "plan_s": plan_s, "train_s": train_s, "aggregate_s": agg_s,
            "actor_train_s_max": max((r["seconds"] for r in results), default=0.0),
            "actor_peak_rss_mb": max((r["peak_rss_mb"] for r in results), default=0.0),
            "server_peak_rss_mb": peak_rss_mb(),
            "round_s": plan_s + train_s + agg_s,
        }

    def _keep_dir(self, t: int) -> str | None:
        keep = self.cfg.keep  # keep.rounds and the directory name count rounds from 1
        if t + 1 not in keep.rounds and t < self.cfg.rounds - keep.last:
            return None
        path = os.path.join(self.run_dir, "models", f"round-{t + 1:05d}")
        os.makedirs(path, exist_ok=True)
        return path

    def _keep_global(self, path: str) -> None:
        """The new deployed model (and the algorithm's extra models) after the round."""
        models = {"global": self.algorithm.deployed(self.state),
                  **self.algorithm.extra_models(self.state)}
        for name, vec in models.items():
            np.save(os.path.join(path, f"{name}.npy"), vec.detach().cpu().numpy())

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Loss/accuracy of the deployed model on the test set (and on the validation clients,
        when the partition holds some); the algorithm's extra models on the test set."""
        tick = time.perf_counter()
        bs = self.cfg.eval.batch_size
        deployed = self.algorithm.deployed(self.state)
        out = {}
        for split, (x, y) in self.eval_sets.items():
            out[f"{split}_loss"], out[f"{split}_accuracy"] = self.model.evaluate(
                deployed, x, y, self.loss_fn, bs)
        test_x, test_y = self.eval_sets["test"]
        if self.handle.eval_group:
            out.update(self._ranking(deployed, test_x, test_y))
        for name, vec in self.algorithm.extra_models(self.state).items():
            out[f"{name}_test_loss"], out[f"{name}_test_accuracy"] = self.model.evaluate(
                vec, test_x, test_y, self.loss_fn, bs)
        out["eval_s"] = time.perf_counter() - tick
        return out

    def _ranking(self, point: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> dict:
        """HR@k, NDCG@k and AUC for leave-one-out recommendation test sets (MovieLens)."""
        logits = self.model.predict(point, x, self.cfg.eval.batch_size)
        scores = (logits[:, 1] - logits[:, 0]).numpy()
        out = {}
        for k in (5, 10):
            out.update(rec_metrics(scores, y.numpy(), self.handle.eval_group, k=k))
        return out

    def _checkpoint(self, t: int, elapsed: float) -> None:
        checkpoint.save(self.run_dir, {
            "round": t, "state": self.state, "versions": self.versions,
            "prev_delta": self.prev_delta, "virtual_time": self.virtual_time,
            "elapsed": elapsed})
        delete_versions(self.state_root, self.pending_delete)
        self.pending_delete = []

    def _final_model(self) -> np.ndarray:
        return self.algorithm.deployed(self.state).detach().cpu().numpy().astype(np.float32)


ServerActor = ray.remote(num_cpus=0, max_concurrency=2)(Server)
