"""The documentation site builds in strict mode (no broken link, anchor or API reference), its
generated reference pages say what the code says, its config snippets are valid configs, and
the algorithm tutorial's blocks run in order. (The commands and the stand-alone ``python``
snippets run in tests/test_readme.py; a ``py`` block is a fragment or a step of a sequence.)"""

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
    """Built for a sub-path (a site served at http://host/rayfl/): it builds strict, its 404
    page's links all lead into the site, and the configs and examples it names are pages."""
    env = {**os.environ, "PYTHONPATH": ROOT, "NO_MKDOCS_2_WARNING": "1",
           "RAYFL_SITE_URL": "http://127.0.0.1:8000/rayfl/"}
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                          "-d", str(tmp_path / "site")], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    _check_404(tmp_path / "site")
    started = (tmp_path / "site" / "getting-started" / "index.html").read_text()
    assert 'href="../source/configs/quickstart.yaml/"' in started
    shown = (tmp_path / "site" / "source" / "configs" / "quickstart.yaml" / "index.html")
    assert "FedAvg" in re.sub(r"<[^>]+>", "", shown.read_text())
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    for name in ("rayfl.run", "rayfl.algorithms.base.Algorithm.client_train",
                 "rayfl.algorithms.base.LocalRule", "rayfl.register_algorithm"):
        assert f'id="{name}"' in api, name
    keys = (tmp_path / "site" / "reference" / "config" / "index.html").read_text()
    assert "runtime.cpus_per_actor" in keys and "aggregation.weighting" in keys
    _check_api_page(api)


def _check_404(site) -> None:
    """The 404 page is served for any missing URL at any depth, so its links are absolute:
    each must be under the sub-path and name a file of the site (no network: no font site)."""
    page = (site / "404.html").read_text()
    fetched = re.findall(r'<(?:link|script|img)\b[^>]*?(?:href|src)="([^"#]+)"', page)
    assert fetched and not [u for u in fetched if "://" in u], fetched
    links = re.findall(r'(?:href|src)="([^"#]+)"', page)
    links = [u for u in links if "://" not in u]  # the theme's credit links to its site
    assert len(links) > 20
    outside = [u for u in links if not u.startswith("/rayfl/")]
    assert not outside, outside
    missing = [u for u in links
               if not (site / u.removeprefix("/rayfl/").split("?")[0]).exists()]
    assert not missing, missing


def _check_api_page(api: str) -> None:
    """Every exported name documented, the register functions with their signatures, and no
    docstring's Sphinx role left as raw text (each became a link)."""
    import rayfl
    import tune

    exported = [f"rayfl.{n}" for n in rayfl.__all__] + [f"tune.{n}" for n in tune.__all__]
    missing = [name for name in exported if f'id="{name}"' not in api]
    assert not missing, missing
    text = re.sub(r"<[^>]+>", "", api)
    assert not re.findall(r":(?:class|func|meth|mod|attr|data|exc|obj):", text)
    for kind in ("algorithm", "model", "dataset", "availability", "selector", "wrapper",
                 "server_opt"):
        heading = re.sub(r"\s+", "", text[text.index(f"rayfl.register_{kind}"):][:400])
        assert re.match(rf"rayfl\.register_{kind}\(\w+:C\|None=None,\*,name:str\|None=None\)",
                        heading), heading
    links = re.findall(r'<a class="autorefs autorefs-internal"(?: title="[^"]*")? href="#([^"]+)"',
                       api)
    assert "rayfl.algorithms.base.Algorithm.client_train" in links  # :meth:`...client_train`
    assert all(f'id="{target}"' in api for target in links)


