"""partition=natural gives client i the rows of writer/user i: ids with gaps below
data.num_clients (clients that would be empty while rows of higher ids are silently dropped)
are refused in one line that counts what would be lost; ids beyond data.num_clients without
such gaps keep their documented meaning (the first N writers/users)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rayfl.data import partition as part
from rayfl.schema import ConfigError
from tests.test_data_boundary import good_arrays, refused

HERE = "tests.test_natural_partition"


class EvenUsers:
    """600 rows of 20 users numbered 0, 2, …, 38 (30 rows each)."""

    natural = True

    @staticmethod
    def load(cfg, seed):
        arrays = good_arrays(n=600)
        return dataclasses.replace(arrays, groups=np.repeat(np.arange(0, 40, 2), 30))


@pytest.mark.parametrize("command", ["dry-run", "run"])
def test_user_ids_with_gaps_are_refused_with_what_would_be_dropped(command, tmp_path, capsys):
    line = refused(tmp_path, capsys, [f"data.dataset={HERE}:EvenUsers",
                                      "data.partition=natural", "data.num_clients=20"],
                   command=command)
    assert "'data.num_clients' = 20" in line
    assert "(0, 2, 4, 6, 8, 10, …, 38)" in line
    assert "10 clients would be empty and 300 of 600 rows (10 ids ≥ 20) dropped" in line
    assert "number the writers/users 0..19 without gaps, or set data.num_clients ≤ 1" in line


def test_a_gap_is_refused_wherever_it_falls_below_num_clients():
    groups = np.array([0, 1, 1, 3, 4, 4])
    with pytest.raises(ConfigError, match=r"1 clients would be empty and 3 of 6 rows \(2 ids ≥ "
                                          r"3\) dropped.*data.num_clients ≤ 2"):
        part.natural(groups, 3)
    with pytest.raises(ConfigError, match=r"\(0, 1, 3, 6\): 3 clients would be empty; number"):
        part.natural(np.array([0, 1, 1, 3, 6, 6]), 7)


def test_ids_above_num_clients_are_the_documented_first_writers_even_with_gaps_up_there():
    groups = np.array([2, 0, 1, 2, 0, 9, 9, 5])
    order, offsets = part.natural(groups, 3)
    assert [sorted(order[a:b].tolist()) for a, b in zip(offsets, offsets[1:])] == \
        [[1, 4], [2], [0, 3]]
