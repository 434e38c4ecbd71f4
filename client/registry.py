"""Algorithm name -> client procedure."""

from client.procedures.base import Procedure
from client.procedures.fedavg import FedAvgClient

PROCEDURES: dict[str, Procedure] = {
    "fedavg": FedAvgClient(),
}
