"""rayfl: a Ray-based simulator for large-scale cross-device federated learning."""

from rayfl.config import Config, ConfigError, load as load_config
from rayfl.simulation import RunResult, resume, run

__all__ = ["Config", "ConfigError", "RunResult", "load_config", "resume", "run"]
__version__ = "0.1.0"
