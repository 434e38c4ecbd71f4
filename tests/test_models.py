import pytest
import torch

from core.models import BODIES, build_body, build_model

SHAPES = {"mnist-cnn": (1, 28, 28), "cifar-cnn": (3, 32, 32), "cifar-cnn-small": (3, 32, 32), "mlp": (108,), "mlp-deep": (2,), "mobilenet-v2": (3, 32, 32), "resnet18": (1, 28, 28), "lenet5": (1, 28, 28), "shufflenet-v2": (3, 32, 32)}


@pytest.mark.parametrize("name", sorted(BODIES))
def test_every_body_maps_inputs_to_m_features(name):
    shape = SHAPES[name]
    body = build_body(name, shape, m=0).eval()
    out = body(torch.zeros(2, *shape))
    assert out.shape == (2, body.out_dim)
    body16 = build_body(name, shape, m=16).eval()
    assert body16(torch.zeros(2, *shape)).shape == (2, 16)


def test_table_a2_widths():
    assert build_body("mnist-cnn", (1, 28, 28)).out_dim == 50
    assert build_body("cifar-cnn", (3, 32, 32)).out_dim == 100
    small = build_body("cifar-cnn-small", (3, 32, 32))
    assert small.out_dim == 100 and len(small.fcs) == 1  # no 120-unit layer
    n = sum(p.numel() for p in build_model("mnist-cnn", (1, 28, 28), 0, 10).parameters())
    assert n == 21840  # the LeNet-style MNIST CNN of Table A.2


def test_models_are_reproducible_from_the_seed():
    a, b, c = (build_model("cifar-cnn", (3, 32, 32), 0, 10, seed=s) for s in (4, 4, 5))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
