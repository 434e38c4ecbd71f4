"""FedPFT (Beitollahi et al. 2024), one shot: clients send per-class Gaussian mixtures of
their frozen-extractor features; the server draws |F_{i,c}| synthetic features from each
and trains a linear head on their union (Alg. 1), or, under ``fedpft-topology=chain``,
relays each client's mixtures to the next client in partition order and fits nothing
itself (§4.2). The maths lives in :mod:`headway.core.fedpft` and :mod:`headway.core.gmm`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, RecordDict
from headway.core import protocol as P
from headway.core.config import ConfigError
from headway.core.data import DatasetSpec
from headway.core.extractors import feature_dim, feature_range
from headway.core.fedpft import (
    ClassMixture,
    PayloadCheck,
    capped_counts,
    features,
    head_logits,
    synthesize,
    train_head,
)
from headway.core.models import resolve_device
from headway.core.settings import Settings
from headway.core.training import task_metrics
from headway.strategies.base import HeadwayStrategy, Step, TrainRound
from headway.strategies.engine import Engine
from headway.strategies.privacy import fedpft_dp_report
from headway.strategies.replies import ArraySpec, Layout, Reply
from headway.strategies.services import Services
from headway.strategies.state import ServerState

log = logging.getLogger("headway")

GMM_ARRAYS = (P.GMM_CLASSES, P.GMM_WEIGHTS, P.GMM_MEANS, P.GMM_COVARIANCES)


@dataclass(frozen=True)
class FedPFTState:
    """What FedPFT's server keeps: the trained head (weight, bias; None before it), the (class, count)
    of every mixture received, each valid reply's wire bytes, and the seconds the head took to train.
    The chain's order lives within its one round (the relay), so no position is kept between rounds."""

    head: tuple[np.ndarray, np.ndarray] | None = None
    received: tuple[tuple[int, int], ...] = ()
    payload_bytes: tuple[int, ...] = ()
    head_seconds: float = 0.0

    def noted(self, replies: list[Reply]) -> FedPFTState:
        """This state with ``replies``' mixtures and bytes counted."""
        received = tuple((m.label, m.count) for r in replies for m in r.payload)
        return FedPFTState(self.head, self.received + received, self.payload_bytes + tuple(r.nbytes for r in replies), self.head_seconds)


