"""The tour's conveniences without Ray: help/version/algorithms, plots that skip unevaluated
rounds, seed bands, the smoothed ETA, strict JSON, readable analysis output, the Grafana
dashboard's metric names, the comparison table and 1-based ``keep.rounds``."""

from __future__ import annotations

import json
import math
import os
import re

import matplotlib
import numpy as np
import pytest
import yaml

from rayfl import cli
from rayfl import config as config_mod
from rayfl.analysis.commands import readable
from rayfl.compare import aggregate, markdown_table
from rayfl.metrics.files import write_json
from rayfl.metrics.plots import evaluated, plot_accuracy, plot_accuracy_bands, seed_band
from rayfl.metrics.progress import Eta
from rayfl.schema import ConfigError
from rayfl.simulation import progress_line
from tests.conftest import ROOT, TINY

# What Ray 2.60's Prometheus endpoint listed for rayfl's gauges and counter (scraped once).
EXPORTED = {"ray_rayfl_round", "ray_rayfl_test_accuracy", "ray_rayfl_train_loss",
            "ray_rayfl_round_seconds", "ray_rayfl_clients_trained",
            "ray_rayfl_clients_trained_total"}
COMMANDS = {"run", "resume", "fork", "compare", "analyze", "tune", "keys", "data", "timeline",
            "algorithms", "privacy"}


def test_help_names_every_command(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    description = text.split("positional arguments")[0].split("\n\n", 1)[1]  # not the usage
    assert set(cli.parser()._subparsers._group_actions[0].choices) == COMMANDS
    assert all(re.search(rf"\b{c}\b", description) for c in COMMANDS), description


def test_version_names_the_packages(capsys):
    import platform

    import ray
    import torch

    import rayfl

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"rayfl {rayfl.__version__} ")
    assert platform.python_version() in out and torch.__version__.split("+")[0] in out
    assert ray.__version__ in out


