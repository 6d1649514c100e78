"""examples/README.md as written: every file of examples/ is in its table, and every command of
the table builds its component and runs one round of the tiny synthetic config in-process; the
server-optimiser snippet runs under SCAFFOLD with its own key."""

from __future__ import annotations

import glob
import os
import re
import runpy
import shlex
import sys
import textwrap

import pytest

from rayfl import cli, registry
from tests.conftest import ROOT

README = os.path.join(ROOT, "examples", "README.md")


def table() -> dict[str, list[str]]:
    """file name -> its command (split like a shell would), from the README's table."""
    with open(README) as f:
        rows = re.findall(r"^\| `(\w+\.py)` \| .* \| `([^`]+)` \|$", f.read(), flags=re.M)
    return {name: shlex.split(command) for name, command in rows}


@pytest.fixture
def scratch_registry(monkeypatch):
    """Registrations made by a test (register_api.py, the snippet) end with it."""
    for kind, registered in registry._REGISTERED.items():
        monkeypatch.setitem(registry._REGISTERED, kind, dict(registered))


def test_every_example_is_in_the_table():
    files = {os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "examples", "*.py"))}
    assert set(table()) == files - {"__init__.py"}


@pytest.mark.parametrize("name", sorted(table()))
def test_each_command_runs_one_round(name, tiny, scratch_registry, monkeypatch, capsys):
    words = table()[name]
    one_round = ["rounds=1", "runtime.executor=inprocess", *tiny]
    monkeypatch.chdir(ROOT)
    if words[0] == "python":
        assert words[1:] == [f"examples/{name}"]
        monkeypatch.setattr(sys, "argv", [words[1], *one_round])
        runpy.run_path(words[1], run_name="__main__")
        assert "final accuracy" in capsys.readouterr().out
        return
    assert words[:3] == ["rayfl", "run", "configs/test/tiny.yaml"]
    assert f"examples.{name[:-3]}:" in " ".join(words)
    assert cli.main([*words[1:], *one_round]) == 0
    run_dir = capsys.readouterr().out.strip().splitlines()[-1]
    assert os.path.isfile(os.path.join(run_dir, "summary.json"))


def test_the_server_optimiser_snippet_runs_with_its_own_key(tiny, scratch_registry):
    from dataclasses import dataclass

    import torch

    import rayfl
    from rayfl import schema
    from rayfl.algorithms.server_opt import ServerOpt

    with open(README) as f:
        (snippet,) = re.findall(r"```py\n(.*?)```", f.read(), flags=re.S)
    names = {"dataclass": dataclass, "torch": torch, "schema": schema, "ServerOpt": ServerOpt}
    exec(compile(textwrap.dedent(snippet), README, "exec"), names)
    rayfl.register_server_opt(names["sign_sgd"], name="sign_sgd")
    common = [*tiny, "rounds=1", "runtime.executor=inprocess", "algorithm.name=scaffold"]
    half = rayfl.run(os.path.join(ROOT, "configs", "test", "tiny.yaml"),
                     [*common, "server_opt.name=sign_sgd", "server_opt.scale=0.5"], quiet=True)
    whole = rayfl.run(os.path.join(ROOT, "configs", "test", "tiny.yaml"),
                      [*common, "server_opt.name=sign_sgd"], quiet=True)
    assert half.summary["model_sha256"] != whole.summary["model_sha256"]
