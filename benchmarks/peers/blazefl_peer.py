"""The peers' reference workload in BlazeFL 2.0.3, its own venv (``requirements-blazefl.txt``).

Run as the contract says::

    python benchmarks/peers/blazefl_peer.py --workload /tmp/wl.npz --out /tmp/result.json \
        --rounds 22 --workers 2 [--mode processes|threads] [--ipc shared_memory|storage]

Built as BlazeFL's quickstart FedAvg example builds a simulation, from BlazeFL's own pieces:

- the server is a ``FedAvgBaseServerHandler`` (BlazeFL's FedAvg server, a ``BaseServerHandler``)
  whose ``sample_clients`` returns ``Workload.plan[t]`` instead of drawing its own sample; its
  ``load`` / ``global_update`` / ``aggregate`` are BlazeFL's own (uplinks sorted by client id,
  flat parameter vectors averaged by ``data_size``, written back with ``deserialize_model``);
- the clients run in BlazeFL's parallel trainers, subclassed as ``contrib/fedavg.py`` does:
  ``--mode processes`` is a ``ProcessPoolClientTrainer`` (a ``torch.multiprocessing`` pool of
  ``--workers`` processes, made anew each round by BlazeFL; the parameters travel through shared
  memory, ``--ipc shared_memory``, or through files, ``--ipc storage``), ``--mode threads`` a
  ``ThreadPoolClientTrainer`` (a ``ThreadPoolExecutor`` of ``--workers`` threads in this
  process). Each worker sets ``torch.set_num_threads(1)`` and trains its client with the
  contract's ``train_client(model, x, y, client_seed(t, c))``;
- the driver is the example's pipeline loop: sample, downlink, ``local_process``, uplink,
  ``load``; no evaluation (the example's ``get_summary``), no checkpoint;
- the client data is a ``PartitionedDataset`` as in the example: each client's rows saved once
  to a file of its own before the clock starts, loaded by the worker that trains it.

Default ``--mode processes``: BlazeFL's README marks the multi-threaded mode "Recommended" but
says that "to achieve true parallelism, this mode requires a Python 3.14+ free-threading build.
Without it, performance will be limited by the Global Interpreter Lock (GIL), resulting in
concurrency rather than true parallelism", while the multi-process mode "utilizes separate
processes to achieve true parallelism". This Python (3.11) has the GIL, so processes is the fast
mode by BlazeFL's own account (torch kernels do release the GIL, so threads may still overlap).
``--ipc shared_memory`` is the example's setting; ``--start-method`` is the platform's (fork on
Linux with Python 3.11; the example sets spawn, for CUDA).

BlazeFL makes a new pool every round, so with fork each round's workers start from the server
process as it is. Before the clock the server trains one batch with the contract's loop (on a
throwaway model), so they inherit what torch sets up lazily on first use — chiefly the import of
``torch._dynamo`` at the optimiser's first ``zero_grad``, 1–2 s here — as any framework's
persistent workers carry it from round to round. ``--cold-workers`` leaves that out (stock
behaviour: every round's workers pay it again); with spawn or forkserver it makes no difference.

Two departures from stock BlazeFL, both forced: BlazeFL 2.0.3 declares Python >= 3.12 but its code
runs on 3.11 (installed with pip's ``--ignore-requires-python``); and its ``serialize_model``
(``param.data.view(-1)``) fails on a channels-last convolution weight ("view size is not
compatible with input tensor's size and stride"), so the flat vectors are made here with
``reshape(-1)`` (the same layout ``deserialize_model`` reads back).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import torch
import torch.multiprocessing as mp
from blazefl.contrib import FedAvgBaseServerHandler, FedAvgUplinkPackage
from blazefl.contrib.fedavg import FedAvgProcessPoolUplinkPackage
from blazefl.core import (
    IPCMode,
    ModelSelector,
    PartitionedDataset,
    ProcessPoolClientTrainer,
    SHMHandle,
    ThreadPoolClientTrainer,
    deserialize_model,
)
from torch.utils.data import TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workload import arguments, LOOP, RoundTimer, Workload, build_model, client_seed, report, train_client  # noqa: E402

VERSION = "2.0.3"


def serialize_model(model: torch.nn.Module) -> torch.Tensor:
    """BlazeFL's ``serialize_model`` with ``reshape`` for ``view``: channels-last weights are not
    contiguous. The vector is in logical (NCHW) order, as ``deserialize_model`` expects."""
    return torch.cat([v.detach().reshape(-1) for v in model.state_dict().values()]).cpu()


class ModelName(StrEnum):
    FMNIST_CNN = "fmnist_cnn"


class WorkloadModelSelector(ModelSelector[ModelName]):
    def select_model(self, model_name: ModelName) -> torch.nn.Module:
        assert model_name == ModelName.FMNIST_CNN
        return build_model()


class PartitionType(StrEnum):
    TRAIN = "train"


class PartitionedWorkload(PartitionedDataset[PartitionType]):
    """Each client's rows in a file of its own under ``path`` (as the example's
    ``PartitionedCIFAR10`` keeps its split); pickles as a path, so it crosses processes cheaply."""

    def __init__(self, data: Workload, path: Path) -> None:
        self.path = path
        self.path.joinpath(PartitionType.TRAIN).mkdir(parents=True, exist_ok=True)
        for cid in range(data.num_clients):
            x, y = data.client(cid)
            torch.save(TensorDataset(x.clone(), y.clone()), self._file(PartitionType.TRAIN, cid))

    def _file(self, type_: PartitionType, cid: int | None) -> Path:
        return self.path.joinpath(type_, f"{cid}.pt")

    def get_dataset(self, type_: PartitionType, cid: int | None) -> TensorDataset:
        dataset = torch.load(self._file(type_, cid), weights_only=False)
        assert isinstance(dataset, TensorDataset)
        return dataset

    # BlazeFL's PartitionedDataset declares these two abstract; this peer never calls them
    # (the partition is written once above, and train_client batches a client's rows itself),
    # so a call would be a bug in the peer: refused loudly rather than half-implemented.
    def set_dataset(self, type_, cid, dataset) -> None:
        raise NotImplementedError("blazefl_peer: the workload's partition is fixed; "
                                  "set_dataset is never called")

    def get_dataloader(self, type_, cid, batch_size, generator):
        raise NotImplementedError("blazefl_peer: train_client batches a client's rows itself; "
                                  "get_dataloader is never called")


@dataclass
class DownlinkPackage:
    """FedAvg's downlink (the global model's flat parameters) and the round, which
    ``client_seed`` needs."""

    model_parameters: torch.Tensor
    round: int


class PlanServerHandler(FedAvgBaseServerHandler):
    """BlazeFL's FedAvg server, sampling the workload's plan: round t's clients are ``plan[t]``."""

    def __init__(self, model_selector: ModelSelector, model_name: ModelName, plan,
                 global_round: int, device: str = "cpu") -> None:
        # FedAvgBaseServerHandler.__init__ needs a test set and a sample ratio; its load,
        # global_update, aggregate and if_stop need only these attributes.
        self.model = model_selector.select_model(model_name)
        self.plan = plan
        self.global_round = global_round
        self.num_clients_per_round = int(plan.shape[1])
        self.device = device
        self.client_buffer_cache: list[FedAvgUplinkPackage] = []
        self.round = 0

    def sample_clients(self) -> list[int]:
        return [int(c) for c in self.plan[self.round]]

    def downlink_package(self) -> DownlinkPackage:
        return DownlinkPackage(serialize_model(self.model), self.round)


