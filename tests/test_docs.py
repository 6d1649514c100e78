"""The documentation site builds in strict mode (no broken link, anchor or API reference), its
generated reference pages say what the code says, and its config snippets are valid configs.
(Its commands and Python snippets run in tests/test_readme.py.)"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

import yaml

from rayfl import config
from tests.conftest import ROOT, TINY


def test_site_builds_strict(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT, "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                          "-d", str(tmp_path / "site")], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    for name in ("rayfl.run", "rayfl.algorithms.base.Algorithm.client_end",
                 "rayfl.algorithms.base.LocalRule", "rayfl.register_algorithm"):
        assert f'id="{name}"' in api, name
    keys = (tmp_path / "site" / "reference" / "config" / "index.html").read_text()
    assert "runtime.cpus_per_actor" in keys and "aggregation.weighting" in keys


def test_every_page_is_in_the_nav():
    with open(os.path.join(ROOT, "mkdocs.yml")) as f:
        nav = f.read().split("\nnav:", 1)[1]
    pages = {os.path.relpath(p, os.path.join(ROOT, "docs"))
             for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)}
    assert pages == set(re.findall(r":\s*(\S+\.md)", nav))


def test_generated_markers_expand():
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        import mkdocs_hooks
    finally:
        sys.path.remove(os.path.join(ROOT, "tools"))
    for page in glob.glob(os.path.join(ROOT, "docs", "reference", "*.md")):
        with open(page) as f:
            text = mkdocs_hooks.on_page_markdown(f.read(), None, None, None)
        assert "<!-- generated" not in text
    cli = mkdocs_hooks.generated("cli")
    assert all(f"## `rayfl {c}`" in cli for c in ("run", "resume", "fork", "compare", "tune"))


def test_yaml_snippets_are_valid_configs():
    with open(TINY) as f:
        base = yaml.safe_load(f)
    blocks = []
    for page in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True):
        with open(page) as f:
            blocks += re.findall(r"```yaml\n(.*?)```", f.read(), flags=re.S)
    assert blocks
    for block in blocks:
        config.from_dict({**base, **yaml.safe_load(block)})


def test_keys_of_one_algorithm_lists_only_its_own(capsys):
    from rayfl import cli

    assert cli.main(["keys", "--algorithm", "fedprox"]) == 0
    out = capsys.readouterr().out
    keys = re.findall(r"^\| `([^`]+)` \|", out, flags=re.M)
    assert keys and all(k.startswith("algorithm.") for k in keys), keys
    assert "algorithm.mu" in keys and "rounds" not in keys
    assert cli.main(["keys", "--model", "transformer_lm"]) == 0
    keys = re.findall(r"^\| `([^`]+)` \|", capsys.readouterr().out, flags=re.M)
    assert keys and all(k.startswith("model.") for k in keys), keys
