"""JAX twins of the example models (texpr.examples.resnet, texpr.examples.gpt_model):
the same losses from the same weight dicts, for bench_models.py.

Written with jax.numpy and lax only, following texpr.examples.models_torch line by
line (NCHW convolutions with OIHW weights, training-mode BatchNorm with the biased
batch variance and eps 1e-5, LayerNorm eps 1e-5, exact GELU, causal attention
with scale 1/sqrt(d_head), mean cross-entropy). bench_models.py checks that their
losses agree with texpr's for the same weights before it times anything.
"""

import math

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["resnet_loss", "gpt_loss"]

EPS = 1e-5


def _conv(h, w, stride=1):
    return lax.conv_general_dilated(h, w, (stride, stride), [(1, 1), (1, 1)],
                                    dimension_numbers=("NCHW", "OIHW", "NCHW"))


def _batch_norm(h, g, b):
    mean = h.mean(axis=(0, 2, 3), keepdims=True)
    var = ((h - mean) ** 2).mean(axis=(0, 2, 3), keepdims=True)
    return (h - mean) * lax.rsqrt(var + EPS) * g[None, :, None, None] + b[None, :, None, None]


def _cross_entropy(logits, labels):
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, labels[:, None], axis=-1).mean()


def resnet_loss(w, x, labels):
    """The ResNet's mean cross-entropy (``w``: the ResNet's weight dict of jax arrays;
    ``x`` ``(B, 3, H, W)``; ``labels`` ``(B,)`` int)."""

    def conv_bn(h, prefix, conv, bn, stride=1):
        h = _conv(h, w[f"{prefix}.{conv}.w"], stride)
        return _batch_norm(h, w[f"{prefix}.{bn}.w"], w[f"{prefix}.{bn}.b"])

    def block(h, prefix):
        y = jax.nn.relu(conv_bn(h, prefix, "conv1", "bn1"))
        return jax.nn.relu(conv_bn(y, prefix, "conv2", "bn2") + h)

    h = jax.nn.relu(conv_bn(x, "stem", "conv", "bn"))
    h = block(h, "block1")
    h = block(h, "block2")
    h = jax.nn.relu(conv_bn(h, "down", "conv", "bn", stride=2))
    h = block(h, "block3")
    h = h.mean(axis=(2, 3))
    logits = h @ w["fc.w"].T + w["fc.b"]
    return _cross_entropy(logits, labels)


def _layer_norm(x, g, b):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + EPS) * g + b


def gpt_loss(w, idx, targets, heads):
    """The mini-GPT's mean cross-entropy (``w``: the GPT's weight dict of jax arrays;
    ``idx``, ``targets`` ``(B, T)`` int; ``heads`` a Python int)."""
    B, T = idx.shape
    d = w["tok_emb.w"].shape[1]
    dh = d // heads
    layers = len({k.split(".")[0] for k in w if k.startswith("h") and k[1:2].isdigit()})
    x = w["tok_emb.w"][idx] + w["pos_emb.w"][:T]
    mask = jnp.tril(jnp.ones((T, T), dtype=bool))
    for l in range(layers):
        p = f"h{l}"
        h = _layer_norm(x, w[f"{p}.ln1.w"], w[f"{p}.ln1.b"])
        qkv = h @ w[f"{p}.attn.qkv.w"].T + w[f"{p}.attn.qkv.b"]
        q, k, v = (qkv[..., i * d:(i + 1) * d].reshape(B, T, heads, dh).transpose(0, 2, 1, 3)
                   for i in range(3))
        s = jnp.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(dh)
        s = jnp.where(mask, s, -jnp.inf)
        a = jnp.einsum("bhij,bhjd->bhid", jax.nn.softmax(s, axis=-1), v)
        a = a.transpose(0, 2, 1, 3).reshape(B, T, d)
        x = x + a @ w[f"{p}.attn.proj.w"].T + w[f"{p}.attn.proj.b"]
        h = _layer_norm(x, w[f"{p}.ln2.w"], w[f"{p}.ln2.b"])
        h = jax.nn.gelu(h @ w[f"{p}.mlp.fc.w"].T + w[f"{p}.mlp.fc.b"], approximate=False)
        x = x + h @ w[f"{p}.mlp.proj.w"].T + w[f"{p}.mlp.proj.b"]
    x = _layer_norm(x, w["ln_f.w"], w["ln_f.b"])
    logits = x @ w["head.w"].T
    return _cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))
