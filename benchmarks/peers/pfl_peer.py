"""The peers' reference workload in Apple's pfl 0.6 (``pfl[pytorch]``), its own venv.

Run as the contract says::

    python benchmarks/peers/pfl_peer.py --workload /tmp/wl.npz --out /tmp/result.json \
        --rounds 22 --workers 2

That process only launches pfl's multi-process simulation, as pfl's benchmarks run it:
``torchrun --nproc_per_node <workers>`` (here ``python -m torch.distributed.run --standalone``)
re-runs this script with ``--worker`` in each process. pfl's ``PyTorchDistributedContext`` sees
torchrun's variables and joins a gloo process group; each process has one torch thread.

In each process, as pfl's PyTorch benchmarks set a simulation up:

- ``FederatedDataset`` over the workload's 100 clients, whose ``user_sampler`` returns the
  plan's clients in order, so round t trains exactly ``Workload.plan[t]``. pfl splits a cohort
  round-robin over the processes (cohort index i goes to rank i % W; every rank draws W users for
  each user it takes and keeps the one at its own rank), so each rank's sampler walks the plan
  in that pattern: see ``plan_sampler``.
- ``PyTorchModel`` around ``build_model()``'s network, local optimiser
  ``SGD(momentum 0.9, weight decay 0.001)`` at ``NNTrainHyperParams``' lr 0.01, batch 50, one
  epoch; central optimiser plain ``SGD(lr=1.0)`` (so the new model is the old one plus the
  averaged update: FedAvg).
- ``FederatedAveraging`` with ``NNAlgorithmParams`` (cohort 10, ``rounds`` central iterations,
  no validation cohort) and a ``SimulatedBackend`` whose postprocessor ``WeightByDatapoints``
  makes the average sample-count weighted (pfl's default weight is 1 a user: an unweighted
  mean). Each process sums its users' weighted updates; pfl all-reduces the sums and the weights
  across processes and every process applies the same averaged update.

Local training (``--local-loop``):

- ``workload`` (default): ``FederatedAveraging.train_one_user`` is overridden to call the
  contract's ``train_client(model, x, y, client_seed(t, c))`` on the PyTorch module, then pfl's
  own ``get_model_difference`` makes the update. Everything else is pfl's.
- ``pfl``: pfl's own local loop (``PyTorchSGDBridge.do_sgd`` via ``do_multiple_epochs_of``) with
  the same optimiser, batch and epoch. pfl's ``Dataset.iter`` does not shuffle, so the client's
  rows are permuted first with the ``client_seed(t, c)`` permutation that ``train_client`` would
  draw — same batches, same steps.

Two more things differ from a plain pfl run: local evaluation is switched off in every round
(pfl's ``FederatedNNAlgorithm`` evaluates each user before and after training in iteration 0
whatever ``evaluation_frequency`` says), and metrics are not printed each round
(``send_metrics_to_platform=False``). The round timer lives in a pfl callback: it starts in
``on_train_begin`` (after the process group, the data and the model are set up) and ticks in
``after_central_iteration``, after the averaged update is applied, with the round's data points
as pfl counted them (checked against the plan). Only rank 0 writes the report and the model.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from workload import arguments  # noqa: E402


def parse_args(argv=None):
    p = arguments(__doc__)
    p.add_argument("--local-loop", choices=("workload", "pfl"), default="workload",
                   help="train_client from workload.py (default) or pfl's own SGD loop")
    p.add_argument("--worker", action="store_true",
                   help="internal: this process is one of torchrun's workers")
    return p.parse_args(argv)


def launch(args) -> int:
    """Re-run this script under torchrun, one process per worker."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={args.workers}", os.path.abspath(__file__),
           "--workload", args.workload, "--out", args.out,
           *(["--rounds", str(args.rounds)] if args.rounds else []), "--workers", str(args.workers), "--local-loop", args.local_loop, "--worker"]
    # One thread a process (torchrun would set this too, with a warning).
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return subprocess.call(cmd, env=env)


def plan_sampler(plan, rank: int, world_size: int):
    """A ``callable() -> user_id`` for this rank that makes pfl's round-robin cohort split
    train exactly ``plan[t]`` in round t.

    pfl (``FederatedDataset.get_cohort`` with ``_distributed_sampler``) gives cohort index i to
    rank ``i % world_size``; for each index it takes, a rank calls the sampler ``world_size``
    times and keeps the user at position ``rank``. So in a round this rank draws blocks
    ``plan[t][j*W:(j+1)*W]`` for j = 0 .. (indices it owns) - 1; a block's tail past the
    cohort's end (never this rank's position) is padded."""
    import numpy as np

    cohort = plan.shape[1]

    def walk():
        for t in range(plan.shape[0]):
            row = plan[t]
            for j in range(len(range(rank, cohort, world_size))):
                for w in range(world_size):
                    k = j * world_size + w
                    yield int(row[k] if k < cohort else row[-1])
        raise RuntimeError("pfl asked for more users than the plan has rounds")

    it = walk()
    assert np.all(plan >= 0)
    return lambda: next(it)


