"""``python -m headway.simulation ...``: the same command as ``headway run ...``, kept for scripts and the benchmarks."""

from headway.simulation.runner import main

raise SystemExit(main(prog="python -m headway.simulation"))
