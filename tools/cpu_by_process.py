"""Where a command's CPU goes: run it, and print the CPU seconds every process on the machine took
between two moments of its run (read from Linux's ``/proc``), largest first, as a share of the
machine's cores over that window. Ray's processes are named by their title (``ray::Server``,
``ray::ClientWorker.train_arrays``), others by their program and first argument.

    python tools/cpu_by_process.py FROM_S TO_S COMMAND [ARGS...]
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import time

TICK = os.sysconf("SC_CLK_TCK")


def processes() -> dict[int, tuple[float, str]]:
    """pid -> (CPU seconds so far, user + system; its name) of every process now running."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline") as f:
                argv = f.read().split("\0")
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        name = argv[0] if argv[0].startswith("ray::") else \
            " ".join(os.path.basename(a) for a in argv[:2] if a)
        out[int(pid)] = ((int(fields[11]) + int(fields[12])) / TICK, name or "(kernel)")
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("start", type=float, help="seconds into the run the window opens")
    parser.add_argument("stop", type=float, help="seconds into the run the window closes")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if not args.command or not 0 <= args.start < args.stop:
        parser.error(f"expected 0 ≤ FROM_S < TO_S and a command (got {args.start:g}, "
                     f"{args.stop:g}, {' '.join(args.command) or 'no command'})")
    began = time.monotonic()
    run = subprocess.Popen(args.command)
    first = last = None
    while run.poll() is None:
        now = time.monotonic() - began
        if first is None and now >= args.start:
            first = processes()
        if last is None and now >= args.stop:
            last = processes()
        time.sleep(0.05)
    if last is None:
        raise SystemExit(f"the command ended after {time.monotonic() - began:.1f} s, before "
                         f"{args.stop:g} s: choose an earlier window")
    took = collections.Counter()
    for pid, (seconds, name) in last.items():
        took[name] += seconds - first.get(pid, (0.0, name))[0]
    window, cores = args.stop - args.start, os.cpu_count()
    print(f"CPU seconds from {args.start:g} s to {args.stop:g} s of the run, "
          f"% of {cores} cores × {window:g} s:")
    for name, seconds in took.most_common():
        if seconds > 0:
            print(f"{seconds:8.2f} s {100 * seconds / (cores * window):5.1f} %  {name}")
    idle = cores * window - sum(took.values())
    print(f"{idle:8.2f} s {100 * idle / (cores * window):5.1f} %  (idle)")


if __name__ == "__main__":
    main()