def test_algorithms_have_distinct_lines_and_list_the_wrappers(capsys):
    from rayfl import registry as components
    from rayfl.algorithms import registry

    assert cli.main(["algorithms"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    names = [line.split()[0] for line in lines]
    assert names == [*registry.names(), *components.names("wrapper")] and "ima" in names
    texts = [line.split(None, 1)[1] for line in lines]
    assert len(set(texts)) == len(texts)


ROWS = [{"round": 1, "test_accuracy": None}, {"round": 2, "test_accuracy": 0.5},
        {"round": 3, "test_accuracy": None}, {"round": 4, "test_accuracy": 0.75},
        {"round": 5}, {"round": 6, "test_accuracy": float("nan")}]


def test_plot_skips_rounds_without_evaluation(tmp_path):
    """eval.every = 2 leaves None in the odd rounds (as metrics.parquet reads back)."""
    assert evaluated(ROWS) == [(2, 0.5), (4, 0.75)]
    assert plot_accuracy({"a": ROWS, "b": ROWS[:2]}, str(tmp_path / "acc.png")) == 2
    assert plot_accuracy({"none": [{"round": 1, "test_accuracy": None}]},
                         str(tmp_path / "empty.png")) == 0
    assert os.path.getsize(tmp_path / "acc.png") > 0


def test_seed_band_is_mean_and_std_over_seeds(tmp_path):
    a = [{"round": 2, "test_accuracy": 0.4}, {"round": 4, "test_accuracy": 0.6}]
    b = [{"round": 2, "test_accuracy": 0.6}, {"round": 4, "test_accuracy": 0.6},
         {"round": 6, "test_accuracy": 0.9}]
    x, mean, std = seed_band([a, b])
    assert list(x) == [2, 4]  # the rounds both seeds evaluated
    assert np.allclose(mean, [0.5, 0.6]) and np.allclose(std, [0.1, 0.0])
    assert plot_accuracy_bands({"fedavg": [a, b]}, str(tmp_path / "band.png")) == 1


def test_eta_is_the_mean_of_recent_rounds():
    eta = Eta(window=3)
    lines = [progress_line({"round": t, "rounds": 10, "round_s": s}, eta)
             for t, s in enumerate([1.0, 1.0, 1.0, 10.0], start=1)]
    # after round 4 the window holds 1, 1, 10: mean 4 s, 6 rounds left = 24 s (not 60 s)
    assert lines[-1].endswith("4.00 s/round | ETA 0:00:24")
    assert lines[0] == "round 1/10 | 1.00 s/round | ETA 0:00:09"
    assert "acc" not in progress_line({"round": 1, "rounds": 2, "test_accuracy": None})


def test_json_files_are_strict(tmp_path):
    path = str(tmp_path / "s.json")
    write_json({"a": float("nan"), "b": [1.0, float("inf")], "c": np.float32(0.5)}, path)

    def refuse(name):
        raise ValueError(name)

    with open(path) as f:
        assert json.load(f, parse_constant=refuse) == {"a": None, "b": [1.0, None], "c": 0.5}


def test_analysis_summary_prints_as_readable_lines():
    lines = readable({"loss": 0.123456, "rounds": [{"round": 3, "bias": 1.5e-05}],
                      "note": None})
    assert lines == ["loss: 0.1235", "rounds:", "  round 3, bias 1.5e-05", "note: —"]


def test_grafana_dashboard_queries_the_exported_metric_names():
    with open(os.path.join(ROOT, "monitoring", "grafana", "rayfl_dashboard.json")) as f:
        dash = json.load(f)
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    named = {m for e in exprs for m in re.findall(r"\bray_rayfl_\w+", e)}
    assert named == EXPORTED
    from rayfl.metrics.live import _GAUGES

    published = {f"ray_{name}" for name, _ in _GAUGES.values()} | {
        "ray_rayfl_clients_trained_total"}
    assert published == EXPORTED
    with open(os.path.join(ROOT, "docs", "howto", "monitoring.md")) as f:
        readme = f.read()
    assert all(f"`{m}`" in readme for m in EXPORTED)
    assert not re.findall(r"`rayfl_\w+`", readme)  # the names without Ray's prefix are wrong


def test_comparison_table_reports_mean_and_std_over_seeds():
    runs = [{"final_accuracy": 0.5, "mean_last_k_evals_accuracy": 0.4, "rounds_to_target": 3,
             "wall_time_s": 10.0, "model_sha256": "a"},
            {"final_accuracy": 0.7, "mean_last_k_evals_accuracy": 0.6, "rounds_to_target": None,
             "wall_time_s": 20.0, "model_sha256": "b"}]
    row = aggregate("fedavg", runs)
    assert row["final_accuracy"] == pytest.approx(0.6)
    assert row["final_accuracy_std"] == pytest.approx(0.1)
    assert row["rounds_to_target"] == 3 and row["reached"] == 1
    base = {"eval": {"last_k": 10, "target_accuracy": 0.55}}
    table = markdown_table([row], base)
    assert "| fedavg | 60.00 ± 10.00 | 50.00 ± 10.00 | 3.0 ± 0.0 (1/2) | 15 |" in table
    assert "mean of last 10 evals" in table and "2 seeds" in table


def test_keep_rounds_count_from_one():
    cfg = config_mod.load(TINY, ["keep.rounds=[1,4]"])
    assert cfg.keep.rounds == [1, 4]
    for bad in (0, 5):
        with pytest.raises(ConfigError, match=r"keep.rounds.*\[1, 4\]"):
            config_mod.load(TINY, [f"keep.rounds=[{bad}]"])


def test_loggers_need_their_package(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboardX" else real(name, *a))
    with pytest.raises(ConfigError, match="loggers.tensorboard.*tensorboardX"):
        config_mod.load(TINY, ["loggers.tensorboard=true"])


def test_dry_run_prints_config_and_partition_and_creates_no_run(tmp, capsys):
    out_dir = tmp[0].split("=", 1)[1]
    assert cli.main(["run", TINY, *tmp, "rounds=3", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert not os.path.exists(out_dir)
    body, _, tail = text.partition("# partition: ")
    assert yaml.safe_load(body) == config_mod.to_dict(config_mod.load(TINY, [*tmp, "rounds=3"]))
    assert "clients 20" in tail and "dry run" in tail
    assert cli.main(["compare", TINY, *tmp, "--algorithms", "fedavg,scaffold", "--seeds", "0,1",
                     "--dry-run"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == "# 4 runs: fedavg (seed 0), fedavg (seed 1), scaffold (seed 0), " \
                    "scaffold (seed 1)"
    assert cli.main(["compare", TINY, *tmp, "--algorithms", "fedavg", "--seeds", "0,x"]) == 2
    assert cli.main(["compare", TINY, *tmp, "--algorithms", "nope", "--dry-run"]) == 2


@pytest.fixture
def tmp(tmp_path):
    return [f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'cache'}"]


def test_availability_axes_start_at_zero_for_a_constant(tmp_path):
    from matplotlib.figure import Figure

    from rayfl.availability.plots import _from_zero

    ax = Figure().subplots()
    ax.plot([1, 2, 3], [100, 100, 100])
    _from_zero(ax, [100, 100, 100])
    assert ax.get_ylim() == (0, pytest.approx(130.0))
    assert matplotlib.get_backend().lower() == "agg"
    assert not math.isnan(ax.get_ylim()[1])
