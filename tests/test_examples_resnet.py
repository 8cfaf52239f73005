"""texpr.examples.resnet.ResNet: the graph's layout, torch's default initialisation, and
the loss and every weight gradient (te.differentiate, one compiled kernel) against the
PyTorch twin texpr.examples.models_torch.resnet_loss in float64."""

import subprocess
import sys

import numpy as np
import pytest

import texpr as te
from texpr.examples.resnet import ResNet

from model_testutil import assert_step_matches_torch

SMALL = dict(batch=2, width=4, image=8, classes=10)


def _names():
    block = ["conv1.w", "bn1.w", "bn1.b", "conv2.w", "bn2.w", "bn2.b"]
    return (["stem.conv.w", "stem.bn.w", "stem.bn.b"]
            + [f"block1.{n}" for n in block] + [f"block2.{n}" for n in block]
            + ["down.conv.w", "down.bn.w", "down.bn.b"] + [f"block3.{n}" for n in block]
            + ["fc.w", "fc.b"])


def test_layout():
    m = ResNet(dtype="float64", **SMALL)
    assert list(m.weights) == _names()
    assert m.x.shape == (2, 3, 8, 8) and m.x.dtype == "float64"
    assert m.labels.shape == (2,) and m.labels.dtype == "int64"
    assert m.logits.shape == (2, 10) and m.loss.shape == () and m.loss.dtype == "float64"
    assert m.weights["stem.conv.w"].shape == (4, 3, 3, 3)
    assert m.weights["block2.conv2.w"].shape == (4, 4, 3, 3)
    assert m.weights["down.conv.w"].shape == (8, 4, 3, 3)
    assert m.weights["block3.bn2.b"].shape == (8,)
    assert m.weights["fc.w"].shape == (10, 8) and m.weights["fc.b"].shape == (10,)
    assert m.inputs_list() == [m.x, m.labels] + list(m.weights.values())
    assert len({t.name for t in m.inputs_list()}) == len(m.inputs_list())
    default = ResNet()
    assert default.x.shape == (64, 3, 32, 32) and default.x.dtype == "float32"
    assert default.weights["block3.conv1.w"].shape == (64, 64, 3, 3)
    assert default.weights["fc.w"].shape == (10, 64)


def test_init_weights_follow_torch_defaults():
    m = ResNet(**SMALL)
    w = m.init_weights(np.random.default_rng(0))
    assert list(w) == list(m.weights)
    for name, a in w.items():
        assert a.shape == m.weights[name].shape and a.dtype == np.float32, name
    assert (w["block1.bn2.w"] == 1).all() and (w["down.bn.b"] == 0).all()
    for name, fan_in in [("stem.conv.w", 27), ("block3.conv1.w", 72), ("fc.w", 8),
                         ("fc.b", 8)]:
        bound = 1 / np.sqrt(fan_in)
        assert np.abs(w[name]).max() <= bound and np.abs(w[name]).max() > 0.5 * bound, name


def test_import_does_not_load_torch():
    code = "import sys, texpr.examples.resnet; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_loss_and_gradients_match_torch():
    pytest.importorskip("torch")
    from texpr.examples.models_torch import resnet_loss

    m = ResNet(dtype="float64", **SMALL)
    rng = np.random.default_rng(0)
    weights = m.init_weights(rng)
    for name in weights:  # move BN off its (1, 0) start so its gradients are general
        if ".bn" in name:
            weights[name] = weights[name] + rng.uniform(-0.5, 0.5, weights[name].shape)
    x = rng.standard_normal(m.x.shape)
    labels = np.array([3, 7])
    assert_step_matches_torch(m, {m.x: x, m.labels: labels}, weights,
                              lambda tw: resnet_loss(tw, x, labels))
