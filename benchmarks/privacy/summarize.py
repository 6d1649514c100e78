"""Tables for the report from runs/privacy/*: DP accuracy against ε, accuracy against bytes."""
import glob
import os

import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))


def rows(prefix):
    out = {}
    for d in sorted(glob.glob(os.path.join(HERE, "..", "..", "runs", "privacy", prefix + "*"))):
        f = os.path.join(d, "metrics.parquet")
        if os.path.exists(f):
            out[os.path.basename(d).rsplit("-", 2)[0]] = pq.read_table(f).to_pylist()
    return out


print("## DP-FedAvg, Fashion-MNIST, 10,000 clients, q = 0.05, δ = 1e-5 (RDP)\n")
print("| run | rounds | ε at round 50 | acc at 50 | ε at round 100 | acc at 100 | ε final | acc final |")
print("|---|---|---|---|---|---|---|---|")
for name, r in rows("dp-").items():
    def at(t):
        row = r[t - 1] if len(r) >= t else None
        if row is None:
            return "–", "–"
        return f"{row.get('dp_epsilon', float('nan')):.3g}", (
            f"{100 * row['test_accuracy']:.2f}%" if row.get("test_accuracy") is not None else "–")
    e50, a50 = at(50)
    e100, a100 = at(100)
    ef, af = at(len(r))
    clip = r[-1].get("dp_clip_norm")
    print(f"| {name} | {len(r)} | {e50} | {a50} | {e100} | {a100} | {ef} | {af} |"
          + (f" (final clip {clip:.3g})" if clip is not None and "adaptive" in name else ""))

print("\n## Compression, Fashion-MNIST, 1,000 clients, 100 a round, logreg (7,850 parameters)\n")
print("| run | bytes / client / round | total uploaded (MB) | acc @ 60 | acc @ 100 | acc final | MB to reach 70% |")
print("|---|---|---|---|---|---|---|")
for name, r in rows("cmp-").items():
    cum, reach = 0.0, None
    for row in r:
        cum += row["upload_bytes"]
        if reach is None and (row.get("test_accuracy") or 0) >= 0.70:
            reach = cum
    per = r[0]["upload_bytes"] / r[0]["completed"]
    acc = lambda t: (f"{100 * r[t - 1]['test_accuracy']:.2f}%" if len(r) >= t and
                     r[t - 1].get("test_accuracy") is not None else "–")
    print(f"| {name} | {per:.0f} | {cum / 1e6:.2f} | {acc(60)} | {acc(100)} | {acc(len(r))} | "
          f"{'–' if reach is None else f'{reach / 1e6:.2f}'} |")
