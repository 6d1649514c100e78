"""Components by name: built-ins, ``package.module:Name`` references and objects registered in
Python.

Nine kinds of component are named in a config: ``algorithm.name``, ``model.name``,
``data.dataset``, ``availability.model``, ``selection.name``, ``server_opt.name``,
``runtime.executor`` and each ``layers`` entry's ``name`` (a server wrapper or an aggregation
transform; the older spelling: ``wrappers`` and ``aggregation.transforms``). Each accepts a
built-in name (the tables below: adding a built-in is one module plus one line here), a ``package.module:Name`` reference
importable from the working directory or ``PYTHONPATH``, or a name given to
:func:`register` (``rayfl.register_algorithm(MyAlgo)``, also usable as a decorator).

A component may declare its typed parameters as a frozen dataclass ``Params`` built from
:func:`rayfl.schema.field`, exactly as the built-ins do; its keys then sit in the component's
config section, are validated, listed by ``rayfl keys`` and searchable by the tuner; its
optional ``check_section(section, prefix)`` holds its own rules on the section (raising
:class:`~rayfl.schema.ConfigError`).

Config sections that name a component (:class:`Named`) carry a user component with them when
pickled, so every Ray worker that receives the config knows it without any hook in user code.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import typing
from typing import Any, Callable, ClassVar, TypeVar, Union

from rayfl import schema
from rayfl.algorithms.base import Algorithm
from rayfl.algorithms.base import declaration_problem as algorithm_problem
from rayfl.layers import Layer
from rayfl.layers import declaration_problem as layer_problem
from rayfl.runtime.executor_declaration import declaration_problem as executor_problem
from rayfl.schema import ConfigError
from rayfl.suggest import no_such_key
from rayfl.version import PACKAGE_DIR

#: kind -> the config key that names it
KEYS = {"algorithm": "algorithm.name", "model": "model.name", "dataset": "data.dataset",
        "availability": "availability.model", "selector": "selection.name",
        "wrapper": "layers[].name", "server_opt": "server_opt.name",
        "executor": "runtime.executor", "transform": "layers[].name"}

#: kind -> built-in name -> "module:attribute" (or "module": the module itself is the component)
BUILTINS: dict[str, dict[str, str]] = {
    "algorithm": {
        "fedavg": "rayfl.algorithms.fedavg:FedAvg",
        "fedavgm": "rayfl.algorithms.fedavgm:FedAvgM",
        "fedprox": "rayfl.algorithms.fedprox:FedProx",
        "fedsam": "rayfl.algorithms.fedsam:FedSAM",
        "fedspeed": "rayfl.algorithms.fedspeed:FedSpeed",
        "moon": "rayfl.algorithms.moon:MOON",
        "ditto": "rayfl.algorithms.ditto:Ditto",
        "fedbn": "rayfl.algorithms.fedbn:FedBN",
        "fedper": "rayfl.algorithms.fedper:FedPer",
        "lgfedavg": "rayfl.algorithms.lgfedavg:LGFedAvg",
        "fedrep": "rayfl.algorithms.fedrep:FedRep",
        "fedbabu": "rayfl.algorithms.fedbabu:FedBABU",
        "perfedavg": "rayfl.algorithms.perfedavg:PerFedAvg",
        "pfedme": "rayfl.algorithms.pfedme:PFedMe",
        "apfl": "rayfl.algorithms.apfl:APFL",
        "fedproto": "rayfl.algorithms.fedproto:FedProto",
        "fedexp": "rayfl.algorithms.fedexp:FedExP",
        "qfedavg": "rayfl.algorithms.qfedavg:QFedAvg",
        "scaffold": "rayfl.algorithms.scaffold:Scaffold",
        "feddyn": "rayfl.algorithms.feddyn:FedDyn",
        "fedadam": "rayfl.algorithms.fedopt:FedAdam",
        "fedyogi": "rayfl.algorithms.fedopt:FedYogi",
        "fedadagrad": "rayfl.algorithms.fedopt:FedAdagrad",
        "fednova": "rayfl.algorithms.fednova:FedNova",
        "adabest": "rayfl.algorithms.adabest:AdaBest",
        "fedeve": "rayfl.algorithms.fedeve:FedEve",
        "fedmim": "rayfl.algorithms.fedmim:FedMIM",
        "fedmsi": "rayfl.algorithms.fedmsi:FedMSI",
    },
    "model": {
        "logreg": "rayfl.models.zoo:logreg",
        "mlp": "rayfl.models.zoo:mlp",
        "fmnist_cnn": "rayfl.models.zoo:fmnist_cnn",
        "cifar_cnn": "rayfl.models.zoo:cifar_cnn",
        "adabest_cnn": "rayfl.models.zoo:adabest_cnn",
        "lenet5": "rayfl.models.zoo:lenet5",
        "resnet18_gn": "rayfl.models.zoo:resnet18_gn",
        "ncf": "rayfl.models.rec:ncf",
        "shakespeare_lstm": "rayfl.models.seq:shakespeare_lstm",
        "stackoverflow_lstm": "rayfl.models.seq:stackoverflow_lstm",
        "transformer_lm": "rayfl.models.seq:transformer_lm",
    },
    "dataset": {
        "fmnist": "rayfl.data.datasets.fmnist",
        "cifar10": "rayfl.data.datasets.cifar",
        "cifar100": "rayfl.data.datasets.cifar",
        "femnist": "rayfl.data.datasets.leaf",
        "shakespeare": "rayfl.data.datasets.shakespeare",
        "leaf_shakespeare": "rayfl.data.datasets.leaf_text:shakespeare",
        "sent140": "rayfl.data.datasets.leaf_text:sent140",
        "celeba": "rayfl.data.datasets.celeba",
        "tff_shakespeare": "rayfl.data.datasets.tff:shakespeare",
        "stackoverflow": "rayfl.data.datasets.tff:stackoverflow",
        "emnist": "rayfl.data.datasets.emnist",
        "movielens": "rayfl.data.datasets.movielens",
        "digits": "rayfl.data.datasets.digits",
        "synthetic": "rayfl.data.datasets.synthetic",
        "synthetic_fedprox": "rayfl.data.datasets.fedprox",
    },
    "availability": {
        "always": "rayfl.availability.always:AlwaysOn",
        "bernoulli": "rayfl.availability.bernoulli:Bernoulli",
        "diurnal": "rayfl.availability.diurnal:Diurnal",
        "trace": "rayfl.availability.trace:Trace",
    },
    "selector": {
        "uniform": "rayfl.selection.uniform:Uniform",
        "power_of_choice": "rayfl.selection.power_of_choice:PowerOfChoice",
        "oort": "rayfl.selection.oort:Oort",
    },
    "wrapper": {
        "ima": "rayfl.algorithms.ima:IMA",
    },
    "transform": {
        "identity": "rayfl.transforms.base:Identity",
        "clip": "rayfl.transforms.base:ClipUpdate",
        "qsgd": "rayfl.transforms.compress:QSGD",
        "topk": "rayfl.transforms.compress:TopK",
        "randk": "rayfl.transforms.compress:RandK",
        "secagg": "rayfl.transforms.secagg:SecAgg",
        "median": "rayfl.transforms.robust:Median",
        "trimmed_mean": "rayfl.transforms.robust:TrimmedMean",
        "krum": "rayfl.transforms.robust:Krum",
        "attack": "rayfl.transforms.robust:Attack",
    },
    "server_opt": {
        "sgd": "rayfl.algorithms.server_opt:sgd_of",
        "momentum": "rayfl.algorithms.server_opt:momentum_of",
        "adam": "rayfl.algorithms.server_opt:adam_of",
        "yogi": "rayfl.algorithms.server_opt:yogi_of",
        "adagrad": "rayfl.algorithms.server_opt:adagrad_of",
    },
    "executor": {
        "ray": "rayfl.runtime.executors:RayExecutor",
        "inprocess": "rayfl.runtime.executors:InProcessExecutor",
        "threads": "rayfl.runtime.threads:ThreadExecutor",
    },
}

_REGISTERED: dict[str, dict[str, Any]] = {kind: {} for kind in KEYS}


def _check_kind(kind: str) -> None:
    if kind not in KEYS:
        raise ValueError(f"unknown component kind {kind!r}; one of {', '.join(KEYS)}")


def names(kind: str) -> list[str]:
    """Built-in and registered names of ``kind`` (references are not listed)."""
    _check_kind(kind)
    return sorted({*BUILTINS[kind], *_REGISTERED[kind]})


def is_builtin(kind: str, name: str) -> bool:
    """Whether ``name`` is one of rayfl's own components of ``kind``."""
    return name in BUILTINS[kind]


