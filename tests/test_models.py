import pytest
import torch
from headway.core.models import BODIES, CNN, build_body, build_model

SHAPES = {
    "mnist-cnn": (1, 28, 28),
    "cifar-cnn": (3, 32, 32),
    "cifar-cnn-small": (3, 32, 32),
    "mlp": (108,),
    "mlp-deep": (2,),
    "mobilenet-v2": (3, 32, 32),
    "resnet18": (1, 28, 28),
    "lenet5": (1, 28, 28),
    "shufflenet-v2": (3, 32, 32),
    "linear": (16,),
    "image-cnn": (3, 45, 37),  # any size
}


@pytest.mark.parametrize("name", sorted(BODIES))
def test_every_body_maps_inputs_to_m_features(name):
    shape = SHAPES[name]
    body = build_body(name, shape, m=0).eval()
    out = body(torch.zeros(2, *shape))
    assert out.shape == (2, body.out_dim)
    body16 = build_body(name, shape, m=16).eval()
    assert body16(torch.zeros(2, *shape)).shape == (2, 16)


def test_the_linear_body_passes_its_input_on_so_the_model_is_its_head():
    x = torch.randn(3, 2, 4)
    body = build_body("linear", (2, 4))
    assert torch.equal(body(x), x.flatten(1)) and body.out_dim == 8 and not list(body.parameters())
    model = build_model("linear", (2, 4), 0, 5)
    assert set(model.state_dict()) == {"head.weight", "head.bias"}
    with pytest.raises(ValueError, match="no layers"):
        build_body("linear", (2, 4), m=3)


def test_table_a2_widths():
    assert build_body("mnist-cnn", (1, 28, 28)).out_dim == 50
    assert build_body("cifar-cnn", (3, 32, 32)).out_dim == 100
    small = build_body("cifar-cnn-small", (3, 32, 32))
    assert isinstance(small, CNN) and small.out_dim == 100 and len(small.fcs) == 1  # no 120-unit layer
    n = sum(p.numel() for p in build_model("mnist-cnn", (1, 28, 28), 0, 10).parameters())
    assert n == 21840  # the LeNet-style MNIST CNN of Table A.2


def test_models_are_reproducible_from_the_seed():
    a, b, c = (build_model("cifar-cnn", (3, 32, 32), 0, 10, seed=s) for s in (4, 4, 5))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_papers_cnn_bodies_drop_out_in_training_only():
    """mnist-cnn and cifar-cnn train with the authors' dropout (body-dropout, default 0.5) and
    are deterministic in eval mode, the mode they are built in; the parameters are the same
    as without dropout, so every method's arrays are unchanged."""
    import torch
    from headway.core.config import resolve
    from headway.core.models import build_body

    assert resolve({})["body-dropout"] == 0.5
    for name, shape in (("mnist-cnn", (1, 28, 28)), ("cifar-cnn", (3, 32, 32))):
        x = torch.randn(8, *shape)
        body = build_body(name, shape, 0, seed=1, dropout=0.5)
        plain = build_body(name, shape, 0, seed=1, dropout=0.0)
        assert list(body.state_dict()) == list(plain.state_dict()) and not body.training
        with torch.no_grad():
            assert torch.equal(body(x), body(x)) and torch.equal(body(x), plain(x))  # eval: no dropout
            body.train()
            torch.manual_seed(0)
            a = body(x)
            torch.manual_seed(1)
            b = body(x)
        assert not torch.equal(a, b) and (a == 0).float().mean() > 0.4  # about half the features dropped
    # bodies without dropout in their papers ignore the setting
    mlp = build_body("mlp", (1, 28, 28), 0, seed=1, dropout=0.5).train()
    x = torch.randn(4, 1, 28, 28)
    assert torch.equal(mlp(x), mlp(x))


@pytest.mark.parametrize("name, m", [("mnist-cnn", 0), ("mobilenet-v2", 0), ("mobilenet-v2", 16), ("resnet18", 16), ("mlp", 0)])
def test_feature_pair_gives_the_features_with_and_without_the_bodys_dropout(name, m):
    """Terms that pull features to class centres use the second of the pair (FedLog-C, FedProto);
    in training the first is what the head sees. MobileNet V2 keeps torchvision's classifier
    dropout (0.2) before the projection; bodies without dropout give one tensor twice."""
    from headway.core.models import feature_pair

    shape = SHAPES[name]
    body = build_body(name, shape, m=m, dropout=0.5).train()
    torch.manual_seed(0)
    x = torch.rand(8, *shape)
    dropped, kept = feature_pair(body, x)
    has_dropout = name in ("mnist-cnn", "mobilenet-v2")
    assert (dropped is not kept) == has_dropout and dropped.shape == kept.shape == (8, body.out_dim)
    if has_dropout:
        assert not torch.equal(dropped, kept)
    body.eval()
    with torch.no_grad():
        dropped, kept = feature_pair(body, x)
        assert torch.allclose(dropped, kept) and torch.allclose(body(x), kept)  # no dropout in eval mode
