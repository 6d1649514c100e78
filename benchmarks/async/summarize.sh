#!/bin/bash
# Tabulate the three runs (partial or finished) and draw runs/async/timeline.png.
cd "$(dirname "$0")/../.."

PY=.venv/bin/python
.venv/bin/rayfl timeline \
    runs/async/fedavg_sync runs/async/fedbuff runs/async/fedasync --targets 0.6,0.65,0.7,0.75,0.8 \
    --out runs/async/timeline.png
$PY - <<'PY'
import pyarrow.parquet as pq
from rayfl.metrics.timeline import staleness_histogram
for name in ("fedavg_sync", "fedbuff", "fedasync"):
    rows = pq.read_table(f"runs/async/{name}/metrics.parquet").to_pylist()
    h = staleness_histogram(rows)
    accs = [(r["round"], r["virtual_time_s"], r["test_accuracy"]) for r in rows
            if r.get("test_accuracy") is not None]
    best = max(accs, key=lambda a: a[2])
    clients = sum(r.get("clients_trained", r.get("completed", 0)) for r in rows)
    print(f"{name}: {len(rows)} server updates, {clients} client trainings, "
          f"{rows[-1]['virtual_time_s']:.0f} virtual s, "
          f"{rows[-1]['virtual_time_s'] / len(rows):.2f} virtual s per update; "
          f"best acc {100 * best[2]:.2f}% (update {best[0]}, {best[1]:.0f} s); "
          f"staleness histogram (τ = 0, 1, ...): {h.tolist()}")
PY
