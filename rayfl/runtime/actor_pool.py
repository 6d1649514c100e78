"""Actor processes kept between the runs of one driver: ``with rayfl.actor_pool(): ...``.

A run on Ray starts a server actor and its client actors, each a process that imports torch and
rayfl first (about 3 s for a small run on 2 cores). Inside a pool, a run that ends (finished or
paused) hands its actors back, and the next run takes those with the same resources (CPUs,
GPUs, restarts, environment) instead of starting new ones; each serves the run it is handed to
from that run's own parts (:class:`rayfl.runtime.client_actor.ClientHost`,
:class:`rayfl.runtime.server.ServerHost`), so a run's bytes are those of fresh actors. A run
that fails or is interrupted kills its actors, as outside a pool.

An idle client actor keeps the CPUs and GPUs it reserved: idle ones of other resources end
before a run starts new ones, and rayfl's other work on Ray (``rayfl analyze``'s evaluations, a
tuning study's trials) ends them first (:func:`make_room`); an idle server reserves nothing.
A pool entered inside another ends the other's idle client actors. Leaving the pool's ``with``
ends every idle actor.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Callable, Iterator

import ray

PING_S = 10.0  # an idle actor that does not answer in this long is ended, not handed out

_current: "ActorPool | None" = None
_serial = itertools.count()  # pooled actors' names, unique in the driver's namespace


def current() -> "ActorPool | None":
    """The pool runs started now take their actors from (None: every run starts its own)."""
    return _current


class ActorPool:
    """Idle server and client actors, by what they were started with (``with pool:`` makes it
    the one runs use; :meth:`close` ends the idle ones)."""

    def __init__(self):
        self.idle: dict[tuple, list] = {}  # (kind, options) -> idle (name, actor handle)s
        self.cluster: tuple | None = None  # (GCS address, namespace) the idle actors live in
        self.startup_s = 0.0  # the longest its actors took to start, from start to first answer
        self._outer: list = []

    def __enter__(self) -> "ActorPool":
        global _current
        make_room()  # the pool this one nests in holds CPUs this one's actors need
        self._outer.append(_current)
        _current = self
        return self

    def __exit__(self, *exc) -> None:
        global _current
        _current = self._outer.pop()

    def take(self, kind: str, options: dict, n: int, start: Callable[[str], object]) -> list:
        """``n`` (name, actor) of ``kind`` started with ``options`` (what tells them apart:
        resources, environment, node): the idle ones that answer, then new ones
        (``start(name)``). Idle actors of the kind with other options end first, freeing their
        resources."""
        here = _cluster()
        if here != self.cluster:  # Ray was restarted: the idle handles are of another cluster
            self.idle, self.cluster = {}, here
        key = _key(kind, options)
        for other in [k for k in self.idle if k[0] == kind and k != key]:
            for _, actor in self.idle.pop(other):
                ray.kill(actor)
        idle = self.idle.pop(key, [])
        taken, spare = _answering(idle[:n]), idle[n:]
        if spare:
            self.idle[key] = spare
        names = [f"rayfl/pool/{kind}-{next(_serial)}" for _ in range(n - len(taken))]
        return taken + [(name, start(name)) for name in names]

    def give_back(self, kind: str, options: dict, actors: list) -> None:
        """(name, actor)s of a run that ended, idle for the next run started with the same
        options."""
        self.idle.setdefault(_key(kind, options), []).extend(actors)

    def close(self, kinds: tuple[str, ...] = ("client", "server")) -> None:
        """End the idle actors of ``kinds``."""
        if not ray.is_initialized() or _cluster() != self.cluster:  # ended with their Ray
            self.idle = {}
            return
        for key in [k for k in self.idle if k[0] in kinds]:
            for _, actor in self.idle.pop(key):
                ray.kill(actor)


def make_room() -> None:
    """End the current pool's idle client actors, whose reserved CPUs and GPUs other work on
    Ray is about to need."""
    if _current is not None:
        _current.close(("client",))


def _key(kind: str, options: dict) -> tuple:
    """What idle actors are filed under: their kind and what they were started with."""
    return kind, repr(sorted(options.items()))


def _cluster() -> tuple:
    ctx = ray.get_runtime_context()
    return ctx.gcs_address, ctx.namespace


def _answering(pairs: list) -> list:
    """The (name, actor)s whose actor answers a ping within ``PING_S``; the others (dead,
    hung) are ended."""
    if not pairs:
        return []
    pings = [actor.ping.remote() for _, actor in pairs]
    ready, _ = ray.wait(pings, num_returns=len(pings), timeout=PING_S)
    alive = []
    for pair, ping in zip(pairs, pings):
        try:
            if ping not in ready:
                raise TimeoutError
            ray.get(ping)
            alive.append(pair)
        except (ray.exceptions.RayActorError, TimeoutError):
            ray.kill(pair[1])
    return alive


@contextlib.contextmanager
def actor_pool() -> Iterator[ActorPool]:
    """Runs on Ray started inside take the server and client actors the runs before them left
    idle, instead of starting processes (a sweep, a notebook's runs): each actor serves the run
    it is handed to from that run's parts, with a fresh actor's bytes. Idle client actors keep
    their CPUs and GPUs; leaving the ``with`` ends every idle actor.

    ::

        with rayfl.actor_pool():
            for lr in (0.03, 0.1, 0.3):
                rayfl.run("configs/quickstart.yaml", [f"local.lr={lr}"])
    """
    pool = ActorPool()
    try:
        with pool:
            yield pool
    finally:
        pool.close()
