#!/bin/bash
# Accuracy against uploaded bytes: no compression, QSGD 8/4/2 bits, top-1% and rand-1% with and
# without error feedback (configs/privacy/compression_fmnist.yaml).
cd "$(dirname "$0")/.."
run() {  # name, overrides...
  local name=$1; shift
  PYTHONPATH=$PWD nice -n 19 /work/main/.venv/bin/python -c "from rayfl.cli import main; main()" \
    run configs/privacy/compression_fmnist.yaml name=$name output_dir=results/runs --quiet "$@" \
    > results/$name.log 2>&1
}
run cmp-none compression=null
for b in 8 4 2; do run cmp-qsgd$b compression.bits=$b; done
for ef in false true; do
  run cmp-top1-ef$ef compression.method=topk compression.fraction=0.01 compression.error_feedback=$ef
done
