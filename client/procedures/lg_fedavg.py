"""LG-FedAvg client: train the local body and the received global layers jointly on the
task loss and return the global layers. For the new test it uploads its whole model
once (the server knows its body from its registration).

Two options of the paper's §3, both local (nothing of them is sent): with ``protected-columns``
a local adversary r_k reads P from the body's output h and the model minimises its loss minus
``lg-adversary-weight`` times the adversary's (Eq. 6, updated alternately); with ``lg-aux-model``
a local auxiliary head a_k on h and the objective L_f(a_k) + λ·L_g of Eq. 3.
"""

from __future__ import annotations

import math

import torch
from flwr.app import ArrayRecord, MetricRecord, RecordDict
from headway.client.env import ClientEnv
from headway.client.procedures.base import round_of, test_metrics, train_metrics
from headway.client.procedures.layer_sharing import PERSONAL, SharedLayersClient
from headway.core import fairness
from headway.core import protocol as P
from headway.core.data import augment_batch
from headway.core.methods import LG_FEDAVG_RECORDS as R
from headway.core.models import Net
from headway.core.training import batches, make_optimizer, predict, task_loss
from torch import nn

ADVERSARY = "lg-adversary"  # state record of the local adversary r_k
AUX = "lg-aux-head"  # state record of the local auxiliary head a_k
ADV_SALT, AUX_SALT = 7301, 7302  # seeds of their initial weights, apart from the model's


class LGFedAvgClient(SharedLayersClient):
    """LG-FedAvg's client: the local body and the global top layers trained jointly; the whole model once for the new test."""

    methods = ("lg-fedavg",)

    def train(self, env: ClientEnv, content: RecordDict, state: RecordDict) -> RecordDict:
        """As every layer-sharing client, unless an adversary or an auxiliary head trains beside the model (then :meth:`train_local_parts`)."""
        if env.p_train is None and not env.cfg.lg_fedavg.aux_model:
            return super().train(env, content, state)
        model, shared = self.model(env, content, state)
        adversary, aux = local_parts(env, model, state)
        loss = train_local_parts(env, model, adversary, aux, round_of(content))
        weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        state[PERSONAL] = ArrayRecord(weights)
        for name, part in ((ADVERSARY, adversary), (AUX, aux)):
            if part is not None:
                state[name] = ArrayRecord({k: v.detach().cpu() for k, v in part.state_dict().items()})
        return RecordDict({P.ARRAYS: ArrayRecord({k: weights[k] for k in shared}), P.METRICS: train_metrics(env, loss)})

    def evaluate(self, env: ClientEnv, content: RecordDict, state: RecordDict) -> RecordDict:
        """Score as the other layer-sharing methods (with the AUCs of :func:`fair_metrics` when there are protected columns),
        except in the upload phase, where the whole model goes up for the new-test evaluation."""
        model, _ = self.model(env, content, state)
        if str(content[P.CONFIG].get(P.PHASE, "")) == P.PHASE_UPLOAD:
            weights = ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})
            return RecordDict({P.ARRAYS: weights, P.METRICS: MetricRecord({P.PARTITION_ID: env.partition_id})})
        metrics = test_metrics(env, model.eval())
        if env.p_train is not None:
            adversary, _ = local_parts(env, model, state)
            for name, value in fair_metrics(env, model, adversary).items():
                metrics[name] = value
        return RecordDict({P.METRICS: metrics})


def representation_width(env: ClientEnv, model: Net) -> int:
    """Units of the body's output h (a user's body may have any width)."""
    with torch.no_grad():
        return int(model.body.eval()(env.x_train[:1].to(env.device)).reshape(1, -1).shape[1])


def local_parts(env: ClientEnv, model: Net, state: RecordDict) -> tuple[nn.Module | None, nn.Module | None]:
    """This client's adversary (with protected columns) and auxiliary head (with lg-aux-model), as kept in its state or freshly seeded."""
    if env.p_train is None and not env.cfg.lg_fedavg.aux_model:
        return None, None
    width = representation_width(env, model)
    adversary = aux = None
    if env.p_train is not None:
        adversary = fairness.make_adversary(width, env.p_train.shape[1], env.init_seed + ADV_SALT)
    if env.cfg.lg_fedavg.aux_model:
        aux = _seeded_linear(width, env.outputs, env.init_seed + AUX_SALT)
    for name, part in ((ADVERSARY, adversary), (AUX, aux)):
        if part is not None and name in state.array_records:
            part.load_state_dict(state.array_records[name].to_torch_state_dict())
    return (adversary.to(env.device) if adversary else None), (aux.to(env.device) if aux else None)


