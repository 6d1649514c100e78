"""The boundary with the user's code: what a component that breaks its contract is told.

rayfl calls code it did not write — model factories, dataset loaders, algorithms, wrappers,
selectors, availability models, transforms. Where it calls one it checks what comes back (type,
shape, dtype, range, finiteness, ids) and runs the call inside :func:`calling`, so that a broken
contract, or an exception the user's code raises, reaches the user as one
:class:`ComponentError`: a line naming the component (``module:Name.method``), the round and
client where it happened and what was wrong, followed by the user's own frames only — never a
Ray or C++ dump. The command line prints it and exits with status 2.

What rayfl lends a call (the broadcast, a client's stored state, the server's state) is shared
with other clients, later rounds and the checkpoint, so the user's code reads it and never
edits it: a :class:`Lent` notes the tensors' version counters before the call (torch moves a
tensor's counter at every in-place operation, on it or a view of it) and refuses a counter
that moved after it, naming the tensor — a check that costs nothing and touches no value.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import numbers
import os
import signal
import sys
import threading
import traceback
from typing import Any, Callable, Iterator

import numpy as np
import torch

from rayfl.schema import ConfigError

#: directories whose frames are not the user's: rayfl itself and installed packages
_RAYFL = os.path.dirname(os.path.abspath(__file__))
_LIBRARY = tuple(p for p in {os.path.dirname(os.__file__), *sys.path}
                 if p and ("site-packages" in p or "dist-packages" in p or
                           p == os.path.dirname(os.__file__)))


class ComponentError(Exception):
    """A user's component broke its contract (or raised): who, where, what, and its frames."""

    def __init__(self, component: str, problem: str, round: int | None = None,
                 client: int | None = None, frames: str = ""):
        self.component, self.problem = component, " ".join(str(problem).split())
        self.round, self.client, self.frames = round, client, frames
        super().__init__(component, problem, round, client, frames)

    def where(self) -> str:
        """`` (round 3, client 17)``, or nothing when neither is known. Rounds count from 1."""
        parts = ([] if self.round is None else [f"round {self.round + 1}"]) + \
            ([] if self.client is None else [f"client {self.client}"])
        return f" ({', '.join(parts)})" if parts else ""

    def __str__(self) -> str:
        return f"{self.component}{self.where()}: {self.problem}"

    def at(self, round: int | None = None, client: int | None = None) -> "ComponentError":
        """This error with the round and client filled in where they were not known."""
        return ComponentError(self.component, self.problem,
                              self.round if self.round is not None else round,
                              self.client if self.client is not None else client, self.frames)


def name_of(obj: Any, method: str | None = None) -> str:
    """``module:Name`` (``.method``) of a user's class, instance or function."""
    target = obj if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismethod(obj) \
        else type(obj)
    func = getattr(target, "__func__", None)
    if func is not None:  # a bound method: its class and its own name
        return f"{name_of(target.__self__)}.{func.__name__}"
    qual = getattr(target, "__qualname__", getattr(target, "__name__", repr(target)))
    base = f"{getattr(target, '__module__', '?')}:{qual}"
    return f"{base}.{method}" if method else base


def _is_user_frame(filename: str) -> bool:
    """Whether a frame's file is the user's: an absolute path (compiled extensions, Ray's
    ``python/ray/_raylet.pyx``, name theirs relative to their build) outside rayfl and the
    installed packages."""
    path = os.path.normpath(filename)
    return os.path.isabs(path) and not (path.startswith(_RAYFL + os.sep)
                                        or path.startswith(_LIBRARY))


def user_frames(tb) -> str:
    """The frames of traceback ``tb`` in the user's own files, formatted (empty when none)."""
    frames = [f for f in traceback.extract_tb(tb) if _is_user_frame(f.filename)]
    return "".join(traceback.format_list(frames)).rstrip()


@contextlib.contextmanager
def calling(component: str, round: int | None = None, client: int | None = None
            ) -> Iterator[None]:
    """Run a call into the user's ``component``: an exception it raises becomes a
    :class:`ComponentError` naming the component, the round and the client, carrying the user's
    frames (a :class:`ComponentError` raised inside gets the round and client filled in; a
    :class:`~rayfl.schema.ConfigError` names a key already and passes unchanged). SystemExit
    and KeyboardInterrupt are the component's error too — except a KeyboardInterrupt of a
    signal that came meanwhile (:func:`signals_watched`): the user's Ctrl-C passes."""
    try:
        yield
    except ComponentError as e:
        raise e.at(round, client) from None
    except ConfigError:
        raise
    except KeyboardInterrupt as e:
        if interrupted():  # a Ctrl-C (or SIGTERM) that came while the user's code ran
            raise
        raise ComponentError(component, ended(e), round, client,
                             user_frames(e.__traceback__)) from None
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's code may raise anything
        raise ComponentError(component, ended(e) if isinstance(e, SystemExit) else
                             f"raised {type(e).__name__}: {e}" if str(e) else
                             f"raised {type(e).__name__}", round, client,
                             user_frames(e.__traceback__)) from None


