"""Per-client evaluation (``eval.clients``): the deployed model scored on each sampled client's
own held-out rows, where those rows live, and optionally after k local fine-tuning steps.

The sample is keyed by (seed, round) and each client's score (its fine-tuning minibatches
included, keyed by (seed, round, client)) depends on nothing else, so the numbers do not depend
on how many actors share the work. Fine-tuning runs on a copy of the global model in the
actor's scratch model: no client state is written and the global model is untouched. A
personalised algorithm (capability ``personal_model``) has its own model of each client scored
instead, built from the client's newest state (read, never written).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from rayfl import rng
from rayfl.algorithms.base import LocalRule
from rayfl.metrics.client_eval import COLUMNS, ClientEvalLog, summary_columns
from rayfl.models.metrics import correct_and_count
from rayfl.runtime.local import DeviceIndices, LocalSpec, train_client



@dataclass(frozen=True)
class FinetuneSpec:
    """How a client personalises the global model before its second score."""

    steps: int = 0
    lr: float = 0.01
    batch_size: int = 50


def eval_sample(holdout_sizes: np.ndarray, count: int, seed: int, t: int) -> np.ndarray:
    """The clients evaluated at loop index ``t``: ``count`` of those holding held-out rows
    (all of them when fewer), drawn without replacement by a generator keyed by (seed, t);
    sorted ids."""
    eligible = np.flatnonzero(np.asarray(holdout_sizes) > 0)
    draw = rng.stream(seed, t, rng.EVAL_SAMPLE)
    return np.sort(draw.choice(eligible, min(count, len(eligible)), replace=False))


def score_clients(model, reader, loss_fn, device, point: torch.Tensor, client_ids, t: int,
                  seed: int, finetune: FinetuneSpec, batch_size: int,
                  buffers: torch.Tensor | None = None, personal=None) -> np.ndarray:
    """One row per client (columns :data:`COLUMNS`): held-out sample count, accuracy and mean
    loss of ``point`` with its model ``buffers``; with ``finetune.steps``, of the client's
    fine-tuned copy too (its buffers updated by the fine-tuning), or with ``personal`` (row
    index -> (point, buffers or None)), of the client's personalised model; else NaN."""
    out = np.full((len(client_ids), len(COLUMNS)), np.nan)
    spec = LocalSpec(steps=finetune.steps, batch_size=finetune.batch_size)
    for row, client in enumerate(np.asarray(client_ids, dtype=np.int64)):
        model.set_buffers(buffers)
        hx, hy = reader.tensors(*reader.holdout(int(client)), device)
        out[row, :2] = client, len(hy)
        out[row, 2], out[row, 3] = _score(model, point, hx, hy, loss_fn, batch_size)
        if personal is not None:
            own, own_buffers = personal(row)
            model.set_buffers(buffers if own_buffers is None else own_buffers)
            out[row, 4], out[row, 5] = _score(model, own, hx, hy, loss_fn, batch_size)
        elif finetune.steps:
            x, y = reader.tensors(*reader.client(int(client)), device)

            def grad_fn(p, idx, x=x, y=y, indices=DeviceIndices(x.device)):
                idx_t = indices(idx)
                return model.loss_and_grad(p, x[idx_t], y[idx_t], loss_fn)

            batches = rng.client_stream(seed, t, int(client), rng.FINETUNE)
            rng.seed_torch(seed, t, int(client), x.device, rng.FINETUNE_TORCH)
            tuned, _, _ = train_client(LocalRule(), point, grad_fn, len(y), spec, finetune.lr,
                                       batches)
            out[row, 4], out[row, 5] = _score(model, tuned, hx, hy, loss_fn, batch_size)
    return out


def _score(model, point, x, y, loss_fn, batch_size: int) -> tuple[float, float]:
    """(accuracy as correct / n, exactly; mean loss) of ``point`` on one client's rows."""
    out = model.predict(point, x, batch_size)
    correct, count = correct_and_count(out, y, loss_fn)
    return (correct / count if count else float("nan")), float(loss_fn(out, y))


def finetune_spec(evaluation, local) -> FinetuneSpec:
    """The :class:`FinetuneSpec` of a run's ``eval`` and ``local`` sections."""
    lr = evaluation.finetune_lr if evaluation.finetune_lr is not None else local.lr
    return FinetuneSpec(evaluation.finetune_steps, lr, local.batch_size)


class ClientEvaluation:
    """The server's side: picks the sample, asks the executor for the scores, summarises them
    and keeps every client's row for ``client_eval.parquet``; ``evaluation`` is the run's
    ``eval`` section, ``finetune`` its :func:`finetune_spec`."""

    def __init__(self, evaluation, finetune: FinetuneSpec, seed: int,
                 holdout_sizes: np.ndarray, executor, run_dir: str):
        self.evaluation, self.finetune, self.seed = evaluation, finetune, seed
        self.executor, self.holdout_sizes = executor, holdout_sizes
        self.log = ClientEvalLog(run_dir)

    def evaluate(self, t: int, deployed: torch.Tensor, buffers: torch.Tensor | None = None,
                 versions: np.ndarray | None = None) -> dict:
        """Score the sample of loop index ``t`` (the deployed model with its ``buffers``; with
        every client's state ``versions``, each client's personalised model too); returns the
        metrics row's summary columns."""
        tick = time.perf_counter()
        ids = eval_sample(self.holdout_sizes, self.evaluation.clients, self.seed, t)
        point = deployed.detach().cpu().numpy()
        scores = self.executor.client_scores(
            t, point, ids, self.finetune, self.evaluation.batch_size,
            None if buffers is None else buffers.detach().cpu().numpy(),
            None if versions is None else versions[ids])
        self.log.append(t + 1, scores)
        self.log.flush()
        return {**summary_columns(scores, self.finetune.steps > 0 or versions is not None),
                "client_eval_s": time.perf_counter() - tick}
