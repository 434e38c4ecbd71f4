"""Algorithm name -> client procedure."""

from client.procedures.base import Procedure
from client.procedures.fedavg import FedAvgClient, FedProxClient
from client.procedures.fedlog import FedLogClient
from client.procedures.fedproto import FedProtoClient
from client.procedures.fedrep import FedRepClient
from client.procedures.layer_sharing import SharedLayersClient
from client.procedures.lg_fedavg import LGFedAvgClient

PROCEDURES: dict[str, Procedure] = {
    "fedavg": FedAvgClient(),
    "fedprox": FedProxClient(),
    "fedlog": FedLogClient(),
    "lg-fedavg": LGFedAvgClient(),
    "fedper": SharedLayersClient(),  # joint training of the whole model; the strategy picks what is shared
    "fedrep": FedRepClient(),
    "fedproto": FedProtoClient(),
}
