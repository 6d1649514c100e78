#!/bin/bash
# The sync and FedAsync runs, started beside the FedBuff run of run_experiment.sh (same config).
cd /work/wt-async
export PYTHONPATH=$PWD
CFG=configs/async/fedbuff_fmnist.yaml
run() { name=$1; shift; /work/main/.venv/bin/python -c 'import sys; from rayfl.cli import main; sys.exit(main())' run $CFG --quiet --run-dir results/$name "$@" > results/$name.log 2>&1; echo "$name rc=$?" >> results/progress.txt; }
run fedavg_sync aggregation.mode=sync &
run fedasync aggregation.mode=fedasync aggregation.buffer_size=null aggregation.concurrency=10 aggregation.mixing=0.6 rounds=1000 eval.every=20 &
wait
