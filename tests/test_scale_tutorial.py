"""docs/scale-tutorial.md, run as written: its bash block with a fresh ``HOME`` (two nodes on
this machine, the head with its dashboard, 100,000 clients trained on the cluster, the actors
listed through the dashboard, the nodes stopped by their pids), then its Python block on the
run it made.

What the test changes, as in tests/test_cluster_howto.py (whose helpers it uses) and for the
same reasons: free ports for the head, the dashboard and the ports Ray takes by default, a
folder of the test's own for the nodes' directories and the tutorial's work folder, the running
interpreter's folder for ``.venv/bin/``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile

import psutil

import rayfl
from tests.conftest import ROOT
from tests.test_cluster_howto import BIN, SLOW_START, _kill, _ours, free_port

PAGE = os.path.join(ROOT, "docs", "scale-tutorial.md")


def blocks() -> tuple[str, str]:
    with open(PAGE) as f:
        text = f.read()
    (bash,) = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    (py,) = re.findall(r"```py\n(.*?)```", text, flags=re.S)
    return bash, py


def adapted(block: str, root: str, work: str) -> str:
    """The block on free ports, with the nodes' and the work folders under the test's own."""
    lines = block.replace("6391", str(free_port())).replace(
        "8265", str(free_port())).splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith(".venv/bin/ray start")]
    assert len(starts) == 2 and "--head" in lines[starts[0]]
    head = ["--ray-client-server-port", str(free_port())]
    for i, flags in ((starts[0], head), (starts[1], [])):
        flags = [*flags, "--dashboard-agent-listen-port", str(free_port())]
        lines[i] = lines[i].replace(" --block", " " + " ".join(flags) + " --block")
    return ("\n".join(lines).replace(".venv/bin/", BIN + "/")
            .replace("/tmp/ray-", root + "/ray-").replace("/tmp/rayfl-scale-", work + "/rayfl-scale-"))


def test_the_scale_tutorial_trains_100k_clients_on_a_cluster_and_reads_the_run(
        tmp_path, capsys):
    home = tmp_path / "home"
    home.mkdir()
    root = tempfile.mkdtemp(prefix="rfs", dir="/tmp")  # short: Ray's socket paths live under it
    bash, py = blocks()
    env = {**os.environ, **SLOW_START, "HOME": str(home), "PYTHONPATH": ROOT}
    env.pop("RAY_AUTH_MODE", None)
    shell = subprocess.Popen(["bash", "-c", adapted(bash, root, str(tmp_path))], env=env,
                             cwd=ROOT, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = shell.communicate(timeout=1500)
        _, left = psutil.wait_procs(_ours(root), timeout=60)
    finally:
        _kill(shell, root)
        shutil.rmtree(root, ignore_errors=True)
    assert not left, f"the block's kill left {[p.pid for p in left]} running"
    (work,) = [p for p in os.listdir(tmp_path) if p.startswith("rayfl-scale-")]
    runs = tmp_path / work / "runs"  # what the block printed says why a run is missing
    assert sorted(os.listdir(tmp_path / work)) == ["cache", "runs"] and \
        len(os.listdir(runs)) == 1, stdout[-3000:] + stderr[-3000:]
    # the dashboard listed the run's actors (two client actors and the server), ended with it
    listed = [ln.split() for ln in stdout.splitlines() if "rayfl/scale-" in ln]
    assert sorted(row[2] for row in listed) == ["ClientHost", "ClientHost", "ServerHost"], \
        stdout[-3000:] + stderr[-3000:]
    assert all(row[3] == "DEAD" for row in listed)

    exec(compile(py.replace("/tmp/rayfl-scale-", f"{tmp_path}/rayfl-scale-"), PAGE, "exec"),
         {"__name__": "__main__"})
    out = capsys.readouterr().out
    assert "20 rounds of 1000 clients" in out
    assert "client-0" in out and "client-1" in out and "server" not in out.split("actors:")[1]
    share = float(re.search(r"slowest actor's training / round: ([\d.]+)", out).group(1))
    assert 0 < share <= 1
    # the cluster's bytes are the in-process run's
    (run,) = os.listdir(tmp_path / work / "runs")
    with open(tmp_path / work / "runs" / run / "summary.json") as f:
        on_cluster = json.load(f)["model_sha256"]
    here = rayfl.run(os.path.join(ROOT, "configs", "scale_cluster.yaml"),
                     [f"output_dir={tmp_path}/here", f"data.cache_dir={tmp_path / work}/cache",
                      "runtime.executor=inprocess"], quiet=True)
    assert here.summary["model_sha256"] == on_cluster
