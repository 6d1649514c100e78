"""rayfl: a Ray-based simulator for large-scale cross-device federated learning."""

from rayfl.config import Config, ConfigError, load as load_config
from rayfl.contract import ComponentError
from rayfl.registry import registrar
from rayfl.simulation import RunResult, resume, run

# Bring your own component: ``@rayfl.register_algorithm`` (or ``register_algorithm(MyAlgo,
# name="mine")``) makes ``algorithm.name: mine`` work; likewise models, datasets, availability
# models, client selectors and server wrappers.
register_algorithm = registrar("algorithm")
register_model = registrar("model")
register_dataset = registrar("dataset")
register_availability = registrar("availability")
register_selector = registrar("selector")
register_wrapper = registrar("wrapper")
register_server_opt = registrar("server_opt")

__all__ = ["ComponentError", "Config", "ConfigError", "RunResult", "load_config", "resume", "run",
           "register_algorithm", "register_model", "register_dataset", "register_availability",
           "register_selector", "register_wrapper", "register_server_opt"]
__version__ = "0.1.0"
