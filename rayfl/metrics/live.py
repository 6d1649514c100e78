"""Live metrics for the Ray dashboard / Prometheus, tagged by run (never by client id)."""

from __future__ import annotations

from ray.util import metrics

_GAUGES = {
    "round": ("rayfl_round", "current communication round"),
    "test_accuracy": ("rayfl_test_accuracy", "test accuracy of the deployed model"),
    "train_loss": ("rayfl_train_loss", "mean local training loss of the round"),
    "round_s": ("rayfl_round_seconds", "wall seconds of the last round"),
    "completed": ("rayfl_clients_trained", "clients that completed the last round"),
}


class LiveMetrics:
    """Gauges published from the server actor after every round."""

    def __init__(self, run_name: str):
        self.tags = {"run": run_name}
        self.gauges = {k: metrics.Gauge(name, description=desc, tag_keys=("run",))
                       for k, (name, desc) in _GAUGES.items()}
        self.trained = metrics.Counter("rayfl_clients_trained_total",
                                       description="clients trained so far", tag_keys=("run",))

    def publish(self, row: dict) -> None:
        """Set every gauge present in ``row``."""
        for key, gauge in self.gauges.items():
            value = row.get(key)
            if value is not None and value == value:  # skip NaN
                gauge.set(float(value), tags=self.tags)
        if row.get("completed"):
            self.trained.inc(float(row["completed"]), tags=self.tags)
