"""A new user's tour, second pass: "did you mean" for mistyped keys, ``rayfl data``'s per-client
table, and the documented metrics row."""

from __future__ import annotations

import pytest

from rayfl import cli
from rayfl import config as config_mod
from rayfl.schema import ConfigError
from tests.conftest import TINY


@pytest.mark.parametrize("override, key, guess", [
    ("local.lrr=0.1", "local.lrr", "local.lr"),
    ("loacl.lr=0.1", "loacl", "local"),
    ("lr=0.1", "lr", "local.lr"),  # a key one section down
    ("clients_per_rnd=3", "clients_per_rnd", "clients_per_round"),
    ("data.num_client=4", "data.num_client", "data.num_clients"),
    ("eval.client=3", "eval.client", "eval.clients"),
    ("algorithm.nam=x", "algorithm.nam", "algorithm.name"),  # a component's section
])
def test_a_mistyped_override_gets_a_guess(override, key, guess):
    with pytest.raises(ConfigError) as e:
        config_mod.load(TINY, [override])
    assert e.value.key == key
    assert f"(did you mean '{guess}'?)" in str(e.value)


def test_nothing_close_gets_no_guess():
    with pytest.raises(ConfigError) as e:
        config_mod.load(TINY, ["xyzzy=1"])
    assert "did you mean" not in str(e.value) and "valid keys here: aggregation" in str(e.value)


def test_a_mistyped_key_in_a_file_is_one_line_with_a_guess(tmp_path, capsys):
    path = tmp_path / "typo.yaml"
    path.write_text(open(TINY).read().replace("batch_size: 10", "batchsize: 10"))
    out = tmp_path / "runs"
    assert cli.main(["run", str(path), f"output_dir={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and not out.exists()
    assert err[0].startswith("rayfl: error: config key 'local.batchsize' = 10: expected no such "
                             "key (did you mean 'local.batch_size'?); valid keys here: ")
