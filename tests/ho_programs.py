"""Random programs for the higher-order fuzzer (tests/test_fuzz_higher_order.py).

A program is a scalar float64 loss ``L(X)`` of one differentiated placeholder
``X`` (plus fixed placeholders: index lists, weights, loss coefficients) built
from one *family* of stages that the simplifier rewrites in different ways:

* ``gather``    ``L = sum_k f(S[I[k]])`` over ``k in [lo, m)`` with ``where=`` an
  affine, modular or data-dependent condition (becomes a scatter-add);
* ``row``       ``Y[r] = red_k f(S[I[r, k]])`` (gathered rows) with ``red`` one
  of sum, prod, max, min and two custom reducers, ``L = sum_r C[r] g(Y[r])``;
* ``affine``    ``Y[i] = red_k f(S[(a i + b k + c) % n])`` under a condition;
* ``scatter``   a ``te.scatter_add`` over a domain ``[lo, hi)`` (indices from
  data or affine), optionally on top of an ``init`` tensor;
* ``conv``      ``te.nn.conv1d`` (stride, padding, dilation) w.r.t. the input or
  the weight; ``pool``: ``max_pool2d`` / ``avg_pool2d`` with padding.

``S`` is ``X`` itself or an elementwise stage of it. Every choice goes through
a *chooser* ``ch(name, options)`` so that hypothesis draws (and shrinks) them,
or a numpy generator picks them (:class:`RngChooser`).

Ties: max/min sources are strictly monotone functions of distinct values of
``X`` (values spread at least 0.3 apart), so the only exact ties are copies of
one element (their derivative is the same whichever wins) and every other gap
is far wider than the finite-difference steps. Empty max/min domains are never
generated (they give -inf).
"""

import numpy as np

import texpr as te

# smooth functions with nonzero second and third derivatives on [-1.5, 1.5]
SMOOTH = {
    "sin": te.sin,
    "tanh": te.tanh,
    "cube": lambda v: v * v * v,
    "exp": lambda v: te.exp(v * 0.5),
    "sq+x": lambda v: v * v + v,
    "sigmoid": te.sigmoid,
}
# strictly increasing on [-1.5, 1.5]: max/min sources keep their order
MONOTONE = ["sin", "tanh", "cube", "exp", "sigmoid"]


def _oplus(a, b):
    return a + b + a * b  # (1 + a)(1 + b) - 1


REDUCERS = {
    "sum": te.sum,
    "prod": te.prod,
    "max": te.max,
    "min": te.min,
    "oplus": te.comm_reducer(_oplus, lambda d: te.const(0, d), name="oplus"),
    "logsumexp": te.comm_reducer(lambda a, b: te.log(te.exp(a) + te.exp(b)),
                                 lambda d: te.const(-np.inf, d), name="logsumexp"),
}