def test_an_unresolved_reference_fails_the_build(tmp_path):
    """A docstring's role naming something the site does not document stops the strict build
    (the site's own configuration, on a page documenting a module that refers to nothing)."""
    from mkdocs.utils.yaml import get_yaml_loader

    with open(os.path.join(ROOT, "mkdocs.yml")) as f:
        site = yaml.load(f, Loader=get_yaml_loader())  # mkdocs's loader reads !ENV
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# x\n\n::: rayfl.run\n\n::: stray\n")
    (tmp_path / "stray.py").write_text('"""Refers to :class:`Nothing`, which nothing defines."""\n')
    site.update(docs_dir=str(docs), nav=[{"Home": "index.md"}],
                hooks=[os.path.join(ROOT, "tools", "mkdocs_hooks.py")])
    python = next(p for p in site["plugins"] if isinstance(p, dict) and "mkdocstrings" in p)
    python = python["mkdocstrings"]["handlers"]["python"]  # paths relative to the repository
    python["paths"] = [ROOT, str(tmp_path)]
    python["options"]["extensions"] = [os.path.join(ROOT, e)
                                       for e in python["options"]["extensions"]]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(site))
    env = {**os.environ, "PYTHONPATH": ROOT, "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                          "-f", str(tmp_path / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode != 0
    assert "Could not find cross-reference target 'Nothing'" in out.stderr, out.stderr


def test_sphinx_roles_become_links_resolved_from_their_scope():
    import griffe

    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        import griffe_roles
    finally:
        sys.path.remove(os.path.join(ROOT, "tools"))
    assert griffe_roles.parse("~rayfl.schema.field") == ("field", "rayfl.schema.field")
    assert griffe_roles.parse("the run <rayfl.run>") == ("the run", "rayfl.run")
    assert griffe_roles.parse("resume()") == ("resume", "resume")
    pkg = griffe.load("rayfl", search_paths=[ROOT], extensions=griffe.load_extensions(
        griffe_roles.SphinxRoles))
    base = pkg["algorithms.base"]
    # a method named in the module's docstring, a name imported where the docstring is
    assert "[`Algorithm.client_train`][rayfl.algorithms.base.Algorithm.client_train]" in \
        base.docstring.value
    assert "[`Config`][rayfl.config.Config]" in pkg["simulation.run"].docstring.value


def test_every_page_is_in_the_nav():
    with open(os.path.join(ROOT, "mkdocs.yml")) as f:
        nav = f.read().split("\nnav:", 1)[1]
    pages = {os.path.relpath(p, os.path.join(ROOT, "docs"))
             for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)}
    assert pages == set(re.findall(r":\s*(\S+\.md)", nav))


