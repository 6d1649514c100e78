"""Strict YAML reading for configs: YAML 1.2 numbers (``1e-3`` is a float), no duplicate keys.

PyYAML follows YAML 1.1, where ``1e-3`` (no dot) is a string and a repeated key silently
replaces the first; both surprise every user, so this loader reads numbers as YAML 1.2 does and
refuses a mapping that names a key twice. Errors come back as one line.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

_FLOAT_12 = re.compile(r"""^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?
                         |[-+]?\.(?:inf|Inf|INF)
                         |\.(?:nan|NaN|NAN))$""", re.X)


class DuplicateKeyError(yaml.YAMLError):
    """A mapping names the same key twice."""

    def __init__(self, key: Any, line: int):
        self.key, self.line = key, line
        super().__init__(f"duplicate key {key!r} at line {line}")


class StrictLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 floats and duplicate keys refused."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    repeated = key in seen
                except TypeError:
                    continue  # unhashable: SafeLoader itself reports it
                if repeated:
                    raise DuplicateKeyError(key, key_node.start_mark.line + 1)
                seen.add(key)
        return super().construct_mapping(node, deep)


StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12,
                                   list("-+0123456789."))


def one_line(text: str) -> str:
    """``text`` with its line breaks and runs of spaces folded (messages stay one line)."""
    return " ".join(str(text).split())


MAX_VALUES = 100_000  # a config holds hundreds; aliases must not multiply them ("billion laughs")


def _expanded_size(node, sizes: dict, open_: set) -> int:
    """How many values ``node`` becomes once every alias is expanded (at most MAX_VALUES + 1)."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_:
        raise yaml.YAMLError("an alias refers to the collection that holds it")
    open_.add(id(node))
    children = [] if isinstance(node, yaml.ScalarNode) else \
        [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else \
        node.value
    total = 1
    for child in children:
        total = min(total + _expanded_size(child, sizes, open_), MAX_VALUES + 1)
    open_.discard(id(node))
    sizes[id(node)] = total
    return total


def parse(text: str | bytes) -> Any:
    """The YAML document in ``text`` (raises ``yaml.YAMLError`` or ``RecursionError``); one
    whose aliases expand it past MAX_VALUES values is refused before it is built."""
    loader = StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}, set()) > MAX_VALUES:
            raise yaml.YAMLError(f"the document expands to more than {MAX_VALUES} values "
                                 "through its aliases")
        return loader.construct_document(node)
    finally:
        loader.dispose()
