"""The cohort benchmarks run end to end on a small cohort and print what they promise (their
numbers are for a quiet machine, not for a test)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.conftest import ROOT

NUMBER = r"\d+\.\d+"


def _run(script: str, *args: str) -> list[str]:
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.splitlines()


def test_bench_cohort_prints_each_pass_and_the_spread():
    lines = _run("bench_cohort.py", "--clients", "2000", "--per-round", "100", "--rounds", "3",
                 "--passes", "1")
    (row,) = [line for line in lines if re.match(r"\s+1\s+100\s", line)]
    assert len(re.findall(NUMBER, row)) == 6, row
    assert lines[-2] == "min–max over the passes"
    assert len(re.findall(rf"{NUMBER}–{NUMBER}", lines[-1])) == 6, lines[-1]


def test_bench_actor_pair_prints_each_round_and_the_ratio():
    lines = _run("bench_actor_pair.py", "--clients", "2000", "--per-round", "100",
                 "--rounds", "3")
    rounds = [line for line in lines if re.match(r"\s+[123]\s+\d", line)]
    assert len(rounds) == 3 and all(len(re.findall(NUMBER, r)) == 3 for r in rounds), lines
    assert re.fullmatch(rf"actor/plain over rounds 2–3: median {NUMBER}, min–max {NUMBER}–"
                        rf"{NUMBER}; everything else took {NUMBER} % of the two cores while "
                        r"the actors trained", lines[-1]), lines[-1]


def test_bench_scripts_refuse_too_few_rounds():
    for script in ("bench_cohort.py", "bench_actor_pair.py"):
        out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script),
                              "--rounds", "1"], cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 2 and "--rounds 1: expected ≥" in out.stderr, out.stderr


def test_bench_client_path_prints_both_sides_and_the_pieces():
    lines = _run("bench_client_path.py", "--clients", "2000", "--chunk", "50", "--chunks", "2")
    assert re.match(rf"rayfl's client path: +{NUMBER} µs a client", lines[1]), lines
    assert re.match(rf"plain loop: +{NUMBER} µs a client", lines[2]), lines
    assert re.match(rf"besides training: -?{NUMBER} µs a client \({NUMBER}×\)", lines[3]), lines
    assert lines[4] == "per-client pieces alone, µs:" and len(lines) == 10, lines
    assert all(re.match(rf"\s+{NUMBER}  \S", line) for line in lines[5:]), lines


def test_bench_startup_prints_each_pass_and_the_spread():
    lines = _run("bench_startup.py", "--passes", "1")
    assert lines[0] == ("pass | import rayfl s | run on 2 actors s | in process s | launch s | "
                        "on 2 pooled actors s")
    assert re.fullmatch(rf"1 \| {NUMBER} \| {NUMBER} \| {NUMBER} \| -?{NUMBER} \| {NUMBER}",
                        lines[1]), lines
    assert re.fullmatch(rf"min–max( \| -?{NUMBER}–-?{NUMBER}){{5}}", lines[2]), lines


def test_bench_report_prints_the_three_ways_and_how_much_faster_the_actors_way_is():
    lines = _run("bench_report.py", "--params", "1000", "--calls", "3")
    assert lines[0] == "1,000 parameters, 3 calls each way, in turn", lines
    for line, way in zip(lines[1:3], ("as torch tensors:      ", "whole as numpy arrays: ")):
        assert re.fullmatch(rf"sums {way}{NUMBER} ms a call \(actors' way {NUMBER}× faster\)",
                            line), lines
    assert re.fullmatch(rf"sums as actors send them:   {NUMBER} ms a call", lines[3]), lines
    assert len(lines) == 4, lines
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_report.py"),
                          "--calls", "0"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2 and "--params, --calls: expected ≥ 1 (got 274026, 0)" in out.stderr


def test_cpu_by_process_names_each_process_of_the_window():
    tool = os.path.join(ROOT, "tools", "cpu_by_process.py")
    busy = "import time\nend = time.process_time() + 3\nwhile time.process_time() < end: pass"
    out = subprocess.run([sys.executable, tool, "0.5", "1.5", sys.executable, "-c", busy],
                         capture_output=True, text=True, timeout=120)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and lines[0] == (f"CPU seconds from 0.5 s to 1.5 s of the run, "
                                                f"% of {os.cpu_count()} cores × 1 s:"), out
    name = f"{os.path.basename(sys.executable)} -c"
    assert any(re.fullmatch(rf"\s*{NUMBER} s\s+{NUMBER} %  {re.escape(name)}", line)
               for line in lines[1:-1]), lines
    assert re.fullmatch(rf"\s*-?{NUMBER} s\s+-?{NUMBER} %  \(idle\)", lines[-1]), lines
    for args, why in ((["2", "1", "true"], "expected 0 ≤ FROM_S < TO_S and a command"),
                      (["0", "60", "true"], "the command ended after")):
        out = subprocess.run([sys.executable, tool, *args], capture_output=True, text=True)
        assert out.returncode != 0 and why in out.stderr, out.stderr
