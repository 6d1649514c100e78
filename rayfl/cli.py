"""rayfl: federated learning simulations on Ray.

Commands: run, resume, fork, compare, analyze, tune, keys, data (and data fetch), timeline,
algorithms, privacy (``rayfl COMMAND --help``).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import signal
import sys
from importlib.metadata import PackageNotFoundError, version

import yaml

from rayfl import config as config_mod
from rayfl import registry as components
from rayfl.algorithms import registry
from rayfl.analysis.commands import add_subcommands, run_command
from rayfl.compare import compare, plan
from rayfl.config import check_given_once, load
from rayfl.contract import ComponentError, own_exits
from rayfl.data.fetch import parser as fetch_parser
from rayfl.data.inspect import report, summary
from rayfl.data.table import check_table_path
from rayfl.docs import HEADER, config_reference
from rayfl.failures import RunStopped
from rayfl.fork import fork
from rayfl.metrics.columns import markdown
from rayfl.metrics.progress import sigterm_as_interrupt
from rayfl.metrics.timeline import timeline
from rayfl.privacy.audit import describe
from rayfl.runtime.cluster import RayStartError
from rayfl.runtime.storage import CheckpointError
from rayfl.schema import ConfigError
from rayfl.simulation import preflight as _prepare
from rayfl.simulation import resume, run
from rayfl.usage import OneLineParser
from rayfl.version import __version__

DIVERGED = 3  # exit status of a run stopped by divergence (2: a bad config)
NO_CLIENTS = 4  # exit status of a run stopped because its rounds completed no client


def exit_status(summary: dict) -> int:
    """0 for a run that did what was asked; DIVERGED or NO_CLIENTS for one that stopped."""
    return DIVERGED if summary.get("diverged") else NO_CLIENTS if summary.get("stopped") else 0


def _cmd_run(args) -> int:
    if args.dry_run:
        return dry_run(args.config, args.overrides)

    result = run(args.config, args.overrides, run_dir=args.run_dir, quiet=args.quiet,
                 max_rounds=args.max_rounds)
    _print_summary(result.summary)
    print(result.run_dir)
    return exit_status(result.summary)


def _cmd_resume(args) -> int:
    result = resume(args.run_dir, quiet=args.quiet, max_rounds=args.max_rounds)
    _print_summary(result.summary)
    print(result.run_dir)
    return exit_status(result.summary)


def _cmd_fork(args) -> int:
    result = fork(args.run_dir, args.at, args.overrides, run_dir=args.new_run_dir,
                  quiet=args.quiet, max_rounds=args.max_rounds)
    _print_summary(result.summary)
    print(result.run_dir)
    return exit_status(result.summary)


def _cmd_compare(args) -> int:
    entries = [e.strip() for e in args.algorithms.split(",") if e.strip()]
    seeds = parse_seeds(args.seeds)
    if args.dry_run:
        return dry_run(args.config, args.overrides, entries, seeds)
    out_dir, _ = compare(args.config, entries, args.overrides, args.out, args.quiet, seeds)
    print(open(f"{out_dir}/comparison.md").read())
    print(out_dir)
    return 0


def parse_seeds(text: str | None) -> list[int] | None:
    """``0,1,2`` → [0, 1, 2]; a clear error otherwise."""
    if text is None:
        return None
    try:
        seeds = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError("--seeds", text, "comma-separated non-negative integers") from None
    if not seeds or min(seeds) < 0:
        raise ConfigError("--seeds", text, "comma-separated non-negative integers")
    return seeds


def dry_run(source, overrides, entries: list[str] | None = None,
            seeds: list[int] | None = None) -> int:
    """Validate, print the resolved config and the partition summary; Ray is not started."""
    cfg = config_mod.load(source, overrides)
    if entries is not None:
        _, configs = plan(cfg, entries, None, seeds)
        print(f"# {len(configs)} runs: " + ", ".join(f"{e} (seed {s})" for e, s in configs))
    print(yaml.safe_dump(config_mod.to_dict(cfg), sort_keys=False), end="")
    handle = _prepare(cfg).handle  # the same pre-flight checks as a run
    head, _ = summary(handle, handle.open())
    print("# partition: " + ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                                      for k, v in head.items()))
    print("dry run: config valid; nothing started")
    return 0


def _cmd_timeline(args) -> int:
    try:
        targets = [float(v) for v in args.targets.split(",") if v.strip()]
    except ValueError:
        raise ConfigError("--targets", args.targets, "comma-separated accuracies in [0, 1]") \
            from None
    if not targets or not all(0 <= t <= 1 for t in targets):
        raise ConfigError("--targets", args.targets, "comma-separated accuracies in [0, 1]")
    path, text = timeline(args.run_dirs, args.out, targets)
    print(text, end="")
    print(path)
    return 0


def _cmd_analyze(args) -> int:
    return run_command(args)


def _cmd_tune(args) -> int:
    from tune.cli import run  # Optuna is loaded by `rayfl tune` alone (tune builds on rayfl)

    return run(args.study, args.overrides, args.quiet)


def _cmd_privacy(args) -> int:
    print("\n".join(describe(args.run_dir)))
    return 0


def _print_summary(s: dict) -> None:
    if s.get("status") == "paused":
        return
    acc = s.get("final_accuracy")
    acc_s = "n/a" if acc is None else f"{100 * acc:.2f}%"
    empty = f" ({s['empty_rounds']} without a completed client)" if s.get("empty_rounds") else ""
    print(f"{'stopped' if s.get('stopped') else 'done'}: {s['algorithm']} | {s['rounds']} "
          f"rounds{empty} | final accuracy {acc_s} | rounds took {s['wall_time_s']:.1f} s | "
          f"model_sha256 {s['model_sha256'][:16]}…")


#: the component kinds besides algorithms whose own keys ``rayfl keys --KIND NAME`` lists
COMPONENT_KINDS = ("model", "dataset", "availability", "selector", "wrapper", "transform",
                   "server_opt")


def _cmd_keys(args) -> int:
    others = {kind: getattr(args, kind) for kind in COMPONENT_KINDS
              if getattr(args, kind)}
    if args.metrics:
        with open(args.metrics, "w") as f:
            f.write(markdown())
        print(args.metrics)
        return 0
    text = config_reference(args.algorithm, others)
    if args.write:
        with open(args.write, "w") as f:
            f.write(HEADER + text)
        print(args.write)
    else:
        print(text)
    return 0


def _cmd_algorithms(args) -> int:
    for name, text in algorithm_lines(registry):
        print(f"{name:12s} {text}")
    return 0


def algorithm_lines(registry) -> list[tuple[str, str]]:
    """(name, one-line description) per algorithm, then per server wrapper.

    Algorithms sharing a module (FedAdam / FedYogi / FedAdagrad) get their class's own line
    after the module's first sentence, so no two lines read the same.
    """
    out = []
    by_module: dict[str, int] = {}
    for name in registry.names():
        by_module[registry.get(name).__module__] = by_module.get(
            registry.get(name).__module__, 0) + 1
    for name in registry.names():
        cls = registry.get(name)
        text = registry.summary(name)
        if by_module[cls.__module__] > 1 and cls.__doc__:
            text = f"{cls.__name__}, server rule {' '.join(cls.__doc__.split())} From: {text}"
        out.append((name, text))
    for name in components.names("wrapper"):
        out.append((name, f"(server wrapper) {components.summary('wrapper', name)} Enable with "
                          f"`wrappers: [{name}]` or NAME+{name} in `rayfl compare`."))
    return out


def _cmd_data(args) -> int:
    cfg = load(args.config, args.overrides)
    check_table_path(args.table)
    for flag, value, least in (("--clients", args.clients, 0), ("--max-clients",
                                                               args.max_clients, 1),
                               ("--rounds", args.rounds, 1)):
        if value is not None and value < least:
            raise ConfigError(flag, value, f"a whole number >= {least}")
    out = args.out or os.path.join(cfg.output_dir, f"data-{cfg.name}")
    for line in report(cfg, out, args.rounds, args.max_clients, args.clients, args.table):
        print(line)
    return 0


def version_text() -> str:
    """``rayfl X.Y.Z (Python …, torch …, ray …)`` for ``rayfl --version``."""
    def v(pkg: str) -> str:
        try:
            return version(pkg)
        except PackageNotFoundError:
            return "not installed"

    return (f"rayfl {__version__} (Python {platform.python_version()}, torch {v('torch')}, "
            f"ray {v('ray')})")


def parser() -> argparse.ArgumentParser:
    """The ``rayfl`` argument parser."""
    p = OneLineParser(prog="rayfl", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=version_text())
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run one experiment from a YAML config")
    r.add_argument("config", help="YAML config file")
    r.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rounds=3 seed=1")
    r.add_argument("--run-dir", help="run directory (default: <output_dir>/<name>-<time>)")
    r.add_argument("--quiet", action="store_true", help="no progress lines")
    r.add_argument("--max-rounds", type=int, help="pause after this many rounds (resumable)")
    r.add_argument("--dry-run", action="store_true", help="validate, print the resolved config "
                                                          "and the partition; start nothing")
    r.set_defaults(fn=_cmd_run)
    s = sub.add_parser("resume", help="continue a run from its last checkpoint")
    s.add_argument("run_dir")
    s.add_argument("--quiet", action="store_true")
    s.add_argument("--max-rounds", type=int, help="pause after this many more rounds")
    s.set_defaults(fn=_cmd_resume)
    f = sub.add_parser("fork", help="a new run from a kept checkpoint of a run, with overrides")
    f.add_argument("run_dir", help="the run to branch from (only read)")
    f.add_argument("--at", type=int, required=True,
                   help="the round (1-based) of a kept checkpoint (checkpoint.keep)")
    f.add_argument("overrides", nargs="*", help="dotted overrides from that round on, e.g. "
                                                "wrappers.ima.window=5 algorithm.server_lr=0.5")
    f.add_argument("--run-dir", dest="new_run_dir",
                   help="the new run's directory (default: <output_dir>/<name>-fork<N>-<time>)")
    f.add_argument("--quiet", action="store_true")
    f.add_argument("--max-rounds", type=int, help="pause after this many rounds (resumable)")
    f.set_defaults(fn=_cmd_fork)
    c = sub.add_parser("compare", help="run several algorithms on the same data and sampling")
    c.add_argument("config")
    c.add_argument("overrides", nargs="*")
    c.add_argument("--algorithms", required=True,
                   help="comma-separated names, NAME+WRAPPER for a server wrapper (e.g. "
                        "fedavg,scaffold,fedavg+ima)")
    c.add_argument("--out", help="comparison directory")
    c.add_argument("--seeds", help="run every algorithm on each of these seeds (e.g. 0,1,2) and "
                                   "report mean ± std")
    c.add_argument("--dry-run", action="store_true", help="validate every run, print the "
                                                          "resolved config and the partition; "
                                                          "start nothing")
    c.add_argument("--quiet", action="store_true")
    c.set_defaults(fn=_cmd_compare)
    z = sub.add_parser("analyze", help="loss landscapes, loss decomposition and drift "
                                       "diagnostics of a run directory")
    add_subcommands(z)
    z.set_defaults(fn=_cmd_analyze)
    t = sub.add_parser("tune", help="run or continue an Optuna study (see tune/README.md)")
    t.add_argument("study", help="study YAML")
    t.add_argument("overrides", nargs="*", help="dotted overrides of study keys, e.g. trials=40")
    t.add_argument("--quiet", action="store_true")
    t.set_defaults(fn=_cmd_tune)
    k = sub.add_parser("keys", help="every config key with its default and meaning")
    k.add_argument("--algorithm", help="list only this algorithm's hyper-parameters (a name or "
                                       "package.module:Name)")
    for kind in COMPONENT_KINDS:
        k.add_argument(f"--{kind.replace('_', '-')}", dest=kind,
                       help=f"list this {kind.replace('_', ' ')}'s own parameters")
    k.add_argument("--write", metavar="PATH", help="write the Markdown reference to PATH")
    k.add_argument("--metrics", metavar="PATH", help="write the metrics.parquet column "
                                                     "reference (METRICS.md) to PATH")
    k.set_defaults(fn=_cmd_keys)
    d = sub.add_parser("data", help="print and plot a config's partition (and regime drift); "
                                    "`rayfl data fetch NAME` downloads a built-in dataset",
                       epilog="rayfl data fetch NAME [--root DIR] [--quiet] | --list: download "
                              "a built-in dataset (see rayfl data fetch --help)")
    d.add_argument("config", help="YAML config file")
    d.add_argument("overrides", nargs="*", help="dotted overrides, e.g. data.alpha=0.5")
    d.add_argument("--out", help="plot directory (default: <output_dir>/data-<name>)")
    d.add_argument("--rounds", type=int, help="rounds of regime drift to show (default: rounds)")
    d.add_argument("--max-clients", type=int, default=100, help="clients in the heat map")
    d.add_argument("--clients", type=int, default=10, help="clients listed in the per-client "
                                                           "table (default 10)")
    d.add_argument("--table", metavar="PATH", help="write every client's row (size, held-out, "
                                                   "classes, per-class counts) to PATH (.csv "
                                                   "or .parquet)")
    d.set_defaults(fn=_cmd_data)
    m = sub.add_parser("timeline", help="accuracy against virtual time and staleness of "
                                        "several runs (sync vs fedbuff/fedasync)")
    m.add_argument("run_dirs", nargs="+", help="run directories")
    m.add_argument("--out", help="PNG path (default: <first run>/timeline.png)")
    m.add_argument("--targets", default="0.7,0.8", help="test accuracies to report the virtual "
                                                        "time to (default 0.7,0.8)")
    m.set_defaults(fn=_cmd_timeline)
    a = sub.add_parser("algorithms", help="list the algorithms")
    a.set_defaults(fn=_cmd_algorithms)
    v = sub.add_parser("privacy", help="check a run's privacy: `rayfl privacy audit RUN_DIR` "
                                       "prints the ε its canary clients show beside the "
                                       "accountant's ε")
    audit = v.add_subparsers(dest="privacy", required=True).add_parser(
        "audit", help="the empirical ε of a run made with privacy.audit_canaries > 0 beside "
                      "its analytical ε")
    audit.add_argument("run_dir", help="the run directory")
    v.set_defaults(fn=_cmd_privacy)
    return p


def nested_parsers() -> dict[str, argparse.ArgumentParser]:
    """Commands under another command's name (``rayfl data fetch``), by their full name."""
    return {"data fetch": fetch_parser()}


