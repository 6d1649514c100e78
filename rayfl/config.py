"""The run config: YAML → typed, validated sections, with dotted ``key=value`` overrides.

Everything is checked here, before Ray starts: unknown keys, wrong types, out-of-range values
and missing files raise :class:`ConfigError` naming the key, the value and what was expected.
Every key with its default and meaning is listed by ``rayfl keys`` and in ``configs/README.md``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Optional

import yaml

from rayfl import compat, layer_list, registry, schema, yamlio
from rayfl.algorithms import legacy
from rayfl.algorithms.base import declaration_problem
from rayfl.algorithms.config import AlgorithmConfig, ServerOptConfig, WrapperConfig
from rayfl.availability.config import AvailabilityConfig
from rayfl.contract import calling, name_of
from rayfl.data.config import DataConfig
from rayfl.metrics.config import EvalConfig, LoggersConfig
from rayfl.models.config import ModelConfig
from rayfl.privacy.rules import check_given
from rayfl.runtime.config import CheckpointConfig, KeepConfig, LocalConfig, RuntimeConfig
from rayfl.schema import ConfigError, field
from rayfl.selection.config import SelectionConfig
from rayfl.transforms.config import AggregationConfig, CompressionConfig, PrivacyConfig

#: config keys holding a list of ``{name: ..., <keys>}`` entries (a dotted key names an entry)
ENTRY_LISTS = ("layers", "wrappers", "aggregation.transforms")
MAX_ROUNDS = 10**6  # rounds (server updates): more is a typo, not an experiment
NAME_PATTERN = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9._+-]{0,99}")


@dataclass(frozen=True)
class Config:
    """One experiment."""

    name: str = field("run", doc="run name (run directory prefix, actor names, metric tags): "
                                 "letters, digits and . _ + - (at most 100, no leading dot)")
    seed: int = field(0, doc="master seed: every random draw is keyed by it", lo=0,
                      hi=2**64 - 1)
    rounds: int = field(10, doc="communication rounds R (server updates in the asynchronous "
                        "modes)", lo=1, hi=MAX_ROUNDS)
    clients_per_round: int = field(10, doc="clients sampled per round", lo=1)
    loss_ceiling: Optional[float] = field(
        1e6, doc="the run stops as diverged (flagged in summary.json and metrics.parquet, exit "
                 "status 3) when a training, test or validation loss exceeds this; NaN/inf "
                 "always stop it; null: no ceiling", lo=0.0, lo_open=True)
    output_dir: str = field("runs", doc="parent directory of run directories")
    data: DataConfig = field(factory=DataConfig)
    model: ModelConfig = field(factory=ModelConfig)
    algorithm: AlgorithmConfig = field(factory=AlgorithmConfig)
    layers: list[dict] = field(
        factory=list, doc="the layers around the algorithm, innermost first, in the order "
                          "written: server wrappers (ima) and aggregation transforms (clip, "
                          "qsgd, topk, randk, secagg, median, trimmed_mean, krum, attack, "
                          "identity) in one list, or package.module:Name, e.g. [{name: ima, "
                          "window: 5}, {name: clip, max_norm: 1.0}] (a bare name is an entry "
                          "with no keys); one entry's key: layers.ima.window=5, or by index "
                          "layers.0.window=5 (see `rayfl keys --wrapper/--transform`)")
    wrappers: list[WrapperConfig] = field(
        factory=list, doc="older spelling of `layers` (not mixed with it): server wrappers "
                          "around the algorithm, innermost first, inside every aggregation "
                          "transform, e.g. [{name: ima, window: 5}]; one entry's key: "
                          "wrappers.ima.window=5")
    local: LocalConfig = field(factory=LocalConfig)
    aggregation: AggregationConfig = field(factory=AggregationConfig)
    privacy: Optional[PrivacyConfig] = field(
        None, doc="user-level differential privacy (DP-FedAvg, DP-FTRL or banded MF); ε per "
                  "round in metrics.parquet; the layer {name: privacy, <keys>} written last in "
                  "`layers` is this section (its keys named layers[i].KEY in errors)")
    compression: Optional[CompressionConfig] = field(
        None, doc="compress client updates (qsgd, topk, randk, optional error feedback); "
                  "upload_bytes per round, and the virtual clock's upload time; {method: M, "
                  "<keys>} is the layer {name: M, <keys>} after the `layers` list (before "
                  "its privacy layer)")
    server_opt: Optional[ServerOptConfig] = field(
        None, doc="replace the algorithm's server step x ← x − η_g D by this optimizer on D "
                  "(fedavg, fedprox, scaffold, feddyn, fedmsi; fedavgm/fedadam/... are presets)")
    availability: AvailabilityConfig = field(factory=AvailabilityConfig)
    selection: SelectionConfig = field(factory=SelectionConfig)
    runtime: RuntimeConfig = field(factory=RuntimeConfig)
    eval: EvalConfig = field(factory=EvalConfig)
    checkpoint: CheckpointConfig = field(factory=CheckpointConfig)
    keep: KeepConfig = field(factory=KeepConfig)
    loggers: LoggersConfig = field(factory=LoggersConfig)

    def layer_entries(self) -> list[layer_list.Entry]:
        """The run's layers, innermost first (:func:`rayfl.layer_list.entries_of`)."""
        return layer_list.entries_of(self.layers, self.wrappers, self.aggregation.transforms,
                                     self.compression)

    def check(self, prefix: str) -> None:
        if not NAME_PATTERN.fullmatch(self.name):
            raise ConfigError("name", self.name, "1 to 100 letters, digits, '.', '_', '+' or "
                              "'-', not starting with '.' (it names a directory inside "
                              "output_dir)")


