"""docs/howto/cluster.md's one-machine walkthrough, run: a head and a worker started with
``ray start``, a rayfl run pointed at the head with ``runtime.address`` that places two actors of
half a CPU and half a GPU on the worker's one (declared) GPU, and the two nodes stopped.

What differs from the page, and why: each ``ray start`` gets ``--block``, so it owns its node's
processes and a SIGTERM stops exactly that node — the page's ``ray stop`` would end every Ray
process on the machine, other tests' local Rays included; the head leaves out its dashboard and
takes a free Ray Client port and both nodes free ports and their own temporary directories (the
defaults could collide with another Ray on the machine); the run reads the tiny synthetic config.
Whatever happens, the nodes are stopped and nothing of them is left running.
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
import time

import psutil

import rayfl
from tests.conftest import ROOT, TINY

PAGE = os.path.join(ROOT, "docs", "howto", "cluster.md")
RAY = os.path.join(os.path.dirname(sys.executable), "ray")
STARTED = "Ray runtime started."


def walkthrough() -> list[list[str]]:
    """The commands of the page's "Try it on one machine" block, split like a shell would."""
    with open(PAGE) as f:
        section = f.read().split("## Try it on one machine", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)
    return [shlex.split(line) for line in block.splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_started(node: subprocess.Popen, log: str, timeout: float = 120.0) -> None:
    """Until ``ray start --block`` says its node is up (it then blocks)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(log) as f:
            if STARTED in f.read():
                return
        assert node.poll() is None, open(log).read()[-3000:]
        time.sleep(0.5)
    raise AssertionError(f"no node within {timeout:g} s: {open(log).read()[-3000:]}")


def _ours(dirs: list[str]) -> list[psutil.Process]:
    """Processes (other than this one) that name or hold open a file under ``dirs``."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if p.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error):
            text = " ".join(p.info["cmdline"] or []) + " ".join(f.path for f in p.open_files())
            if any(d in text for d in dirs):
                found.append(p)
    return found


def _stop(nodes: list[subprocess.Popen], dirs: list[str]) -> None:
    """SIGTERM each ``ray start --block`` (it stops its node), then kill whatever of its
    process group, its descendants or our directories' users is still alive."""
    family = []
    for node in nodes:
        with contextlib.suppress(psutil.Error):
            family += psutil.Process(node.pid).children(recursive=True)
    for node in reversed(nodes):  # the worker first, then the head
        node.send_signal(signal.SIGTERM)
    for node in nodes:
        try:
            node.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGKILL)
            node.wait(timeout=10)
    leftover = [p for p in family if p.is_running()] + _ours(dirs)
    for p in leftover:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(leftover, timeout=10)


def test_the_cluster_walkthrough_places_actors_on_the_workers_gpu(tmp_path):
    commands = walkthrough()
    assert [c[:2] for c in commands] == [["export", "RAY_AUTH_MODE=token"],
                                         [".venv/bin/ray", "start"], [".venv/bin/ray", "start"],
                                         [".venv/bin/rayfl", "run"], [".venv/bin/ray", "stop"]]
    env = {**os.environ, "PYTHONPATH": ROOT, commands[0][1].split("=")[0]: "token"}
    head_cmd, worker_cmd, run_cmd = commands[1], commands[2], commands[3]
    page_port = head_cmd[head_cmd.index("--port") + 1]
    port = str(free_port())
    dirs = [tempfile.mkdtemp(prefix="rfh", dir="/tmp"), tempfile.mkdtemp(prefix="rfw", dir="/tmp")]
    extra = [["--include-dashboard", "false", "--ray-client-server-port", str(free_port()),
              "--dashboard-agent-listen-port", str(free_port())],
             ["--dashboard-agent-listen-port", str(free_port())]]
    nodes = []
    try:
        for cmd, own_dir, more, name in zip((head_cmd, worker_cmd), dirs, extra, ("head", "w")):
            args = [RAY, *cmd[1:], *more, "--block"]
            args[args.index("--temp-dir") + 1] = own_dir
            args = [a.replace(page_port, port) for a in args]
            log = str(tmp_path / f"{name}.log")
            with open(log, "w") as out:
                nodes.append(subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                              env=env, cwd=ROOT, start_new_session=True))
            _wait_started(nodes[-1], log)

        short = [f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'cache'}"]
        args = [a.replace(page_port, port) for a in run_cmd[1:]]
        args[args.index("configs/quickstart.yaml")] = TINY
        run = subprocess.run([sys.executable, "-m", "rayfl", *args, *short], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
    finally:
        _stop(nodes, dirs)
        alive = _ours(dirs)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    assert not alive, "a process of the cluster outlived it"

    assert run.returncode == 0, run.stderr[-3000:]
    run_dir = run.stdout.strip().splitlines()[-1]
    with open(os.path.join(run_dir, "actors.json")) as f:
        actors = list(json.load(f).values())
    # only the worker declares a GPU: half a GPU each puts both actors there, sharing it
    assert len(actors) == 2 and len({a["node_id"] for a in actors}) == 1
    assert all(a["gpu_ids"] == ["0"] and a["device"] == "cpu" for a in actors)
    with open(os.path.join(run_dir, "summary.json")) as f:
        on_cluster = json.load(f)
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
