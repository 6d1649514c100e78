"""The README's and the documentation's commands, run as written: every Python snippet verbatim,
every ``.venv/bin/rayfl`` command with its own arguments plus a few that make it short (fewer
rounds, a smaller grid).

The commands run from a scratch directory whose ``configs/`` holds the tiny synthetic config
under the README's file names, so nothing needs Fashion-MNIST; a README command this test does
not know how to shorten fails it, so a new example cannot slip in untested.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import shutil

import pyarrow.parquet as pq
import pytest
import yaml

from rayfl import cli
from tests.conftest import ROOT, TINY

# Arguments appended to each README command (later overrides win) to keep it seconds long.
SHORT = {
    # Ray: the Python snippet runs on it (and tests/test_runtime.py, test_open_core.py)
    "run": ["rounds=3", "runtime.executor=inprocess"],
    "resume": [],
    "fork": ["runtime.executor=inprocess"],  # a Ray fork: tests/test_fork.py
    "compare": ["rounds=2", "runtime.executor=inprocess"],  # Ray: covered by run and resume
    "tune": ["trials=2", "parallel=1", "overrides=[algorithm.name=adabest,"
             "data.validation_clients=4,runtime.executor=inprocess]"],
    "analyze interpolate": ["--steps", "3", "--max-samples", "50"],
    "analyze plane": ["--grid", "3", "--max-samples", "50"],
    "analyze decompose": ["--subsets", "1", "--cohort-samples", "50", "--max-samples", "50"],
    "analyze drift": [],
    "analyze regimes": ["rounds=2", "runtime.executor=inprocess", "--quiet"],
    "data": ["--rounds", "2"],
    "keys": [],
    "timeline": [],
    "algorithms": [],
}
# The comparison over many algorithms or seeds is validated only (the first runs for real).
DRY = {"--seeds", "fedmsi"}


DOCS = [os.path.join(ROOT, "README.md"),
        *sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))]


def readme_blocks(lang: str) -> list[str]:
    """Every ``lang`` code block of the README and of the pages under docs/."""
    blocks = []
    for path in DOCS:
        with open(path) as f:
            blocks += re.findall(rf"```{lang}\n(.*?)```", f.read(), flags=re.S)
    return list(dict.fromkeys(blocks))  # a block the README shares with a page runs once


def readme_commands() -> list[list[str]]:
    """Each ``.venv/bin/rayfl ...`` line of the README's sh blocks, split like a shell would."""
    out = []
    for block in readme_blocks("sh"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] == ".venv/bin/rayfl" and words[1:] not in out:
                out.append(words[1:])
    return out


def _scratch(root) -> None:
    """configs/ with the tiny config under every name the README uses (and the real study)."""
    with open(TINY) as f:
        tiny = yaml.safe_load(f)
    # 10 clients a round, as the real configs: the robust how-to's Multi-Krum (f = 2, k = 5)
    # needs m > 2f + 2 and k ≤ m − f
    tiny.update({"output_dir": "runs", "rounds": 4, "eval": {"every": 2},
                 "clients_per_round": 10})
    tiny["data"]["cache_dir"] = str(root / "cache")
    for name in ("quickstart", "papers/compare_fmnist", "analysis/fmnist_drift",
                 "shakespeare/compare_cpu", "async/fedbuff_fmnist"):
        path = root / "configs" / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        config = {**tiny, "name": os.path.basename(name)}
        if name == "papers/compare_fmnist":  # its commands evaluate 100 clients, name a
            # model's body and head, and train BatchNorm (no client left a 1-row minibatch)
            config["data"] = {**tiny["data"], "num_clients": 100, "partition": "iid"}
            config["model"] = {"name": "mlp"}
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
    (root / "configs" / "studies").mkdir()
    shutil.copy(os.path.join(ROOT, "configs", "studies", "adabest_fmnist.yaml"),
                root / "configs" / "studies")


def test_readme_commands_and_snippets_run(ray_local, tmp_path, monkeypatch, capsys):
    from rayfl import registry

    for kind, registered in registry._REGISTERED.items():  # snippets register components
        monkeypatch.setitem(registry._REGISTERED, kind, dict(registered))
    _scratch(tmp_path)
    monkeypatch.chdir(tmp_path)
    snippets = readme_blocks("python")
    assert snippets
    for code in snippets:
        exec(compile(code, "docs", "exec"), {"__name__": "__main__"})
    printed = capsys.readouterr().out
    assert re.search(r"\[\(2, [0-9.]+\), \(4, [0-9.]+\), \(5, [0-9.]+\)\]", printed), printed

    done = set()
    for words in readme_commands():
        key = " ".join(words[:2]) if words[0] == "analyze" else words[0]
        assert key in SHORT, f"README command without a short variant here: {words}"
        short = {o.split("=", 1)[0] for o in SHORT[key]}  # the short variant's keys win
        args = [w.replace("runs/quickstart-20261122-101500", _first_run(tmp_path))
                for w in words if w.split("=", 1)[0] not in short]
        if key == "compare" and DRY & set(",".join(args).split(",")):
            args.append("--dry-run")
        assert cli.main([*args, *SHORT[key]]) == 0, words
        done.add(key)
    assert done == set(SHORT)

    cmp_dir = glob.glob(str(tmp_path / "runs" / "compare-quickstart-*"))
    assert len(cmp_dir) == 1  # the dry runs made none
    rows = pq.read_table(os.path.join(cmp_dir[0], "comparison.parquet")).to_pylist()
    assert [r["algorithm"] for r in rows] == ["fedavg", "scaffold", "fedeve", "adabest",
                                              "fedavg+ima"]
    assert all(r["final_accuracy"] is not None for r in rows)
    assert os.path.isfile(tmp_path / "studies" / "adabest_fmnist" / "best.yaml")
    assert {"plane-paper.png", "interp-rounds.png", "decomposition.png", "drift.png"} <= set(
        os.listdir(tmp_path / "runs" / "landscape" / "analysis"))


def _first_run(root) -> str:
    found = sorted(glob.glob(str(root / "runs" / "quickstart-*")))
    return found[0] if found else "runs/none-yet"


@pytest.mark.parametrize("words", readme_commands(), ids=lambda w: " ".join(w[:2]))
def test_readme_commands_parse(words):
    """Every README command is accepted by the parser as written."""
    args, extra = cli.parser().parse_known_args(words)
    assert all("=" in e for e in extra)
    assert callable(args.fn)
