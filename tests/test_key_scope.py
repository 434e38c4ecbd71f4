"""FedLog-C's own keys set where nothing reads them are refused in one line, not silently
ignored: fedlog-c-downlink outside FedLog-C (on plain FedLog or another algorithm), and
fedlog-beta on another algorithm (the outside probe's finding in issue 42)."""

from __future__ import annotations

import pytest
from headway.core.config import ConfigError, resolve


@pytest.mark.parametrize(
    ("config", "where"),
    [
        ({"algorithm": "fedavg", "fedlog-c-downlink": "stats"}, "algorithm=fedavg"),
        ({"algorithm": "fedpft", "fedlog-c-downlink": "stats"}, "algorithm=fedpft"),
        ({"algorithm": "fedlog", "fedlog-c-downlink": "stats"}, "plain FedLog"),
    ],
)
def test_the_stats_downlink_outside_fedlog_c_is_refused_in_one_line(config, where):
    with pytest.raises(ConfigError, match=f"'fedlog-c-downlink' is 'stats', but {where}.*leave it 'eta-and-stats'") as err:
        resolve(config)
    assert "\n" not in str(err.value)


def test_fedlog_beta_on_another_algorithm_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="'fedlog-beta' is 0.001, but algorithm=fedprox .*leave it 0") as err:
        resolve({"algorithm": "fedprox", "fedlog-beta": 0.001})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "config",
    [
        {"fedlog-alpha": 0.01},
        {"fedlog-beta": 0.001, "fedlog-clip": 1.0},  # β alone is FedLog-C too: the server sends Φ
        {"fedlog-alpha": 0.01, "fedlog-beta": 0.0001},
    ],
)
def test_fedlog_c_takes_the_stats_downlink(config):
    assert resolve({"algorithm": "fedlog", "fedlog-c-downlink": "stats", **config})["fedlog-c-downlink"] == "stats"


def test_the_defaults_pass_on_every_algorithm():
    from headway.core.methods import ALGORITHMS

    for algorithm in ALGORITHMS:
        resolve({"algorithm": algorithm})