def from_dict(raw: dict) -> Config:
    """Validate a plain dict (as loaded from YAML) into a :class:`Config`."""
    if not isinstance(raw, dict):
        raise ConfigError("<root>", raw, "a mapping of config keys")
    raw = upgrade(raw)
    for section in ("algorithm", "selection"):  # `algorithm: scaffold` is `{name: scaffold}`
        if isinstance(raw.get(section), str):
            raw = {**raw, section: {"name": raw[section]}}
    raw = {**raw, **_entries_named(raw)}
    raw, where = layer_list.privacy_preset(raw)
    try:
        return _validated(raw)
    except ConfigError as e:  # a key of the privacy layer: named where it was written
        if where is None or not (e.key == "privacy" or e.key.startswith("privacy.")):
            raise
        raise ConfigError(where + e.key[len("privacy"):], e.value,
                          e.expected.replace("privacy.", where + ".")) from None


def _entries_named(raw: dict) -> dict:
    """The entry lists of ``raw`` with each bare name an entry: ``layers: [ima]`` is
    ``[{name: ima}]``."""
    def named(entries):
        return [{"name": e} if isinstance(e, str) else e for e in entries]

    out = {key: named(raw[key]) for key in ("layers", "wrappers")
           if isinstance(raw.get(key), list)}
    agg = raw.get("aggregation")
    if isinstance(agg, dict) and isinstance(agg.get("transforms"), list):
        out["aggregation"] = {**agg, "transforms": named(agg["transforms"])}
    return out


def _validated(raw: dict) -> Config:
    check_given(raw.get("privacy"))
    cfg = schema.build(Config, raw)
    legacy.check(cfg)  # a component of rayfl 0.1's interface: what to change
    algorithm = cfg.algorithm.component()
    problem = declaration_problem(algorithm)  # its traits and how it is built
    if problem:
        raise ConfigError("algorithm.name", cfg.algorithm.name, problem)
    for section, where in ((cfg.algorithm, "algorithm"), (cfg.selection, "selection")):
        component = section.component()
        with calling(name_of(component, "check_config")):  # its own rules may raise anything
            component.check_config(section.params, cfg, where)
    layer_list.check_run(cfg)
    compat.check(cfg)
    return cfg


def to_dict(cfg: Config) -> dict:
    """Plain dict that :func:`from_dict` turns back into the same config (each component's
    parameters sit beside its name)."""
    return schema.to_dict(cfg)


