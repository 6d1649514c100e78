#!/bin/bash
# FedAvg (sync) vs FedBuff vs FedAsync on Fashion-MNIST with log-normal device speeds and
# bandwidths (configs/async/fedbuff_fmnist.yaml). Outputs: runs/async/*; then summarize.sh.
cd "$(dirname "$0")/../.."
CFG=configs/async/fedbuff_fmnist.yaml
run() { name=$1; shift; .venv/bin/rayfl run $CFG --quiet --run-dir runs/async/$name "$@"; }
run fedbuff rounds=400
run fedavg_sync aggregation.mode=sync rounds=250
run fedasync aggregation.mode=fedasync aggregation.buffer_size=null aggregation.concurrency=10 \
  aggregation.mixing=0.6 rounds=2000 eval.every=20
