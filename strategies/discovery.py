"""Before a ``dataset=local`` run can build its models, the nodes agree on what their data
is: the server asks every connected node to describe its own data (class names and counts,
columns with summed moments and levels; never rows) and merges the descriptions into one
schema (classes in index order, the input shape, a federated scaling of table columns).

Descriptions are merged largest group of agreeing ones first (same kind, same columns and
types, same image size): a description that cannot be read, holds classes outside a pinned
``classes`` list, or contradicts the ones merged before it is left out, and its node is
refused later, at registration, if its data does not fit the schema. Listing ``classes`` in
the run config pins the class list, so no node can add to it.

The agreeing descriptions are then merged so that a minority of lying nodes shapes nothing
(:mod:`headway.core.node_merge`: no weight for row counts, medians for the scaling, class names and
levels by support, outliers left out and the schema recomputed without them), over at most
``num-clients`` nodes, the lowest node ids first as registration offers them indices.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flwr.app import ConfigRecord, MessageType, RecordDict
from flwr.serverapp import Grid
from headway.core import protocol as P
from headway.core.run_data import read_profile, source_options
from headway.core.settings import Settings
from headway.strategies.engine import Engine, RoundFailed
from headway.strategies.meter import short_reason
from headway.strategies.services import Services

if TYPE_CHECKING:  # headway.core.sources is imported when a description is merged
    from headway.core.sources import DataSchema, SourceOptions

log = logging.getLogger("headway")


class DiscoveryFailed(RoundFailed):
    """No description could be used; ``left_out`` says why, node by node (for summary.json)."""

    def __init__(self, message: str, left_out: list[str]):
        super().__init__(message)
        self.left_out = left_out

    def summary(self) -> dict[str, Any]:
        """What summary.json says of a discovery that failed."""
        return {"discovery": {"nodes": 0, "left_out": self.left_out}}


@dataclass
class Discovery:
    """What the description exchange gave: the schema, and figures for summary.json."""

    schema: DataSchema
    nodes: int
    bytes_down: int
    bytes_up: int
    left_out: list[str] = field(default_factory=list)
    described: dict[int, dict[str, Any]] = field(
        default_factory=dict
    )  # node id -> the description merged (registration may not declare more)

    def summary(self) -> dict[str, Any]:
        """What summary.json says of the discovery: nodes, bytes, who was left out, and the schema in brief."""
        return {
            "discovery": {
                "nodes": self.nodes,
                "bytes_down": self.bytes_down,
                "bytes_up": self.bytes_up,
                "left_out": self.left_out,
                "classes": list(self.schema.classes),
                "input_shape": list(self.schema.input_shape),
                "kind": self.schema.kind,
            }
        }


def discover(grid: Grid, settings: Settings) -> Discovery:
    """Wait for ``min-available-clients`` (0: ``num-clients``) nodes, ask each to describe its
    data within ``round-timeout``, and merge the descriptions; RoundFailed when none can be used."""
    from headway.core.run_data import MAX_PROFILE_CHARS

    engine = Engine(grid, settings, Services(settings))
    nodes = engine.wait_for_clients()
    content = RecordDict({P.CONFIG: ConfigRecord({P.ROUND: 0, P.PHASE: P.PHASE_DESCRIBE})})
    replies = engine.send(P.PHASE_DESCRIBE, {n: content for n in nodes}, MessageType.QUERY)
    opts = source_options(settings)
    described: list[tuple[str, int, dict[str, Any]]] = []
    left_out: list[str] = list(engine.meter.failures)
    logged = len(left_out)  # the engine logged these already ("failure: describe: node ...: no reply"): once is enough
    for reply in replies:
        node = reply.metadata.src_node_id
        try:
            if reply.has_error():
                raise ValueError(f"error {reply.error.code}: {short_reason(reply.error.reason or '')}")
            record = reply.content.config_records.get(P.CONFIG)
            text = None if record is None else record.get(P.DATA_PROFILE)
            if isinstance(text, str) and len(text) > MAX_PROFILE_CHARS:  # refused before measuring: serializing it is the cost
                raise ValueError(f"the data profile has {len(text)} characters, more than {MAX_PROFILE_CHARS}")
            engine.meter.add(P.PHASE_DESCRIBE, up=engine.wire.message(reply))
            profile = read_profile(text)
            described.append((json.dumps(profile, sort_keys=True), node, profile))
        except Exception as exc:
            left_out.append(f"node {node}: {type(exc).__name__}: {short_reason(str(exc))}")
    agreeing = _agreeing(described, opts, left_out)
    schema, kept = _robust(agreeing, opts, engine.example_cap(), int(settings.num_clients), left_out)
    for reason in left_out[logged:]:
        log.warning("discovery: %s", reason)
    if schema is None:
        raise DiscoveryFailed(
            "dataset=local: no node described its data" + (f"; first problem: {left_out[0]}" if left_out else ""), left_out
        )
    down, up = engine.meter.phase(P.PHASE_DESCRIBE)
    log.info(
        "discovery: %d nodes described their data: %d classes %s, inputs %s",
        len(kept),
        len(schema.classes),
        list(schema.classes)[:20],
        tuple(schema.input_shape),
    )
    return Discovery(schema, len(kept), down, up, left_out, kept)


def _agreeing(described: list[tuple[str, int, dict[str, Any]]], opts: SourceOptions, left_out: list[str]) -> dict[int, dict[str, Any]]:
    """The descriptions that merge with each other (same kind, columns and types, classes
    within a pinned list), the largest group of agreeing ones first; the others go to ``left_out``."""
    from headway.core.sources import fits, merge, profile_problem

    profiles: list[dict[str, Any]] = []
    kept: dict[int, dict[str, Any]] = {}
    groups = Counter(_shape(p, opts) for _, _, p in described)
    # the largest group of agreeing descriptions first, then a canonical order: one set of descriptions, one schema
    for _, node, profile in sorted(described, key=lambda d: (-groups[_shape(d[2], opts)], d[0])):
        try:  # a malformed description is named by itself, not by its place in the merge
            problem = profile_problem(profile)
            problem = f"malformed: {problem}" if problem else fits(profile, merge(profiles + [profile], opts))
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
        if problem:
            left_out.append(f"node {node}: its description does not agree with the others or the run: {short_reason(problem)}")
            continue
        profiles.append(profile)
        kept[node] = profile
    return kept


def _robust(
    agreeing: dict[int, dict[str, Any]], opts: SourceOptions, cap: int, clients: int, left_out: list[str]
) -> tuple[DataSchema | None, dict[int, dict[str, Any]]]:
    """The schema of at most ``clients`` descriptions, merged by :func:`headway.core.node_merge.merge_robustly`
    (a minority cannot shape it), and the descriptions merged; the nodes left out go to ``left_out``.
    The nodes with the lowest ids come first, as registration offers them the client indices: a
    description beyond ``clients`` is merged only in place of one left out."""
    from headway.core.node_merge import merge_robustly

    out: dict[int, str] = {}
    schema: DataSchema | None = None
    chosen: dict[int, dict[str, Any]] = {}
    while True:
        pool = [n for n in sorted(agreeing) if n not in out]
        chosen = {n: agreeing[n] for n in pool[:clients]}
        if not chosen:
            break
        schema, dropped = merge_robustly(chosen, opts, cap)
        out.update(dropped)
        if not dropped or len(pool) <= clients:  # all fit, or no description waits to take a left-out one's place
            break
    left_out.extend(f"node {n}: left out of the schema: {short_reason(why)}" for n, why in out.items())
    kept = {n: p for n, p in chosen.items() if n not in out}
    return (schema if kept else None), kept


def _shape(profile: dict[str, Any], opts: SourceOptions) -> str:
    """What descriptions must share to merge: the kind, and the columns with their types, or
    the image size where the run takes the images' own (image-size=0)."""
    if profile.get("kind") == "image":
        return json.dumps(["image", None if opts.image_size else profile.get("size")])
    columns = profile.get("columns")
    types = (
        sorted((str(c), str(s.get("type")) if isinstance(s, dict) else "") for c, s in columns.items()) if isinstance(columns, dict) else []
    )
    return json.dumps([str(profile.get("kind")), types])
