#!/bin/bash
# Accuracy against uploaded bytes (configs/privacy/compression_fmnist.yaml): no compression,
# QSGD 8/4/2 bits, top-1 % with and without error feedback.
# Outputs: runs/privacy/cmp-*; tables: python benchmarks/privacy/summarize.py
cd "$(dirname "$0")/../.."
run() {  # name, overrides...
  local name=$1; shift
  .venv/bin/rayfl run configs/privacy/compression_fmnist.yaml name=$name \
    output_dir=runs/privacy --quiet "$@"
}
run cmp-none compression=null
for b in 8 4 2; do run cmp-qsgd$b compression.bits=$b; done
for ef in false true; do
  run cmp-top1-ef$ef compression.method=topk compression.fraction=0.01 compression.error_feedback=$ef
done
