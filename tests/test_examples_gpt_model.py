"""texpr.examples.gpt_model.GPT: the graph's layout, torch's default initialisation, and
the loss and every weight gradient (te.differentiate, one compiled kernel) against the
PyTorch twin texpr.examples.models_torch.gpt_loss in float64."""

import subprocess
import sys

import numpy as np
import pytest

import texpr as te
from texpr.examples.gpt_model import GPT

from model_testutil import assert_step_matches_torch

SMALL = dict(batch=2, seq=8, vocab=11, d=16, heads=2, layers=2)


def _names(layers):
    per = ["ln1.w", "ln1.b", "attn.qkv.w", "attn.qkv.b", "attn.proj.w", "attn.proj.b",
           "ln2.w", "ln2.b", "mlp.fc.w", "mlp.fc.b", "mlp.proj.w", "mlp.proj.b"]
    return (["tok_emb.w", "pos_emb.w"] + [f"h{i}.{n}" for i in range(layers) for n in per]
            + ["ln_f.w", "ln_f.b", "head.w"])


def test_layout():
    g = GPT(dtype="float64", **SMALL)
    assert list(g.weights) == _names(2)
    assert g.idx.shape == g.targets.shape == (2, 8)
    assert g.idx.dtype == g.targets.dtype == "int64"
    assert g.logits.shape == (16, 11) and g.loss.shape == () and g.loss.dtype == "float64"
    w = g.weights
    assert w["tok_emb.w"].shape == (11, 16) and w["pos_emb.w"].shape == (8, 16)
    assert w["h1.attn.qkv.w"].shape == (48, 16) and w["h1.attn.qkv.b"].shape == (48,)
    assert w["h0.attn.proj.w"].shape == (16, 16) and w["h0.mlp.fc.w"].shape == (64, 16)
    assert w["h0.mlp.proj.w"].shape == (16, 64) and w["head.w"].shape == (11, 16)
    assert g.inputs_list() == [g.idx, g.targets] + list(w.values())
    assert len({t.name for t in g.inputs_list()}) == len(g.inputs_list())
    default = GPT()
    assert default.idx.shape == (16, 64) and default.logits.shape == (1024, 65)
    assert default.weights["h1.mlp.fc.w"].shape == (512, 128)
    assert "h2.ln1.w" not in default.weights and default.weights["head.w"].dtype == "float32"
    assert list(GPT(layers=3, **{k: v for k, v in SMALL.items() if k != "layers"})
                .weights) == _names(3)


def test_heads_must_divide_width():
    with pytest.raises(te.ShapeError, match="heads .3. must be a positive int dividing"):
        GPT(d=16, heads=3)


def test_init_weights_follow_torch_defaults():
    g = GPT(**SMALL)
    w = g.init_weights(np.random.default_rng(0))
    assert list(w) == list(g.weights)
    for name, a in w.items():
        assert a.shape == g.weights[name].shape and a.dtype == np.float32, name
    assert (w["h0.ln2.w"] == 1).all() and (w["ln_f.b"] == 0).all()
    assert 0.7 < w["tok_emb.w"].std() < 1.3  # torch.nn.Embedding: N(0, 1)
    for name, fan_in in [("h0.attn.qkv.w", 16), ("h1.attn.qkv.b", 16), ("h0.mlp.proj.w", 64),
                         ("h0.mlp.proj.b", 64), ("head.w", 16)]:
        bound = 1 / np.sqrt(fan_in)
        assert np.abs(w[name]).max() <= bound and np.abs(w[name]).max() > 0.5 * bound, name


def test_import_does_not_load_torch():
    code = "import sys, texpr.examples.gpt_model; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_loss_and_gradients_match_torch():
    pytest.importorskip("torch")
    from texpr.examples.models_torch import gpt_loss

    g = GPT(dtype="float64", **SMALL)
    rng = np.random.default_rng(0)
    weights = g.init_weights(rng)
    for name in weights:  # move LayerNorm off its (1, 0) start so its gradients are general
        if ".ln" in name or name.startswith("ln_f"):
            weights[name] = weights[name] + rng.uniform(-0.5, 0.5, weights[name].shape)
    idx = rng.integers(0, 11, (2, 8))
    targets = rng.integers(0, 11, (2, 8))
    assert_step_matches_torch(g, {g.idx: idx, g.targets: targets}, weights,
                              lambda tw: gpt_loss(tw, idx, targets, heads=2))
