"""PyTorch twins of the example models: the same losses from the same weights.

:func:`resnet_loss` is :class:`texpr.examples.resnet.ResNet` and :func:`gpt_loss` is
:class:`texpr.examples.gpt_model.GPT`, written functionally with
``torch.nn.functional`` so that the very arrays a texpr kernel takes go in (the
weight dicts of the models' ``init_weights``, keyed by the same names). They are
the references of the gradient tests and the benchmarks. This module imports
torch (an optional dependency); the model modules do not.
"""

import math

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["resnet_loss", "gpt_loss", "as_torch"]


def as_torch(weights, requires_grad=True):
    """numpy arrays (a dict name -> array) as torch leaf tensors of the same dtype.

    Args:
        weights: dict name -> numpy array (or torch tensor, used as given).
        requires_grad: make float tensors leaves that collect ``.grad``.
    Returns:
        dict name -> torch tensor, in the same order.
    """
    out = {}
    for name, a in weights.items():
        t = a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))
        if requires_grad and t.is_floating_point() and not t.requires_grad:
            t = t.detach().requires_grad_(True)
        out[name] = t
    return out


def _tensor(a, dtype=None):
    t = a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))
    return t if dtype is None else t.to(dtype)


def resnet_loss(weights, x, labels):
    """The ResNet's mean cross-entropy, as :class:`texpr.examples.resnet.ResNet`.

    Args:
        weights: dict name -> torch tensor or numpy array, the ResNet's names
            (:func:`as_torch` gives leaves whose ``.grad`` a ``backward()`` fills).
        x: ``(B, 3, H, W)`` images. labels: ``(B,)`` int class labels.
    Returns:
        the scalar loss (a torch tensor).
    """
    w = {k: _tensor(v) for k, v in weights.items()}
    x, labels = _tensor(x), _tensor(labels, torch.int64)

    def conv_bn(h, prefix, conv, bn, stride=1):
        h = F.conv2d(h, w[f"{prefix}.{conv}.w"], stride=stride, padding=1)
        return F.batch_norm(h, None, None, w[f"{prefix}.{bn}.w"], w[f"{prefix}.{bn}.b"],
                            training=True, eps=1e-5)

    def block(h, prefix):
        y = F.relu(conv_bn(h, prefix, "conv1", "bn1"))
        return F.relu(conv_bn(y, prefix, "conv2", "bn2") + h)

    h = F.relu(conv_bn(x, "stem", "conv", "bn"))
    h = block(h, "block1")
    h = block(h, "block2")
    h = F.relu(conv_bn(h, "down", "conv", "bn", stride=2))
    h = block(h, "block3")
    h = F.adaptive_avg_pool2d(h, 1).flatten(1)
    logits = F.linear(h, w["fc.w"], w["fc.b"])
    return F.cross_entropy(logits, labels)


def gpt_loss(weights, idx, targets, heads):
    """The mini-GPT's mean cross-entropy, as :class:`texpr.examples.gpt_model.GPT`.

    Args:
        weights: dict name -> torch tensor or numpy array, the GPT's names (the
            layer count is read from them).
        idx, targets: ``(B, T)`` int tokens. heads: the number of attention heads.
    Returns:
        the scalar loss (a torch tensor).
    """
    w = {k: _tensor(v) for k, v in weights.items()}
    idx, targets = _tensor(idx, torch.int64), _tensor(targets, torch.int64)
    B, T = idx.shape
    d = w["tok_emb.w"].shape[1]
    dh = d // heads
    layers = len({k.split(".")[0] for k in w if k.startswith("h") and k[1:2].isdigit()})
    x = F.embedding(idx, w["tok_emb.w"]) + w["pos_emb.w"][:T]
    for layer in range(layers):
        p = f"h{layer}"
        h = F.layer_norm(x, (d,), w[f"{p}.ln1.w"], w[f"{p}.ln1.b"], eps=1e-5)
        q, k, v = F.linear(h, w[f"{p}.attn.qkv.w"], w[f"{p}.attn.qkv.b"]).split(d, dim=2)
        q, k, v = (t.view(B, T, heads, dh).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(dh))
        a = a.transpose(1, 2).reshape(B, T, d)
        x = x + F.linear(a, w[f"{p}.attn.proj.w"], w[f"{p}.attn.proj.b"])
        h = F.layer_norm(x, (d,), w[f"{p}.ln2.w"], w[f"{p}.ln2.b"], eps=1e-5)
        h = F.gelu(F.linear(h, w[f"{p}.mlp.fc.w"], w[f"{p}.mlp.fc.b"]))
        x = x + F.linear(h, w[f"{p}.mlp.proj.w"], w[f"{p}.mlp.proj.b"])
    x = F.layer_norm(x, (d,), w["ln_f.w"], w["ln_f.b"], eps=1e-5)
    logits = F.linear(x, w["head.w"])
    return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))
