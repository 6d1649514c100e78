"""``eval.*`` and ``loggers.*``: evaluation of the deployed model and experiment trackers."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Optional

from rayfl.schema import ConfigError, field


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation of the deployed model on the test set."""

    every: int = field(1, doc="evaluate every this many rounds (and always the last)", lo=1)
    last_rounds: int = field(0, doc="also evaluate each of the last this many rounds: a "
                                    "paper's mean over its last rounds at eval.every > 1",
                             lo=0)
    batch_size: int = field(1000, doc="evaluation batch size", lo=1)
    test_rows: Optional[int] = field(None, doc="score a seeded uniform sample of this many "
                                               "test rows, the same rows at every evaluation "
                                               "(`rayfl analyze ... --max-samples` with the "
                                               "run's seed draws the same); null: every row",
                                     lo=1)
    last_k: int = field(10, doc="summary reports the mean of the last k evaluations", lo=1)
    target_accuracy: Optional[float] = field(None, doc="report the first round reaching it",
                                             lo=0.0, hi=1.0)
    clients: int = field(0, doc="per-client evaluation: every evaluation also scores the "
                                "deployed model on the held-out rows (data.client_holdout) of "
                                "this many training clients, a sample keyed by (seed, round); "
                                "metrics.parquet gets client_accuracy_mean/_p10/_p50/_p90/"
                                "_worst10, client_eval.parquet every client's; a personalised "
                                "algorithm (ditto) has each client's own model scored too, "
                                "as personal_accuracy_*; 0: off", lo=0)
    finetune_steps: int = field(0, doc="per-client evaluation: also score each client's model "
                                       "after this many local SGD steps (batch local.batch_size) "
                                       "on its own training rows (personal_accuracy_*); "
                                       "nothing persists; 0 with a personalised algorithm",
                                lo=0)
    finetune_lr: Optional[float] = field(None, doc="learning rate of those steps (default: "
                                                   "local.lr)", lo=0.0, lo_open=True)

    def check(self, prefix: str) -> None:
        if self.finetune_steps and not self.clients:
            raise ConfigError(f"{prefix}.finetune_steps", self.finetune_steps,
                              "0 unless eval.clients > 0 (the fine-tuned model is scored only "
                              "by the per-client evaluation, on data.client_holdout rows)")
        if self.finetune_lr is not None and not self.finetune_steps:
            raise ConfigError(f"{prefix}.finetune_lr", self.finetune_lr,
                              "null unless eval.finetune_steps > 0 (it is those steps' rate)")


@dataclass(frozen=True)
class LoggersConfig:
    """Experiment trackers that receive every metrics row (``pip install 'rayfl[tracking]'``)."""

    tensorboard: bool = field(False, doc="write TensorBoard event files to <run_dir>/tensorboard "
                                         "(tensorboard --logdir RUN_DIR); needs tensorboardX")
    mlflow: bool = field(False, doc="log the config as params and every row as metrics to an "
                                    "MLflow run; needs mlflow (or mlflow-skinny)")
    mlflow_uri: Optional[str] = field(None, doc="MLflow tracking URI (default: the local store "
                                                "mlruns next to the run directory, i.e. "
                                                "<output_dir>/mlruns)")
    mlflow_experiment: Optional[str] = field(None, doc="MLflow experiment (default: the run "
                                                       "name)")

    def check(self, prefix: str) -> None:
        for key in ("mlflow_uri", "mlflow_experiment"):
            value = getattr(self, key)
            if value is not None and not value.strip():
                raise ConfigError(f"{prefix}.{key}", value, "null (the default) or a non-blank "
                                                            "string")
        for key, module in (("tensorboard", "tensorboardX"), ("mlflow", "mlflow")):
            if getattr(self, key) and importlib.util.find_spec(module) is None:
                raise ConfigError(f"{prefix}.{key}", True, f"the {module} package installed "
                                                          f"(pip install 'rayfl[tracking]')")
