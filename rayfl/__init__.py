"""rayfl: a Ray-based simulator for large-scale cross-device federated learning."""

from rayfl.config import Config, ConfigError, load as load_config
from rayfl.contract import ComponentError
# Bring your own component: ``@rayfl.register_algorithm`` (or ``register_algorithm(MyAlgo,
# name="mine")``) makes ``algorithm.name: mine`` work; likewise models, datasets, availability
# models, client selectors, server wrappers, aggregation transforms, server optimisers and
# executors.
from rayfl.registry import (register_algorithm, register_availability, register_dataset,
                            register_executor, register_model, register_selector,
                            register_server_opt, register_transform, register_wrapper)
from rayfl.runtime.actor_pool import actor_pool
from rayfl.runtime.harness import simulate
from rayfl.runtime.storage import CheckpointError
from rayfl.simulation import RunResult, resume, run
from rayfl.version import __version__ as __version__  # re-exported: rayfl.__version__

__all__ = ["CheckpointError", "ComponentError", "Config", "ConfigError", "RunResult",
           "actor_pool", "load_config", "resume", "run", "simulate", "register_algorithm",
           "register_model", "register_dataset", "register_availability", "register_selector",
           "register_wrapper", "register_transform", "register_server_opt", "register_executor"]
