"""``python -m simulation ...``: the same command as ``headway run ...``, kept for scripts and the benchmarks."""

from simulation.runner import main

raise SystemExit(main(prog="python -m simulation"))