def ended(e: BaseException) -> str:
    """What a component that raised SystemExit or KeyboardInterrupt itself did: it would end
    the run, or pass for a Ctrl-C, without rayfl's summary."""
    what = f"SystemExit({e.code!r}) (sys.exit)" if isinstance(e, SystemExit) else \
        "KeyboardInterrupt, though no Ctrl-C came"
    return (f"raised {what}; a component does not end the run: raise an exception saying "
            "what went wrong")


#: the signals (SIGINT, SIGTERM) that reached this process while :func:`signals_watched`
_signals: list[int] = []
_watching = [0]  # how deep signals_watched is entered


def interrupted() -> bool:
    """Whether a SIGINT or SIGTERM reached this process since :func:`signals_watched` was
    entered: a KeyboardInterrupt then is the user's Ctrl-C, not one their code raised."""
    return bool(_signals)


@contextlib.contextmanager
def signals_watched() -> Iterator[None]:
    """Note every SIGINT and SIGTERM before the handler that was there runs (the handlers
    themselves are unchanged), so that :func:`calling` tells a Ctrl-C from a KeyboardInterrupt
    the user's code raises. Nests; in the main thread only (elsewhere no signal arrives, and a
    KeyboardInterrupt is always the code's own)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if not _watching[0]:
        _signals.clear()
    replaced = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(sig)
        if callable(handler) and not getattr(handler, "noted", False):
            def note(signum, frame, handler=handler):
                _signals.append(signum)
                return handler(signum, frame)

            note.noted = True
            replaced[sig] = handler
            signal.signal(sig, note)
    _watching[0] += 1
    try:
        yield
    finally:
        _watching[0] -= 1
        for sig, handler in replaced.items():
            signal.signal(sig, handler)


class Lent:
    """The tensors lent to one call into the user's code, each by the name the user reads it
    by (``task.state["c"]``), with their version counters; :meth:`check` after the call."""

    def __init__(self):
        self.items: list[tuple[str, Any, int]] = []

    def add(self, name: str, value: Any) -> "Lent":
        """Lend ``value``: a tensor, or the tensors in a dict, list, tuple or dataclass
        (``name["key"]``, ``name[0]``, ``name.field``)."""
        if isinstance(value, torch.Tensor):
            version = _version(value)
            if version is not None:
                self.items.append((name, value, version))
        elif isinstance(value, dict):
            for key, inner in value.items():
                self.add(f'{name}["{key}"]' if isinstance(key, str) else f"{name}[{key!r}]",
                         inner)
        elif isinstance(value, (list, tuple)):
            for i, inner in enumerate(value):
                self.add(f"{name}[{i}]", inner)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for f in dataclasses.fields(value):
                self.add(f"{name}.{f.name}", getattr(value, f.name))
        return self

    def check(self, component: str, round: int | None = None,
              client: int | None = None) -> None:
        """ComponentError naming ``component`` and the first lent tensor it edited in place."""
        for name, tensor, version in self.items:
            if _version(tensor) != version:
                raise ComponentError(component, f"edited {name} in place; what rayfl lends is "
                                                "read-only (other clients, later rounds and the "
                                                "checkpoint share it): compute a new tensor, or "
                                                ".clone() it first", round, client)


def _version(tensor: Any) -> int | None:
    """A tensor's version counter (None: an inference tensor, which keeps none)."""
    try:
        return tensor._version
    except RuntimeError:
        return None


@contextlib.contextmanager
def own_exits() -> Iterator[None]:
    """Within: a SystemExit, or a KeyboardInterrupt no signal caused, that the user's code
    raises where rayfl calls it outside :func:`calling` is a ComponentError naming the user's
    function it was raised in (its innermost frame in the user's files), with the user's
    frames; one raised anywhere else (a Ctrl-C, rayfl's own) passes unchanged."""
    with signals_watched():
        try:
            yield
        except (SystemExit, KeyboardInterrupt) as e:
            where = raised_in(e.__traceback__)
            if where is None or isinstance(e, KeyboardInterrupt) and interrupted():
                raise
            raise ComponentError(where, ended(e), frames=user_frames(e.__traceback__)) from None


def raised_in(tb) -> str | None:
    """``module:function`` of the innermost frame of traceback ``tb`` in the user's files
    (None: none is)."""
    frames = [f for f, _ in traceback.walk_tb(tb) if _is_user_frame(f.f_code.co_filename)]
    if not frames:
        return None
    return f"{frames[-1].f_globals.get('__name__', '?')}:{frames[-1].f_code.co_qualname}"


def expect(ok: bool, component: str, problem: str, round: int | None = None,
           client: int | None = None) -> None:
    """ComponentError(``component``, ``problem``) unless ``ok``."""
    if not ok:
        raise ComponentError(component, problem, round, client)