class FedPFT(HeadwayStrategy[FedPFTState]):
    """One-shot transfer of per-class Gaussian mixtures (see the module docstring)."""

    name = "fedpft"
    arrays_from_method = True  # the head as sent: head_record of the method state (chain: none)

    def __init__(self, settings: Settings, spec: DatasetSpec, services: Services):
        super().__init__(settings, spec, services)
        if spec.task != "classification":
            raise ConfigError(f"fedpft needs a classification data set; '{settings.dataset}' is {spec.task}")
        if settings.num_server_rounds != 1:
            raise ConfigError(
                f"fedpft is one-shot: set num-server-rounds=1 (got {settings.num_server_rounds}); "
                "every client sends its mixtures once and the head is trained once"
            )
        if settings.fedpft.extractor != "identity" and len(spec.input_shape) != 3:
            raise ConfigError(
                f"fedpft-extractor {settings.fedpft.extractor!r} takes images; data set '{settings.dataset}' is tabular: use fedpft-extractor=identity"
            )
        if settings.fedpft.dp == "on" and settings.fedpft.components != 1:
            raise ConfigError(
                f"fedpft-dp=on releases one Gaussian per class (Theorem 4.1 is for K = 1): set fedpft-components=1 (got {settings.fedpft.components})"
            )
        self.chain = settings.fedpft.topology == "chain"
        self.eval_metrics = ("correct-local",) if self.chain else ()
        self.classes = spec.num_classes
        self.dim = feature_dim(settings.fedpft.extractor, spec.input_shape)
        self.k = settings.fedpft.components
        self.covariance = settings.fedpft.covariance
        # under DP the released means carry noise, and in the chain a client fits its mixtures on
        # Gaussian samples of the ones relayed to it as well (unbounded): only max-feature-value bounds them
        unbounded = settings.fedpft.dp == "on" or settings.fedpft.topology == "chain"
        value_range = None if unbounded else feature_range(settings.fedpft.extractor, settings.dataset)
        self.checker = PayloadCheck(
            self.classes, self.dim, self.k, self.covariance, settings.max_feature_value, settings.fedpft.min_class_examples, value_range
        )

    def initial_method_state(self) -> FedPFTState:
        """No head, nothing received."""
        return FedPFTState()

    # ----- what a reply may be ------------------------------------------------------
    def train_layout(self, ctx: TrainRound[FedPFTState]) -> Layout:
        """A client's mixtures, sent to the server (star): see :meth:`payload_layout`."""
        return self.payload_layout(relayed=0)

    def payload_layout(self, relayed: int) -> Layout:
        """Class table and float16 mixtures, as many classes and components as a client
        can hold (named dimensions), checked by :class:`headway.core.fedpft.PayloadCheck`; in the
        chain a client's mixtures also summarize the ``relayed`` examples of the ones it was sent."""
        cov = {"spherical": ("components",), "diag": ("components", self.dim), "full": ("components", self.dim * (self.dim + 1) // 2)}[
            self.covariance
        ]
        arrays = {
            P.GMM_CLASSES: ArraySpec(("classes", 3), "int32"),
            P.GMM_WEIGHTS: ArraySpec(("components",), "float16"),
            P.GMM_MEANS: ArraySpec(("components", self.dim), "float16"),
            P.GMM_COVARIANCES: ArraySpec(cov, "float16"),
        }
        return Layout(
            arrays,
            count=True,
            optional=(P.LOSS,),
            check=partial(self.check_payload, relayed=relayed),
            dims={"classes": self.classes, "components": self.classes * self.k},
        )

    def check_payload(self, arrays: dict[str, np.ndarray], reply: Reply, relayed: int = 0) -> tuple[list[ClassMixture] | None, str | None]:
        """The reply's mixtures, counted against the client's own examples plus the ``relayed`` ones."""
        bound = None if reply.count is None else reply.count + relayed
        return self.checker.decode(arrays, bound)

    # ----- the round --------------------------------------------------------------------
    def configure_train(
        self, server_round: int, state: ServerState[FedPFTState], engine: Engine
    ) -> tuple[TrainRound[FedPFTState], dict[int, RecordDict]]:
        """One shot: every available client is asked for its mixtures."""
        content = self.content(server_round, ArrayRecord(), **{P.PHASE: P.PHASE_TRAIN})
        return TrainRound(server_round, engine, state), {n: content for n in engine.nodes()}

    def train_round(self, server_round: int, state: ServerState[FedPFTState], engine: Engine) -> Step[FedPFTState]:
        """The star's one exchange (every strategy's round), or under ``fedpft-topology=chain`` the relay."""
        if self.chain:
            return self._chain(server_round, state, engine)
        return super().train_round(server_round, state, engine)

    def aggregate_train(self, ctx: TrainRound[FedPFTState], replies: list[Reply]) -> Step[FedPFTState]:
        """Alg. 1 lines 13–17: sample every received class mixture, train the head."""
        mixtures = [m for r in replies for m in r.payload]
        noted = ctx.state.method.noted(replies)
        gen = torch.Generator().manual_seed(int(self.settings.seed))  # synthetic draws protect nothing: seeded, reproducible
        x, y = synthesize(mixtures, gen, capped_counts(mixtures, self.settings.fedpft.max_synthetic))
        if len(y) == 0:  # valid replies, but no class anyone could send: no head this round
            return Step(None, len(replies), {"synthetic_examples": 0.0}, method=noted)
        settings = self.settings
        t0 = time.perf_counter()
        head = train_head(
            x,
            y,
            self.classes,
            settings.fedpft.head_optimizer,
            settings.fedpft.head_lr,
            settings.fedpft.head_epochs,
            settings.fedpft.head_batch_size,
            settings.seed,
            resolve_device(settings.device),
        )
        seconds = time.perf_counter() - t0
        method = FedPFTState(head, noted.received, noted.payload_bytes, seconds)
        return Step(
            self.head_record(method),
            len(replies),
            {"synthetic_examples": float(len(y)), "classes_received": float(len(mixtures)), "head_seconds": seconds},
            method=method,
        )

    def _chain(self, server_round: int, state: ServerState[FedPFTState], engine: Engine) -> Step[FedPFTState]:
        """§4.2: relay each client's mixtures to the next, in partition order; a hop's reply
        is bounded by its own examples plus those the mixtures it was sent summarize."""

        def forward(reply: Reply) -> tuple[RecordDict, Layout]:
            content = self.content(
                server_round,
                ArrayRecord({k: Array(np.asarray(reply.arrays[k], order="C")) for k in GMM_ARRAYS}),
                **{P.PHASE: P.PHASE_CHAIN},
            )
            return content, self.payload_layout(relayed=int(sum(m.count for m in reply.payload)))

        first = self.content(server_round, ArrayRecord(), **{P.PHASE: P.PHASE_CHAIN})
        out = engine.relay(
            P.PHASE_CHAIN, engine.nodes(), first, forward, self.payload_layout(relayed=0), hop_timeout=self.settings.round_timeout
        )
        details = {"chain_order": [r.partition_id for r in out]}
        return Step(None, len(out), {"chain_hops": float(len(out))}, details, method=state.method.noted(out))

    # ----- the head -----------------------------------------------------------------------
    def head_record(self, method: FedPFTState) -> ArrayRecord:
        """The head of ``method`` as float32 weight and bias (empty before it is trained)."""
        if method.head is None:
            return ArrayRecord()
        return ArrayRecord({P.HEAD_WEIGHT: Array(method.head[0].astype(np.float32)), P.HEAD_BIAS: Array(method.head[1].astype(np.float32))})

    def global_evaluation(self, state: ServerState[FedPFTState]) -> dict[str, float]:
        """The server's head on the whole test set, where the server holds the data."""
        head = state.method.head
        if head is None or not self.settings.global_eval:
            return {}
        test = self.services.data.test_tensors()
        if test is None:
            return {}
        f = features(self.settings, self.settings.dataset, test[0], resolve_device(self.settings.device))
        s = task_metrics("classification", head_logits(f, *head), test[1])
        return {f"global_{k}": v for k, v in s.items()}

    def aggregate_evaluate(self, server_round: int, replies: list[Reply]) -> dict[str, float]:
        """Every method's figures; in the chain also each client's accuracy with the last head and its own."""
        out = super().aggregate_evaluate(server_round, replies)
        if self.chain:  # each client's own head, by partition id (§5.4)
            for r in replies:
                if r.count:
                    out[f"accuracy_p{r.partition_id}"] = r.metrics[P.CORRECT] / r.count
                    out[f"accuracy_local_p{r.partition_id}"] = r.metrics.get("correct-local", float("nan")) / r.count
        return out

    def participants(self, engine: Engine) -> dict[str, Any]:
        """As every method's, but naming what each client runs: the shared frozen extractor
        and a linear head (FedPFT never builds the config's ``body``)."""
        out = super().participants(engine)
        runs = f"{self.settings.fedpft.extractor} (frozen) + linear head"
        if "participants" in out:
            out["participants"] = {pid: runs for pid in out["participants"]}
        return out

    def summary_extra(self, engine: Engine, state: ServerState[FedPFTState] | None) -> dict[str, Any]:
        """The extractor, mixtures and head figures, and the DP report of the classes received."""
        method = state.method if state is not None else FedPFTState()
        settings = self.settings
        extra: dict[str, Any] = {
            "extractor": settings.fedpft.extractor,
            "resolution": settings.fedpft.resolution,
            "feature_dim": self.dim,
            "components": self.k,
            "covariance": self.covariance,
            "topology": settings.fedpft.topology,
            "classes_received": len(method.received),
            "payload_bytes_per_client": float(np.mean(method.payload_bytes)) if method.payload_bytes else None,
            "head_seconds": method.head_seconds,
        }
        if settings.fedpft.dp == "on":
            extra["dp"] = {
                **fedpft_dp_report(settings.fedpft.epsilon, settings.fedpft.delta, [int(n) for _, n in method.received]),
                "noise": "OS entropy, added by each client before sending",
                "features": "L2-normalized to the unit sphere",
            }
        return extra
