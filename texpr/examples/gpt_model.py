"""A mini-GPT (a decoder-only transformer language model), written with ``te.nn``.

Architecture (GPT-2's pre-LayerNorm block; defaults: vocabulary 65, context
T = 64, batch 16, width d = 128, 4 heads, 2 layers)::

    idx (B, T) int64
    x = tok_emb[idx] + pos_emb[t]                   (B*T, d)  te.nn.embedding
    for each layer l:
        x = x + attn(ln1(x))
        x = x + mlp(ln2(x))
    logits = head(ln_f(x))                          (B*T, V)  untied, no bias
    loss = mean cross-entropy over all B*T positions against targets (B, T)

``attn``: a fused qkv dense layer d -> 3d (with bias) whose columns are
``[q | k | v]``, each split into heads of ``d / heads`` columns; causal
``te.nn.scaled_dot_product_attention`` on ``(B, heads, T, d / heads)``; heads
merged back to ``(B*T, d)``; an output dense layer d -> d (with bias).
``mlp``: dense d -> 4d (bias), exact GELU (``te.nn.gelu``), dense 4d -> d (bias).
The LayerNorms (``te.nn.layer_norm``, eps 1e-5) have weights and biases. The
activations are kept as ``(B*T, features)`` matrices throughout, so every dense
layer is one GEMM. :mod:`texpr.examples.models_torch` computes the same loss with
PyTorch from the same weights.
"""

import numpy as np

import texpr as te
from texpr.errors import ShapeError

__all__ = ["GPT"]


