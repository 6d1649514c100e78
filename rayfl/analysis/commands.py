"""``rayfl analyze interpolate | plane | decompose | drift | regimes``: arguments and outputs.

Each command but ``regimes`` reads a run directory and writes PNG figures, Parquet tables and
a strict JSON summary into ``<run_dir>/analysis/`` (or ``--out``), says on stderr what it wrote,
and prints the summary as readable ``key: value`` lines (numbers rounded); ``regimes``
runs a config under each data regime and writes the comparison into its experiment directory.
Heavy imports happen inside the commands, so building the ``rayfl`` parser stays cheap.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from rayfl.analysis import decomposition, drift, landscape, plots, presets
from rayfl.analysis.drift import REGIMES
from rayfl.analysis.evaluate import select_data
from rayfl.analysis.presets import INTERPOLATIONS, PLANES
from rayfl.analysis.rundir import RunDir
from rayfl.creatable import check_creatable
from rayfl.metrics.files import strict, write_json, write_parquet
from rayfl.models import build_for
from rayfl.models.flat import persistent_buffers
from rayfl.runtime.cluster import connect_ray
from rayfl.schema import ConfigError
from rayfl.simulation import preflight


def _eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a run directory (made by `rayfl run`)")
    p.add_argument("--data", default="test",
                   help="evaluation rows: test (default) or clients:ID,ID,... (their training "
                        "data)")
    p.add_argument("--max-samples", type=int, help="evaluate on a seeded subset of this size")
    p.add_argument("--batch-size", type=int, help="evaluation batch (default eval.batch_size)")
    p.add_argument("--num-cpus", type=int, help="CPUs of a local Ray (default: all)")
    p.add_argument("--out", help="output directory (default <run_dir>/analysis)")


def add_subcommands(p: argparse.ArgumentParser) -> None:
    """The sub-commands of ``rayfl analyze``."""
    sub = p.add_subparsers(dest="analysis", required=True)
    i = sub.add_parser("interpolate", help="loss/error along β·w1 + (1−β)·w2 (seed 004 §5.1)")
    _eval_args(i)
    i.add_argument("--preset", choices=INTERPOLATIONS, default="auto",
                   help="wrapper: the deployed model vs the output inside its server wrapper "
                        "(IMA: the plain average it replaced); rounds: the last two kept "
                        "global models; auto: wrapper if kept, else rounds")
    i.add_argument("--models", nargs=2, metavar=("W1", "W2"),
                   help="instead of a preset: NAME@ROUND, final or a .npy path")
    i.add_argument("--beta", nargs=2, type=float, default=[-0.5, 1.5], metavar=("LO", "HI"))
    i.add_argument("--steps", type=int, default=41, help="β values (0 and 1 always added)")
    pl = sub.add_parser("plane", help="loss/error on the plane through three models "
                                      "(seed 004 §5.2)")
    _eval_args(pl)
    pl.add_argument("--preset", choices=PLANES, default="paper",
                    help="clients: three client models of --round; globals: the last three "
                         "kept global models; paper: clients at the first/middle/last kept "
                         "round + globals")
    pl.add_argument("--models", nargs=3, metavar=("W1", "W2", "W3"),
                    help="instead of a preset: NAME@ROUND, final or a .npy path")
    pl.add_argument("--mark", action="append", default=[],
                    help="also evaluate this model and show its projection (repeatable)")
    pl.add_argument("--round", type=int, help="clients preset: the kept round (default -1)")
    pl.add_argument("--clients", help="clients preset: three client ids ID,ID,ID")
    pl.add_argument("--grid", type=int, default=21, help="grid points per axis")
    pl.add_argument("--margin", type=float, default=0.2, help="margin, fraction of the span")
    d = sub.add_parser("decompose", help="seed 004's loss decomposition per kept round")
    _eval_args(d)
    d.add_argument("--rounds", help="kept rounds to analyse, comma-separated (default all)")
    d.add_argument("--cohort-samples", type=int,
                   help="a seeded subset of the cohort's training rows for the bias terms")
    d.add_argument("--subsets", type=int, default=5,
                   help="random subsets per model count for error vs #models")
    dr = sub.add_parser("drift", help="client and period drift of a run over rounds")
    dr.add_argument("run_dir")
    dr.add_argument("--label-column", default="label_tv",
                    help="metrics column with the sampled set's label distance")
    dr.add_argument("--out")
    r = sub.add_parser("regimes", help="seed 000's drift experiment: the four data regimes "
                                       "with the same sampling sequence")
    r.add_argument("config")
    r.add_argument("overrides", nargs="*")
    r.add_argument("--regimes", default=",".join(REGIMES),
                   help=f"comma-separated subset of {','.join(REGIMES)}")
    r.add_argument("--label-column", default="label_tv")
    r.add_argument("--out", help="experiment directory (default <output_dir>/drift-<name>-<time>)")
    r.add_argument("--quiet", action="store_true")


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _out(run, out: str | None) -> str:
    """Where a command writes — ``--out`` or ``<run_dir>/analysis`` — checked but not yet made:
    :func:`_write` makes it with the first result, so a refused command leaves no folder."""
    path = out or os.path.join(run.path, "analysis")
    check_creatable(path, "--out")
    return path


def _write(out: str, stem: str, summary: dict, rows: list[dict] | None = None) -> None:
    os.makedirs(out, exist_ok=True)
    write_json(summary, os.path.join(out, f"{stem}.json"))
    _say(f"wrote {os.path.join(out, stem)}.json")
    if rows:
        write_parquet(rows, os.path.join(out, f"{stem}.parquet"))
        _say(f"wrote {os.path.join(out, stem)}.parquet ({len(rows)} rows)")


def _setup(args):
    run = RunDir(args.run_dir)
    out = _out(run, args.out)
    if persistent_buffers(build_for(run.cfg.model, run.handle)):
        raise ConfigError("RUN_DIR", args.run_dir, "a run of a model without buffers (the "
                          "analysis evaluates points between models, whose BatchNorm "
                          "statistics no run computed)")
    data = select_data(run.handle, args.data, args.max_samples, run.cfg.seed)
    connect_ray(run.cfg, args.num_cpus)
    return run, data, args.batch_size or run.cfg.eval.batch_size, out


def _interpolate(args) -> dict:
    run, data, bs, out = _setup(args)
    if args.models:
        tag, (w1, w2) = "custom", [run.model(s) for s in args.models]
    else:
        tag, w1, w2 = presets.interpolation(run, args.preset)
    line = landscape.interpolate(run.cfg, run.handle, w1, w2,
                                 landscape.betas(*args.beta, args.steps), data, bs)
    summary = line.summary()
    _write(out, f"interp-{tag}", summary, line.rows())
    plots.plot_line(line, os.path.join(out, f"interp-{tag}.png"))
    return summary


def _ids(text: str | None, key: str) -> list[int] | None:
    try:
        return None if text is None else [int(v) for v in text.split(",")]
    except ValueError:
        raise ConfigError(key, text, "comma-separated integers") from None


def _plane(args) -> dict:
    run, data, bs, out = _setup(args)
    marks = [run.model(s) for s in args.mark]
    if args.models:
        tag, specs = "custom", [("custom", [run.model(s) for s in args.models], [])]
    else:
        tag = args.preset
        specs = presets.planes(run, args.preset, args.round, _ids(args.clients, "--clients"))
    results = []
    for i, (name, models, own) in enumerate(specs):
        _say(f"[{i + 1}/{len(specs)}] plane {name}: {args.grid}×{args.grid} grid, the models, "
             f"their average and {len(own) + len(marks)} mark(s) on the {data.label}")
        results.append(landscape.plane(run.cfg, run.handle, name, models, [*own, *marks], data,
                                       args.grid, args.margin, bs))
        _write(out, f"plane-{name}", results[-1].summary(), results[-1].rows())
    plots.plot_planes(results, os.path.join(out, f"plane-{tag}.png"))
    return {res.name: res.summary() for res in results}


def _decompose(args) -> dict:
    run, data, bs, out = _setup(args)
    rounds = [run.round_of(t, "--rounds") for t in _ids(args.rounds, "--rounds") or []] \
        or run.need_rounds(1, "`rayfl analyze decompose`")
    rows, curves = [], []
    for i, t in enumerate(rounds):
        _say(f"[{i + 1}/{len(rounds)}] decompose round {t}")
        row, curve = decomposition.decompose_round(run, t, data, args.cohort_samples,
                                                   args.subsets, bs)
        rows.append(row)
        curves += curve
    summary = {"estimators": decomposition.ESTIMATORS, "test_data": data.label, "rounds": rows}
    _write(out, "decomposition", summary, rows)
    _write(out, "decomposition-models", {"rows": curves}, curves)
    plots.plot_decomposition(rows, curves, os.path.join(out, "decomposition.png"))
    return summary


def _drift(args) -> dict:
    run = RunDir(args.run_dir)
    out = _out(run, args.out)
    metrics = run.metrics()
    if not metrics:
        raise ConfigError("run_dir", run.path, "a run with at least one round in metrics.parquet")
    rows = drift.drift_rows(metrics, args.label_column)
    summary = drift.drift_summary(rows)
    _write(out, "drift", summary, rows)
    plots.plot_drift({run.cfg.name: rows}, [k for k in rows[0] if k != "round"],
                     os.path.join(out, "drift.png"))
    return summary


def _regimes(args) -> dict:
    regimes = [r.strip() for r in args.regimes.split(",") if r.strip()]
    bad = [r for r in regimes if r not in REGIMES]
    if bad or not regimes:
        raise ConfigError("--regimes", args.regimes, f"a subset of {', '.join(REGIMES)}")
    configs = drift.regime_configs(args.config, args.overrides, regimes)  # validate all first
    if args.out:
        check_creatable(args.out, "--out")
    for cfg in configs.values():  # and their data: a refusal before any folder is made
        preflight(cfg)
    out, curves = drift.run_regimes(configs, args.out, args.quiet)
    table = drift.regime_table(curves, configs[regimes[0]].eval.last_k, args.label_column)
    rows = [{"regime": r, **row} for r, rs in curves.items()
            for row in drift.drift_rows(rs, args.label_column)]
    _write(out, "regimes", {"out_dir": out, "regimes": table}, rows)
    keys = [k for k in ("test_accuracy", "client_drift", "period_drift", args.label_column)
            if any(k in row for row in rows)]
    plots.plot_drift(curves, keys, os.path.join(out, "regimes.png"))
    return {"out_dir": out, "regimes": table}


COMMANDS = {"interpolate": _interpolate, "plane": _plane, "decompose": _decompose,
            "drift": _drift, "regimes": _regimes}


def readable(obj, indent: int = 0) -> list[str]:
    """A summary as indented ``key: value`` lines, floats to 4 significant digits; a list of
    records becomes one line per record."""
    pad = "  " * indent
    if isinstance(obj, dict):
        lines = []
        for key, value in obj.items():
            if isinstance(value, (dict, list)) and value:
                lines += [f"{pad}{key}:", *readable(value, indent + 1)]
            else:
                lines.append(f"{pad}{key}: {_value(value)}")
        return lines
    if isinstance(obj, list):
        if all(isinstance(v, dict) for v in obj):
            return [pad + ", ".join(f"{k} {_value(v)}" for k, v in r.items()) for r in obj]
        return [pad + ", ".join(_value(v) for v in obj)]
    return [pad + _value(obj)]


def _value(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return str(v)


def run_command(args) -> int:
    """Run ``rayfl analyze <args.analysis>`` and print its summary (readable lines; the same
    numbers are in the command's strict JSON file)."""
    print("\n".join(readable(strict(COMMANDS[args.analysis](args)))))
    return 0