def expected(kind: str) -> str:
    """What a config value naming a ``kind`` may be (for error messages and docs)."""
    return "one of " + ", ".join(names(kind)) + ", or a package.module:Name reference"


def _import_attr(ref: str) -> Any:
    """The object ``module:attr.path`` (or the module ``module``); the working directory is
    searched too, as a user running ``rayfl`` from their project expects."""
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        cwd = os.getcwd()
        if cwd in sys.path or not (e.name and module_name.startswith(e.name)):
            raise
        sys.path.insert(0, cwd)
        module = importlib.import_module(module_name)
    obj = module
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj


#: kind -> the class its components subclass (kinds not listed take factories or pairs)
BASES = {"algorithm": "rayfl.algorithms.base:Algorithm",
         "selector": "rayfl.selection.base:Selector",
         "availability": "rayfl.availability.base:AvailabilityModel",
         "transform": "rayfl.transforms.base:Transform",
         "wrapper": "rayfl.algorithms.wrapper:ServerWrapper"}


def resolve(kind: str, name: str) -> Any:
    """The component ``name`` of ``kind``; a :class:`ConfigError` on its config key otherwise
    (a class that does not subclass its kind's base included)."""
    _check_kind(kind)
    if not isinstance(name, str):
        raise ConfigError(KEYS[kind], name, expected(kind))
    if name in BUILTINS[kind] and name not in _REGISTERED[kind]:
        return _import_attr(BUILTINS[kind][name])
    obj = _REGISTERED[kind][name] if name in _REGISTERED[kind] else _import_user(kind, name)
    if kind in BASES:
        base = _import_attr(BASES[kind])
        if not (isinstance(obj, type) and issubclass(obj, base)):
            raise ConfigError(KEYS[kind], name, f"a subclass of {base.__module__}."
                                                f"{base.__qualname__} (got {obj!r})")
    return obj


