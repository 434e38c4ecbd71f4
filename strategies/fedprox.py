"""FedProx (Li et al. 2020): FedAvg whose clients add (μ/2)‖w − w_global‖² to their loss.

The server side is FedAvg's; μ (``fedprox-mu``) reaches clients through the run config.
Flower's own FedProx strategy only adds μ to the train config; it does not fit headway's
round loop and byte metering, so this subclass is the whole server side."""

from __future__ import annotations

from headway.strategies.fedavg import FedAvg


class FedProx(FedAvg):
    """FedProx's server: FedAvg's; the proximal term is the clients' (client/procedures/fedavg.py)."""

    name = "fedprox"
