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


HEADER = """# Config reference

Generated from the schema by `rayfl keys --write configs/README.md`; a test keeps it in sync.
Overrides on the command line use the dotted keys: `rayfl run CONFIG rounds=50 local.lr=0.05`.
Each algorithm's own hyper-parameters go in the `algorithm` section next to its `name`.

"""


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
