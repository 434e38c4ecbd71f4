"""FedProf's simulated device costs (Wu et al. §5.1, Eqs. 9-16 with Table 2's constants):
the wall time of a round and the energy its clients spend, from who was selected, their
data sizes and the bytes of a model and a profile.

Choices the paper leaves open, stated here once:
- a link's rate is Shannon's bw · log2(1 + SNR) in Mbit/s (bw in MHz, SNR from dB to a
  ratio); sizes are converted from bytes to megabits;
- the uplink has half the downlink's bandwidth (Eq. 11: upload takes twice the download);
- per-client compute speed s_k and bandwidth bw_k are drawn once per run from Table 2's
  normal distributions (their own seeded stream) and floored at a tenth of the mean;
- profile costs (Eqs. 13, 16) count for FedProf only, in every round its selected clients
  profile and, before round 1, for every client.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from headway.core import seeds

P_TRANS = 0.75  # W, transmitter power (§5.1)
P_F = 0.7  # W, baseline processor power (§5.1)


@dataclass(frozen=True)
class DeviceSpec:
    """Table 2's client specification of one task."""

    speed_ghz: tuple[float, float]  # s_k ~ N(mean, sd²)
    bandwidth_mhz: tuple[float, float]  # bw_k ~ N(mean, sd²)
    snr_db: float
    bits_per_sample: int
    cycles_per_bit: int
    epochs: int


TABLE2 = {
    "gasturbine": DeviceSpec((0.5, 0.1), (0.7, 0.1), 7.0, 11 * 8 * 4, 300, 2),
    "mnist": DeviceSpec((1.0, 0.2), (1.0, 0.3), 10.0, 28 * 28 * 1 * 8, 400, 5),  # the EMNIST task's column
    "cifar10": DeviceSpec((3.0, 0.4), (2.0, 0.2), 10.0, 32 * 32 * 3 * 8, 400, 6),
}


@dataclass(frozen=True)
class Devices:
    """Per-client compute speed (GHz) and downlink bandwidth (MHz)."""

    speed_ghz: np.ndarray
    bandwidth_mhz: np.ndarray


def draw_devices(spec: DeviceSpec, num_clients: int, seed: int) -> Devices:
    """s_k and bw_k of every client, from ``seed`` (a stream of its own)."""
    rng = np.random.default_rng([int(seed), seeds.DEVICES])
    speed = rng.normal(*spec.speed_ghz, num_clients)
    bw = rng.normal(*spec.bandwidth_mhz, num_clients)
    return Devices(np.maximum(speed, spec.speed_ghz[0] / 10), np.maximum(bw, spec.bandwidth_mhz[0] / 10))


def rate_mbps(bandwidth_mhz: np.ndarray | float, snr_db: float) -> np.ndarray:
    """Downlink rate in Mbit/s: bw · log2(1 + SNR)."""
    return np.asarray(bandwidth_mhz, dtype=float) * np.log2(1.0 + 10.0 ** (snr_db / 10.0))


def client_costs(
    spec: DeviceSpec,
    speed_ghz: np.ndarray,
    bandwidth_mhz: np.ndarray,
    sizes: np.ndarray,
    model_bytes: float,
    profile_bytes: float,
    train: bool = True,
    profile: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, joules) of each client in one round: Eq. 9's inner sum and Eq. 10.

    ``train``: the client downloads the model, trains E epochs on ``sizes`` examples and
    uploads it (Eqs. 11, 12, 14, 15). ``profile``: it also profiles one epoch's worth of
    data and uploads ``profile_bytes`` at half the rate (Eqs. 13, 16)."""
    rate = rate_mbps(bandwidth_mhz, spec.snr_db)
    sizes = np.asarray(sizes, dtype=float)
    t_train_full = spec.epochs * sizes * spec.bits_per_sample * spec.cycles_per_bit / (np.asarray(speed_ghz) * 1e9)  # Eq. 12
    power = P_F * np.asarray(speed_ghz, dtype=float) ** 3  # Eq. 15's P_f · s_k³
    seconds = np.zeros_like(sizes)
    joules = np.zeros_like(sizes)
    if train:
        t_comm = 3.0 * (model_bytes * 8 / 1e6) / rate  # Eq. 11
        seconds += t_comm + t_train_full
        joules += P_TRANS * t_comm + power * t_train_full  # Eqs. 14, 15
    if profile:
        t_gen = t_train_full / spec.epochs
        t_up = (profile_bytes * 8 / 1e6) / (0.5 * rate)  # Eq. 13
        seconds += t_gen + t_up
        joules += P_TRANS * t_up + power * t_gen  # Eq. 16
    return seconds, joules


def round_cost(seconds: np.ndarray, joules: np.ndarray) -> tuple[float, float]:
    """Eq. 9 and the round's energy: the slowest client's time, the clients' summed energy."""
    return (float(np.max(seconds)) if len(seconds) else 0.0), float(np.sum(joules))
