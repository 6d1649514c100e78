"""The peers' reference workload (``workload.py``) in Flower 1.42's simulation engine.

    python benchmarks/peers/flower_peer.py --workload /tmp/wl.npz --out /tmp/result.json \
        --rounds 22 --workers 2

run in its own environment (``requirements-flower.txt``). As a Flower user would write it: a
``ClientApp`` and a ``ServerApp`` (message API) started by ``flwr.simulation.run_simulation`` on
the Ray backend, with 100 virtual SuperNodes whose ``partition-id`` is the workload's client id,
and ``backend_config`` giving Ray ``--workers`` CPUs and each ClientApp 1 CPU, so that
``--workers`` ClientAppActors (Ray actor processes) train clients in parallel.

Round t trains exactly ``plan[t]``. The ServerApp sees only opaque node ids (``Grid`` exposes no
node config), so before the rounds it asks every node for its partition-id with a ``query``
message (Flower's message type for custom requests); that start-up exchange also loads the
workload into each actor. A FedAvg subclass then addresses round t's training messages to the
nodes of ``plan[t]``, aggregates with FedAvg's own sample-weighted mean (``num-examples``), and
times each round with ``RoundTimer`` (the clock starts as round 1 is configured). No evaluation.

The script re-imports itself as the module ``flower_peer`` so that the ClientApp Ray ships to
the actors refers to this module by name (imported there through the PYTHONPATH Flower gives
Ray) and each actor keeps the workload it loaded between messages.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from flwr.app import (  # noqa: E402
    ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict)
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402

import workload as W  # noqa: E402

PARTITION_ID = "partition-id"
QUERY_PARTITION = "query.partition"

# ---------------------------------------------------------------------------------------------
# ClientApp (runs in the Ray actors)
# ---------------------------------------------------------------------------------------------

_PROCESS: dict = {}  # per actor process: the loaded workload and a model to train in


def _local(path: str) -> tuple[W.Workload, torch.nn.Module]:
    """This process's workload and model, loaded on the first message it handles."""
    if _PROCESS.get("path") != path:
        torch.set_num_threads(1)
        _PROCESS.update(path=path, wl=W.Workload.load(path), model=W.build_model())
    return _PROCESS["wl"], _PROCESS["model"]


client_app = ClientApp()


@client_app.query("partition")
def partition(msg: Message, context: Context) -> Message:
    """Tell the server this node's partition-id (and load the workload while at it)."""
    _local(str(msg.content["config"]["workload"]))
    pid = int(context.node_config[PARTITION_ID])
    return Message(RecordDict({"partition": ConfigRecord({PARTITION_ID: pid})}), reply_to=msg)


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    """Train this node's client from the global model: ``workload.train_client``."""
    config = msg.content["config"]
    wl, model = _local(str(config["workload"]))
    c, t = int(context.node_config[PARTITION_ID]), int(config["server-round"]) - 1
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = wl.client(c)
    samples = W.train_client(model, x, y, W.client_seed(t, c))
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()),
                               "metrics": MetricRecord({"num-examples": samples})}),
                   reply_to=msg)


# ---------------------------------------------------------------------------------------------
# ServerApp (runs in a thread of this process)
# ---------------------------------------------------------------------------------------------


class PlannedFedAvg(FedAvg):
    """FedAvg whose round t trains the nodes of ``plan[t]``, timed with ``RoundTimer``."""

    def __init__(self, plan: np.ndarray, node_of: dict[int, int]):
        super().__init__(fraction_evaluate=0.0)  # no federated evaluation
        self.plan, self.node_of = plan, node_of
        self.timer: W.RoundTimer | None = None

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid):
        if server_round == 1:
            self.timer = W.RoundTimer()  # the clock starts with the first round
        config["server-round"] = server_round
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        nodes = [self.node_of[int(c)] for c in self.plan[server_round - 1]]
        return self._construct_messages(record, nodes, "train")

    def aggregate_train(self, server_round: int, replies):
        replies = list(replies)
        bad = [m for m in replies if m.has_error()]
        if bad or len(replies) != self.plan.shape[1]:
            raise RuntimeError(f"round {server_round}: {len(replies)} replies, errors: "
                               f"{[m.error.reason for m in bad]}")
        arrays, metrics = super().aggregate_train(server_round, replies)
        self.timer.tick(sum(int(m.content["metrics"]["num-examples"]) for m in replies))
        return arrays, metrics


