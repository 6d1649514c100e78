#!/bin/bash
# DP-FedAvg on Fashion-MNIST split over 10,000 clients (configs/privacy/dpfedavg_fmnist.yaml):
# accuracy against ε for z = 0 (clipping only), 0.5, 1, 2, and z = 1 with adaptive clipping.
# Outputs: runs/privacy/dp-*; tables: python benchmarks/privacy/summarize.py
cd "$(dirname "$0")/../.."
run() {  # name, overrides...
  local name=$1; shift
  .venv/bin/rayfl run configs/privacy/dpfedavg_fmnist.yaml rounds=200 name=$name \
    output_dir=runs/privacy --quiet "$@"
}
for z in 0.0 0.5 1.0 2.0; do run dp-z$z privacy.noise_multiplier=$z; done
run dp-z1.0-adaptive privacy.noise_multiplier=1.0 privacy.adaptive_clip.target_quantile=0.5