def main(argv: list[str] | None = None) -> int:
    """Entry point; a bad config exits with status 2 and one clear line."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:2] == ["data", "fetch"]:  # not a config named "fetch": the nested command
        args = nested_parsers()["data fetch"].parse_args(argv[2:])
    else:
        p = parser()
        args, extra = p.parse_known_args(argv)
        stray = [e for e in extra if e.startswith("-") or "=" not in e or
                 not hasattr(args, "overrides")]
        if stray:
            p.error(f"unrecognized arguments: {' '.join(stray)}")
        if extra:
            args.overrides = [*args.overrides, *extra]
    previous = sigterm_as_interrupt()
    try:
        if hasattr(args, "overrides"):
            check_given_once(args.overrides)
        with own_exits():  # the user's sys.exit or KeyboardInterrupt: their error, not a result
            return args.fn(args)
    except (ConfigError, CheckpointError) as e:
        print(f"rayfl: error: {e}", file=sys.stderr)
        return 2
    except ComponentError as e:  # a user's component broke its contract: it and its frames
        print(f"rayfl: error: {e}", file=sys.stderr)
        if e.frames:
            print(e.frames, file=sys.stderr)
        return 2
    except RunStopped as e:
        print(f"rayfl: run stopped: {e}", file=sys.stderr)
        if e.frames:
            print(e.frames, file=sys.stderr)
        return 1
    except RayStartError as e:
        print(f"rayfl: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the run printed how to continue; no traceback
        _quiet_shutdown()
        return 130
    except BrokenPipeError:  # `rayfl keys | head`: the reader has gone, nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 141
    finally:
        _restore_sigterm(previous)


def _quiet_shutdown() -> None:
    """Disconnect from Ray now, while the interrupted command's actor handles are gone, rather
    than at interpreter exit (where the handles outlive Ray and it logs RPC errors)."""
    ray = sys.modules.get("ray")
    gc.collect()
    if ray is not None and ray.is_initialized():
        ray.shutdown()


def _restore_sigterm(previous) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
