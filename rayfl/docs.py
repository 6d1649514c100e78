"""The config reference, generated from the schema and the registries so it cannot drift."""

from __future__ import annotations

from rayfl import registry
from rayfl.config import Config
from rayfl.schema import describe_fields

#: the config key naming each kind of component -> that kind
NAMING_KEYS = {key: kind for kind, key in registry.KEYS.items()}


def _table(rows) -> str:
    out = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key, tp, default, doc in rows:
        if key in NAMING_KEYS:
            tp = registry.expected(NAMING_KEYS[key])
        out.append(f"| `{key}` | {tp} | `{default}` | {doc} |")
    return "\n".join(out)


HEADER = """# Config reference

Generated from the schema by `rayfl keys --write configs/README.md`; a test keeps it in sync.
Overrides on the command line use the dotted keys: `rayfl run CONFIG rounds=50 local.lr=0.05`.
Each algorithm's own hyper-parameters go in the `algorithm` section next to its `name`; a
component of your own (`package.module:Name`) declares its keys as a `Params` dataclass and they
go in its section the same way (`rayfl keys --algorithm my_pkg.algo:MyAlgo` lists them).

"""


def _components(kind: str) -> list[str]:
    key = registry.KEYS[kind]
    rows = [f"## `{key}`", "", "| name | what |", "|---|---|"]
    rows += [f"| `{n}` | {registry.summary(kind, n)} |" for n in registry.names(kind)]
    rows.append("")
    for name in registry.names(kind):  # the keys a component adds to its section
        if registry.params_class(registry.resolve(kind, name)) is not None:
            rows.append(component_reference(kind, name))
    return rows


def component_reference(kind: str, name: str) -> str:
    """The parameters one component adds to its section (a line saying so when it has none)."""
    obj = registry.resolve(kind, name)
    section = registry.KEYS[kind].split(".")[0]
    params = registry.params_class(obj)
    head = [f"## `{registry.KEYS[kind]}: {name}`", "", registry.summary(kind, name), ""]
    if params is None:
        return "\n".join(head + ["(no parameters of its own)", ""])
    return "\n".join(head + [_table(describe_fields(params, section)), ""])


def config_reference(algorithm: str | None = None, others: dict[str, str] | None = None) -> str:
    """Markdown tables of every config key and component (and the named algorithm's, or all
    algorithms', parameters; ``others`` maps further kinds to a component name to document)."""
    parts = ["## Run config keys", "", _table(describe_fields(Config)), ""]
    if algorithm is None and not others:
        for kind in ("model", "dataset", "availability"):
            parts += _components(kind)
    for name in [algorithm] if algorithm else ([] if others else registry.names("algorithm")):
        parts.append(component_reference("algorithm", name))
    for kind, name in (others or {}).items():
        parts.append(component_reference(kind, name))
    return "\n".join(parts)
