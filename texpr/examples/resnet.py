"""A small ResNet for 32x32 colour images (CIFAR-10 sized), written with ``te.nn``.

Architecture (NCHW; every convolution 3x3, padding 1, no bias; every BN is
``te.nn.batch_norm`` in training mode -- batch statistics -- with a weight and a
bias)::

    x (B, 3, 32, 32)
    stem:    conv 3->W, BN, relu
    block1:  residual block at W channels
    block2:  residual block at W channels
    down:    conv W->2W stride 2, BN, relu            (B, 2W, 16, 16)
    block3:  residual block at 2W channels
    pool:    global average pool (te.nn.global_avg_pool2d) -> (B, 2W)
    fc:      dense 2W->10 with bias -> logits (B, 10)
    loss:    mean cross-entropy (te.nn.cross_entropy)

with ``W = 32`` by default; a residual block is
``relu(BN(conv(relu(BN(conv(h))))) + h)``. ``width``, ``image`` and ``batch``
shrink it for tests. :mod:`texpr.examples.models_torch` computes the same loss
with PyTorch from the same weights.
"""

import numpy as np

import texpr as te

__all__ = ["ResNet"]


class ResNet:
    """The ResNet as a texpr graph for a fixed batch size.

    Attributes:
        x: placeholder ``(B, 3, image, image)``. labels: int64 placeholder ``(B,)``.
        weights: dict name -> placeholder, in the order a kernel takes them:
            ``stem.conv.w``, ``stem.bn.w``, ``stem.bn.b``; for ``block1``, ``block2``:
            ``{block}.conv1.w``, ``{block}.bn1.w``, ``{block}.bn1.b``, ``{block}.conv2.w``,
            ``{block}.bn2.w``, ``{block}.bn2.b``; ``down.conv.w``, ``down.bn.w``,
            ``down.bn.b``; the six of ``block3``; ``fc.w`` ``(classes, 2*width)``,
            ``fc.b``. Convolution weights are ``(out, in, 3, 3)`` (torch's layout).
        logits: ``(B, classes)``. loss: the scalar mean cross-entropy.
    """

    def __init__(self, batch=64, dtype="float32", width=32, image=32, classes=10):
        """Build the graph.

        Args:
            batch: the batch size B. dtype: the float dtype of inputs and weights.
            width: channels of the first stage (the second has ``2 * width``).
            image: the input's height and width (the stride-2 stage gives ``ceil(image / 2)``).
            classes: the number of classes.
        Raises:
            TexprError: from ``te.placeholder``/``te.nn`` for bad sizes or dtype.
        """
        nn = te.nn
        self.batch, self.dtype, self.width, self.image, self.classes = (
            batch, dtype, width, image, classes)
        self.x = te.placeholder((batch, 3, image, image), name="x", dtype=dtype)
        self.labels = te.placeholder((batch,), name="labels", dtype="int64")
        self.weights = {}

        def P(name, shape):
            t = te.placeholder(shape, name=name.replace(".", "_"), dtype=dtype)
            self.weights[name] = t
            return t

        def conv_bn(h, prefix, conv, bn, cin, cout, stride=1):
            w = P(f"{prefix}.{conv}.w", (cout, cin, 3, 3))
            g, b = P(f"{prefix}.{bn}.w", (cout,)), P(f"{prefix}.{bn}.b", (cout,))
            name = f"{prefix}_{conv}"
            h = nn.conv2d(h, w, stride=stride, padding=1, name=name)
            return nn.batch_norm(h, g, b, name=f"{prefix}_{bn}")

        def block(h, prefix, c):
            y = nn.relu(conv_bn(h, prefix, "conv1", "bn1", c, c), name=f"{prefix}_relu1")
            y = conv_bn(y, prefix, "conv2", "bn2", c, c)
            s = te.compute(y.shape, lambda *i: y[i] + h[i], name=f"{prefix}_skip")
            return nn.relu(s, name=f"{prefix}_relu2")

        c1, c2 = width, 2 * width
        h = nn.relu(conv_bn(self.x, "stem", "conv", "bn", 3, c1), name="stem_relu")
        h = block(h, "block1", c1)
        h = block(h, "block2", c1)
        h = nn.relu(conv_bn(h, "down", "conv", "bn", c1, c2, stride=2), name="down_relu")
        h = block(h, "block3", c2)
        h = nn.flatten(nn.global_avg_pool2d(h, name="pool"), name="features")
        self.logits = nn.dense(h, P("fc.w", (classes, c2)), P("fc.b", (classes,)),
                               name="logits")
        self.loss = nn.cross_entropy(self.logits, self.labels, name="loss")

    def inputs_list(self):
        """``[x, labels, *weights]``: the order a built kernel takes its inputs."""
        return [self.x, self.labels] + list(self.weights.values())

    def init_weights(self, rng):
        """torch's default initialisation: convolution and dense weights (and the
        dense bias) uniform in ``(-1/sqrt(fan_in), 1/sqrt(fan_in))`` (kaiming-uniform
        with ``a = sqrt 5``), BN weights 1 and biases 0.

        Args:
            rng: a ``numpy.random.Generator``.
        Returns:
            dict name -> numpy array of :attr:`dtype`, in :attr:`weights`' order.
        """
        out = {}
        for name, t in self.weights.items():
            if ".bn" in name:
                value = 1.0 if name.endswith(".w") else 0.0
                out[name] = np.full(t.shape, value, dtype=self.dtype)
                continue
            fan_in = self.weights["fc.w"].shape[1] if name == "fc.b" else int(
                np.prod(t.shape[1:]))
            bound = 1.0 / np.sqrt(fan_in)
            out[name] = rng.uniform(-bound, bound, size=t.shape).astype(self.dtype)
        return out
