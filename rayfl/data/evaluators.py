"""Test metrics a dataset adds to loss and accuracy; the dataset chooses (``evaluator``).

A dataset component may define ``evaluator(model, point, x, y, *, batch_size, group) -> dict``:
``model`` is the run's :class:`~rayfl.models.FlatModel`, ``point`` the flat parameters being
evaluated, ``x``/``y`` the model-ready test tensors, ``group`` the store's ``eval_group``. The
server asks :func:`test_metrics`, which knows no dataset by name.
"""

from __future__ import annotations

from rayfl.models.rec import rec_metrics


def ranking(model, point, x, y, *, batch_size: int, group: int) -> dict:
    """HR@k, NDCG@k (k = 5, 10) and AUC for leave-one-out recommendation test sets, whose rows
    come in consecutive groups of ``group`` candidates with one positive each (MovieLens)."""
    logits = model.predict(point, x, batch_size)
    scores = (logits[:, 1] - logits[:, 0]).numpy()
    out = {}
    for k in (5, 10):
        out.update(rec_metrics(scores, y.numpy(), group, k=k))
    return out


def test_metrics(handle, model, point, x, y, batch_size: int) -> dict:
    """The metrics the dataset behind ``handle`` adds on its test set (none by default)."""
    evaluator = getattr(handle.cfg.component(), "evaluator", None) if handle.cfg else None
    if evaluator is None:
        return {}
    return evaluator(model, point, x, y, batch_size=batch_size, group=handle.eval_group)
