"""MkDocs hook: fills each ``<!-- generated: NAME -->`` marker with reference text generated
from the code (config keys, metrics columns, tuning keys, the command line), so the site cannot
drift from what rayfl accepts and writes, and with the executed tutorial notebook (its cells,
printed outputs and plots; stale outputs fail the strict build)."""

from __future__ import annotations

import logging
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
log = logging.getLogger("mkdocs.hooks.rayfl")


def _strip_title(text: str) -> str:
    """Generated documents start with their own ``# Title``; the page has one already."""
    lines = text.splitlines()
    return "\n".join(lines[1:] if lines and lines[0].startswith("# ") else lines)


def _cli() -> str:
    """``--help`` of ``rayfl`` and each of its commands, as the parser prints them."""
    import argparse

    from rayfl import cli

    parser = cli.parser()
    nested = cli.nested_parsers()
    out = ["```text", parser.format_help().rstrip(), "```", ""]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                subs = [(name, sub)] + [(n, p) for n, p in nested.items()
                                        if n.startswith(name + " ")]
                for full, each in subs:
                    out += [f"## `rayfl {full}`", "", "```text", each.format_help().rstrip(),
                            "```", ""]
    return "\n".join(out)


def _fence(lang: str, text: str) -> list[str]:
    fence = "````" if "```" in text else "```"
    return [f"{fence}{lang}", text.rstrip("\n"), fence, ""]


def _output(out) -> list[str]:
    """One code cell output as Markdown: printed text, a PNG inline, or a value's text."""
    if out.output_type == "stream":
        return _fence("text", out.text)
    data = out.get("data", {})
    if "image/png" in data:
        png = data["image/png"].replace("\n", "")
        return [f'<img alt="a figure the cell drew" src="data:image/png;base64,{png}">', ""]
    if out.output_type == "error":
        return _fence("text", f"{out.ename}: {out.evalue}")
    return _fence("text", data["text/plain"]) if "text/plain" in data else []


def tutorial() -> str:
    """``examples/tutorial.ipynb`` as Markdown, with the outputs it was committed with (its
    first heading left out: the page has one)."""
    import importlib.util

    import nbformat

    spec = importlib.util.spec_from_file_location(
        "run_tutorial", os.path.join(ROOT, "tools", "run_tutorial.py"))
    run_tutorial = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_tutorial)
    nb = nbformat.read(run_tutorial.NOTEBOOK, as_version=4)
    if nb.metadata.get("rayfl", {}).get("source_sha256") != run_tutorial.source_sha256(nb):
        log.warning("examples/tutorial.ipynb: its outputs are not those of its cells; run "
                    "python tools/run_tutorial.py")
    out = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            out += [_strip_title(cell.source) if not out else cell.source, ""]
        elif cell.cell_type == "code":
            out += _fence("python", cell.source)
            for o in cell.get("outputs", []):
                out += _output(o)
    return "\n".join(out)


def generated(name: str) -> str:
    """The reference text behind a marker."""
    if name == "config":
        from rayfl.docs import config_reference

        return config_reference()
    if name == "metrics":
        from rayfl.metrics.columns import markdown

        return _strip_title(markdown())
    if name == "tune":
        from tune.docs import HEADER, reference

        return _strip_title(HEADER + reference())
    if name == "cli":
        return _cli()
    if name == "tutorial":
        return tutorial()
    raise KeyError(f"no generated reference named {name!r}")


def on_page_markdown(markdown: str, page, config, files) -> str:
    import re

    return re.sub(r"<!-- generated: (\w+) -->", lambda m: generated(m.group(1)), markdown)
