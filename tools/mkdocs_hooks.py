"""MkDocs hook: fills each ``<!-- generated: NAME -->`` marker with reference text generated
from the code (config keys, metrics columns, tuning keys, the command line), so the site cannot
drift from what rayfl accepts and writes."""

from __future__ import annotations


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
    raise KeyError(f"no generated reference named {name!r}")


def on_page_markdown(markdown: str, page, config, files) -> str:
    import re

    return re.sub(r"<!-- generated: (\w+) -->", lambda m: generated(m.group(1)), markdown)
