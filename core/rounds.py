"""What a round record (rounds.jsonl) says about who took part, in words: the round line's
clients part (how many of the clients a round wanted sent a reply it used, who is missing and
why), whether its accuracy covers fewer clients' test splits than are registered, and which
rounds of a run ran short (for summary.json and the run's last line). Pure functions of the
records, so a run, its log and a reader of rounds.jsonl say the same."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

MAX_NAMED = 5  # missing clients named on a round line; beyond, "and N more" (rounds.jsonl names them all)
MAX_REASON = 100  # characters of one client's reason on a round line


def wanted_clients(record: Mapping[str, Any]) -> int | None:
    """The clients a round wanted: those sent its training message, and those registered but not
    connected (they could not be asked); None for a record that does not say (written before)."""
    selected = record.get("selected")
    if selected is None:
        return None
    return len(set(selected) | set(record.get("absent_partitions") or []))


def short_of_clients(record: Mapping[str, Any]) -> bool:
    """Whether a round ran without some client it wanted (named in ``missing_clients``, or fewer used replies than wanted)."""
    wanted = wanted_clients(record)
    return bool(record.get("missing_clients")) or (wanted is not None and int(record.get("clients") or 0) < wanted)


def clients_note(record: Mapping[str, Any]) -> str:
    """``clients 2 of 3 (missing: partition 1: train: no reply within 60 s)``, or ``clients 3 of 3``."""
    wanted = wanted_clients(record)
    text = f"clients {record.get('clients')}" + ("" if wanted is None else f" of {wanted}")
    missing: Mapping[str, str] = record.get("missing_clients") or {}
    if missing:
        named = [f"partition {p}: {_cut(str(why))}" for p, why in list(missing.items())[:MAX_NAMED]]
        more = len(missing) - len(named)
        text += f" (missing: {'; '.join(named)}{f'; and {more} more' if more > 0 else ''})"
    return text


def eval_note(record: Mapping[str, Any]) -> str:
    """Where a round's accuracy was measured on fewer clients' test splits than are registered:
    `` (on 2 of 3 clients' test splits, 52 test rows)``; else empty. Such an accuracy is over other rows
    than the rounds around it, so it may jump without the model changing."""
    scored, registered = record.get("eval_clients"), record.get("registered_clients")
    if scored is None or not registered or int(scored) >= int(registered):
        return ""
    rows = record.get("test_examples")
    return f" (on {int(scored)} of {int(registered)} clients' test splits" + ("" if rows is None else f", {int(rows)} test rows") + ")"


def short_rounds(rounds: Sequence[Mapping[str, Any]]) -> dict[str, list[int]]:
    """summary.json's figures: the rounds that ran without some client they wanted, and those whose
    accuracy covered fewer clients' test splits than were registered."""
    return {
        "rounds_with_missing_clients": [int(r["round"]) for r in rounds if short_of_clients(r)],
        "rounds_with_partial_evaluation": [int(r["round"]) for r in rounds if eval_note(r)],
    }


def short_rounds_note(summary: Mapping[str, Any]) -> str:
    """What a run's last line adds when rounds ran short of clients: ``; rounds 2, 3 ran with clients
    missing (rounds.jsonl: missing_clients)``; else empty."""
    short = list(summary.get("rounds_with_missing_clients") or [])
    if not short:
        return ""
    shown = ", ".join(str(r) for r in short[:10]) + (f" and {len(short) - 10} more" if len(short) > 10 else "")
    return f"; round{'s' if len(short) > 1 else ''} {shown} ran with clients missing (rounds.jsonl: missing_clients)"


def _cut(text: str) -> str:
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"
