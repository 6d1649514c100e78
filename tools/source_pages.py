"""MkDocs hook: the repository files the pages name — the configs (``configs/**/*.yaml``), the
examples (``examples/*.py``) and their READMEs — become pages of the site under ``source/``,
each showing the file, and every ``configs/...`` or ``examples/...`` path written as inline code
outside a code block links to its page. The site then shows what it names without a network
or a hosted repository, and a path to a file that does not exist stays plain code."""

from __future__ import annotations

import glob
import os
import posixpath
import re

from mkdocs.structure.files import File

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATTERNS = ("configs/**/*.yaml", "configs/README.md", "examples/*.py", "examples/README.md")
PREFIX = "source"
LANGUAGES = {".yaml": "yaml", ".py": "python", ".md": "markdown"}
CODE = re.compile(r"(?<![\[\w/`])`((?:configs|examples)/[\w./-]+)`(?![\]\(`])")
FENCE = re.compile(r"^[ \t]*(```+|~~~+).*?^[ \t]*\1[ \t]*$", flags=re.S | re.M)


def sources() -> list[str]:
    """The repository paths that get a page, sorted."""
    found = set()
    for pattern in PATTERNS:
        found.update(os.path.relpath(p, ROOT).replace(os.sep, "/")
                     for p in glob.glob(os.path.join(ROOT, pattern), recursive=True))
    return sorted(p for p in found if "__pycache__" not in p and p != "examples/__init__.py")


def page_of(path: str) -> str:
    """The site page (its Markdown name) showing repository file ``path``."""
    return f"{PREFIX}/{path}.md"


def content(path: str) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        text = f.read().rstrip("\n")
    fence = "````" if "```" in text else "```"
    lang = LANGUAGES[os.path.splitext(path)[1]]
    return (f"# `{path}`\n\nThe file as it is in the repository.\n\n"
            f"{fence}{lang}\n{text}\n{fence}\n")


def on_files(files, config):
    for path in sources():
        files.append(File.generated(config, page_of(path), content=content(path)))
    return files


def link(markdown: str, from_page: str, known: set[str]) -> str:
    """``markdown`` with each inline-code path of ``known`` outside code blocks made a link
    from the page ``from_page`` (its Markdown name) to the file's page."""
    here = posixpath.dirname(from_page)

    def one(m: re.Match) -> str:
        path = m.group(1)
        if path not in known:
            return m.group(0)
        return f"[`{path}`]({posixpath.relpath(page_of(path), here or '.')})"

    out, last = [], 0
    for block in FENCE.finditer(markdown):
        out += [CODE.sub(one, markdown[last:block.start()]), block.group(0)]
        last = block.end()
    return "".join(out + [CODE.sub(one, markdown[last:])])


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri.startswith(PREFIX + "/"):
        return markdown
    return link(markdown, page.file.src_uri, set(sources()))
