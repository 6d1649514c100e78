"""One way to reach Ray for ``run``, ``tune`` and ``analyze``: :func:`connect_ray`.

It joins ``runtime.address`` or starts a local Ray, and ships the user's own code (the modules
behind ``package.module:Name`` components and components registered from Python) to every worker
through Ray's ``runtime_env.py_modules``, locally and on a cluster alike: nobody writes a worker
hook. Components defined in ``__main__`` travel by value inside the pickled config instead
(see :class:`rayfl.registry.Named`). ``ATEN_CPU_CAPABILITY`` set where the run starts reaches
every worker the same way (``runtime_env.env_vars``).
"""

from __future__ import annotations

import math
import os
import socket

import ray

from rayfl import layer_list, registry
from rayfl.schema import ConfigError

KERNELS = "ATEN_CPU_CAPABILITY"  # PyTorch's CPU kernel set, read when a process imports torch


class RayStartError(RuntimeError):
    """A local Ray did not come up (Ray gives a raylet 30 s to register; an overloaded machine
    can miss it): nothing of the run was created, and the same command can simply be re-run."""


def components(cfg) -> list:
    """The config's algorithm, layers, model, dataset, availability model and selector that are
    not built-ins."""
    sections = (cfg.algorithm, cfg.model, cfg.data, cfg.availability, cfg.selection)
    return [s.component() for s in sections
            if not registry.is_builtin(s.KIND, s.component_name)] + layer_list.user_classes(cfg)


def runtime_env(cfg) -> dict:
    """Ray ``runtime_env`` that makes the config's user components importable on every worker
    and gives every worker the driver's ``ATEN_CPU_CAPABILITY`` (PyTorch's CPU kernel set: one
    set on nodes of mixed CPUs keeps the model bytes); empty when there is nothing to pass."""
    modules = registry.user_modules(components(cfg))
    env: dict = {"py_modules": modules} if modules else {}
    if os.environ.get(KERNELS):
        env["env_vars"] = {KERNELS: os.environ[KERNELS]}
    return env


def connect_ray(cfg, num_cpus: int | None = None) -> bool:
    """Join the configured cluster or start a local Ray (unless one is up); returns whether this
    call started or joined it (the caller then owns ``ray.shutdown``). A local Ray gets
    ``num_cpus`` or ``runtime.ray_num_cpus`` or the machine's CPUs (at least what the actors
    reserve), ``runtime.ray_num_gpus`` and ``runtime.dashboard``."""
    if ray.is_initialized():
        return False
    rt, env = cfg.runtime, runtime_env(cfg)
    if rt.address:
        _join(rt, env)
    else:
        needed = math.ceil(rt.num_actors * rt.cpus_per_actor)
        cpus = num_cpus or rt.ray_num_cpus or max(os.cpu_count() or 1, needed)
        try:
            ray.init(address="local", num_cpus=cpus, num_gpus=rt.ray_num_gpus,
                     include_dashboard=rt.dashboard, runtime_env=env or None,
                     logging_level="WARNING", configure_logging=True)
        except Exception as e:  # Ray reports a start-up timeout as a bare Exception
            if "timed out during startup" not in str(e):
                raise
            raise RayStartError("the local Ray did not start in time (is the machine "
                                "overloaded?); nothing was created, run the command again") \
                from None
    return True


def _join(rt, env: dict) -> None:
    """``ray.init`` on ``runtime.address``; an unreachable head is a ConfigError within
    ``runtime.connect_timeout_s``."""
    target = rt.address.removeprefix("ray://")
    if ":" in target:
        host, port = target.rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=rt.connect_timeout_s).close()
        except OSError as e:
            raise ConfigError("runtime.address", rt.address,
                              f"a reachable Ray head (no connection within "
                              f"{rt.connect_timeout_s:g} s: {e.strerror or e})") from None
    try:
        ray.init(address=rt.address, runtime_env=env or None, logging_level="WARNING")
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
        raise ConfigError("runtime.address", rt.address,
                          f"a running Ray cluster ({type(e).__name__}: "
                          f"{' '.join(str(e).split())[:300]})") from None


def require_actor_resources(cfg) -> None:
    """A ConfigError when the cluster cannot hold the run's client actors."""
    rt = cfg.runtime
    have = ray.cluster_resources()
    cpu_need = rt.num_actors * rt.cpus_per_actor
    gpu_need = rt.num_actors * rt.gpus_per_actor
    if have.get("CPU", 0) + 1e-9 < cpu_need:
        raise ConfigError("runtime.cpus_per_actor", rt.cpus_per_actor,
                          f"num_actors × cpus_per_actor ≤ the cluster's {have.get('CPU', 0):g} "
                          f"CPUs (asked for {cpu_need:g})")
    if gpu_need and have.get("GPU", 0) + 1e-9 < gpu_need:
        raise ConfigError("runtime.gpus_per_actor", rt.gpus_per_actor,
                          f"num_actors × gpus_per_actor ≤ the cluster's {have.get('GPU', 0):g} "
                          f"GPUs (asked for {gpu_need:g})")
