"""Where a run's numbers came from: versions, git commit, command lines, the config's hash.

Recorded in the user's process (the only one that knows the command line) into
``<run_dir>/provenance.json`` when a run starts or resumes; ``summary.json`` copies it.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import platform
import subprocess
import sys

from rayfl.config import ConfigError, to_dict
from rayfl.metrics.files import write_json
from rayfl.version import PACKAGE_DIR, __version__

PROVENANCE = "provenance.json"


def _module_version(name: str) -> str | None:
    try:
        return importlib.import_module(name).__version__
    except ImportError:
        return None


def git_commit(path: str) -> str | None:
    """HEAD of the git checkout holding ``path`` (``+dirty`` if it has local changes), or None."""
    try:
        head = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", path, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty else "")


def config_hash(cfg) -> str:
    """sha256 of the resolved config as canonical JSON (sorted keys)."""
    text = json.dumps(to_dict(cfg), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def record(run_dir: str, cfg, forked_from: dict | None = None) -> dict:
    """Write (or, on resume, extend) ``provenance.json``; returns its content. ``forked_from``:
    the run directory and round a fork started from (kept on later resumes)."""
    path = os.path.join(run_dir, PROVENANCE)
    old = load(run_dir)
    info = {
        "rayfl_version": __version__,
        "git_commit": git_commit(PACKAGE_DIR),
        "python": platform.python_version(),
        "torch": _module_version("torch"),  # with its build tag (e.g. +cu130)
        "ray": _module_version("ray"),
        "config_sha256": config_hash(cfg),
        "command_lines": [*old.get("command_lines", []), " ".join(sys.argv)],
    }
    if forked_from or "forked_from" in old:
        info["forked_from"] = forked_from or old["forked_from"]
    write_json(info, path)
    return info


def load(run_dir: str) -> dict:
    """``provenance.json`` of a run directory ({} when absent); a ConfigError naming it when it
    is not a JSON object."""
    path = os.path.join(run_dir, PROVENANCE)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError among them
        info = e
    if not isinstance(info, dict):
        raise ConfigError("run_dir", path, "rayfl's provenance record, a JSON object (" + (
            f"{type(info).__name__}: {' '.join(str(info).split())[:120]}"
            if isinstance(info, Exception) else f"it holds a {type(info).__name__}") + ")")
    return info