def worker(args) -> None:
    import numpy as np
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*reduce_op.* is deprecated")  # pfl's all-reduce
    np.random.seed(0)  # pfl draws its (here unused) seeds from numpy; same on every rank

    from workload import (LOOP, RoundTimer, Workload, build_model, client_seed, report,
                          train_client)

    # Importing pfl's PyTorch model selects pfl's PyTorch ops, which join torchrun's
    # process group (gloo on CPU).
    from pfl.aggregate.base import get_num_datapoints_weight_name
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByDatapoints
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.common_types import Population
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.hyperparam import NNTrainHyperParams
    from pfl.internal.ops.selector import get_default_framework_module as get_ops
    from pfl.metrics import Metrics
    from pfl.model.pytorch import PyTorchModel
    from pfl.version import __version__ as pfl_version

    dist = get_ops().distributed
    rank, world = dist.global_rank, dist.world_size
    assert world == args.workers, (world, args.workers)

    wl = Workload.load(args.workload)
    rounds = args.rounds or len(wl.plan)
    plan = wl.plan[:rounds]
    assert len(plan) == rounds, f"the workload plans {len(wl.plan)} rounds, not {rounds}"
    cohort = int(plan.shape[1])
    round_samples = [sum(wl.size(int(c)) for c in plan[t]) * LOOP["epochs"]
                     for t in range(rounds)]

    def make_user(c):
        x, y = wl.client(c)
        return Dataset(raw_data=[x, y], user_id=c)

    train_data = FederatedDataset(make_user, plan_sampler(plan, rank, world))

    class PflNet(torch.nn.Sequential):
        """The workload's network with the ``loss`` and ``metrics`` pfl's PyTorchModel needs
        (same modules, so the same state-dict keys)."""

        def loss(self, x, y):
            self.train()
            return torch.nn.functional.cross_entropy(self(x), y)

        @torch.no_grad()
        def metrics(self, x, y):
            from pfl.metrics import Weighted
            self.eval()
            out = self(x)
            return {"loss": Weighted(torch.nn.functional.cross_entropy(
                out, y, reduction="sum").item(), len(y)),
                "accuracy": Weighted((out.argmax(1) == y).sum().item(), len(y))}

    net = PflNet(*build_model().children())
    model = PyTorchModel(
        model=net,
        local_optimizer_create=functools.partial(
            torch.optim.SGD, momentum=LOOP["momentum"], weight_decay=LOOP["weight_decay"]),
        central_optimizer=torch.optim.SGD(
            [p for p in net.parameters() if p.requires_grad], lr=1.0))

    local_loop = args.local_loop

    class PlanFedAvg(FederatedAveraging):
        """pfl's FedAvg; local training on the workload's seeds, no local evaluation."""

        def get_next_central_contexts(self, *a, **k):
            contexts, m, metrics = super().get_next_central_contexts(*a, **k)
            if contexts is not None:
                contexts = tuple(dataclasses.replace(c, do_evaluation=False)
                                 for c in contexts)
            return contexts, m, metrics

        def train_one_user(self, initial_model_state, model, user_dataset, central_context):
            t, c = central_context.current_central_iteration, int(user_dataset.user_id)
            assert c in plan[t], f"round {t} trained client {c}, not in its plan"
            x, y = user_dataset.raw_data
            seed = client_seed(t, c)
            if local_loop == "workload":
                train_client(model.pytorch_model, x, y, seed)
                return model.get_model_difference(initial_model_state), Metrics()
            # pfl's own loop; one epoch of sequential batches over train_client's permutation
            perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
            shuffled = Dataset(raw_data=[x[perm], y[perm]], user_id=c)
            return super().train_one_user(initial_model_state, model, shuffled,
                                          central_context)

    datapoints_name = get_num_datapoints_weight_name(Population.TRAIN)

    class Timer(TrainingProcessCallback):
        def on_train_begin(self, *, model):
            self.timer = RoundTimer()  # the clock starts as round 0 starts
            return Metrics()

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            samples = int(round(aggregate_metrics[datapoints_name].weighted_value))
            assert samples == round_samples[central_iteration], (
                central_iteration, samples, round_samples[central_iteration])
            self.timer.tick(samples)
            return False, Metrics()

    timer = Timer()
    backend = SimulatedBackend(training_data=train_data, val_data=None,
                               postprocessors=[WeightByDatapoints()])
    algo_params = NNAlgorithmParams(central_num_iterations=rounds, evaluation_frequency=1,
                                    train_cohort_size=cohort, val_cohort_size=None)
    train_params = NNTrainHyperParams(local_learning_rate=LOOP["lr"],
                                      local_num_epochs=LOOP["epochs"],
                                      local_batch_size=LOOP["batch_size"])
    model = PlanFedAvg().run(algorithm_params=algo_params, backend=backend, model=model,
                             model_train_params=train_params, callbacks=[timer],
                             send_metrics_to_platform=False)

    if rank == 0:
        state = {k: v.detach().cpu().clone() for k, v in model.pytorch_model.state_dict().items()}
        assert list(state) == list(build_model().state_dict()), "state-dict keys drifted"
        torch.save(state, args.out + ".pt")
        loop = ("train_client from workload.py inside FederatedAveraging.train_one_user"
                if local_loop == "workload" else
                "pfl's own SGD loop (do_sgd) over the client's rows in train_client's "
                "client_seed permutation")
        report(args.out, f"pfl {pfl_version}", timer.timer.rounds,
               note=(f"{world} torchrun processes (gloo), 1 torch thread each; pfl "
                     f"FederatedDataset + SimulatedBackend + FederatedAveraging, cohort split "
                     f"round-robin over processes and all-reduced; user sampler replays "
                     f"Workload.plan; WeightByDatapoints (sample-count weighted); central "
                     f"SGD lr 1.0; local: {loop}; local evaluation off; clock starts at "
                     f"on_train_begin, after process-group and data set-up"),
               workers=world, local_loop=local_loop)
        print(f"pfl {pfl_version}: {rounds} rounds, {world} processes, "
              f"{sum(s for s, _ in timer.timer.rounds)} samples, "
              f"{sum(d for _, d in timer.timer.rounds):.1f} s")


def main() -> int:
    args = parse_args()
    if not args.worker:
        return launch(args)
    worker(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
