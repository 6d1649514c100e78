"""Griffe extension for the API reference: the docstrings' Sphinx roles (``:class:`Config```,
``:meth:`observe```, ``:func:`~rayfl.schema.field```) become mkdocs-autorefs cross-references
(``[`Config`][rayfl.config.Config]``), so they render as links.

A target is looked up as Sphinx's Python domain would: a full path as it is; a short one from
the docstring's own scope (its
object, then the enclosing class and module, with their imports); then, in a module's docstring,
as a member of one of the module's classes; then as the one object of the package whose path
ends with the target. A target none of these finds, or one the site does not document, stays an
unresolved reference, which fails the strict build.
"""

from __future__ import annotations

import re
from typing import Iterator

import griffe

#: ``:role:`target```, ``:role:`~dotted.target``` or ``:role:`title <target>```
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):`([^`]+)`")


def parse(text: str) -> tuple[str, str]:
    """(title, target) of a role's text: ``~`` keeps the target's last part as the title,
    ``title <target>`` names its title."""
    text = text.strip()
    explicit = re.fullmatch(r"(.+?)\s*<([^>]+)>", text)
    if explicit:
        return explicit.group(1), explicit.group(2).rstrip("()")
    target = text.lstrip("~").rstrip("()")
    return (target.rsplit(".", 1)[-1] if text.startswith("~") else target), target


def objects(obj: griffe.Object) -> Iterator[griffe.Object]:
    """``obj`` and everything defined under it (imports left out)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from objects(member)


class SphinxRoles(griffe.Extension):
    """Rewrites every docstring's roles once a package is loaded, its whole tree known."""

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        everything = list(objects(pkg))
        for obj in everything:
            if obj.docstring is not None:
                obj.docstring.value = ROLE.sub(
                    lambda m: self.link(obj, *parse(m.group(1)), everything),
                    obj.docstring.value)

    @staticmethod
    def link(obj: griffe.Object, title: str, target: str, everything) -> str:
        """The autorefs link for one role in ``obj``'s docstring."""
        return f"[`{title}`][{resolve(obj, target, everything)}]"


def resolve(obj: griffe.Object, target: str, everything) -> str:
    """The full path of ``target`` as seen from ``obj`` (``target`` itself when nothing
    matches, which the strict build then reports)."""
    head, _, rest = target.partition(".")
    if head == obj.package.name:  # a full path already
        return target
    try:
        path = obj.resolve(head)
        return f"{path}.{rest}" if rest else path
    except (griffe.NameResolutionError, ValueError):
        pass
    if obj.is_module:
        owners = [c.path for c in obj.classes.values() if not c.is_alias and head in c.members]
        if len(owners) == 1:
            return f"{owners[0]}.{target}"
    ends = [o.path for o in everything if o.path.endswith("." + target)]
    return ends[0] if len(ends) == 1 else target
