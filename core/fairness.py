"""Fair local representations (LG-FedAvg §3, Eqs 4–6, after Louppe, Kagan and Cranmer 2017):
protected attributes P as binary targets, an adversary r_k that reads a representation h and
predicts P, the alternating updates of the minimax objective, and the ROC AUC that scores them.

Plain functions on arrays and tensors, no Flower. The client procedure
(client/procedures/lg_fedavg.py) calls them; nothing here is ever sent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported where the adversary is built: the config check needs only the parser
    import torch
    from torch import nn

ADV_HIDDEN = 32  # the authors' adversary: three hidden layers of 32 units (main_fair.py)
DEFAULT_LEVELS = {"race": "White", "sex": "Male"}  # uci-adult: the authors' encoding (helpers.py: race == 'White', sex == 'Male')


class ProtectedError(ValueError):
    """A protected-columns value that cannot be used; its message is one line naming the key."""


@dataclass(frozen=True)
class Protected:
    """One protected column and the level that makes P = 1 (empty: the column's most common level)."""

    column: str
    level: str = ""


def protected_problem(value: str) -> str | None:
    """Why ``protected-columns`` cannot be parsed (one line), or None."""
    try:
        parse_protected(value)
    except ProtectedError as exc:
        return str(exc)
    return None


def parse_protected(value: str) -> tuple[Protected, ...]:
    """``protected-columns``: a comma list of ``column`` or ``column=level``; ProtectedError naming what is wrong."""
    out: list[Protected] = []
    for item in (s.strip() for s in str(value).split(",")):
        if not item:
            continue
        column, _, level = (s.strip() for s in item.partition("="))
        if not column or ("=" in item and not level):
            raise ProtectedError(
                f"run-config key 'protected-columns' has entry {item!r}: write a column name, or column=level (P = 1 where the column holds that level)"
            )
        if column in [p.column for p in out]:
            raise ProtectedError(f"run-config key 'protected-columns' names column {column!r} twice: name each column once")
        out.append(Protected(column, level))
    return tuple(out)


# Without a named level P is "the most common value against the rest". Above this many distinct values a column is
# a measurement (a sensor, an age, an id), not a category: its most common value marks almost no row, so P is near
# all zeros. 50 admits every categorical column of the paper's table (Adult's native-country has the most: 42).
MAX_DEFAULT_LEVELS = 50


def encode_protected(values: Sequence[str] | np.ndarray, spec: Protected, reference: Sequence[str] | np.ndarray) -> np.ndarray:
    """P of one column as 0/1 float32: 1 where the value equals ``spec.level``, else where it equals the most
    common value of ``reference`` (the training rows). A multi-valued column (race) is thus one level against the rest."""
    vals = np.asarray(values, dtype=str)
    return (vals == protected_level(spec, reference)).astype(np.float32)


def protected_level(spec: Protected, reference: Sequence[str] | np.ndarray) -> str:
    """The level that makes P = 1 over the training rows ``reference``; ProtectedError (one line) for a named level
    that no training row holds (P would be all zeros) or, with no level named, a column of too many distinct values."""
    ref = np.asarray(reference, dtype=str)
    if spec.level:
        if len(ref) and not (ref == spec.level).any():
            raise ProtectedError(
                f"run-config key 'protected-columns' names level {spec.level!r} of column {spec.column!r}, which none of "
                f"the {len(ref)} training rows holds (P would be 0 everywhere): name a level the column holds"
            )
        return spec.level
    if spec.column in DEFAULT_LEVELS:
        return DEFAULT_LEVELS[spec.column]
    if (distinct := len(np.unique(ref))) > MAX_DEFAULT_LEVELS:
        raise ProtectedError(
            f"run-config key 'protected-columns' names column {spec.column!r}, which has {distinct} distinct values (more than "
            f"{MAX_DEFAULT_LEVELS}: a measurement, not a category), so 'its most common value' would mark almost no row: "
            f"bin it into a category column first, or name a level ({spec.column}=LEVEL)"
        )
    return _most_common(ref)


def _most_common(values: np.ndarray) -> str:
    if not len(values):
        return ""
    levels, counts = np.unique(values, return_counts=True)
    return str(levels[int(np.argmax(counts))])


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Exact ROC AUC of ``scores`` for binary ``labels`` (the Mann–Whitney statistic, ties counted half); NaN when one class is absent."""
    s, y = np.asarray(scores, dtype=np.float64).ravel(), np.asarray(labels).ravel().astype(bool)
    pos, neg = int(y.sum()), int((~y).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s), dtype=np.float64)
    sorted_s = s[order]
    # average ranks over ties
    starts = np.flatnonzero(np.r_[True, sorted_s[1:] != sorted_s[:-1]])
    ends = np.r_[starts[1:], len(s)]
    for a, b in zip(starts, ends):
        ranks[order[a:b]] = (a + b + 1) / 2.0
    return float((ranks[y].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def mean_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Macro AUC over the columns of (n, m) ``scores`` and ``labels`` (columns with one class skipped); NaN when none scores."""
    s, y = np.asarray(scores).reshape(len(scores), -1), np.asarray(labels).reshape(len(labels), -1)
    aucs = [a for a in (roc_auc(s[:, j], y[:, j]) for j in range(s.shape[1])) if np.isfinite(a)]
    return float(np.mean(aucs)) if aucs else float("nan")


def make_adversary(features: int, attributes: int, seed: int) -> nn.Module:
    """The adversary r_k: an MLP from a representation of ``features`` units to one logit per protected attribute."""
    import torch
    from torch import nn

    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Linear(features, ADV_HIDDEN),
        nn.ReLU(),
        nn.Linear(ADV_HIDDEN, ADV_HIDDEN),
        nn.ReLU(),
        nn.Linear(ADV_HIDDEN, ADV_HIDDEN),
        nn.ReLU(),
        nn.Linear(ADV_HIDDEN, attributes),
    )
    torch.random.set_rng_state(gen_state)
    return net