def _seeded_linear(width: int, outputs: int, seed: int) -> nn.Module:
    """A linear head seeded apart from the model, leaving torch's global generator as it found it (dropout draws stay the same)."""
    saved = torch.random.get_rng_state()
    torch.manual_seed(seed)
    head = nn.Linear(width, outputs)
    torch.random.set_rng_state(saved)
    return head


def train_local_parts(env: ClientEnv, model: Net, adversary: nn.Module | None, aux: nn.Module | None, server_round: int) -> float:
    """Local epochs of Eq. 6 (and Eq. 3): per batch one adversary step on the detached h, then one step of the model
    (and aux head) on L − λ·L_r. The batches are those plain training draws, and h is computed once per batch, so with
    λ = 0 and no aux head the model trains exactly as without an adversary. Returns the last epoch's mean model loss."""
    cfg = env.cfg
    loss_fn = task_loss(env.data.task)
    params = list(model.parameters()) + (list(aux.parameters()) if aux is not None else [])
    opt = make_optimizer(cfg.optimizer, params, env.lr(server_round))
    adv_opt = make_optimizer(cfg.optimizer, list(adversary.parameters()), env.lr(server_round)) if adversary is not None else None
    gen = torch.Generator().manual_seed(env.seed_for(server_round))
    weight = cfg.lg_fedavg.adversary_weight
    model.train()
    mean = float("nan")
    for _ in range(cfg.local_epochs):
        total, count = 0.0, 0
        for idx in batches(len(env.x_train), cfg.batch_size, gen):
            xb, yb = env.x_train[idx], env.y_train[idx]
            if env.data.augment:
                xb = augment_batch(xb, gen)
            xb, yb = xb.to(env.device), yb.to(env.device)
            h = model.body(xb)
            if adversary is not None and adv_opt is not None and env.p_train is not None:
                pb = env.p_train[idx].to(env.device)
                for _ in range(cfg.lg_fedavg.adversary_steps):
                    fairness.adversary_step(adversary, adv_opt, h, pb)
            loss = loss_fn(model.head(h), yb)
            if aux is not None:
                loss = fairness.local_global_objective(loss_fn(aux(h), yb), loss, cfg.lg_fedavg.aux_weight)
            if adversary is not None and weight > 0 and env.p_train is not None:
                loss = fairness.fair_objective(loss, fairness.adversary_loss(adversary, h, pb), weight)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
            count += len(idx)
        mean = total / max(count, 1)
    model.eval()
    return mean


def fair_metrics(env: ClientEnv, model: Net, adversary: nn.Module | None) -> dict[str, float]:
    """Table 4's scores on the local test split: the classifier's ROC AUC (two classes), the adversary's ROC AUC on P,
    and a fresh adversary's fitted on the frozen training representations (the post-hoc check); NaN ones left out."""
    assert env.p_train is not None and env.p_test is not None
    model.eval()
    out: dict[str, float] = {}
    h_test = predict(model.body, env.x_test, device=env.device).reshape(len(env.x_test), -1)
    if env.data.task == "classification" and env.outputs == 2 and len(env.x_test):
        prob = torch.softmax(predict(model.head, h_test, device=env.device), 1)[:, 1]
        out[R.class_auc] = fairness.roc_auc(prob.numpy(), env.y_test.numpy())
    if adversary is not None:
        adversary.eval()
        out[R.adv_auc] = fairness.mean_auc(predict(adversary, h_test, device=env.device).numpy(), env.p_test.numpy())
    h_train = predict(model.body, env.x_train, device=env.device).reshape(len(env.x_train), -1)
    posthoc = fairness.fit_posthoc(h_train, env.p_train, env.init_seed + ADV_SALT + 1)
    out[R.posthoc_adv_auc] = fairness.mean_auc(posthoc(h_test).numpy(), env.p_test.numpy())
    return {k: v for k, v in out.items() if math.isfinite(v)}