#: the kinds a ``layers`` entry may name, innermost-first order of the run's stack
LAYER_KINDS = ("wrapper", "transform")


def resolve_layer(name: str, key: str = "layers[].name") -> tuple[str, Any]:
    """(kind, class) of what a ``layers`` entry names: a server wrapper or an aggregation
    transform, a built-in or registered name of either kind or a ``package.module:Name``
    subclassing either base (a ConfigError on ``key`` otherwise)."""
    if not isinstance(name, str):
        raise ConfigError(key, name, "the name of a server wrapper or an aggregation transform")
    kinds = [k for k in LAYER_KINDS if name in BUILTINS[k] or name in _REGISTERED[k]]
    if len(kinds) > 1:
        raise ConfigError(key, name, "a name registered as one kind (it names a wrapper and a "
                                     "transform; give the class as package.module:Name)")
    if kinds:
        return kinds[0], resolve(kinds[0], name)
    if not isinstance(name, str) or ":" not in name:
        raise ConfigError(key, name, "a server wrapper or an aggregation transform: one of "
                                     + ", ".join(names("wrapper") + names("transform"))
                                     + ", or a package.module:Name reference")
    obj = _import_user("wrapper", name, key)
    kinds = [k for k in LAYER_KINDS
             if isinstance(obj, type) and issubclass(obj, _import_attr(BASES[k]))]
    if len(kinds) != 1:
        raise ConfigError(key, name, "a subclass of rayfl.algorithms.wrapper.ServerWrapper or of "
                                     "rayfl.transforms.base.Transform (got "
                                     f"{obj!r}{', a subclass of both' if kinds else ''})")
    return kinds[0], obj