def _parse_value(key: str, text: str) -> Any:
    if text == "":
        return ""
    try:
        return yamlio.parse(text)
    except (yaml.YAMLError, RecursionError) as e:
        raise ConfigError(key, text, f"a YAML value ({yamlio.one_line(e)})") from None


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply ``a.b.c=value`` strings (values parsed as YAML) to a plain config dict; inside a
    list of named entries a part names the entry (``wrappers.ima.window=3``)."""
    raw = _deep_copy(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(item, None, "an override of the form key=value (e.g. rounds=3)")
        key, text = item.split("=", 1)
        set_key(raw, key.strip(), _parse_value(key, text), text)
    return raw


def check_given_once(overrides: list[str]) -> None:
    """Overrides typed on a command line: none may be undone by a later one — the same key
    twice (``rounds=2 rounds=3``), or a section after one of its keys (``local.lr=0.1
    local={...}``) — a ConfigError naming the key; a key inside a section given before it
    refines that section and is fine. (Python callers compose override lists, later ones
    winning, and are not checked.)"""
    given: dict[str, str] = {}
    for item in overrides:
        key, _, text = item.partition("=")
        key = key.strip()
        for earlier, value in given.items():
            if earlier == key or earlier.startswith(key + "."):
                raise ConfigError(earlier, text, f"each key once on the command line ({earlier}="
                                  f"{value}, then {key}={text}: the later would silently replace "
                                  "the earlier)")
        given[key] = text


def set_key(raw: dict, key: str, value: Any, text: Any = None) -> None:
    """Set a dotted key in a plain config dict, creating sections (and named list entries); in
    a list of entries a part names an entry, or is its index (``layers.1.max_norm``, also
    written ``layers[1].max_norm``)."""
    key = _respelled(raw, re.sub(r"\[(\d+)\]", r".\1", key))
    node: Any = raw
    parts = key.split(".")
    for depth, part in enumerate(parts[:-1]):
        node = _child(node, part, ".".join(parts[:depth + 1]), key, text)
    if isinstance(node, list):
        raise ConfigError(key, text, f"a key inside the entry (e.g. {key}.KEY=VALUE) or the "
                                     f"whole list ({'.'.join(parts[:-1])}=[...])")
    node[parts[-1]] = value


def _respelled(raw: dict, key: str) -> str:
    """A key into an entry of one spelling of the layer list, in the spelling ``raw`` uses: on a
    config writing ``layers``, ``wrappers.ima.window`` (a tuner preset's key) is
    ``layers.ima.window``; on one writing the older lists, ``layers.ima.window`` is the key of
    the older list holding an ``ima`` entry; ``privacy.KEY`` is ``layers.privacy.KEY`` on one
    writing the privacy section as its last layer."""
    older = layer_list.OLDER
    if key.startswith("privacy.") and get_key(raw, "layers.privacy") is not None:
        return "layers." + key
    if raw.get("layers"):
        for prefix in older:
            if key.startswith(prefix + ".") and key.count(".") > prefix.count(".") + 1:
                return "layers" + key[len(prefix):]
    elif key.startswith("layers.") and key.count(".") > 1:
        name, rest = key.split(".", 2)[1:]
        lists = [get_key(raw, prefix) or [] for prefix in older]
        if name.isdigit() and int(name) < len(lists[0]) + len(lists[1]):  # wrappers first
            i, prefix = int(name), older[0]
            if i >= len(lists[0]):
                i, prefix = i - len(lists[0]), older[1]
            return f"{prefix}.{i}.{rest}"
        for prefix in older:
            if get_key(raw, f"{prefix}.{name}") is not None:
                return prefix + key[len("layers"):]
        if any(lists):  # a new entry joins the older list of its kind
            try:
                kind, _ = registry.resolve_layer(name)
            except ConfigError:
                return key
            return older[kind == "transform"] + key[len("layers"):]
    return key


def get_key(raw: dict, key: str) -> Any:
    """The value at a dotted key of a plain config dict (None when absent)."""
    node: Any = raw
    for part in _respelled(raw, key).split("."):
        if isinstance(node, list):
            named = _named(node, part)
            node = node[named[0]] if named else node[int(part)] \
                if part.isdigit() and int(part) < len(node) else None
        elif isinstance(node, dict):
            node = node.get(part)
        else:
            return None
    return node


def _child(node: Any, part: str, path: str, key: str, text: Any) -> Any:
    """The section (or list entry, by name or index) ``part`` of ``node``, created when
    absent."""
    if isinstance(node, list):  # a list of {name: ..., <keys>} entries
        return _entry(node, part, path.rpartition(".")[0], key, text)
    child = node.get(part)
    if child is None:
        child = node[part] = [] if path in ENTRY_LISTS else {}
    if not isinstance(child, (dict, list)):
        raise ConfigError(key, text, f"'{part}' to be a section, not {child!r}")
    return child


def _named(entries: list, name: str) -> list[int]:
    """The indexes of the entries named ``name`` (``{name: ..}`` or the bare name)."""
    return [i for i, e in enumerate(entries)
            if e == name or isinstance(e, dict) and e.get("name") == name]


def _entry(node: list, part: str, where: str, key: str, text: Any) -> dict:
    """The entry of the list ``where`` named ``part`` (or at index ``part``), added when absent
    (inside a trailing privacy layer, which stays last)."""
    named = _named(node, part)
    if len(named) > 1:
        raise ConfigError(key, text, f"one entry named {part!r} in {where} (it has {len(named)}, "
                                     f"at {', '.join(map(str, named))}: name one by its index, "
                                     f"e.g. {where}.{named[1]}.KEY=VALUE)")
    if not named and part.isdigit():
        if int(part) >= len(node):
            raise ConfigError(key, text, f"an index below {len(node)} (the entries of {where})")
        named = [int(part)]
    if not named:
        last = node[-1] if node else None
        at = len(node) - (last == layer_list.PRIVACY
                          or isinstance(last, dict) and last.get("name") == layer_list.PRIVACY)
        node.insert(at, {"name": part})
        return node[at]
    i = named[0]
    if isinstance(node[i], str):  # the short form `[ima]`
        node[i] = {"name": node[i]}
    if not isinstance(node[i], dict):
        raise ConfigError(key, text, f"{where}[{i}] to be an entry {{name: ..., <keys>}}, not "
                                     f"{node[i]!r}")
    return node[i]


def _deep_copy(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _deep_copy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deep_copy(v) for v in d]
    return d


def read_yaml(path: str) -> dict:
    """Load a YAML config file, with a clear error when it is missing, malformed or empty."""
    if not os.path.isfile(path):
        raise ConfigError("config", path, "an existing YAML file")
    try:
        with open(path, "rb") as f:
            raw = yamlio.parse(f.read())
    except yamlio.DuplicateKeyError as e:
        raise ConfigError(str(e.key), f"{path}:{e.line}", "each key once per mapping (this "
                          "one is given twice)") from None
    except yaml.YAMLError as e:
        raise ConfigError("config", path, f"valid YAML ({yamlio.one_line(e)})") from None
    except RecursionError:
        raise ConfigError("config", path, "YAML nested at most a few hundred levels") from None
    except OSError as e:
        raise ConfigError("config", path, f"a readable file ({e.strerror})") from None
    if raw is None:
        raise ConfigError("config", path, "a YAML mapping of config keys (the file holds none)")
    if not isinstance(raw, dict):
        raise ConfigError("config", path, f"a YAML mapping of config keys, not a "
                          f"{type(raw).__name__}")
    return raw


def load(source: Any, overrides: list[str] | None = None) -> Config:
    """A :class:`Config` from a path, a dict or a config (overrides applied on top)."""
    if isinstance(source, Config):
        if not overrides:
            return source
        source = to_dict(source)
    raw = read_yaml(source) if isinstance(source, (str, os.PathLike)) else source
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError("<root>", raw, "a mapping of config keys")
    return from_dict(apply_overrides(expand_shorthands(raw or {}), overrides or []))


def expand_shorthands(raw: dict) -> dict:
    """``algorithm: scaffold`` is short for ``algorithm: {name: scaffold}``."""
    if isinstance(raw.get("algorithm"), str):
        return {**raw, "algorithm": {"name": raw["algorithm"]}}
    return raw


def upgrade(raw: dict) -> dict:
    """A config written by an earlier rayfl in today's keys, so run directories made before
    stay readable (resume, fork, analyze): ``ima: {...}`` is ``wrappers: [{name: ima, ...}]``
    (``ima: null``: none); ``availability.selection`` / ``availability.candidates`` are
    ``selection.name`` / ``selection.candidates``."""
    raw = dict(raw)
    if "ima" in raw:
        ima = raw.pop("ima")
        if isinstance(ima, dict):
            raw["wrappers"] = [*(raw.get("wrappers") or []), {"name": "ima", **ima}]
        elif ima is not None:
            raw["ima"] = ima  # not an earlier config's value: refused as an unknown key
    avail = raw.get("availability")
    if isinstance(avail, dict) and {"selection", "candidates"} & set(avail):
        avail = dict(avail)
        name, candidates = avail.pop("selection", "uniform"), avail.pop("candidates", None)
        if name != "uniform" or candidates is not None:
            extra = {} if candidates is None else {"candidates": candidates}
            raw["selection"] = {**(raw.get("selection") or {}), "name": name, **extra}
        raw["availability"] = avail
    return raw


def dump(cfg: Config, path: str) -> None:
    """Write the resolved config as YAML (atomically)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        yaml.safe_dump(to_dict(cfg), f, sort_keys=False)
    os.replace(tmp, path)
