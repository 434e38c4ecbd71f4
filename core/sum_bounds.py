"""What an unmasked secure sum must satisfy before the server uses it.

Under secure aggregation the server never sees one client's reply, so the per-reply checks
of plain mode (a count within the client's bound, an update within the norm bound) can only
be applied to the sum: each is the sum of the bounds of the clients in it. A sum past them
holds at least one reply that the plain check would have refused; one inside them may still
hold a lying client, which can move the sum anywhere inside (docs/secure-aggregation.md
gives the largest move per method).
"""

from __future__ import annotations

import math

RELATIVE_SLACK = 1e-6  # fixed-point rounding of the sum (2^-frac per entry and client) is far below this


def count_problem(count: float, most: float, least: float = 0.0, slack: float = 0.0) -> str | None:
    """Why ``count``, a summed number of examples, cannot be the sum of the clients' counts:
    not a whole number (``slack`` 0, no noise on it), below ``least`` or above ``most`` (the
    sum of what the clients in the sum can hold) by more than ``slack``. None when it can."""
    if not math.isfinite(count):
        return f"the summed count is {count}"
    if slack == 0 and count != round(count):
        return f"the summed count {count:.6g} is not a whole number of examples"
    if count < least - slack:
        return f"the summed count {count:.6g} is below {least:g}"
    if count > most + slack:
        extra = f" plus {slack:.4g} of noise" if slack else ""
        return f"the summed count {count:.6g} is above the {most:g} examples the clients in the sum can hold together{extra}"
    return None


def update_sum_problem(count: float, norm: float, clip: float) -> str | None:
    """Why ‖Σ n_k·Δ_k‖ = ``norm`` cannot come from clients whose updates each have ‖Δ_k‖ ≤ ``clip``
    and whose counts add up to ``count``: the triangle inequality bounds it by clip·Σ n_k. None when it can."""
    if not math.isfinite(norm):
        return f"the summed update's norm is {norm}"
    limit = clip * count * (1.0 + RELATIVE_SLACK)
    if not norm <= limit:
        return f"the summed update's norm {norm:.6g} exceeds clip × count = {clip:.4g} × {count:g} (mean update norm {norm / max(count, 1e-300):.4g} > {clip:.4g})"
    return None


def largest_mean_move(clip: float, honest_mean_norm: float) -> float:
    """The most one lying client can move an accepted weighted mean update from the honest
    clients' mean: the accepted mean has norm ≤ ``clip`` and the liar can reach any such mean,
    so ‖m − m_honest‖ ≤ clip + ‖m_honest‖."""
    return clip + honest_mean_norm
