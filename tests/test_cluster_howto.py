"""docs/howto/cluster.md's one-machine walkthrough, run as written: its block in bash with a fresh
``HOME`` (no Ray token yet), which generates the token, starts a head and a worker with
``ray start --block`` in the background, points a rayfl run at the head with
``runtime.address`` (two actors of half a CPU and half a GPU on the worker's one declared GPU),
and stops the two nodes by their commands' pids.

What the test changes in the block, and why: the machine running the suite is shared, so the
head's port and the ports Ray would take by default (Ray Client, the dashboard agent) become
free ones and the head leaves out its dashboard; ``/tmp/ray-`` becomes a folder of the test's
own, so every process of the cluster can be found by its directories; ``.venv/bin/`` becomes the
running interpreter's folder; the run reads the tiny synthetic config. On a loaded machine a
node can take long to start: Ray's start-up waits get generous limits. Whatever happens, nothing
of the cluster is left running, and the test fails if the block's own ``kill`` left anything.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

import psutil

import rayfl
from tests.conftest import ROOT, TINY

PAGE = os.path.join(ROOT, "docs", "howto", "cluster.md")
BIN = os.path.dirname(sys.executable)
SLOW_START = {"RAY_raylet_start_wait_time_s": "600", "RAY_worker_register_timeout_seconds": "600"}


def walkthrough() -> str:
    """The page's "Try it on one machine" block."""
    with open(PAGE) as f:
        section = f.read().split("## Try it on one machine", 1)[1]
    return re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ours(root: str) -> list[psutil.Process]:
    """Processes (other than this one) that name or hold open a file under ``root``."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if p.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error):
            text = " ".join(p.info["cmdline"] or []) + " ".join(f.path for f in p.open_files())
            if root in text:
                found.append(p)
    return found


def _kill(shell: subprocess.Popen, root: str) -> None:
    """End the block's shell, its process group and whatever still uses ``root``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(shell.pid, signal.SIGKILL)
    shell.wait(timeout=10)
    leftover = _ours(root)
    for p in leftover:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(leftover, timeout=10)


def adapted(block: str, root: str, out: str) -> str:
    """The block with the substitutions the module docstring lists."""
    port = re.search(r"--head --port (\d+)", block).group(1)
    lines = block.replace(port, str(free_port())).splitlines()
    assert [ln.split()[0] for ln in lines] == [
        "export", ".venv/bin/ray", "head_dir=$(mktemp", ".venv/bin/ray", "head_pid=$!", "while",
        ".venv/bin/ray", "worker_pid=$!", "while", ".venv/bin/rayfl", "kill"]
    head = ["--include-dashboard", "false", "--ray-client-server-port", str(free_port())]
    for i, flags in ((3, head), (6, [])):
        flags = [*flags, "--dashboard-agent-listen-port", str(free_port())]
        lines[i] = lines[i].replace(" --block", " " + " ".join(flags) + " --block")
    lines[9] = lines[9].replace("configs/quickstart.yaml", shlex.quote(TINY)) + " " + " ".join(
        [f"output_dir={out}/runs", f"data.cache_dir={out}/cache"])
    return "\n".join(lines).replace(".venv/bin/", BIN + "/").replace("/tmp/ray-", root + "/ray-")


def test_the_cluster_walkthrough_places_actors_on_the_workers_gpu(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    root = tempfile.mkdtemp(prefix="rfc", dir="/tmp")  # short: Ray's socket paths live under it
    script = adapted(walkthrough(), root, str(tmp_path))
    env = {**os.environ, **SLOW_START, "HOME": str(home), "PYTHONPATH": ROOT}
    env.pop("RAY_AUTH_MODE", None)
    shell = subprocess.Popen(["bash", "-c", script], env=env, cwd=ROOT, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
    try:
        stdout, stderr = shell.communicate(timeout=1500)
        # a node's workers end once its raylet has: give them a minute to notice
        _, left = psutil.wait_procs(_ours(root), timeout=60)
    finally:
        _kill(shell, root)
        logs = "".join(open(p).read()[-2000:] for p in
                       (os.path.join(root, d, "start.log") for d in os.listdir(root))
                       if os.path.exists(p))
        shutil.rmtree(root, ignore_errors=True)
    assert not left, f"the block's kill left {[p.pid for p in left]} running"

    printed = stdout.strip().splitlines()
    run_dir = printed[-1] if printed else ""
    assert os.path.isdir(run_dir), stderr[-3000:] + logs
    assert (home / ".ray" / "auth_token").is_file()
    with open(os.path.join(run_dir, "actors.json")) as f:
        actors = list(json.load(f).values())
    # only the worker declares a GPU: half a GPU each puts both actors there, sharing it
    assert len(actors) == 2 and len({a["node_id"] for a in actors}) == 1
    assert all(a["gpu_ids"] == ["0"] and a["device"] == "cpu" for a in actors)
    with open(os.path.join(run_dir, "summary.json")) as f:
        on_cluster = json.load(f)
    short = [f"output_dir={tmp_path}/runs", f"data.cache_dir={tmp_path}/cache"]
    here = rayfl.run(TINY, [*short, "runtime.executor=inprocess"], quiet=True)
    assert on_cluster["model_sha256"] == here.summary["model_sha256"]


def test_every_rayfl_command_of_the_page_is_valid():
    """The multi-machine commands (HEAD_IP stands for an address) parse, and their configs
    validate, as written."""
    from rayfl import cli, config

    with open(PAGE) as f:
        blocks = re.findall(r"```bash\n(.*?)```", f.read(), flags=re.S)
    runs = [shlex.split(line)[1:] for block in blocks for line in block.splitlines()
            if line.startswith(".venv/bin/rayfl ")]
    assert len(runs) == 3
    for words in runs:
        args = cli.parser().parse_args(words)
        assert args.config == "configs/quickstart.yaml" and callable(args.fn)
        cfg = config.load(os.path.join(ROOT, args.config), args.overrides)
        assert cfg.runtime.address
