"""Registering components from Python: no module path in the config, no worker hook.

Run it: ``python examples/register_api.py`` (a few seconds on synthetic data, 2 Ray actors).
Objects registered in a script travel to every Ray worker inside the run's config.
"""

import rayfl
from rayfl.algorithms.base import Algorithm, ClientResult, LocalRule


class Damped(LocalRule):
    def direction(self, g, y, lr):
        return 0.5 * g


@rayfl.register_algorithm(name="half_step")
class HalfStep(Algorithm):
    """FedAvg with every local step halved."""

    def client_train(self, task, ctx):
        return ClientResult(ctx.train(Damped()))


if __name__ == "__main__":
    import os
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = rayfl.run(os.path.join(root, "configs", "test", "tiny.yaml"),
                       ["algorithm.name=half_step", "rounds=2", *sys.argv[1:]], quiet=True)
    print(f"half_step: final accuracy {result.summary['final_accuracy']:.3f}, "
          f"model_sha256 {result.summary['model_sha256']}")
