"""Per-class sums of feature rows, the statistic more than one method builds on: FedLog shares
them (its sufficient statistics T, fedlog-extended §3.2) and FedProto divides them by the class
counts to get its prototypes. A shared module, so neither method's maths imports the other's."""

from __future__ import annotations

import numpy as np


def class_sums(features: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """T = Σ_i φ_i ⊗ e_{y_i} as a classes × m float64 array (row y sums the features of class y;
    rows of absent classes are 0)."""
    stats = np.zeros((num_classes, features.shape[1]), dtype=np.float64)
    np.add.at(stats, labels, features.astype(np.float64))
    return stats
