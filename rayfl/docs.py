"""The config reference, generated from the schema so it cannot drift from the code."""

from __future__ import annotations

from rayfl.config import Config
from rayfl.schema import describe_fields


def _table(rows) -> str:
    out = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key, tp, default, doc in rows:
        if key == "algorithm.params":
            continue
        out.append(f"| `{key}` | {tp} | `{default}` | {doc} |")
    return "\n".join(out)


def config_reference(algorithm: str | None = None) -> str:
    """Markdown tables of every config key (and the named algorithm's, or all algorithms')."""
    from rayfl.algorithms import registry

    parts = ["## Run config keys", "", _table(describe_fields(Config)), ""]
    for name in [algorithm] if algorithm else registry.names():
        cls = registry.get(name)
        parts += [f"## `algorithm.name: {name}`", "",
                  registry.summary(name), "",
                  _table(describe_fields(cls.Params, "algorithm")), ""]
    return "\n".join(parts)
