"""Algorithm name -> client procedure."""

from client.procedures.base import Procedure
from client.procedures.fedavg import FedAvgClient
from client.procedures.fedlog import FedLogClient

PROCEDURES: dict[str, Procedure] = {
    "fedavg": FedAvgClient(),
    "fedlog": FedLogClient(),
}