def train_one(model_selector: ModelSelector, model_name: ModelName,
              dataset: PartitionedWorkload, cid: int, payload: DownlinkPackage):
    """One client: the global model, the contract's local loop, the flat result."""
    torch.set_num_threads(1)
    model = model_selector.select_model(model_name)
    deserialize_model(model, payload.model_parameters)
    x, y = dataset.get_dataset(PartitionType.TRAIN, cid).tensors
    samples = train_client(model, x, y, client_seed(payload.round, cid))
    return serialize_model(model), samples


@dataclass
class ClientConfig:
    """What a pool process needs for one client (``FedAvgClientConfig``'s role)."""

    model_selector: ModelSelector
    model_name: ModelName
    dataset: PartitionedWorkload
    cid: int


class PlanProcessPoolClientTrainer(
    ProcessPoolClientTrainer[FedAvgProcessPoolUplinkPackage, DownlinkPackage, ClientConfig]
):
    """``FedAvgProcessPoolClientTrainer``'s shape with the contract's local loop."""

    def __init__(self, model_selector: ModelSelector, model_name: ModelName,
                 dataset: PartitionedWorkload, share_dir: Path, num_parallels: int,
                 ipc_mode: IPCMode, device: str = "cpu") -> None:
        self.model_selector, self.model_name, self.dataset = model_selector, model_name, dataset
        self.num_parallels = num_parallels
        self.share_dir = share_dir
        self.share_dir.mkdir(parents=True, exist_ok=True)
        self.device = device
        self.cache: list[FedAvgProcessPoolUplinkPackage] = []
        self.ipc_mode = ipc_mode
        self.manager = mp.Manager()
        self.stop_event = self.manager.Event()
        self.model_parameters_buffer = serialize_model(model_selector.select_model(model_name))

    def prepare_uplink_package_buffer(self) -> FedAvgProcessPoolUplinkPackage:
        return FedAvgProcessPoolUplinkPackage(
            cid=-1, model_parameters=self.model_parameters_buffer.clone(), data_size=0)

    def get_client_config(self, cid: int) -> ClientConfig:
        return ClientConfig(self.model_selector, self.model_name, self.dataset, cid)

    @staticmethod
    def worker(config: ClientConfig | Path, payload: DownlinkPackage | Path, device: str,
               stop_event: threading.Event, *,
               shm_buffer: FedAvgProcessPoolUplinkPackage | None = None,
               ) -> FedAvgProcessPoolUplinkPackage | Path:
        storage = isinstance(config, Path)
        if storage:  # IPCMode.STORAGE: the config and the payload are files
            config_path = config
            config = torch.load(config_path, weights_only=False)
            payload = torch.load(payload, weights_only=False)
        assert isinstance(config, ClientConfig) and isinstance(payload, DownlinkPackage)
        parameters, samples = train_one(config.model_selector, config.model_name,
                                        config.dataset, config.cid, payload)
        package = FedAvgProcessPoolUplinkPackage(config.cid, parameters, samples)
        if storage:
            torch.save(package, config_path)
            return config_path
        assert shm_buffer is not None and isinstance(shm_buffer.model_parameters, torch.Tensor)
        shm_buffer.model_parameters.copy_(package.model_parameters)
        package.model_parameters = SHMHandle()
        return package

    def uplink_package(self) -> list[FedAvgProcessPoolUplinkPackage]:
        package, self.cache = self.cache, []
        return package