def _import_user(kind: str, name: str, key: str | None = None) -> Any:
    """The object a ``package.module:Name`` reference names (errors on ``key``, default the
    kind's own config key)."""
    key = key or KEYS[kind]
    if not isinstance(name, str) or ":" not in name:
        raise ConfigError(key, name, expected(kind))
    try:
        return _import_attr(name)
    except ModuleNotFoundError as e:
        raise ConfigError(key, name, f"an importable package.module:Name (no module {e.name!r} "
                                     "on the working directory or PYTHONPATH)") from None
    except AttributeError:
        module, _, attr = name.partition(":")
        raise ConfigError(key, name, f"a name defined in module {module!r} (it has no "
                                     f"{attr!r})") from None
    except Exception as e:  # the user's module itself fails on import: say so on the key
        raise ConfigError(key, name, f"a module that imports cleanly ({type(e).__name__}: "
                                     f"{e})") from None


def register(kind: str, obj: Any = None, *, name: str | None = None) -> Any:
    """Register ``obj`` as a ``kind`` under ``name`` (default: its ``name`` attribute or
    ``__name__``); returns ``obj``, so it also works as ``@register("model")`` or
    ``@register("model", name="mynet")``. Built-in names cannot be replaced."""
    _check_kind(kind)
    if obj is None:
        return lambda o: register(kind, o, name=name)
    if name is None:
        name = getattr(obj, "name", None) or getattr(obj, "__name__", None)
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"register {_article(kind)} {kind} with a name (without ':'), got "
                         f"{name!r}")
    if name in BUILTINS[kind]:
        raise ValueError(f"{name!r} is a built-in {kind}; register yours under another name")
    problem = _declared(kind, obj)
    if problem:
        raise ValueError(f"{identity(obj)} cannot be registered as {kind!r}: expected {problem}")
    _REGISTERED[kind][name] = obj
    return obj


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _declared(kind: str, obj: Any) -> str | None:
    """What is wrong with what a component declares of itself (the base class of its kind; an
    algorithm's, a layer's or an executor's traits and how it is built), or None; other kinds
    are checked where a config names them."""
    base = _import_attr(BASES[kind]) if kind in BASES else None
    if base is not None and not (isinstance(obj, type) and issubclass(obj, base)):
        return f"a subclass of {base.__module__}.{base.__qualname__} (got {obj!r})"
    if kind == "algorithm" and isinstance(obj, type) and issubclass(obj, Algorithm):
        return algorithm_problem(obj)
    if kind in ("wrapper", "transform") and isinstance(obj, type) and issubclass(obj, Layer):
        return layer_problem(obj)
    if kind == "executor":
        return executor_problem(obj)
    return None


def unregister(kind: str, name: str) -> None:
    """Forget a registered component (tests and notebooks re-registering)."""
    _REGISTERED[kind].pop(name, None)


def identity(obj: Any) -> str:
    """``module:qualname`` of a component (a module: its name), for cache keys and listings."""
    if isinstance(obj, type(sys)):
        return obj.__name__
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', type(obj).__name__)}"


def summary(kind: str, name: str) -> str:
    """One line on a component: its docstring's first paragraph (a built-in class: its
    module's, which names the paper; an executor, which names no paper: its own)."""
    obj = resolve(kind, name)
    module = sys.modules.get(getattr(obj, "__module__", "") or "")
    from_module = is_builtin(kind, name) and isinstance(obj, type) and module is not None \
        and kind not in ("executor", "transform")  # several share a module
    doc = (module.__doc__ if from_module else None) or obj.__doc__ or ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def params_class(obj: Any) -> type | None:
    """The component's typed parameters (a dataclass ``Params``), or None."""
    params = getattr(obj, "Params", None)
    return params if dataclasses.is_dataclass(params) else None


