"""Run outputs: the per-round metrics table, the summary, plots and Ray metrics."""
