"""Record the model bytes (``model_sha256``) of a fixed set of short runs, to compare two versions.

Every built-in algorithm, server wrappers, BatchNorm models, privacy, compression with error
feedback, a robust rule, attackers, client selectors and FedBuff on ``configs/test/tiny.yaml``
(3 rounds), in process and on 2 Ray actors, plus the personal scores of the personalised
methods. A change that keeps a run's math keeps its line::

    .venv/bin/python tools/record_hashes.py > before.json
    # ... change ...
    .venv/bin/python tools/record_hashes.py > after.json
    .venv/bin/python tools/record_hashes.py --diff before.json after.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile

TINY = "configs/test/tiny.yaml"
BASE = ["rounds=3"]
BN = ["model.name=examples.bn_model:BNNet", "local.batch_size=16"]
MLP = ["model.name=mlp"]
HOLDOUT = ["data.client_holdout=0.2", "eval.clients=8"]
PERSONAL = ("ditto", "fedper", "fedrep", "pfedme", "apfl", "perfedavg", "fedbabu", "lgfedavg",
            "fedproto", "fedbn")
#: models an algorithm needs on the tiny data (a body and a head, or normalisation layers)
NEEDS = {"fedbn": BN, "lgfedavg": MLP}


def cases() -> dict[str, list[str]]:
    """Case name -> overrides of the tiny config."""
    from rayfl.algorithms.registry import names

    out = {}
    for name in sorted(names()):
        out[name] = [f"algorithm.name={name}"] + NEEDS.get(name, [])
    out["fedavg+ima"] = ["wrappers=[{name: ima, start: 1, window: 2}]"]
    out["scaffold+ima"] = ["algorithm.name=scaffold", "wrappers=[{name: ima, start: 1, window: 2}]"]
    out["fedavg-bn"] = BN
    out["fedbn-bn"] = ["algorithm.name=fedbn", *BN]
    out["dp"] = ["privacy.noise_multiplier=0.5", "privacy.clip_norm=0.5"]
    out["dp-adaptive"] = ["privacy.noise_multiplier=0.5",
                          "privacy.adaptive_clip={target_quantile: 0.5, count_noise: 1.0}"]
    out["dp-ftrl"] = ["privacy.mechanism=dp_ftrl", "privacy.noise_multiplier=0.5",
                      "privacy.clip_norm=0.5", "privacy.min_separation=2", "privacy.honaker=true"]
    out["banded-mf"] = ["privacy.mechanism=banded_mf", "privacy.noise_multiplier=0.5",
                        "privacy.clip_norm=0.5", "privacy.min_separation=2"]
    out["topk-ef"] = ["compression.method=topk", "compression.fraction=0.1",
                      "compression.error_feedback=true"]
    out["median"] = ["aggregation.transforms=[{name: median}]"]
    out["krum-attack"] = ["aggregation.transforms=[{name: attack, kind: sign_flip, "
                          "fraction: 0.2}, {name: krum, byzantine: 1}]",
                          "aggregation.weighting=uniform"]
    # the one layer list, a transform inside a wrapper (an order the older spelling cannot
    # write), and the privacy section as its last layer
    out["layers-clip-inside-ima"] = ["layers=[{name: clip, max_norm: 0.5}, "
                                     "{name: ima, start: 1, window: 2}]"]
    out["layers-privacy"] = ["layers=[{name: ima, start: 1, window: 2}, {name: privacy, "
                             "noise_multiplier: 0.5, clip_norm: 0.5}]"]
    # Upload payload entries through a compressor with error feedback, and through DP
    out["ifca-topk-ef"] = ["algorithm.name=examples.ifca:IFCA", "algorithm.clusters=2",
                           "layers=[{name: topk, fraction: 0.1, error_feedback: true}]"]
    out["ifca-privacy"] = ["algorithm.name=examples.ifca:IFCA", "algorithm.clusters=2",
                           "privacy.noise_multiplier=0.5", "privacy.clip_norm=0.5"]
    out["oort"] = ["selection.name=oort"]
    out["power_of_choice"] = ["selection.name=power_of_choice"]
    out["fedbuff"] = ["aggregation.mode=fedbuff", "aggregation.buffer_size=3"]
    for name in PERSONAL:
        out[f"{name}-personal"] = [f"algorithm.name={name}", *HOLDOUT] + (
            NEEDS.get(name, MLP) if name in NEEDS or name in ("fedper", "fedrep", "fedbabu")
            else [])
    return out


def record(executor: str, only: list[str] | None = None) -> dict[str, dict]:
    """Case -> {model_sha256, personal scores} (or the refusal) under ``executor``."""
    import rayfl

    where = (["runtime.executor=inprocess"] if executor == "inprocess"
             else ["runtime.num_actors=2"])
    out = {}
    # the Ray runs share their actors, as a sweep's do (a pooled actor gives a fresh one's bytes)
    with tempfile.TemporaryDirectory() as tmp, rayfl.actor_pool():
        for name, overrides in cases().items():
            if only and name not in only:
                continue
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    r = rayfl.run(TINY, BASE + where + overrides + [f"output_dir={tmp}"],
                                  quiet=True)
            except Exception as e:  # noqa: BLE001 - a refusal is part of the record
                out[name] = {"refused": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
                continue
            last = r.metrics.to_pylist()[-1]
            out[name] = {"model_sha256": r.summary["model_sha256"],
                         **{k: v for k, v in last.items() if k.startswith("personal_")
                            and isinstance(v, float)}}
            print(f"{executor} {name}: {out[name].get('model_sha256', '')[:12]}",
                  file=sys.stderr, flush=True)
    return out


def diff(before: str, after: str) -> int:
    """Print the cases whose record differs; exit status 1 when any does."""
    with open(before) as f:
        a = json.load(f)
    with open(after) as f:
        b = json.load(f)
    changed = 0
    for executor in sorted(set(a) | set(b)):
        for name in sorted(set(a.get(executor, {})) | set(b.get(executor, {}))):
            x, y = a.get(executor, {}).get(name), b.get(executor, {}).get(name)
            if x != y:
                changed += 1
                print(f"{executor} {name}:\n  before {x}\n  after  {y}")
    print(f"{changed} of {sum(len(v) for v in a.values())} records differ")
    return 1 if changed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--diff", nargs=2, metavar=("BEFORE", "AFTER"))
    ap.add_argument("--executor", choices=["inprocess", "ray", "both"], default="both")
    ap.add_argument("--only", nargs="*", help="case names (default: all)")
    args = ap.parse_args()
    if args.diff:
        return diff(*args.diff)
    executors = ["inprocess", "ray"] if args.executor == "both" else [args.executor]
    json.dump({e: record(e, args.only) for e in executors}, sys.stdout, indent=1,
              sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