def params_problem(component: Any) -> str | None:
    """What is wrong with the ``Params`` a component declares, in words (None: nothing)."""
    declared = getattr(component, "Params", None)
    if declared is not None and not dataclasses.is_dataclass(declared):
        return (f"a component whose Params is a dataclass of rayfl.schema fields (its Params "
                f"{declared!r} is not a dataclass: add @dataclass(frozen=True))")
    params_cls = params_class(component)
    if params_cls and "name" in {f.name for f in dataclasses.fields(params_cls)}:
        return ("a component whose Params has no field called name (an entry's name is the "
                "component it names: the field could never be set)")
    redefined = _loosened(params_cls) if params_cls else None
    if redefined:
        return (f"a component whose Params keep the type and bounds of the fields they "
                f"redefine ({redefined})")
    return None


def built_params(component: Any, values: dict, prefix: str, key: str, name: str) -> Any:
    """The component's ``Params`` built from ``values`` (keys under ``prefix``; None: it
    declares none); a field of a type the schema cannot validate is a ConfigError on ``key``."""
    params_cls = params_class(component)
    try:
        return schema.build(params_cls, values, prefix) if params_cls else None
    except TypeError as e:  # a Params field of a type the schema cannot validate
        if not str(e).startswith("unsupported schema type"):
            raise
        raise ConfigError(key, name, f"a component whose Params fields have types the schema "
                                     f"validates ({e}: bool, int, float, str, Literal, "
                                     "Optional, list, dict or a dataclass)") from None


# ----- config sections that name a component ----------------------------------------------------

class Named:
    """Mixin for a config section whose ``NAME_FIELD`` names a component of ``KIND``; its
    ``params`` field holds the component's validated ``Params``. Pickling carries a non-built-in
    component with the section, so the receiving process (a Ray worker) can resolve the name."""

    KIND: ClassVar[str] = ""
    NAME_FIELD: ClassVar[str] = "name"

    @property
    def component_name(self) -> str:
        return getattr(self, self.NAME_FIELD)

    def component(self) -> Any:
        """The named component."""
        return resolve(self.KIND, self.component_name)

    @classmethod
    def schema_build(cls, data: Any, prefix: str) -> Any:
        """The section from a mapping: its own keys, plus the named component's ``Params``
        keys (validated into ``params``); a key that is neither is an error listing both."""
        if not isinstance(data, (dict, type(None))):
            raise ConfigError(prefix, data, "a mapping")
        data = dict(data or {})
        fields = {f.name: f for f in dataclasses.fields(cls)}
        own = {n for n, f in fields.items() if not f.metadata.get("flatten")}
        key = f"{prefix}.{cls.NAME_FIELD}"
        name = data.get(cls.NAME_FIELD, fields[cls.NAME_FIELD].default)
        if name is dataclasses.MISSING:
            raise ConfigError(key, None, f"{expected(cls.KIND)}; this key is required")
        if not isinstance(name, str):
            raise ConfigError(key, name, expected(cls.KIND))
        try:
            component = resolve(cls.KIND, name)
        except ConfigError as e:  # the entry's own key (wrappers[2].name), not the kind's
            raise ConfigError(key, name, e.expected) from None
        problem = params_problem(component)
        if problem:
            raise ConfigError(key, name, problem)
        params_cls = params_class(component)
        theirs = {f.name for f in dataclasses.fields(params_cls)} if params_cls else set()
        if own & theirs:
            raise ConfigError(f"{prefix}.{cls.NAME_FIELD}", name,
                              f"a component whose Params do not reuse the section's own keys "
                              f"({', '.join(sorted(own & theirs))})")
        extra = {k: data.pop(k) for k in list(data) if k not in own}
        unknown = sorted(set(extra) - theirs)
        if unknown:
            raise ConfigError(f"{prefix}.{unknown[0]}", extra[unknown[0]],
                              no_such_key(unknown[0], prefix, own | theirs))
        section = schema.build_fields(cls, data, prefix)
        params = built_params(component, extra, prefix, key, name)
        section = dataclasses.replace(section, params=params)
        check = getattr(component, "check_section", None)
        if check is not None:  # the component's own rules on its section
            check(section, prefix)
        return section

    def __reduce__(self):
        name = self.component_name
        carried = None if is_builtin(self.KIND, name) else resolve(self.KIND, name)
        return _restore, (type(self), dict(self.__dict__), carried)