def test_every_howto_is_on_the_home_page_in_a_group():
    with open(os.path.join(ROOT, "docs", "index.md")) as f:
        home = f.read().split("## How-to guides", 1)[1].split("\n## ", 1)[0]
    groups = re.split(r"\*\*(Extend rayfl|Scale out|Evaluate|Reproduce)\*\*", home)[1:]
    listed = {group: set(re.findall(r"\((howto/[\w-]+\.md)\)", body))
              for group, body in zip(groups[::2], groups[1::2])}
    assert list(listed) == ["Extend rayfl", "Scale out", "Evaluate", "Reproduce"]
    howtos = {os.path.relpath(p, os.path.join(ROOT, "docs"))
              for p in glob.glob(os.path.join(ROOT, "docs", "howto", "*.md"))}
    assert set().union(*listed.values()) == howtos
    assert sum(len(v) for v in listed.values()) == len(howtos)  # each in one group


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
    assert cli.main(["keys", "--server-opt", "yogi"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("## `server_opt.name: yogi`") and "FedYogi" in out
    assert cli.main(["keys", "--transform", "examples.centered_clip:CenteredClip"]) == 0
    out = capsys.readouterr().out  # entry keys, beside its name
    assert re.findall(r"^\| `([^`]+)` \|", out, flags=re.M) == ["tau", "iterations"]
    assert cli.main(["keys", "--wrapper", "rayfl.transforms.base:ClipUpdate"]) == 2
    assert "a subclass of rayfl.algorithms.wrapper.ServerWrapper" in capsys.readouterr().err


def test_readme_opens_with_the_two_commands():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    head = text.splitlines()[:40]
    assert any(line.startswith("make demo") for line in head)
    assert any(line.startswith("make test") for line in head)
    assert "index.html" not in text  # the site is served (search needs a server), not opened


def test_source_paths_become_links_outside_code_blocks():
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        import source_pages
    finally:
        sys.path.remove(os.path.join(ROOT, "tools"))
    known = set(source_pages.sources())
    assert {"configs/quickstart.yaml", "configs/test/tiny.yaml", "examples/my_algo.py",
            "examples/README.md"} <= known and "examples/__init__.py" not in known
    text = ("Run `configs/quickstart.yaml`, not `configs/nothing.yaml`; see "
            "[`examples/my_algo.py`](x.md).\n\n```sh\nrayfl run `configs/quickstart.yaml`\n```\n"
            "- list:\n\n  ```py\n  `examples/my_algo.py`\n  ```\n")
    out = source_pages.link(text, "howto/page.md", known)
    assert out.startswith("Run [`configs/quickstart.yaml`](../source/configs/quickstart.yaml.md)"
                          ", not `configs/nothing.yaml`; see [`examples/my_algo.py`](x.md).")
    assert out.split("\n", 1)[1] == text.split("\n", 1)[1]  # code blocks untouched
    assert "(source/examples/my_algo.py.md)" in source_pages.link("`examples/my_algo.py`",
                                                                   "index.md", known)


def test_the_config_table_lists_every_field_in_order():
    import dataclasses

    with open(os.path.join(ROOT, "docs", "reference", "api.md")) as f:
        page = f.read().split("::: rayfl.Config", 1)[1].split(":::", 1)[0]
    assert "show_signature: false" in page
    listed = re.findall(r"^\| `(\w+)` \|", page, flags=re.M)
    assert listed == [f.name for f in dataclasses.fields(config.Config)]


def _paste_tutorial(name: str, blocks: int, start_in: str, tmp_path, monkeypatch) -> dict:
    """Run a tutorial page's ``py`` blocks in order in one session started in ``start_in``,
    with a registry and a temporary folder of the test's own; returns the session."""
    import tempfile

    from rayfl import registry

    for kind, registered in registry._REGISTERED.items():  # pages register their components
        monkeypatch.setitem(registry._REGISTERED, kind, dict(registered))
    monkeypatch.chdir(start_in)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temp"))
    page = os.path.join(ROOT, "docs", name)
    with open(page) as f:
        found = re.findall(r"```py\n(.*?)```", f.read(), flags=re.S)
    assert len(found) == blocks
    session = {"__name__": "__main__"}
    for block in found:
        exec(compile(block, page, "exec"), session)
    return session


def _only_its_folder(tmp_path, prefix: str) -> None:
    """The tutorial wrote one fresh folder, holding its cache and its runs."""
    (work,) = os.listdir(tmp_path / "temp")
    assert work.startswith(prefix)
    assert sorted(os.listdir(tmp_path / "temp" / work)) == ["cache", "runs"]


def test_the_algorithm_tutorial_runs_in_order(ray_local, tmp_path, monkeypatch, capsys):
    """docs/algorithm-tutorial.md's blocks, pasted in order into one session started in some
    directory: they write only under the fresh folder they make, and print what they claim."""
    started_in = tmp_path / "started-here"
    started_in.mkdir()
    (tmp_path / "temp").mkdir()
    _paste_tutorial("algorithm-tutorial.md", 5, str(started_in), tmp_path, monkeypatch)
    printed = capsys.readouterr().out
    assert "mu = 0, boost = 0 is FedAvg byte for byte: True" in printed
    assert "the same bytes on 2 Ray actors: True" in printed
    rows = [line for line in printed.splitlines() if line.startswith("{'round': ")]
    assert len(rows) == 8 and "'agreement': 0.0," in rows[0]
    assert not os.listdir(started_in)
    _only_its_folder(tmp_path, "rayfl-algorithm-")


def test_the_privacy_tutorial_runs_in_order(tmp_path, monkeypatch, capsys):
    """docs/privacy-tutorial.md's blocks, pasted in order into one session started in the
    repository's root: they write only under the fresh folder they make, and print what they
    claim."""
    (tmp_path / "temp").mkdir()
    session = _paste_tutorial("privacy-tutorial.md", 6, ROOT, tmp_path, monkeypatch)
    printed = capsys.readouterr().out
    z = session["z"]
    assert 1.8 < z["fixed"] / z["poisson"] < 2.6  # replace-one moves the sum twice as far
    assert "ε = 8.00 at δ = 0.0001, add-or-remove-one neighbours" in printed
    assert "ε 8 (add-or-remove-one)" in printed  # the progress line's last round
    assert "<= analytical ε 8.00: True" in printed
    assert "refused: examples.plateau:ReduceOnPlateau.client_apply" in printed
    assert "ε excludes ['loss', 'weight']" in printed
    assert printed.count("ε = 8.00 (zero-out)") == 2
    _only_its_folder(tmp_path, "rayfl-privacy-")
