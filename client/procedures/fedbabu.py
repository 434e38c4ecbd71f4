"""FedBABU client (Oh, Kim, Yun, ICLR 2022): the body learns on a head that never does.

Every client builds its model from the run seed (whatever ``body-init`` says), so all hold the
same random head; training loads the received body, trains only the body and sends it back.
To score itself a client fine-tunes a copy of that model on its own training rows
(``fedbabu-finetune-epochs``, the part ``fedbabu-finetune-part`` names) and scores the copy on
its test split; the copy is then dropped, so fine-tuning never reaches what a client sends.
The reply also counts the global model's correct predictions before fine-tuning
(``correct-initial``), the paper's "initial accuracy".
"""

from __future__ import annotations

from flwr.app import RecordDict
from headway.client.env import ClientEnv
from headway.client.procedures.base import round_of, test_metrics
from headway.client.procedures.layer_sharing import SharedLayersClient
from headway.core import protocol as P
from headway.core import seeds
from headway.core.layers import in_layers
from headway.core.models import Net, build_model
from headway.core.training import trainable_only

HEAD = "head"  # the Net's last linear layer: fixed during federated training
INITIAL = f"{P.CORRECT}-initial"  # the strategy's eval_metrics names it too
FINETUNE_SALT = seeds.salt("fedbabu-finetune")  # the fine-tuning's own stream, apart from training's (evaluation only)


def fixed_head_model(env: ClientEnv) -> Net:
    """The run's initial model built from the run seed: its head is FedBABU's fixed head, the same on every client."""
    cfg = env.cfg
    model = build_model(env.body, env.data.input_shape, cfg.feature_dim, env.outputs, int(cfg.seed), cfg.body_dropout)
    return model.to(env.device)


def part_names(model: Net, part: str) -> list[str]:
    """Parameter names of ``part`` (full, head or body) of ``model``."""
    names = [n for n, _ in model.named_parameters()]
    if part == "full":
        return names
    return [n for n in names if in_layers(n, [HEAD]) == (part == "head")]


class FedBABUClient(SharedLayersClient):
    """FedBABU's client (this module's docstring): body-only training, fine-tune-then-score evaluation."""

    methods = ("fedbabu",)
    keeps_state = False  # the body comes from the server each round and the head from the seed: nothing to keep

    def model(self, env: ClientEnv, content: RecordDict, state: RecordDict) -> tuple[Net, list[str]]:
        """The fixed-head model with the received body in place, and the received names."""
        model = fixed_head_model(env)
        received = content.array_records[P.ARRAYS].to_torch_state_dict()
        own = model.state_dict()
        for name, value in received.items():
            if name not in own or own[name].shape != value.shape or in_layers(name, [HEAD]):
                raise ValueError(
                    f"the server sent {name!r} with shape {tuple(value.shape)}, which is not a body layer of this client's {env.body} model"
                )
        model.load_state_dict(received, strict=False)
        return model, list(received)

    def fit(self, env: ClientEnv, model: Net, shared: list[str], server_round: int) -> float:
        """Train the body only: the head keeps its initial values."""
        with trainable_only(model, part_names(model, "body")) as params:
            return self.train_all(env, model, params, server_round)

    def fine_tune(self, env: ClientEnv, model: Net, server_round: int) -> None:
        """Train ``fedbabu-finetune-part`` of ``model`` for ``fedbabu-finetune-epochs`` on the local training rows."""
        epochs = env.cfg.fedbabu.finetune_epochs
        with trainable_only(model, part_names(model, env.cfg.fedbabu.finetune_part)) as params:
            self.train_all(env, model, params, server_round, epochs=epochs, salt=FINETUNE_SALT)

    def evaluate(self, env: ClientEnv, content: RecordDict, state: RecordDict) -> RecordDict:
        """Score the global model, fine-tune a copy of it, and report the copy's scores (with the global model's correct count)."""
        model, _ = self.model(env, content, state)
        before = test_metrics(env, model.eval())
        self.fine_tune(env, model, round_of(content))
        metrics = test_metrics(env, model.eval())
        if P.CORRECT in before:
            metrics[INITIAL] = before[P.CORRECT]
        return RecordDict({P.METRICS: metrics})
