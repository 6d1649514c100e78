"""``rayfl analyze``: loss landscapes, the loss decomposition and drift diagnostics of a run.

Modules: :mod:`~rayfl.analysis.rundir` (a run directory's config, metrics and kept models),
:mod:`~rayfl.analysis.evaluate` (many models evaluated as Ray tasks),
:mod:`~rayfl.analysis.landscape` (1-D interpolation and 2-D planes, seed 004 §5.1–5.2),
:mod:`~rayfl.analysis.decomposition` (seed 004 Theorem 1), :mod:`~rayfl.analysis.drift`
(drift diagnostics and seed 000's four-regime experiment), :mod:`~rayfl.analysis.plots` and
:mod:`~rayfl.analysis.commands` (the CLI). Every command writes into ``<run_dir>/analysis/``.
"""
