"""The Optuna layer: studies over rayfl runs, from a study YAML, with parallel trials on Ray.

``rayfl tune STUDY.yaml`` (or ``python -m tune STUDY.yaml``); in Python::

    from tune import load, run_study
    summary = run_study(load("configs/studies/adabest_fmnist.yaml"))

or, from a study written as a dict, ``run_study(build({...}))``.

See ``tune/README.md`` for the study keys.
"""

from tune.driver import run_study
from tune.spec import build, load

__all__ = ["build", "load", "run_study"]
