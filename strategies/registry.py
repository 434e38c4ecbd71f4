"""Algorithm name -> strategy class. A new method adds one line here."""

from strategies.base import HeadwayStrategy
from strategies.fedavg import FedAvg
from strategies.fedlog import FedLog

STRATEGIES: dict[str, type[HeadwayStrategy]] = {
    "fedavg": FedAvg,
    "fedlog": FedLog,
}
