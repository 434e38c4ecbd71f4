"""Algorithm name -> strategy class. A new method adds one line here."""

from strategies.base import HeadwayStrategy
from strategies.fedavg import FedAvg
from strategies.fedlog import FedLog
from strategies.fedper import FedPer
from strategies.fedprox import FedProx
from strategies.fedproto import FedProto
from strategies.fedrep import FedRep
from strategies.lg_fedavg import LGFedAvg

STRATEGIES: dict[str, type[HeadwayStrategy]] = {
    "fedavg": FedAvg,
    "fedprox": FedProx,
    "fedlog": FedLog,
    "lg-fedavg": LGFedAvg,
    "fedper": FedPer,
    "fedrep": FedRep,
    "fedproto": FedProto,
}
