"""Algorithm name -> strategy class. A new method adds one line here."""

from strategies.base import HeadwayStrategy
from strategies.fedavg import FedAvg

STRATEGIES: dict[str, type[HeadwayStrategy]] = {
    "fedavg": FedAvg,
}