def make_server_app(args: argparse.Namespace, num_nodes: int, result: dict) -> ServerApp:
    with np.load(args.workload) as f:
        plan = f["plan"][:args.rounds]
    assert len(plan) == args.rounds, f"the workload plans only {len(plan)} rounds"
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        # Wait for the simulation engine to register every SuperNode, then learn which node
        # holds which partition (the Grid only knows node ids).
        while len(node_ids := list(grid.get_node_ids())) < num_nodes:
            time.sleep(0.1)
        query = RecordDict({"config": ConfigRecord({"workload": args.workload})})
        replies = list(grid.send_and_receive(
            [Message(query, dst_node_id=n, message_type=QUERY_PARTITION) for n in node_ids]))
        if len(replies) != num_nodes or any(m.has_error() for m in replies):
            raise RuntimeError("partition query failed: "
                               f"{[m.error.reason for m in replies if m.has_error()][:3]}")
        node_of = {int(m.content["partition"][PARTITION_ID]): m.metadata.src_node_id
                   for m in replies}
        assert sorted(node_of) == list(range(num_nodes))

        strategy = PlannedFedAvg(plan, node_of)
        torch.manual_seed(0)
        out = strategy.start(grid=grid, initial_arrays=ArrayRecord(W.build_model().state_dict()),
                             num_rounds=args.rounds,
                             train_config=ConfigRecord({"workload": args.workload}))
        result.update(arrays=out.arrays, rounds=strategy.timer.rounds)

    return app


def main() -> None:
    ap = W.arguments(__doc__)
    args = ap.parse_args()
    args.workload = os.path.abspath(args.workload)
    torch.set_num_threads(1)
    logging.getLogger("flwr").setLevel(logging.ERROR)  # Flower logs every round at INFO
    warnings.filterwarnings("ignore", category=FutureWarning, module="ray")  # a GPU env tip

    import flwr
    from flwr.simulation import run_simulation

    with np.load(args.workload) as f:
        num_nodes = len(f["offsets"]) - 1
    result: dict = {}
    run_simulation(
        server_app=make_server_app(args, num_nodes, result),
        client_app=client_app,
        num_supernodes=num_nodes,
        backend_name="ray",
        # log_to_driver off: the actors print nothing of ours, and a pre-started Ray worker
        # occasionally dies at start-up (SIGSEGV in Ray's metrics thread; Ray starts another)
        # and would dump its trace here
        backend_config={"init_args": {"num_cpus": args.workers, "log_to_driver": False},
                        "client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    if "rounds" not in result:
        raise SystemExit("the ServerApp did not finish")

    W.report(args.out, f"Flower {flwr.__version__}", result["rounds"],
             note=f"flwr.simulation.run_simulation, Ray backend (ray init num_cpus="
                  f"{args.workers}, client_resources num_cpus=1): {args.workers} "
                  "ClientAppActor processes, torch.set_num_threads(1) in each; "
                  f"{num_nodes} SuperNodes, partition-id = client id; message-API ServerApp "
                  "with a FedAvg subclass sending round t's train messages to the nodes of "
                  "plan[t] (node -> partition-id learned by a query message to every node "
                  "before round 1, which also loads the workload in each actor); FedAvg's "
                  "aggregation weighted by num-examples; no evaluation; rounds timed in the "
                  "strategy from round 1's configure_train to each aggregate_train's end")
    state = {k: v.clone() for k, v in result["arrays"].to_torch_state_dict().items()}
    torch.save(state, args.out + ".pt")
    r = result["rounds"]
    print(f"Flower {flwr.__version__}: {len(r)} rounds, {sum(s for s, _ in r)} samples, "
          f"{sum(d for _, d in r):.1f} s")


if __name__ == "__main__":
    # Run as the module ``flower_peer`` so the ClientApp is pickled by reference (see above).
    import flower_peer
    flower_peer.main()
