#!/bin/bash
# DP-FedAvg on Fashion-MNIST, 10,000 clients: accuracy against ε for three noise levels (+ z=0).
cd "$(dirname "$0")/.."
for z in 0.0 0.5 1.0 2.0; do
  PYTHONPATH=$PWD nice -n 19 /work/main/.venv/bin/python -c "from rayfl.cli import main; main()" \
    run configs/privacy/dpfedavg_fmnist.yaml rounds=200 privacy.noise_multiplier=$z \
    name=dp-z$z output_dir=results/runs --quiet > results/dp-z$z.log 2>&1
done
