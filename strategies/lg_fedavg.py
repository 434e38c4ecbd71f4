"""LG-FedAvg (Liang et al. 2020, Algorithm 1): bodies stay local, the top
``lg-global-layers`` layers are global and averaged with weights n_k/n.

Optionally the first ``lg-warmup-rounds`` rounds are plain FedAvg on the whole model, as
the paper warm-starts from FedAvg. Clients are scored on their own test splits with
their own body (the paper's *local test*); after the last round every client uploads its
model once and the server scores the ensemble on the whole test set (*new test*,
:mod:`headway.strategies.new_test`; outputs combined by ``lg-ensemble``, mean logits by default),
counting those bytes in the ``upload`` phase.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from headway.core.config import ConfigError, body_names, fit_body
from headway.core.data import DatasetSpec
from headway.core.goal import lg_rounds_over, warming_up, warmup_end_after
from headway.core.layers import is_top_k, match_layers, select
from headway.core.methods import LG_FEDAVG_RECORDS
from headway.core.models import Net, build_model
from headway.core.settings import Settings
from headway.strategies.engine import Engine
from headway.strategies.fedavg import FedAvg, FedAvgState
from headway.strategies.layer_sharing import LayerSharing
from headway.strategies.new_test import new_test
from headway.strategies.replies import Layout, Reply
from headway.strategies.services import Services
from headway.strategies.state import ServerState

log = logging.getLogger("headway")
FAIR_METRICS = (LG_FEDAVG_RECORDS.class_auc, LG_FEDAVG_RECORDS.adv_auc, LG_FEDAVG_RECORDS.posthoc_adv_auc)


def fair_figures(replies: list[Reply]) -> dict[str, float]:
    """Each AUC of :data:`FAIR_METRICS` as the sample-weighted mean over the counted replies that carry it (``adv-auc`` -> ``adv_auc``)."""
    out: dict[str, float] = {}
    for name in FAIR_METRICS:
        have = [r for r in replies if r.count and name in r.metrics]
        if have:
            out[name.replace("-", "_")] = sum(r.metrics[name] * r.examples for r in have) / sum(r.examples for r in have)
    return out


@dataclass(frozen=True)
class LGFedAvgState(FedAvgState):
    """FedAvg's state and the round the warm-up ended at (None: it has not, or there is none): the warm-up may end at a
    goal accuracy, so the rounds that follow share the global layers whatever their number, also after a resume."""

    warmup_end: int | None = None


def lg_state(method: FedAvgState) -> LGFedAvgState:
    """``method`` as LG-FedAvg's state (one saved before it kept a warm-up end: that of a run with none ended)."""
    return method if isinstance(method, LGFedAvgState) else LGFedAvgState(counts=method.counts)


def has_warmup(settings: Settings) -> bool:
    """Whether the run starts with warm-up rounds that average whole models (a count or a goal)."""
    return settings.lg_fedavg.warmup_rounds > 0 or settings.lg_fedavg.warmup_goal > 0