class GPT:
    """The mini-GPT as a texpr graph for a fixed batch size and context length.

    Attributes:
        idx: int64 placeholder ``(B, T)``, the input tokens. targets: int64 placeholder
            ``(B, T)``, the next tokens.
        weights: dict name -> placeholder, in the order a kernel takes them:
            ``tok_emb.w`` ``(V, d)``, ``pos_emb.w`` ``(T, d)``; per layer ``l``:
            ``h{l}.ln1.w``, ``h{l}.ln1.b`` ``(d,)``, ``h{l}.attn.qkv.w`` ``(3d, d)``,
            ``h{l}.attn.qkv.b`` ``(3d,)``, ``h{l}.attn.proj.w`` ``(d, d)``,
            ``h{l}.attn.proj.b``, ``h{l}.ln2.w``, ``h{l}.ln2.b``, ``h{l}.mlp.fc.w``
            ``(4d, d)``, ``h{l}.mlp.fc.b``, ``h{l}.mlp.proj.w`` ``(d, 4d)``,
            ``h{l}.mlp.proj.b``; then ``ln_f.w``, ``ln_f.b`` and ``head.w`` ``(V, d)``
            (the head has no bias). Dense weights are ``(out, in)`` (torch's layout).
        logits: ``(B*T, V)`` -- row ``b*T + t`` is position ``t`` of sequence ``b``.
        loss: the scalar mean cross-entropy over the ``B*T`` positions.
    """

    def __init__(self, batch=16, seq=64, vocab=65, d=128, heads=4, layers=2,
                 dtype="float32"):
        """Build the graph.

        Args:
            batch: B. seq: the context length T. vocab: V. d: the model width.
            heads: attention heads (must divide ``d``). layers: transformer blocks.
            dtype: the float dtype of the weights and activations.
        Raises:
            ShapeError: ``heads`` does not divide ``d``. TexprError: from
                ``te.placeholder``/``te.nn`` for other bad sizes or dtype.
        """
        if not isinstance(heads, int) or heads < 1 or d % heads:
            raise ShapeError(f"GPT: heads ({heads!r}) must be a positive int dividing the "
                             f"width d ({d!r})")
        nn = te.nn
        self.batch, self.seq, self.vocab, self.d = batch, seq, vocab, d
        self.heads, self.layers, self.dtype = heads, layers, dtype
        B, T, H, dh = batch, seq, heads, d // heads
        N = B * T
        self.idx = te.placeholder((B, T), name="idx", dtype="int64")
        self.targets = te.placeholder((B, T), name="targets", dtype="int64")
        self.weights = {}

        def P(name, shape):
            t = te.placeholder(shape, name=name.replace(".", "_"), dtype=dtype)
            self.weights[name] = t
            return t

        def add(a, b, name):
            return te.compute(a.shape, lambda *i: a[i] + b[i], name=name)

        tok = P("tok_emb.w", (vocab, d))
        pos = P("pos_emb.w", (T, d))
        emb = nn.embedding(nn.reshape(self.idx, (N,), name="idx_flat"), tok, name="tok_emb")
        x = te.compute((N, d), lambda n, c: emb[n, c] + pos[n % T, c], name="emb")
        for layer in range(layers):
            p = f"h{layer}"
            ln1 = nn.layer_norm(x, d, P(f"{p}.ln1.w", (d,)), P(f"{p}.ln1.b", (d,)),
                                name=f"{p}_ln1")
            qkv = nn.dense(ln1, P(f"{p}.attn.qkv.w", (3 * d, d)),
                           P(f"{p}.attn.qkv.b", (3 * d,)), name=f"{p}_qkv")

            def heads_of(part, qkv=qkv, p=p):
                # (B*T, 3d) columns [q | k | v] -> (B, H, T, dh)
                return te.compute((B, H, T, dh),
                                  lambda b, h, t, e: qkv[b * T + t, part * d + h * dh + e],
                                  name=f"{p}_{'qkv'[part]}")

            att = nn.scaled_dot_product_attention(heads_of(0), heads_of(1), heads_of(2),
                                                  causal=True, name=f"{p}_attn")
            merged = te.compute((N, d), lambda n, c, att=att: att[n // T, c // dh, n % T,
                                                                   c % dh],
                                name=f"{p}_merge")
            proj = nn.dense(merged, P(f"{p}.attn.proj.w", (d, d)), P(f"{p}.attn.proj.b", (d,)),
                            name=f"{p}_attn_proj")
            x = add(x, proj, f"{p}_res1")
            ln2 = nn.layer_norm(x, d, P(f"{p}.ln2.w", (d,)), P(f"{p}.ln2.b", (d,)),
                                name=f"{p}_ln2")
            fc = nn.dense(ln2, P(f"{p}.mlp.fc.w", (4 * d, d)), P(f"{p}.mlp.fc.b", (4 * d,)),
                          name=f"{p}_fc")
            act = nn.gelu(fc, name=f"{p}_gelu")
            mlp = nn.dense(act, P(f"{p}.mlp.proj.w", (d, 4 * d)), P(f"{p}.mlp.proj.b", (d,)),
                           name=f"{p}_mlp_proj")
            x = add(x, mlp, f"{p}_res2")
        lnf = nn.layer_norm(x, d, P("ln_f.w", (d,)), P("ln_f.b", (d,)), name="ln_f")
        self.logits = nn.dense(lnf, P("head.w", (vocab, d)), name="logits")
        targets = nn.reshape(self.targets, (N,), name="targets_flat")
        self.loss = nn.cross_entropy(self.logits, targets, name="loss")

    def inputs_list(self):
        """``[idx, targets, *weights]``: the order a built kernel takes its inputs."""
        return [self.idx, self.targets] + list(self.weights.values())

    def init_weights(self, rng):
        """torch's default initialisation: embeddings standard normal
        (``torch.nn.Embedding``), dense weights and biases uniform in
        ``(-1/sqrt(fan_in), 1/sqrt(fan_in))`` (``torch.nn.Linear``), LayerNorm weights 1
        and biases 0.

        Args:
            rng: a ``numpy.random.Generator``.
        Returns:
            dict name -> numpy array of :attr:`dtype`, in :attr:`weights`' order.
        """
        out = {}
        for name, t in self.weights.items():
            if "emb" in name:
                v = rng.standard_normal(t.shape)
            elif ".ln" in name or name.startswith("ln_f"):
                v = np.full(t.shape, 1.0 if name.endswith(".w") else 0.0)
            else:
                w = self.weights[name[:-1] + "w"]
                bound = 1.0 / np.sqrt(w.shape[1])
                v = rng.uniform(-bound, bound, size=t.shape)
            out[name] = v.astype(self.dtype)
        return out