def _bounds(f: dataclasses.Field, hints: dict) -> str:
    """A field's type (of ``hints``, its class's resolved annotations) and bounds, in words:
    ``float > 0.0``."""
    m, tp = f.metadata, hints.get(f.name, f.type)
    out = [tp.__name__ if isinstance(tp, type) else str(tp)]
    if m.get("lo") is not None:
        out.append(f"{'>' if m.get('lo_open') else '≥'} {m['lo']}")
    if m.get("hi") is not None:
        out.append(f"{'<' if m.get('hi_open') else '≤'} {m['hi']}")
    return " ".join(out)


def _loosened(params: type) -> str | None:
    """The first field ``params`` redefines from a dataclass it extends with another type or
    other bounds (the inherited bounds would no longer hold: η_g = −1 ascends), in words; None
    when every redefinition only changes the default (checked against the bounds kept)."""
    own = vars(params).get("__annotations__", {})
    mine = {f.name: f for f in dataclasses.fields(params)}
    for base in params.__mro__[1:]:
        if not dataclasses.is_dataclass(base):
            continue
        inherited = {f.name: f for f in dataclasses.fields(base)}
        for n in (n for n in own if n in inherited):
            now, before = _bounds(mine[n], _hints(params)), _bounds(inherited[n], _hints(base))
            if now != before:
                return (f"{params.__qualname__}.{n} is {now}, where the {base.__qualname__}.{n} "
                        f"it redefines is {before}")
    return None


def _hints(cls: type) -> dict:
    """``cls``'s annotations resolved (empty when they cannot be: compared as written)."""
    try:
        return typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - a name the annotation's module lacks
        return {}


def _restore(cls: type, state: dict, carried: Any) -> Any:
    """Unpickle a :class:`Named` section, registering the component it carries here too."""
    obj = object.__new__(cls)
    obj.__dict__.update(state)
    name = state[cls.NAME_FIELD]
    if carried is not None and ":" not in name:
        _REGISTERED[cls.KIND].setdefault(name, carried)
    return obj


def user_modules(components: list[Any]) -> list[str]:
    """Top-level modules or packages (file paths) the given components come from, for
    Ray's ``runtime_env.py_modules``: not rayfl, not installed packages, not ``__main__`` (which
    cloudpickle ships by value)."""
    installed = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)}
    own = os.path.realpath(PACKAGE_DIR)
    paths = []
    for obj in components:
        module_name = obj.__name__ if isinstance(obj, type(sys)) else getattr(obj, "__module__",
                                                                                None)
        if not module_name or module_name == "__main__":
            continue
        top = sys.modules.get(module_name.split(".")[0])
        if top is None:
            continue
        path = list(top.__path__)[0] if hasattr(top, "__path__") else getattr(top, "__file__",
                                                                                None)
        if not path:
            continue
        path = os.path.realpath(path)
        if path.startswith(own) or any(path.startswith(p + os.sep) for p in installed) or \
                "site-packages" in path.split(os.sep):
            continue
        paths.append(path)
    return sorted(set(paths))


# ----- registering from Python: rayfl.register_algorithm and friends ----------------------------

C = TypeVar("C")
Registered = Union[C, Callable[[C], C]]  # the object itself, or (as a decorator) a registrar


def register_algorithm(algorithm: C | None = None, *, name: str | None = None) -> Registered:
    """Make ``algorithm.name: NAME`` run ``algorithm``, a subclass of
    [`Algorithm`][rayfl.algorithms.base.Algorithm] (its ``Params`` dataclass, if any, gives
    the keys of the ``algorithm`` section).

    ``NAME`` is ``name``, else the class's ``name`` attribute or ``__name__``; a built-in name
    cannot be taken. Returns ``algorithm``, so it works as ``register_algorithm(MyAlgo,
    name="mine")``, ``@register_algorithm`` and ``@register_algorithm(name="mine")``. The class
    travels with the run's config to every Ray worker; no import hook is needed there."""
    return register("algorithm", algorithm, name=name)


