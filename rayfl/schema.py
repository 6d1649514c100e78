"""Typed config sections built from plain dicts, with errors that name key, value and expectation.

A section is a frozen dataclass. Its fields' type hints drive validation (int, float, bool, str,
``Literal`` choices, ``list[float]``, ``Optional``, nested sections, ``dict``); a field's
``metadata`` may add ``min``/``max`` bounds (``rng(lo, hi)``) and ``doc`` text. Cross-field rules
live in a section's ``check()`` method, which raises :class:`ConfigError` itself.
"""

from __future__ import annotations

import dataclasses
import math
import types
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from rayfl.suggest import no_such_key, section_keys


class ConfigError(ValueError):
    """A config value is wrong: says which key, what value, and what was expected."""

    def __init__(self, key: str, value: Any, expected: str):
        self.key, self.value, self.expected = key, value, expected
        super().__init__(f"config key {_short(str(key))} = {_short(value)}: expected "
                         f"{' '.join(str(expected).split())}")



@dataclasses.dataclass(frozen=True)
class NoParams:
    """The settings of a component that has none."""

def _short(value: Any, limit: int = 200) -> str:
    """``repr`` on one line, cut to ``limit`` characters (a 3000-deep list stays readable)."""
    try:
        text = repr(value)
    except RecursionError:
        text = f"<{type(value).__name__} nested too deeply to show>"
    return text if len(text) <= limit else text[:limit - 1] + "…"


def field(default: Any = dataclasses.MISSING, *, doc: str = "", lo=None, hi=None,
          lo_open: bool = False, hi_open: bool = False, factory=None, flatten: bool = False):
    """A dataclass field carrying a docstring and optional numeric bounds. A ``flatten`` field
    holds a nested section whose keys live in the parent's mapping (a component's ``Params``:
    see :class:`rayfl.registry.Named`)."""
    meta = {"doc": doc, "lo": lo, "hi": hi, "lo_open": lo_open, "hi_open": hi_open,
            "flatten": flatten}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        return " or ".join(_describe(a) for a in args) + " (or null)"
    if origin is list:
        return f"a list of {_describe(get_args(tp)[0])}"
    if origin is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        fields = dataclasses.fields(tp)
        own = [f.name for f in fields if not f.metadata.get("flatten")]
        theirs = ", and the named component's keys" if len(own) < len(fields) else ""
        return f"a mapping with keys {', '.join(own)}{theirs}"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string",
            dict: "a mapping"}.get(tp, str(tp))


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in (a for a in args if a is not type(None)):
            try:
                return _coerce(a, value, key)
            except ConfigError:
                if dataclasses.is_dataclass(a) and isinstance(value, dict):
                    raise  # a mapping for a section: the section's own error says what is wrong
                continue
        raise ConfigError(key, value, _describe(tp))
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(key, value, _describe(tp))
        return value
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(key, value, _describe(tp))
        (inner,) = get_args(tp)
        return [_coerce(inner, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(key, value, "a mapping")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, value, "true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(key, value, "an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, value, "a number")
        try:
            value = float(value)
        except OverflowError:
            raise ConfigError(key, value, "a number within ±1.8e308") from None
        if not math.isfinite(value):
            raise ConfigError(key, value, "a finite number (not NaN or infinity)")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, value, "a string")
        if "\0" in value:
            raise ConfigError(key, value, "a string without NUL characters")
        return value
    if tp is Any:
        return value
    raise TypeError(f"unsupported schema type {tp!r} at {key}")


def _check_bounds(f: dataclasses.Field, value: Any, key: str) -> None:
    m = f.metadata
    if value is None or not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    lo, hi = m.get("lo"), m.get("hi")
    bad_lo = lo is not None and (value <= lo if m.get("lo_open") else value < lo)
    bad_hi = hi is not None and (value >= hi if m.get("hi_open") else value > hi)
    if bad_lo or bad_hi:
        left = "(" if m.get("lo_open") or lo is None else "["  # ±inf is never a value
        right = ")" if m.get("hi_open") or hi is None else "]"
        lo_s = "-inf" if lo is None else lo
        hi_s = "inf" if hi is None else hi
        raise ConfigError(key, value, f"a value in {left}{lo_s}, {hi_s}{right}")


def _check_default(cls: type, f: dataclasses.Field, tp: Any, key: str) -> None:
    """A default is held to its field's type and bounds like a value given explicitly (a
    component's ``Params`` declaring 5.0 with ``hi=1.0`` is refused, not run)."""
    try:
        _check_bounds(f, _coerce(tp, f.default, key), key)
    except ConfigError as e:
        raise ConfigError(key, f.default, f"{e.expected} (this is the default "
                          f"{cls.__module__}:{cls.__qualname__} declares, outside its own "
                          "type or bounds: give the key a value)") from None


def build(cls: type, data: Any, prefix: str = "") -> Any:
    """Validate ``data`` (a mapping) into the dataclass ``cls``; unknown keys are errors.

    A class with a ``schema_build(data, prefix)`` classmethod builds itself (a section naming a
    component whose parameters join its keys); it calls :func:`build_fields` for its own keys.
    """
    custom = getattr(cls, "schema_build", None)
    if custom is not None:
        return custom(data, prefix)
    return build_fields(cls, data, prefix)


def build_fields(cls: type, data: Any, prefix: str = "") -> Any:
    """:func:`build` on ``cls``'s own fields only."""
    where = prefix or "<root>"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(where, data, _describe(cls))
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields), key=str)  # YAML keys may be numbers
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else str(unknown[0])
        raise ConfigError(key, data[unknown[0]],
                          no_such_key(str(unknown[0]), prefix, fields, section_keys(cls)))
    kwargs = {}
    for name, f in fields.items():
        key = f"{prefix}.{name}" if prefix else name
        if name in data:
            value = _coerce(hints[name], data[name], key)
            _check_bounds(f, value, key)
            kwargs[name] = value
        elif dataclasses.is_dataclass(hints[name]) and f.default_factory is not \
                dataclasses.MISSING:
            kwargs[name] = build(hints[name], {}, key)  # a nested section at its defaults
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(key, None,
                              f"a value ({_describe(hints[name])}); this key is required")
        elif f.default is not dataclasses.MISSING:
            _check_default(cls, f, hints[name], key)
    obj = cls(**kwargs)
    check = getattr(obj, "check", None)
    if check is not None:
        check(prefix)
    return obj


def to_dict(obj: Any) -> Any:
    """Plain-data view of a section (for YAML dumps and hashing)."""
    if dataclasses.is_dataclass(obj):
        out = {}
        for f in dataclasses.fields(obj):
            value = to_dict(getattr(obj, f.name))
            if f.metadata.get("flatten"):
                out.update(value or {})
            else:
                out[f.name] = value
        return out
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def describe_fields(cls: type, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """Rows (key, type, default, doc) for every field, nested sections flattened."""
    rows = []
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("flatten"):
            continue  # a component's parameters: listed with the component
        key = f"{prefix}.{f.name}" if prefix else f.name
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            rows += describe_fields(tp, key)
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else "(required)")
        rows.append((key, _describe(tp), default, f.metadata.get("doc", "")))
    return rows


__all__ = ["ConfigError", "build", "build_fields", "field", "to_dict", "describe_fields"]
