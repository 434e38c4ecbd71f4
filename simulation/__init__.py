"""Run one experiment through Flower's simulation engine and write its results folder.

    headway run CONFIG.toml --out DIR [--set key=value ...] [--overwrite]

(``python -m headway.simulation`` is the same command, kept for scripts.)

CONFIG.toml holds run-config keys (top level, or under [run-config]); --set overrides
them. Every virtual client is a Flower SuperNode in Flower's Ray-based simulation.

This package is the one place that brings the ServerApp (``server``) and the ClientApp
(``client``) together; neither of those imports the other, nor this.

Before the engine starts, pre-flight checks stop a run that cannot work, each with one
line ``error: ...`` on stderr and exit code 2: a bad config key or value (seed outside
0..2**32-1, feature-dim above its bound, min-replies above the clients a round asks), a
``classes-per-client`` above the data set's classes, a results folder that already holds
files (without --overwrite), a data set that is neither on disk nor downloadable, a
partition the data cannot give (e.g. a ``fedprof-val-size`` that leaves clients no rows),
and whatever the method's strategy refuses (``headway.server.app.check_strategy``, e.g. a
``fedprof-layer`` that is not a layer of the model). A run that stops early still leaves
summary.json, with status "failed" or "interrupted" and the reason; a run in which no
round aggregated is "failed". Exit codes: 0 complete, 1 failed, 2 refused before
starting, 130 interrupted by Ctrl-C (SIGINT), 143 by SIGTERM.
"""

from headway.simulation.runner import load_config, main, parse_value, simulate

__all__ = ["simulate", "load_config", "parse_value", "main"]
