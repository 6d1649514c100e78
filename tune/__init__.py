"""The Optuna layer: studies over rayfl runs, from a study YAML, with parallel trials on Ray.

``rayfl tune STUDY.yaml`` (or ``python -m tune STUDY.yaml``); in Python::

    from tune import load, run_study
    summary = run_study(load("configs/studies/adabest_fmnist.yaml"))

See ``tune/README.md`` for the study keys.
"""

from tune.driver import run_study
from tune.spec import load

__all__ = ["load", "run_study"]
