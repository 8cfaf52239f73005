"""The gradient suite (docs/testing.md) for the simplifier: each case builds
its operator with ``te.nn`` (or a plain compute), its inputs, and the ideal
iteration count of each gradient computed independently (numpy counting of the
structurally nonzero terms). Shared by the other ``test_simplify_*`` files.
"""

import itertools

import numpy as np

import texpr as te

from texpr import simplify


def taps(out, k, s, d, p, size):
    """Number of (output position, kernel tap) pairs inside the input along one axis."""
    o = np.arange(out)[:, None]
    r = np.arange(k)[None, :]
    pos = o * s + r * d - p
    return int(np.count_nonzero((pos >= 0) & (pos < size)))


def conv_out(size, k, s, d, p):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def conv_case(n, c, h, w, o, k, s=1, d=1, p=0, groups=1):
    X = te.placeholder((n, c, h, w), "X")
    W = te.placeholder((o, c // groups, k, k), "W")
    Y = te.nn.conv2d(X, W, stride=s, padding=p, dilation=d, groups=groups)
    ho, wo = conv_out(h, k, s, d, p), conv_out(w, k, s, d, p)
    pairs = n * o * (c // groups) * taps(ho, k, s, d, p, h) * taps(wo, k, s, d, p, w)
    return Y, [X, W], [pairs, pairs]


def conv_transpose_case(n, c, h, w, o, k, s, p):
    X = te.placeholder((n, c, h, w), "X")
    W = te.placeholder((c, o, k, k), "W")
    Y = te.nn.conv2d_transpose(X, W, stride=s, padding=p)
    ho = Y.shape[2]
    # forward pairs: (output position, tap) with t = oh + p - kh divisible by s and in range
    oh = np.arange(ho)[:, None]
    kh = np.arange(k)[None, :]
    t = oh + p - kh
    valid = (t >= 0) & (t % s == 0) & (t // s < h)
    per = int(np.count_nonzero(valid))
    pairs = n * o * c * per * per
    return Y, [X, W], [pairs, pairs]


def pool_case(kind, n, c, h, w, k, s, p=0):
    X = te.placeholder((n, c, h, w), "X")
    if kind == "max":
        Y = te.nn.max_pool2d(X, k, stride=s, padding=p)
    else:
        Y = te.nn.avg_pool2d(X, k, stride=s, padding=p, count_include_pad=True)
    ho = conv_out(h, k, s, 1, p)
    pairs = n * c * taps(ho, k, s, 1, p, h) ** 2
    windows = n * c * ho * ho * k * k
    ideal = pairs + windows if kind == "max" else pairs
    return Y, [X], [ideal]


def dense_case(n, m, k):
    X = te.placeholder((n, k), "X")
    W = te.placeholder((m, k), "W")
    return te.nn.dense(X, W), [X, W], [n * m * k, n * m * k]


def cumsum_case(n, m):
    X = te.placeholder((n, m), "X")
    return te.nn.cumsum(X, axis=1), [X], [n * m]


#: cases whose simplified gradient is linear but not yet at its ideal: the exact counts,
#: which the count tests check instead of the ideal. None now: cumsum's gradient, a
#: reverse scan whose state lives in X's layout (n * m points), reached its ideal.
KNOWN_GAPS = {}


def causal_case(b, t, dd):
    Q = te.placeholder((b, t, dd), "Q")
    K = te.placeholder((b, t, dd), "K")
    d = te.reduce_axis(dd, "d")
    S = te.compute((b, t, t), lambda bb, i, j: te.if_then_else(
        j <= i, te.sum(Q[bb, i, d] * K[bb, j, d], axis=d), 0.0), name="scores")
    tri = b * dd * t * (t + 1) // 2
    return S, [Q, K], [tri, tri]


def upsample_case(n, c, h, w):
    X = te.placeholder((n, c, h, w), "X")
    Y = te.compute((n, c, 2 * h, 2 * w), lambda a, b, i, j: X[a, b, i // 2, j // 2], name="up")
    return Y, [X], [n * c * 4 * h * w]


def pixel_shuffle_case(n, c, h, w):
    X = te.placeholder((n, c, h, w), "X")
    Y = te.compute((n, c // 4, 2 * h, 2 * w), lambda a, b, i, j: X[
        a, 4 * b + 2 * (i % 2) + j % 2, i // 2, j // 2], name="shuffle")
    return Y, [X], [n * c * h * w]


def flatten_dense_case(n, c, h, w, m):
    X = te.placeholder((n, c, h, w), "X")
    W = te.placeholder((m, c * h * w), "W")
    Y = te.nn.dense(te.nn.flatten(X), W)
    return Y, [X, W], [n * m * c * h * w] * 2


def transpose_sum_case(n):
    A = te.placeholder((n, n), "A")
    Y = te.compute((n, n), lambda i, j: A[i, j] + A[j, i], name="tsum")
    return Y, [A], [n * n]


def layernorm_case(n, m):
    X = te.placeholder((n, m), "X")
    return te.nn.layer_norm(X, m), [X], [16 * n * m]


def softmax_xent_case(n, c):
    Z = te.placeholder((n, c), "Z")
    L = te.placeholder((n,), "labels", dtype="int64")
    return te.nn.cross_entropy(Z, L, reduction="none"), [Z], [16 * n * c]


def suite(small):
    """name -> (output, inputs, ideal counts); ``small``: the suite's test sizes."""
    if small:
        N, C, S = 2, 3, 10
        return {
            "dense": dense_case(4, 3, 6),
            "conv2d_s1": conv_case(N, C, S, S, 4, 3, 1, 1, 1),
            "conv2d_s2": conv_case(N, C, S, S, 4, 3, 2, 1, 1),
            "conv2d_dil2": conv_case(N, C, S, S, 4, 3, 1, 2, 2),
            "depthwise": conv_case(N, C, S, S, C, 3, 1, 1, 1, groups=C),
            "maxpool2": pool_case("max", N, C, S, S, 2, 2),
            "avgpool3s2": pool_case("avg", N, C, S, S, 3, 2, 1),
            "conv2d_transpose_s2": conv_transpose_case(N, 4, 5, 5, 3, 4, 2, 1),
            "cumsum": cumsum_case(3, 7),
            "causal_scores": causal_case(2, 5, 3),
            "upsample2": upsample_case(N, C, 4, 4),
            "pixel_shuffle2": pixel_shuffle_case(N, 8, 3, 3),
            "flatten_dense": flatten_dense_case(N, C, 3, 3, 4),
            "transpose_sum": transpose_sum_case(10),
            "layernorm": layernorm_case(4, 6),
            "softmax_xent": softmax_xent_case(4, 5),
        }
    return {
        "dense": dense_case(256, 128, 784),
        "conv2d_s1": conv_case(32, 16, 28, 28, 32, 3, 1, 1, 1),
        "conv2d_s2": conv_case(32, 16, 28, 28, 32, 3, 2, 1, 1),
        "conv2d_dil2": conv_case(32, 16, 28, 28, 32, 3, 1, 2, 2),
        "depthwise": conv_case(32, 32, 28, 28, 32, 3, 1, 1, 1, groups=32),
        "maxpool2": pool_case("max", 32, 32, 28, 28, 2, 2),
        "avgpool3s2": pool_case("avg", 32, 32, 28, 28, 3, 2, 1),
        "conv2d_transpose_s2": conv_transpose_case(32, 16, 14, 14, 8, 4, 2, 1),
        "cumsum": cumsum_case(256, 1024),
        "causal_scores": causal_case(8, 128, 64),
        "upsample2": upsample_case(32, 16, 14, 14),
        "pixel_shuffle2": pixel_shuffle_case(32, 64, 14, 14),
        "flatten_dense": flatten_dense_case(32, 16, 7, 7, 10),
        "transpose_sum": transpose_sum_case(10),
        "layernorm": layernorm_case(256, 512),
        "softmax_xent": softmax_xent_case(256, 10),
    }


SUITE_FULL_IDEALS = {  # the suite's table of ideals, to check the independent counts above
    "dense": [25690112] * 2, "conv2d_s1": [110166016] * 2, "conv2d_s2": [27541504] * 2,
    "conv2d_dil2": [104857600] * 2, "depthwise": [6885376] * 2,
    "maxpool2": [802816 * 2], "avgpool3s2": [1721344],
    "conv2d_transpose_s2": [11943936] * 2, "cumsum": [262144],
    "causal_scores": [4227072] * 2, "upsample2": [401408], "pixel_shuffle2": [401408],
    "flatten_dense": [250880] * 2, "transpose_sum": [100],
}


def gradients(Y, inputs, simplify_=True, H=None):
    """Simplified (or raw) gradients of ``Y`` with a placeholder head (``H`` or a new one)."""
    H = te.placeholder(Y.shape, "H", dtype=Y.dtype) if H is None else H
    res = te.differentiate(Y, inputs, head=H, simplify=simplify_)
    return list(res), H


def sweep_cases():
    """The 27 conv2d sweep cases: X 1x2x10x10, W 2x2xKxK, pad 0."""
    for k, s, d in itertools.product((1, 2, 3), repeat=3):
        yield (k, s, d), conv_case(1, 2, 10, 10, 2, k, s, d, 0)


def test_ideals_match_suite_table():
    cases = suite(small=False)
    for name, ideal in SUITE_FULL_IDEALS.items():
        assert cases[name][2] == ideal, name


if __name__ == "__main__":
    import sys
    import time

    full = "--full" in sys.argv
    for name, (Y, inputs, ideals) in suite(small=not full).items():
        t0 = time.time()
        grads, _H = gradients(Y, inputs)
        t1 = time.time()
        counts = [simplify.iteration_count([g]) for g in grads]
        t2 = time.time()
        ok = all(c <= i for c, i in zip(counts, ideals))
        print(f"{name:22s} ideal {ideals} measured {counts} {'OK' if ok else 'OVER'} "
              f"simplify {t1 - t0:.2f}s count {t2 - t1:.2f}s")