class PlanThreadPoolClientTrainer(
    ThreadPoolClientTrainer[FedAvgUplinkPackage, DownlinkPackage]
):
    """``FedAvgThreadPoolClientTrainer``'s shape with the contract's local loop."""

    def __init__(self, model_selector: ModelSelector, model_name: ModelName,
                 dataset: PartitionedWorkload, num_parallels: int, device: str = "cpu") -> None:
        self.model_selector, self.model_name, self.dataset = model_selector, model_name, dataset
        self.num_parallels = num_parallels
        self.device = device
        self.cache: list[FedAvgUplinkPackage] = []
        self.stop_event = threading.Event()

    def worker(self, cid: int, device: str, payload: DownlinkPackage,
               stop_event: threading.Event) -> FedAvgUplinkPackage:
        parameters, samples = train_one(self.model_selector, self.model_name, self.dataset,
                                        cid, payload)
        return FedAvgUplinkPackage(cid, parameters, samples)

    def uplink_package(self) -> list[FedAvgUplinkPackage]:
        package, self.cache = self.cache, []
        return package


def main(argv=None) -> None:
    parser = arguments(__doc__)
    parser.add_argument("--mode", choices=["processes", "threads"], default="processes",
                        help="ProcessPoolClientTrainer or ThreadPoolClientTrainer (default: "
                             "processes, BlazeFL's parallel mode on a Python with the GIL)")
    parser.add_argument("--ipc", choices=["shared_memory", "storage"], default="shared_memory",
                        help="processes only: BlazeFL's IPCMode (default: the example's)")
    parser.add_argument("--cold-workers", action="store_true",
                        help="processes only: skip the server's warm-up batch before the clock, "
                             "so each round's new pool pays torch's first-use costs again")
    parser.add_argument("--start-method", choices=["fork", "spawn", "forkserver"], default=None,
                        help="processes only: multiprocessing start method (default: the "
                             "platform's)")
    args = parser.parse_args(argv)
    if args.start_method:
        mp.set_start_method(args.start_method)
    torch.set_num_threads(1)

    data = Workload.load(args.workload)
    rounds = args.rounds or len(data.plan)
    scratch = Path(tempfile.mkdtemp(prefix="blazefl-peer-"))
    trainer = None
    try:
        dataset = PartitionedWorkload(data, scratch / "split")
        selector, name = WorkloadModelSelector(), ModelName.FMNIST_CNN
        handler = PlanServerHandler(selector, name, data.plan, rounds)
        warm = (args.mode == "processes" and mp.get_start_method() == "fork"
                and not args.cold_workers)
        if args.mode == "processes":
            ipc = IPCMode.SHARED_MEMORY if args.ipc == "shared_memory" else IPCMode.STORAGE
            trainer = PlanProcessPoolClientTrainer(selector, name, dataset, scratch / "share",
                                                   args.workers, ipc)
            how = (f"ProcessPoolClientTrainer: a pool of {args.workers} processes "
                   f"({mp.get_start_method()}) made each round, IPCMode.{ipc.name}, "
                   + ("forked from a server warmed by one batch before the clock" if warm else
                      "each round's workers start cold"))
        else:
            trainer = PlanThreadPoolClientTrainer(selector, name, dataset, args.workers)
            how = f"ThreadPoolClientTrainer: {args.workers} threads in one process (GIL)"
        if warm:
            # One batch of the local loop in this process before the clock: the pool BlazeFL
            # forks each round inherits what torch set up lazily on first use (the optimiser's
            # first zero_grad imports torch._dynamo, 1-2 s), as persistent workers would.
            x, y = data.client(int(data.plan[0][0]))
            train_client(build_model(), x[:LOOP["batch_size"]], y[:LOOP["batch_size"]], 0)
        del data  # the workers read the split files

        timer = RoundTimer()
        while not handler.if_stop():
            sampled = handler.sample_clients()
            broadcast = handler.downlink_package()
            trainer.local_process(broadcast, sampled)
            uploads = trainer.uplink_package()
            assert sorted(p.cid for p in uploads) == sorted(sampled)
            for package in uploads:
                handler.load(package)
            timer.tick(sum(p.data_size for p in uploads))

        report(args.out, f"BlazeFL {VERSION}", timer.rounds,
               note=f"{how}, 1 torch thread each; FedAvgBaseServerHandler sampling the plan; "
                    f"Python {sys.version.split()[0]} (BlazeFL declares >= 3.12)")
        torch.save({k: v.detach().clone() for k, v in handler.model.state_dict().items()},
                   args.out + ".pt")
        print(f"BlazeFL {VERSION} ({args.mode}): {len(timer.rounds)} rounds, "
              f"{sum(s for _, s in timer.rounds):.1f} s")
    finally:
        if isinstance(trainer, PlanProcessPoolClientTrainer):
            trainer.manager.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