class RngChooser:
    """``ch(name, options)`` picking uniformly with a numpy generator."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def __call__(self, name, options):
        return options[int(self.rng.integers(len(options)))]


class Program:
    """``loss`` (scalar), ``x`` (the differentiated placeholder), ``feed`` (dict of
    float64/int64 arrays), ``text`` (the choices, for failure reports)."""

    def __init__(self, loss, x, feed, text):
        self.loss, self.x, self.feed, self.text = loss, x, feed, text


def spread_values(rng, shape, gap=0.3):
    """Distinct values in about [-1.3, 1.3], pairwise at least ``gap`` apart
    (a shuffled grid plus a small jitter; more than 9 values get a finer grid)."""
    n = int(np.prod(shape, dtype=np.int64))
    grid = np.linspace(-1.3, 1.3, max(n, 2))
    if n > 1 and grid[1] - grid[0] < gap + 0.02:
        gap = (grid[1] - grid[0]) * 0.8
    jitter = rng.uniform(-0.01, 0.01, n)
    return (rng.permutation(grid[:n]) + jitter).reshape(shape)


def _condition(ch, kind_options, k, m, data):
    """A ``where=`` condition on the reduction index ``k`` (over ``[lo, m)``), or None."""
    kind = ch("cond", kind_options)
    if kind == "none":
        return None, kind
    if kind == "affine":
        c = ch("cond_c", [1, 2])
        op = ch("cond_op", [">=", "<=", "range"])
        if op == ">=":
            return k >= c, f"k>={c}"
        if op == "<=":
            return k <= m - 1 - c, f"k<={m - 1 - c}"
        return (k >= 1) & (k <= m - 2), f"1<=k<={m - 2}"
    if kind == "modular":
        mod = ch("cond_mod", [2, 3])
        r = ch("cond_r", list(range(mod)))
        eq = ch("cond_eq", [True, False])
        return (k % mod == r) if eq else (k % mod != r), f"k%{mod}{'==' if eq else '!='}{r}"
    # data-dependent: an int mask loaded at k, or the gathered index itself
    which = ch("cond_data", ["mask", "index"])
    if which == "mask":
        return data["J"][k] > 0, "J[k]>0"
    return data["I"][k] % 2 == 0, "I[k]%2==0"


def _source(ch, x, n, monotone=False):
    """``S``: ``X`` itself or an elementwise stage of it (strictly increasing when
    ``monotone``: max/min sources keep the order of ``X``)."""
    kind = ch("source", ["X", "X", "elementwise"])
    if kind == "X":
        return x, "S=X"
    fname = ch("source_f", ["tanh", "sin"] if monotone else ["tanh", "sq+x", "sin"])
    f = SMOOTH[fname]
    return te.compute((n,), lambda j: f(x[j]) + 0.1 * x[j], name="S"), f"S={fname}(X)+0.1X"


def _loss_of(ch, y, rng, feed, linear=True):
    """``L = sum C * g(Y)`` with ``g`` smooth (or the identity when ``linear``) and
    ``C`` a fixed placeholder."""
    gname = ch("outer", ["sin", "tanh", "cube", "sq+x"] + (["identity"] if linear else []))
    g = (lambda v: v) if gname == "identity" else SMOOTH[gname]
    c = te.placeholder(y.shape, "C", "float64")
    feed[c] = rng.uniform(-1, 1, y.shape)
    if y.shape == ():
        return te.compute((), lambda: c[()] * g(y[()]), name="L"), gname
    axes = [te.reduce_axis(s, f"o{d}") for d, s in enumerate(y.shape)]
    return te.compute((), lambda: te.sum(c[tuple(axes)] * g(y[tuple(axes)]), axis=axes),
                      name="L"), gname


def build_program(ch, seed):
    """A random :class:`Program` (choices from ``ch``, values from ``seed``)."""
    rng = np.random.default_rng(seed)
    family = ch("family", ["gather", "row", "affine", "scatter", "conv", "pool"])
    builders = {"gather": _gather, "row": _row, "affine": _affine, "scatter": _scatter,
                "conv": _conv, "pool": _pool}
    return builders[family](ch, rng)


def _index_data(rng, n, shape):
    idx = te.placeholder(shape, "I", "int64")
    mask = te.placeholder(shape, "J", "int64")
    feed = {idx: rng.integers(0, n, shape), mask: rng.integers(0, 2, shape)}
    return {"I": idx, "J": mask}, feed


def _gather(ch, rng):
    n = ch("n", [4, 5])
    m = ch("m", [4, 5, 6])
    x = te.placeholder((n,), "X", "float64")
    data, feed = _index_data(rng, n, (m,))
    feed[x] = spread_values(rng, (n,))
    s, stext = _source(ch, x, n)
    lo = ch("lo", [0, 0, 1, 2])
    k = te.reduce_axis((lo, m) if lo else m, "k")
    where, ctext = _condition(ch, ["affine", "modular", "data", "none"], k, m,
                              {"I": data["I"], "J": data["J"]})
    fname = ch("f", sorted(SMOOTH))
    f = SMOOTH[fname]
    y = te.compute((), lambda: te.sum(f(s[data["I"][k]]), axis=k, where=where), name="Y")
    loss, gname = _loss_of(ch, y, rng, feed)
    return Program(loss, x, feed, f"gather n={n} m={m} k in [{lo},{m}) where {ctext} "
                                  f"f={fname} {stext} g={gname}")


def _row(ch, rng):
    n = ch("n", [4, 5, 6])
    rows, m = ch("rows", [2, 3]), ch("m", [3, 4])
    x = te.placeholder((n,), "X", "float64")
    idx = te.placeholder((rows, m), "I", "int64")
    mask = te.placeholder((rows, m), "J", "int64")
    feed = {x: spread_values(rng, (n,)), idx: rng.integers(0, n, (rows, m)),
            mask: rng.integers(0, 2, (rows, m))}
    rname = ch("reducer", sorted(REDUCERS))
    red = REDUCERS[rname]
    extreme = rname in ("max", "min")
    s, stext = _source(ch, x, n, monotone=extreme)
    fname = ch("f", MONOTONE if extreme else sorted(SMOOTH))
    f = SMOOTH[fname]
    lo = ch("lo", [0, 1])
    k = te.reduce_axis((lo, m) if lo else m, "k")
    # max/min: conditions that keep a point in every row (no -inf)
    ckind = ch("cond", ["none", "affine", "modular", "data", "coupled"] if not extreme
               else ["none", "affine_keep"])
    if ckind == "none":
        cond, ctext = (lambda r: None), "none"
    elif ckind in ("affine", "affine_keep"):
        cond, ctext = (lambda r: k <= m - 2), f"k<={m - 2}"
    elif ckind == "modular":
        cond, ctext = (lambda r: k % 2 == 1), "k%2==1"
    elif ckind == "data":
        cond, ctext = (lambda r: mask[r, k] > 0), "J[r,k]>0"
    else:
        cond, ctext = (lambda r: k >= r), "k>=r"
    y = te.compute((rows,), lambda r: red(f(s[idx[r, k]]), axis=k, where=cond(r)), name="Y")
    loss, gname = _loss_of(ch, y, rng, feed)
    return Program(loss, x, feed, f"row {rname} n={n} rows={rows} k in [{lo},{m}) where "
                                  f"{ctext} f={fname} {stext} g={gname}")


def _affine(ch, rng):
    n = ch("n", [4, 5, 6])
    m = ch("m", [3, 4])
    x = te.placeholder((n,), "X", "float64")
    feed = {x: spread_values(rng, (n,))}
    a, b, c = ch("a", [1, 2, 3]), ch("b", [1, 2, -1]), ch("c", [0, 1, 3])
    rname = ch("reducer", ["sum", "prod", "max", "min", "oplus"])
    extreme = rname in ("max", "min")
    s, stext = _source(ch, x, n, monotone=extreme)
    fname = ch("f", MONOTONE if extreme else sorted(SMOOTH))
    f = SMOOTH[fname]
    lo = ch("lo", [0, 1])
    k = te.reduce_axis((lo, m) if lo else m, "k")
    ckind = ch("cond", ["none", "k<=i", "k%2==0"] if not extreme else ["none"])
    conds = {"none": lambda i: None, "k<=i": lambda i: k <= i + lo, "k%2==0": lambda i: k % 2 == 0}
    red = REDUCERS[rname]
    y = te.compute((n,), lambda i: red(f(s[(a * i + b * k + c) % n]), axis=k,
                                       where=conds[ckind](i)), name="Y")
    loss, gname = _loss_of(ch, y, rng, feed)
    return Program(loss, x, feed, f"affine {rname} Y[i]=f(S[({a}i+{b}k+{c})%{n}]) k in "
                                  f"[{lo},{m}) where {ckind} f={fname} {stext} g={gname}")


def _scatter(ch, rng):
    n = ch("n", [4, 5])
    m = ch("m", [5, 6])
    x = te.placeholder((n,), "X", "float64")
    data, feed = _index_data(rng, n, (m,))
    feed[x] = spread_values(rng, (n,))
    s, stext = _source(ch, x, n)
    lo = ch("lo", [0, 1, 2])
    hi = ch("hi", [m, m - 1])
    target = ch("target", ["data", "affine"])
    fname = ch("f", sorted(SMOOTH))
    f = SMOOTH[fname]
    read = ch("read", ["p", "data"])
    wkind = ch("where", ["none", "p%2==0", "p>=lo+1", "J[p]>0"])
    wfn = {"none": None, "p%2==0": lambda p: p % 2 == 0, "p>=lo+1": lambda p: p >= lo + 1,
           "J[p]>0": lambda p: data["J"][p] > 0}[wkind]

    def index(p):
        return data["I"][p] if target == "data" else (2 * p + 1) % n

    def value(p):
        return f(s[p % n]) if read == "p" else f(s[data["I"][m - 1 - p]])

    init_kind = ch("init", ["zeros", "square"])
    init = None if init_kind == "zeros" else te.compute((n,), lambda j: x[j] * x[j], name="Init")
    y = te.scatter_add((n,), "float64", ((lo, hi),), index, value,
                       where=wfn, init=init, name="Scat")
    loss, gname = _loss_of(ch, y, rng, feed)
    return Program(loss, x, feed, f"scatter n={n} p in [{lo},{hi}) target={target} "
                                  f"read={read} where {wkind} init={init_kind} f={fname} "
                                  f"{stext} g={gname}")


def _conv(ch, rng):
    length = ch("L", [5, 6, 7])
    cin = ch("cin", [1, 2])
    ksize = ch("K", [2, 3])
    stride, dil, pad = ch("stride", [1, 2]), ch("dilation", [1, 2]), ch("padding", [0, 1])
    if (length + 2 * pad - dil * (ksize - 1) - 1) < 0:
        dil = 1
    x = te.placeholder((1, cin, length), "X", "float64")
    w = te.placeholder((2, cin, ksize), "W", "float64")
    feed = {x: rng.uniform(-1, 1, x.shape), w: rng.uniform(-1, 1, w.shape)}
    y = te.nn.conv1d(x, w, stride=stride, padding=pad, dilation=dil)
    # the identity outer function would leave L linear in X and in W
    loss, gname = _loss_of(ch, y, rng, feed, linear=False)
    wrt = ch("wrt", ["X", "W"])
    return Program(loss, x if wrt == "X" else w, feed,
                   f"conv1d L={length} cin={cin} K={ksize} stride={stride} dilation={dil} "
                   f"padding={pad} wrt={wrt} g={gname}")


def _pool(ch, rng):
    size = ch("H", [4, 5])
    kind = ch("pool", ["max", "avg"])
    kernel, stride, pad = ch("kernel", [2, 3]), ch("stride", [1, 2]), ch("padding", [0, 1])
    if pad * 2 > kernel:
        pad = 0
    x = te.placeholder((1, 1, size, size), "X", "float64")
    feed = {x: spread_values(rng, x.shape, gap=0.05)}
    if kind == "max":
        y = te.nn.max_pool2d(x, kernel, stride=stride, padding=pad)
    else:
        y = te.nn.avg_pool2d(x, kernel, stride=stride, padding=pad,
                             count_include_pad=ch("count_pad", [True, False]))
    loss, gname = _loss_of(ch, y, rng, feed)
    return Program(loss, x, feed, f"{kind}_pool2d H={size} kernel={kernel} stride={stride} "
                                  f"padding={pad} g={gname}")
