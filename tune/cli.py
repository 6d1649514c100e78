"""``rayfl tune STUDY.yaml [key=value ...]`` and ``python -m tune``: run or continue a study."""

from __future__ import annotations

import sys
import time
import warnings

import optuna

from rayfl.metrics.progress import Eta, hms
from rayfl.schema import ConfigError
from rayfl.usage import OneLineParser
from tune.docs import HEADER, reference
from tune.driver import run_study
from tune.spec import load


def _fmt(v) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


class StudyProgress:
    """Prints :func:`print_event`'s lines, each trial's end followed by the study's counts:
    ``[7/20 finished: 5 complete, 2 pruned | 2 running | ETA 0:03:10]``; the ETA is the mean
    time between recent trial ends times the trials still to finish."""

    def __init__(self):
        self.total = self.before = self.started = 0
        self.states: dict[str, int] = {}
        self.eta, self.last = Eta(), time.perf_counter()

    def __call__(self, kind: str, info: dict) -> None:
        print_event(kind, info)
        if kind == "begin":
            self.total, self.before = info["trials"], info["finished"]
            self.last = time.perf_counter()
        elif kind == "start":
            self.started += 1
        elif kind == "end":
            self.states[info["state"]] = self.states.get(info["state"], 0) + 1
            now = time.perf_counter()
            self.eta.add(now - self.last)
            self.last = now
            print(self.counts_line(), flush=True)

    def counts_line(self) -> str:
        ended = sum(self.states.values())
        done = self.before + ended
        states = ", ".join(f"{n} {state.lower()}" for state, n in sorted(self.states.items()))
        left = self.eta.left(self.total - done)
        return (f"[{done}/{self.total} finished this study ({states} now) | "
                f"{self.started - ended} running"
                + ("" if left is None or done >= self.total else f" | ETA {hms(left)}") + "]")


def print_event(kind: str, info: dict) -> None:
    """One progress line per study event."""
    if kind == "begin":
        print(f"study {info['name']}: {info['finished']}/{info['trials']} trials finished | "
              f"storage {info['storage']}", flush=True)
    elif kind == "start":
        values = ", ".join(f"{k}={_fmt(v)}" for k, v in info["values"].items())
        print(f"trial {info['number']} started: {values}", flush=True)
    elif kind == "end":
        parts = [f"trial {info['number']} {info['state']}"]
        if info["value"] is not None:
            parts.append(f"objective {_fmt(info['value'])}")
        if info["test_accuracy"] is not None:
            parts.append(f"test acc {100 * info['test_accuracy']:.2f}%")
        if info["reason"]:
            parts.append(info["reason"])
        print(" | ".join(parts), flush=True)
    else:
        print(f"note: {info['text']}", flush=True)


def summary_text(s: dict) -> str:
    """The study's outcome in a few lines."""
    counts = ", ".join(f"{n} {state.lower()}" for state, n in s["trials"].items())
    lines = [f"done: {counts} | wall {s['wall_time_s']:.1f} s | {s['dashboard']}"]
    b = s["best"]
    if b:
        test = "n/a" if b["test_accuracy"] is None else f"{100 * b['test_accuracy']:.2f}%"
        lines.append(f"best trial {b['number']}: {s['objective']['metric']} "
                     f"({s['objective']['reduce']}) {_fmt(b['value'])} | test accuracy {test} | "
                     + ", ".join(f"{k}={_fmt(v)}" for k, v in b["values"].items()))
        lines.append(f"best config: {b['config']}")
    return "\n".join(lines)


def run(study: str, overrides: list[str], quiet: bool = False) -> int:
    """Load, run and summarise a study; Ctrl-C leaves it ready to continue."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        setup = load(study, overrides)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    try:
        summary = run_study(setup, None if quiet else StudyProgress())
    except KeyboardInterrupt:
        print(f"interrupted: run the same command to continue study {setup.name}",
              file=sys.stderr)
        return 130
    print(summary_text(summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m tune``; a bad study exits with status 2 and one clear line."""
    p = OneLineParser(prog="python -m tune", description=__doc__)
    p.add_argument("study", nargs="?", help="study YAML (see tune/README.md)")
    p.add_argument("overrides", nargs="*", help="dotted overrides of study keys, e.g. trials=40")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--keys", action="store_true", help="print every study key and exit")
    p.add_argument("--write", metavar="PATH", help="with --keys: write the reference to PATH")
    args = p.parse_args(argv)
    if args.keys:
        if args.write:
            with open(args.write, "w") as f:
                f.write(HEADER + reference())
        else:
            print(reference())
        return 0
    if not args.study:
        p.error("a study YAML is required")
    try:
        return run(args.study, args.overrides, args.quiet)
    except ConfigError as e:
        print(f"tune: error: {e}", file=sys.stderr)
        return 2