def adversary_loss(adversary: nn.Module, h: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """L_r: mean binary cross-entropy of the adversary's logits on ``h`` against P (log likelihood, as Eq. 6 asks)."""
    import torch

    return torch.nn.functional.binary_cross_entropy_with_logits(adversary(h), p)


def fair_objective(task_loss: torch.Tensor, adv_loss: torch.Tensor, weight: float) -> torch.Tensor:
    """Eq. 5/6 for the model's step: minimise the task loss while maximising the adversary's, L − λ·L_r."""
    return task_loss - weight * adv_loss


def local_global_objective(local_loss: torch.Tensor, global_loss: torch.Tensor, weight: float) -> torch.Tensor:
    """Eq. 3: the local auxiliary loss plus λ times the global model's loss, L = L_f + λ·L_g."""
    return local_loss + weight * global_loss


def adversary_step(adversary: nn.Module, opt: torch.optim.Optimizer, h: torch.Tensor, p: torch.Tensor) -> float:
    """One coordinate step for θ_r: minimise L_r on the representation held fixed (``h`` detached)."""
    opt.zero_grad()
    loss = adversary_loss(adversary, h.detach(), p)
    loss.backward()
    opt.step()
    return float(loss.detach())


def fit_posthoc(
    h_train: torch.Tensor, p_train: torch.Tensor, seed: int, epochs: int = 200, lr: float = 0.01
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A fresh adversary fitted (full batch, Adam) on frozen representations to P: the paper's post-hoc check
    that a low adversary AUC comes from the representation, not from a weak adversary."""
    import torch

    net = make_adversary(h_train.shape[1], p_train.shape[1], seed)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    if len(h_train):
        for _ in range(epochs):
            adversary_step(net, opt, h_train, p_train)
    net.eval()
    return lambda h: torch.sigmoid(net(h)).detach()
