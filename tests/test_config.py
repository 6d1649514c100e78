"""Config validation: a bad config names key, value and expectation, exits 2, starts nothing."""

from __future__ import annotations

import os

import pytest

from rayfl import config
from rayfl.cli import main
from rayfl.schema import ConfigError
from tests.conftest import TINY


@pytest.mark.parametrize("override, key, expected", [
    ("rounds=0", "rounds", "[1, 1000000]"),
    ("local.lr=-0.1", "local.lr", "(0.0, inf)"),
    ("local.batch_size=ten", "local.batch_size", "an integer"),
    ("data.partition=shards9", "data.partition", "one of"),
    ("runtime.nonsense=1", "runtime.nonsense", "no such key"),
    ("algorithm.name=fedfoo", "algorithm.name", "one of"),
    ("clients_per_round=500", "clients_per_round", "at most data.num_clients"),
])
def test_bad_value_names_key_value_and_expectation(override, key, expected):
    with pytest.raises(ConfigError) as err:
        config.load(TINY, [override])
    assert err.value.key == key
    assert expected in err.value.expected
    assert key in str(err.value)


def test_cli_exits_2_with_one_clear_line_and_writes_nothing(tmp_path, capsys):
    runs = tmp_path / "runs"
    code = main(["run", TINY, "local.momentum=1.5", f"output_dir={runs}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "local.momentum" in err[0] and "1.5" in err[0]
    assert not runs.exists()


def test_missing_config_file_and_missing_dataset_dir(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err
    code = main(["run", TINY, "data.dataset=fmnist", f"data.root={tmp_path}",
                 f"output_dir={tmp_path / 'runs'}"])
    msg = capsys.readouterr().err
    assert code == 2 and "data.root" in msg and "dataset-fashion-mnist" in msg
    assert not os.path.exists(tmp_path / "runs")


def test_overrides_are_typed_and_round_trip():
    cfg = config.load(TINY, ["rounds=3", "seed=7", "runtime.num_actors=1", "local.lr=0.5",
                             "wrappers.ima.window=3"])
    assert (cfg.rounds, cfg.seed, cfg.runtime.num_actors, cfg.local.lr) == (3, 7, 1, 0.5)
    assert [(w.name, w.params.window) for w in cfg.wrappers] == [("ima", 3)]
    assert config.from_dict(config.to_dict(cfg)) == cfg


def test_error_inside_an_optional_section_names_the_nested_key():
    with pytest.raises(ConfigError) as err:
        config.load(TINY, ["wrappers.ima.window=0"])
    assert err.value.key == "wrappers[0].window" and "[1, inf)" in str(err.value)


def test_config_readme_is_the_generated_reference():
    from rayfl.docs import HEADER, config_reference
    from tests.conftest import ROOT

    with open(os.path.join(ROOT, "configs", "README.md")) as f:
        assert f.read() == HEADER + config_reference(), \
            "configs/README.md is stale: run `rayfl keys --write configs/README.md`"


def test_every_key_has_a_doc():
    from rayfl.algorithms import registry
    from rayfl.config import Config
    from rayfl.schema import describe_fields

    rows = describe_fields(Config)
    for name in registry.names():
        rows += describe_fields(registry.get(name).Params, f"algorithm[{name}]")
    undocumented = [key for key, _, _, doc in rows if not doc]
    assert not undocumented


@pytest.mark.parametrize("name, weighting, expected", [
    ("fedavg", "auto", "samples"), ("adabest", "auto", "uniform"), ("fedmim", "auto", "uniform"),
    ("adabest", "samples", "samples"), ("scaffold", "uniform", "uniform")])
def test_auto_weighting_is_the_papers_choice(name, weighting, expected):
    from rayfl.assemble import stack as build

    cfg = config.load(TINY, [f"algorithm.name={name}", f"aggregation.weighting={weighting}"])
    assert build(cfg, num_clients=20).algorithm.weighting == expected


def test_configs_of_earlier_versions_load_in_todays_keys():
    """Run directories written before `wrappers` and `selection` existed stay readable."""
    old = config.load(TINY, ["ima={window: 3, start: 1}", "availability.selection=power_of_choice",
                             "availability.candidates=12"])
    new = config.load(TINY, ["wrappers=[{name: ima, window: 3, start: 1}]",
                             "selection.name=power_of_choice", "selection.candidates=12"])
    assert old == new
    assert config.load(TINY, ["ima=null", "availability.selection=uniform"]) == config.load(TINY)
    with pytest.raises(ConfigError) as err:
        config.load(TINY, ["ima=5"])
    assert err.value.key == "ima"