def describe(value: Any) -> str:
    """What a returned value is, in a few words: ``a str``, ``a float64 tensor of shape (3,)``."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        kind = "tensor" if type(value).__module__.startswith("torch") else "array"
        dt = str(dtype).replace("torch.", "")
        return f"{_a(dt)} {dt} {kind} of shape {tuple(shape)}"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)}"
    return "None" if value is None else f"{_a(type(value).__name__)} {type(value).__name__}"


def _a(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def returned(value: Any, names: tuple[str, ...], component: str,
             round: int | None = None) -> tuple:
    """``value`` checked to be a tuple of ``len(names)`` (what a method returns several of)."""
    expect(isinstance(value, tuple) and len(value) == len(names), component,
           f"returned {describe(value)}; expected a tuple ({', '.join(names)})", round)
    return value


def returned_vector(value: Any, like: Any, component: str, what: str,
                    round: int | None = None, as_: str = "like the model's x") -> Any:
    """``value`` checked to be a float tensor shaped like ``like`` (the model vector, or what
    ``as_`` says), cast to ``like``'s dtype."""
    ok = isinstance(value, torch.Tensor) and value.is_floating_point() and \
        value.shape == like.shape
    expect(ok, component, f"{what} is {describe(value)}; expected a float tensor of shape "
                          f"{tuple(like.shape)}, {as_}", round)
    return value if value.dtype == like.dtype else value.to(like.dtype)


class Trail:
    """A value, then what each maker made of it in turn, each read as it is added (``parts``:
    its tensors and numbers) — so a maker that later writes into a value in place changes
    nothing here. :meth:`check` names the maker of NaN or ±inf."""

    def __init__(self, what: str, first: Any, parts: Callable[[Any], list] = lambda v: [v]):
        self.what, self.parts = what, parts
        self.makers: list[str] = []
        self.marks = [self._mark(first)]  # (finite, tame) of each value

    def add(self, maker: str, value: Any) -> None:
        """What ``maker`` made of the value before."""
        self.makers.append(maker)
        self.marks.append(self._mark(value))

    def check(self, round: int | None = None, client: int | None = None) -> None:
        """When the last value holds NaN or ±inf, the first value that does is looked at: a
        ComponentError names its maker if that made it of a tame value — finite, with a
        squared norm its dtype can hold, so that no computation of a correct component
        overflows on it (the run would otherwise stop as diverged, naming no one). From a value
        that is not tame (training that diverges: an upload of norm 1e20) a non-finite result
        is divergence: nobody is named."""
        if self.marks[-1][0]:
            return
        i = next(i for i, (finite, _) in enumerate(self.marks) if not finite)
        if i and self.marks[i - 1][1]:
            raise ComponentError(self.makers[i - 1], f"returned {self.what} holding NaN or ±inf, "
                                                     "made from a finite one", round, client)

    def _mark(self, value: Any) -> tuple[bool, bool]:
        marks = [_mark(v) for v in self.parts(value)]
        return all(f for f, _ in marks), all(t for _, t in marks)


def no_new_non_finite(trail: list, makers: list[str], what: str, round: int | None = None,
                      client: int | None = None, parts: Callable[[Any], list] = lambda v: [v]
                      ) -> None:
    """:meth:`Trail.check` of ``trail`` (a value, then what each of ``makers`` made of it in
    turn), every value read now."""
    line = Trail(what, trail[0], parts)
    for maker, value in zip(makers, trail[1:]):
        line.add(maker, value)
    line.check(round, client)


def _mark(v: Any) -> tuple[bool, bool]:
    """(finite, tame: finite with a squared norm representable in its dtype) of a tensor or a
    number. A tensor is read by one dot product with itself (a BLAS pass, 30× the speed of a
    max-abs reduction on a CPU; half precision's in float64); only a value that is not tame is
    read again, for whether it is finite."""
    if not isinstance(v, torch.Tensor):
        return (math.isfinite(v),) * 2
    if not v.numel() or not v.is_floating_point():
        return True, True
    flat = v.detach().reshape(-1)
    if flat.dtype not in (torch.float32, torch.float64):
        flat = flat.double()
    if float(flat @ flat) < torch.finfo(v.dtype).max:  # NaN and inf are not
        return True, True
    return math.isfinite(float(torch.linalg.vector_norm(flat, ord=math.inf))), False


def returned_metrics(value: Any, component: str, round: int | None = None) -> dict:
    """``value`` checked to be a dict of metric names to real numbers or None (0-d tensors and
    numpy scalars become Python numbers)."""
    expect(isinstance(value, dict), component,
           f"returned metrics as {describe(value)}; expected a dict of name -> number", round)
    out = {}
    for k, v in value.items():
        if isinstance(v, (torch.Tensor, np.ndarray)) and v.ndim == 0:
            v = v.item()
        expect(isinstance(k, str) and (v is None or isinstance(v, numbers.Real)), component,
               f"metric {k!r} is {describe(v)}; expected a real number (or None)", round)
        out[k] = v
    return out