class LGFedAvg(LayerSharing):
    """LG-FedAvg's server (this module's docstring): averages the global top layers; bodies stay local and may differ."""

    name = "lg-fedavg"
    mixed_bodies = True  # only the top layers are shared, so bodies may differ below them

    def __init__(self, settings: Settings, spec: DatasetSpec, services: Services):
        if has_warmup(settings) and len(body_names(settings)) > 1:
            raise ConfigError(
                "lg-fedavg: warm-up rounds average whole models, so every client must run the same body: set lg-warmup-rounds=0 "
                "and lg-warmup-goal=0, or leave 'bodies' empty"
            )
        self._check_global_layers(settings, spec)
        super().__init__(settings, spec, services)

    def _check_global_layers(self, settings: Settings, spec: DatasetSpec) -> None:
        """lg-global-layers against the run body and every body in ``bodies``: one line naming the pattern, the body
        and its layers when a pattern names no layer, every layer, or layers whose names or shapes differ between bodies."""
        layer_spec = settings.lg_fedavg.global_layers
        if is_top_k(layer_spec):  # the top-k shorthand: layer sharing's own checks, as before patterns
            return
        settings = fit_body(settings, spec.input_shape)  # 'auto' as the run will build it
        shapes: dict[str, dict[str, tuple[int, ...]]] = {}
        for body in dict.fromkeys([settings.body, *body_names(settings)]):
            model = build_model(body, spec.input_shape, settings.feature_dim, spec.num_classes, settings.seed, settings.body_dropout)
            try:
                chosen = match_layers(model, layer_spec)
            except ValueError as exc:
                raise ConfigError(f"lg-fedavg: run-config key 'lg-global-layers' = {layer_spec!r} on body {body!r}: {exc}") from None
            shapes[body] = {k: tuple(v.shape) for k, v in select(model.state_dict(), chosen).items()}
            if (first := next(iter(shapes))) != body and shapes[body] != shapes[first]:
                raise ConfigError(
                    f"lg-fedavg: run-config key 'lg-global-layers' = {layer_spec!r} names layers {', '.join(chosen)} of body {body!r} "
                    f"({shapes[body]}), which differ from those of body {first!r} ({shapes[first]}): the global layers must agree"
                )

    def body_problem(self, body: str) -> str | None:
        """As layer sharing's, but warm-up rounds average whole models: then only the run body."""
        if has_warmup(self.settings):  # warm-up rounds average whole models
            return FedAvg.body_problem(self, body)
        return super().body_problem(body)

    def shared_layers(self, model: Net, server_round: int) -> list[str] | None:
        """Every layer in warm-up rounds, then the layers ``lg-global-layers`` names (top k, or by pattern)."""
        if server_round <= self.settings.lg_fedavg.warmup_rounds:
            return None
        return match_layers(model, self.settings.lg_fedavg.global_layers)

    def initial_method_state(self) -> LGFedAvgState:
        """FedAvg's, with no warm-up ended yet."""
        return LGFedAvgState()

    def round_layers(self, model: Net, server_round: int, method: Any) -> list[str] | None:
        """Every layer while the warm-up lasts (:func:`headway.core.goal.warming_up`: a count, or until the goal), then the global layers."""
        lg = self.settings.lg_fedavg
        if warming_up(server_round, getattr(method, "warmup_end", None), lg.warmup_goal, lg.warmup_rounds):
            return None
        return self.shared_layers(model, lg.warmup_rounds + 1)  # the global layers, as after a counted warm-up

    def evaluated(
        self, server_round: int, state: ServerState[FedAvgState], figures: Mapping[str, Any]
    ) -> tuple[ServerState[FedAvgState], dict[str, Any]]:
        """As every method's (goal-accuracy), and the warm-up's end: after the round that reaches ``lg-warmup-goal`` or
        the ``lg-warmup-rounds`` cap (kept in the method state); ``lg-rounds`` rounds later the run stops."""
        state, notes = super().evaluated(server_round, state, figures)
        lg = self.settings.lg_fedavg
        before = lg_state(state.method).warmup_end
        end = warmup_end_after(server_round, figures, before, lg.warmup_goal, lg.warmup_rounds)
        if end != before:
            state = replace(state, method=replace(lg_state(state.method), warmup_end=end))
            notes = {**notes, "warmup_ended": True}
            log.info("lg-fedavg: warm-up ends after round %d; only the global layers are averaged from now on", server_round)
        if "stop" not in notes and lg_rounds_over(server_round, end, lg.warmup_goal, lg.warmup_rounds, lg.rounds):
            notes = {**notes, "stop": "lg-rounds"}
        return state, notes

    def summary_extra(self, engine: Engine, state: ServerState[FedAvgState] | None) -> dict[str, Any]:
        """``warmup_rounds_used``: the round the warm-up ended at (a run with a warm-up; null when it never ended)."""
        if not has_warmup(self.settings):
            return {}
        return {"warmup_rounds_used": None if state is None else lg_state(state.method).warmup_end}

    def eval_layout(self) -> Layout:
        """As every strategy's, and a client may add Table 4's AUCs (protected-columns), each in [0, 1]."""
        layout = super().eval_layout()
        return replace(layout, optional=(*layout.optional, *FAIR_METRICS), check=self._check_fair_scores)

    def _check_fair_scores(self, arrays: dict, reply: Reply) -> tuple[None, str | None]:
        for name in FAIR_METRICS:
            if name in reply.metrics and not 0 <= reply.metrics[name] <= 1:
                return None, f"metric {name!r} is {reply.metrics[name]:g}, not an AUC in [0, 1]"
        return self._check_scores(arrays, reply)

    def aggregate_evaluate(self, server_round: int, replies: list[Reply]) -> dict[str, float]:
        """As every strategy's, with the sample-weighted means of the AUCs the replies carry (``class_auc``, ``adv_auc``, ``posthoc_adv_auc``)."""
        return {**super().aggregate_evaluate(server_round, replies), **fair_figures(replies)}

    def final_evaluation(self, state: ServerState[FedAvgState], engine: Engine) -> dict[str, float]:
        """New test (:mod:`headway.strategies.new_test`): every client's model once, their outputs combined by ``lg-ensemble``."""
        if not self.settings.lg_fedavg.new_test:
            return {}
        last = self.settings.num_server_rounds if state.end is None else state.end  # the round the run stopped at
        return new_test(self, engine, self.shared(last, state.arrays, state.method), last, self.settings.lg_fedavg.ensemble)
