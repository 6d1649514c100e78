"""The examples/ components run through real Ray actors (2 actors), from a config reference, from
the user's working directory, from a script's registration, and under the tuner."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import yaml

from rayfl import run
from tests.conftest import ROOT, TINY

ALGO = "examples.my_algo:MyAlgo"


def _run(tiny, *overrides):
    return run(TINY, [*tiny, "rounds=2", "runtime.num_actors=2", *overrides], quiet=True)


def _actors(result) -> int:
    with open(os.path.join(result.run_dir, "actors.json")) as f:
        return len(json.load(f))


def test_custom_algorithm_runs_on_two_actors_and_its_param_acts(ray_local, tiny):
    fedavg = _run(tiny, "runtime.executor=inprocess")  # the executors give the same bytes
    still = _run(tiny, f"algorithm.name={ALGO}", "algorithm.pull=0")
    pulled = _run(tiny, f"algorithm.name={ALGO}", "algorithm.pull=0.5",
                  "runtime.executor=inprocess")
    assert _actors(still) == 2
    # no pull is FedAvg to the byte; a pull changes the model
    assert still.summary["model_sha256"] == fedavg.summary["model_sha256"]
    assert pulled.summary["model_sha256"] != fedavg.summary["model_sha256"]
    assert pulled.summary["algorithm"] == ALGO


def test_custom_model_runs_on_two_actors_with_its_own_width(ray_local, tiny):
    result = _run(tiny, "model.name=examples.my_model:TinyMLP", "model.width=8")
    assert _actors(result) == 2 and result.metrics.num_rows == 2
    # 16 features -> 8 hidden -> 4 classes
    assert result.params.size == 16 * 8 + 8 + 8 * 4 + 4
    assert np.isfinite(result.summary["final_accuracy"])


def test_custom_dataset_runs_on_two_actors(ray_local, tiny):
    result = _run(tiny, "data.dataset=examples.my_data:Rings", "data.noise=0.2")
    assert _actors(result) == 2
    assert result.params.size == 2 * 4 + 4  # logreg on the rings' 2-D inputs, 4 classes
    with open(os.path.join(result.run_dir, "config.yaml")) as f:
        assert yaml.safe_load(f)["data"]["noise"] == 0.2  # the resolved config keeps its key


def _python(args, cwd, tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT, "RAYFL_CACHE": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_a_module_in_the_working_directory_reaches_every_worker(tmp_path):
    """A fresh process (its own Ray) runs an algorithm from a file in its working directory,
    which is not on PYTHONPATH: connect_ray ships it to the workers."""
    work = tmp_path / "project"
    work.mkdir()
    (work / "my_rule.py").write_text(
        '"""A user algorithm."""\nfrom rayfl.algorithms.fedavg import FedAvg\n\n\n'
        'class Mine(FedAvg):\n    """FedAvg, renamed."""\n')
    done = _python(["-m", "rayfl", "run", TINY, "algorithm.name=my_rule:Mine", "rounds=1",
                    "runtime.num_actors=2", "runtime.ray_num_cpus=2", "--quiet",
                    f"output_dir={tmp_path / 'runs'}"], work, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "my_rule:Mine" in done.stdout


def test_a_component_registered_in_a_script_reaches_every_worker(tmp_path):
    done = _python([os.path.join(ROOT, "examples", "register_api.py"), "runtime.ray_num_cpus=2",
                    f"output_dir={tmp_path / 'runs'}"], tmp_path, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "half_step: final accuracy" in done.stdout


def test_an_optuna_study_tunes_a_custom_algorithms_param(ray_local, tmp_path):
    from tune import spec
    from tune.driver import run_study

    setup = spec.build({
        "name": "custom", "base": TINY, "dir": str(tmp_path / "study"),
        "overrides": [f"algorithm.name={ALGO}", "rounds=2", "runtime.executor=inprocess",
                      "data.validation_clients=4", f"data.cache_dir={tmp_path / 'cache'}",
                      f"output_dir={tmp_path / 'runs'}"],
        "presets": [ALGO], "enqueue": [{"algorithm.pull": 0.01}, {"algorithm.pull": 0.5}],
        "trials": 2, "parallel": 1})
    summary = run_study(setup)
    assert summary["trials"]["COMPLETE"] == 2
    best = yaml.safe_load(open(os.path.join(setup.dir, "best.yaml")))
    assert best["algorithm"]["name"] == ALGO and best["algorithm"]["pull"] in (0.01, 0.5)
