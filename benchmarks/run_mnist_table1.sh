#!/usr/bin/env bash
# FedLog Table 1, MNIST: FedAvg, FedLog and FedLog-C on the same setup, one seed per call.
#   bash benchmarks/run_mnist_table1.sh [SEED] [METHOD ...]     (about 15 min per method on 2 cores)
# A results folder that already holds files is refused; OVERWRITE=1 replaces it.
set -euo pipefail
cd "$(dirname "$0")/.."
seed="${1:-0}"; shift || true
methods=("${@:-fedavg fedlog fedlog-c}")
for method in ${methods[@]}; do
  case "$method" in
    fedavg)   extra=(--set algorithm=fedavg) ;;
    fedlog)   extra=(--set algorithm=fedlog) ;;
    fedlog-c) extra=(--set algorithm=fedlog --set fedlog-alpha=0.01) ;;
    *) echo "unknown method $method" >&2; exit 2 ;;
  esac
  .venv/bin/python -m headway run benchmarks/configs/mnist-table1.toml "${extra[@]}" --set seed="$seed" \
      --out "benchmarks/results/mnist-table1/${method}-seed${seed}" ${OVERWRITE:+--overwrite}
done