def register_model(model: C | None = None, *, name: str | None = None) -> Registered:
    """Make ``model.name: NAME`` build ``model``: a function or ``torch.nn.Module`` class called
    as ``model(input_shape, num_classes, **options)`` (the options it names among ``hidden``,
    ``groups``, ``embedding_dim`` and ``vocab``, and every field of its own ``Params``, the
    ``model`` section's further keys).

    Naming and decorator use as [`register_algorithm`][rayfl.registry.register_algorithm]."""
    return register("model", model, name=name)


def register_dataset(dataset: C | None = None, *, name: str | None = None) -> Registered:
    """Make ``data.dataset: NAME`` read ``dataset``: a module or class whose ``load(cfg,
    seed)`` returns the whole data set as [`Arrays`][rayfl.data.datasets.Arrays] (optionally
    with its own ``Params``, the ``data`` section's further keys); rayfl partitions, caches and
    serves it.

    Naming and decorator use as [`register_algorithm`][rayfl.registry.register_algorithm]."""
    return register("dataset", dataset, name=name)


def register_availability(model: C | None = None, *, name: str | None = None) -> Registered:
    """Make ``availability.model: NAME`` decide who is online: a subclass of
    [`AvailabilityModel`][rayfl.availability.base.AvailabilityModel], built as ``cls(params,
    ctx)`` with its own ``Params`` (the ``availability`` section's further keys).

    Naming and decorator use as [`register_algorithm`][rayfl.registry.register_algorithm]."""
    return register("availability", model, name=name)


def register_selector(selector: C | None = None, *, name: str | None = None) -> Registered:
    """Make ``selection.name: NAME`` pick each round's clients with ``selector``, a subclass of
    [`Selector`][rayfl.selection.base.Selector].

    Naming and decorator use as [`register_algorithm`][rayfl.registry.register_algorithm]."""
    return register("selector", selector, name=name)


def register_wrapper(wrapper: C | None = None, *, name: str | None = None) -> Registered:
    """Make a ``wrappers`` entry ``{name: NAME}`` wrap the algorithm's server side in
    ``wrapper``, a subclass of [`ServerWrapper`][rayfl.algorithms.wrapper.ServerWrapper]; a
    registered wrapper is also named in ``rayfl compare --algorithms fedavg+NAME``.

    Naming and decorator use as [`register_algorithm`][rayfl.registry.register_algorithm]."""
    return register("wrapper", wrapper, name=name)


def register_transform(transform: C | None = None, *, name: str | None = None) -> Registered:
    """Make an ``aggregation.transforms`` entry ``{name: NAME}`` pass every client's upload and
    the round's aggregate through ``transform``, a subclass of
    [`Transform`][rayfl.transforms.base.Transform] (its client and server halves).

    Naming and decorator use as [`register_algorithm`][rayfl.registry.register_algorithm]."""
    return register("transform", transform, name=name)


def register_server_opt(optimizer: C | None = None, *, name: str | None = None) -> Registered:
    """Make ``server_opt.name: NAME`` step the server with ``optimizer``: a callable
    ``optimizer(section, lr)`` returning a
    [`ServerOpt`][rayfl.algorithms.server_opt.ServerOpt], an optax-shaped ``init``/``update``
    pair (``section``: the validated ``server_opt`` section, with its own ``Params`` in
    ``section.params``; ``lr``: the server learning rate).

    Naming and decorator use as [`register_algorithm`][rayfl.registry.register_algorithm]."""
    return register("server_opt", optimizer, name=name)


def register_executor(executor: C | None = None, *, name: str | None = None) -> Registered:
    """Make ``runtime.executor: NAME`` train the clients with ``executor``: a class with
    ``on_ray`` (False: the run stays in this process; True: it gets Ray's client actors) and a
    classmethod ``build(hosting)`` (a [`Hosting`][rayfl.runtime.executors.Hosting]) returning an
    object that answers [`Executor`][rayfl.runtime.loop.Executor]'s calls.

    Naming and decorator use as [`register_algorithm`][rayfl.registry.register_algorithm]."""
    return register("executor", executor, name=name)
