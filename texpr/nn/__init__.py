"""texpr.nn: the operator library (``te.nn``), every operator a plain compute definition.

The operators are ordinary texpr stages -- ``differentiate``, ``simplify`` and
``codegen`` treat them exactly like user code. Layout is NCHW (NCL for 1-D);
float parameters are weak constants (a float64 input stays float64); integer
parameters stay Python ints, so they are constants of the index arithmetic.
Bad arguments raise :class:`texpr.TexprError` subclasses naming the sizes at
fault. Families:

- :mod:`.linear` -- dense, matmul, batch_matmul, bias_add, einsum
- :mod:`.attention` -- scaled_dot_product_attention (optionally causal)
- :mod:`.conv` -- conv1d, conv2d, conv2d_transpose
- :mod:`.pool` -- max_pool2d, avg_pool2d, global_avg_pool2d, adaptive_avg_pool2d
- :mod:`.activation` -- relu, leaky_relu, elu, gelu, sigmoid, tanh
- :mod:`.loss` -- softmax, log_softmax, logsumexp, cross_entropy, mse_loss
- :mod:`.normalization` -- layer_norm, batch_norm, dropout
- :mod:`.shape` -- flatten, reshape, transpose, squeeze, expand_dims, broadcast_to,
  concatenate, split, pad, take, embedding, upsample_nearest, pixel_shuffle
- :mod:`.scan` -- cumsum, cumprod
- :mod:`.recurrent` -- rnn_cell, lstm_cell, gru_cell (torch's weight layout)
- :mod:`.sequence` -- rnn, lstm, gru over a whole sequence (``te.scan``)
- :mod:`.reduce` -- sum, mean, max, min (along axes, with keepdims)
"""

from .activation import elu, gelu, leaky_relu, relu, sigmoid, tanh
from .attention import scaled_dot_product_attention
from .conv import conv1d, conv2d, conv2d_transpose
from .linear import batch_matmul, bias_add, dense, einsum, matmul
from .loss import cross_entropy, log_softmax, logsumexp, mse_loss, softmax
from .normalization import batch_norm, dropout, layer_norm
from .pool import adaptive_avg_pool2d, avg_pool2d, global_avg_pool2d, max_pool2d
from .reduce import max, mean, min, sum  # noqa: A004 - numpy's names
from .recurrent import gru_cell, lstm_cell, rnn_cell
from .scan import cumprod, cumsum
from .sequence import gru, lstm, rnn
from .shape import (broadcast_to, concatenate, embedding, expand_dims, flatten, pad,
                    pixel_shuffle, reshape, split, squeeze, take, transpose, upsample_nearest)

__all__ = [
    # linear
    "dense", "matmul", "batch_matmul", "bias_add", "einsum",
    # attention
    "scaled_dot_product_attention",
    # convolution
    "conv1d", "conv2d", "conv2d_transpose",
    # pooling
    "max_pool2d", "avg_pool2d", "global_avg_pool2d", "adaptive_avg_pool2d",
    # activations
    "relu", "leaky_relu", "elu", "gelu", "sigmoid", "tanh",
    # softmax and losses
    "softmax", "log_softmax", "logsumexp", "cross_entropy", "mse_loss",
    # normalisation
    "layer_norm", "batch_norm", "dropout",
    # shape and data movement
    "flatten", "reshape", "transpose", "squeeze", "expand_dims", "broadcast_to",
    "concatenate", "split", "pad", "take", "embedding", "upsample_nearest", "pixel_shuffle",
    # scans
    "cumsum", "cumprod",
    # recurrent cells
    "rnn_cell", "lstm_cell", "gru_cell",
    # whole-sequence recurrent models
    "rnn", "lstm", "gru",
    # reductions
    "sum", "mean", "max", "min",
]


def _checks_name(fn):
    """``fn`` that first checks its ``name`` argument is a str (a TexprError naming
    the operator otherwise, before any stage is built)."""
    import functools
    import inspect

    from ..tensor import check_name

    sig = inspect.signature(fn)
    if "name" not in sig.parameters:
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError:
            return fn(*args, **kwargs)  # Python's own message for a wrong call
        if "name" in bound.arguments:
            check_name(bound.arguments["name"], f"te.nn.{fn.__name__}")
        return fn(*args, **kwargs)

    return wrapper


for _n in __all__:
    globals()[_n] = _checks_name(globals()[_n])
del _n
