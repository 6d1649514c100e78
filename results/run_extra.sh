#!/bin/bash
# After run_dp.sh: DP-FedAvg z = 1 with adaptive clipping (γ = 0.5), starting from S = 0.5.
cd "$(dirname "$0")/.."
while pgrep -f "results/run_dp.sh" > /dev/null; do sleep 20; done
PYTHONPATH=$PWD nice -n 19 /work/main/.venv/bin/python -c "from rayfl.cli import main; main()" \
  run configs/privacy/dpfedavg_fmnist.yaml rounds=200 privacy.noise_multiplier=1.0 \
  privacy.adaptive_clip.target_quantile=0.5 name=dp-z1.0-adaptive output_dir=results/runs \
  --quiet > results/dp-z1.0-adaptive.log 2>&1
