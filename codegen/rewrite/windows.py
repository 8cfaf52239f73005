"""Window stages: a contraction's im2col operand computed once for every GEMM
that reads it.

One job: rewrite, before scheduling, the contraction stages that run on BLAS
(:mod:`codegen.analysis.contraction`) and read an operand through a sliding window, so
that they read a materialised window stage instead. A convolution and its
weight gradient both read its input through the same window,

    conv[n, o, h, w] = sum(X[n, c, h + kh - 1, w + kw - 1] * W[o, c, kh, kw], ...)
    d_W[o, c, kh, kw] = sum(H[n, o, h, w] * X[n, c, h + kh - 1, w + kw - 1], ...)

and the GEMM path packed an im2col copy of ``X`` for each of them (a zero-padded
copy first, then a strided numpy copy with short innermost runs). The rewrite
adds one stage,

    X_win[c, kh, kw, n, h, w] = select(0 <= h + kh - 1 < 28 && 0 <= w + kw - 1 < 28,
                                       X[n, c, h + kh - 1, w + kw - 1], 0)

(zeros outside ``X``, so no padded copy; run as strided moves,
:mod:`codegen.analysis.shifts`, or else as a loop nest), and both stages
read ``X_win[c, kh, kw, n, h, w]``: plain views, whose strides merge into both
GEMMs' operands (the convolution's ``K = (c, kh, kw)`` beside its images
``(n, h, w)``; the weight gradient's ``K = (n, h, w)`` beside ``(c, kh, kw)``),
so neither GEMM copies it. The stages keep their ``where``: what the window's
zeros stand for are absent terms, applied as masks on the GEMM path's exact
path only (a non-finite operand, :func:`codegen.backends.numpy_host.exact.run_exact`),
where a term the original never visits must stay absent rather than be ``0 *
inf``; the stage is marked (``attrs[WINDOWED]``) and the window stage carries
its valid region (``attrs[WINDOW]``) for :func:`codegen.analysis.contraction.match`.

**The pattern.** A load of a stage that :func:`codegen.analysis.contraction.match` runs
on BLAS (its cost rule says so) whose index dimensions are each either one
stage axis (a *plain* dimension) or ``a * u + b * v + c`` over two stage axes
(a *window* dimension: ``u`` the position, the longer axis, ``v`` the tap),
with at least one window dimension and every axis in one dimension only. Two
loads share a window when they read one tensor with the same plain
dimensions and the same window dimensions (coefficients, constants and
extents): a convolution's ``h + kh - 1`` and its weight gradient's ``r_h + j2 -
1``.

**Layout.** The window's axes: the plain dimensions that are reduction axes of
the first stage reading it, its taps, the other plain dimensions, its
positions (a convolution's ``(c, kh, kw, n, h, w)``).

**Cost rule.** A window is made only when at least ``options.window_min_readers`` stages read
it, and it is no larger than what each reader's GEMMs read of that operand
(their im2col copies; a strided convolution's dX reads its weights by taps,
and a window over its positions would be a hundred times that). For a single
reader a window costs a compiled unit and saved nothing: the forward
convolutions of conv2d_s1 and conv2d_s2 alone ran 3.73 ms and 1.28-1.33 ms
with and without one (in-process A/B, medians, 2026-12-05).

A window is made only up to ``options.window_max_bytes`` (16 MiB, half this
machine's last-level cache): a larger one is written to DRAM whole and read
back by each GEMM, where its readers, without it, pack their im2col copies
chunk by chunk from the operand, which stays in cache
(:mod:`codegen.backends.numpy_host.gemm`'s chunks). The CIFAR ResNet's step
(benchmarks/model_cases.py, its 75 MB windows) took 409 ms with its windows,
343 ms without (in-process A/B, medians of 5, load 3, 2026-12-07): each
3x3 convolution at 32 channels 6 ms less for the window's moves and 4 ms less
in its GEMM.
"""

import math

import numpy as np

from texpr import expr as E
from texpr.errors import TexprError
from texpr.expr import Load
from texpr.simplify.graph import rebuild
from texpr.simplify.isl_bridge import isl
from texpr.tensor import ComputeOp, topo_order
from texpr.visitor import substitute

from ..analysis import contraction, matches
from ..ir.marks import WINDOW, WINDOW_ORDER, WINDOWED
from ..analysis.affine import linear_coefs as _linear
from ..options import current as _opts

__all__ = ["window_operands", "WINDOW", "WINDOWED"]

# options.window_min_readers (default 2): a window is made when at least this many stages
#   read it
# options.windows (default True): False: no window stage is made (for A/B timings,
#   benchmarks/bench_variants.py)


def window_operands(outputs, keep=()):
    """The graph of ``outputs`` (simplified Tensors) with the sliding-window
    operands of its BLAS contractions read from window stages (module docstring).

    Args:
        outputs: list of Tensors.
        keep: ops of the input graph the caller holds on to (stages to be
            materialised); returned as the ops that replace them.
    Returns ``(tensors, windows, kept)``: the output Tensors, the window
    stages' ops (to be materialised), ``keep``'s ops in the rewritten graph.
    Never raises for a stage it cannot rewrite: that stage is kept."""
    if not _opts().windows:
        return list(outputs), [], list(keep)
    # first pass: which windows would be read, and by how many stages
    counts = {}
    for op in topo_order(list(outputs)):
        for sig, _i, _roles in _window_loads(op):
            counts[sig] = counts.get(sig, 0) + 1
    wanted = {sig for sig, n in counts.items() if n >= _opts().window_min_readers}
    if not wanted:
        return list(outputs), [], list(keep)
    made, replaced = {}, {}

    def fn(op, orig, tmap):
        replaced[id(orig)] = op
        try:
            new = _rewritten(op, orig, wanted, made)
        except (TexprError, isl.Error):
            return None
        if new is None:
            return None
        replaced[id(orig)] = new
        return new.output(0)

    outs = rebuild(list(outputs), fn)
    used = {id(op) for op in topo_order(outs)}
    kept = [replaced.get(id(op), op) for op in keep]
    return (outs, [t.op for t in made.values() if id(t.op) in used],
            [op for op in kept if id(op) in used])


def _candidate(op):
    """``(reduce, loads)`` of a stage the pattern may apply to, or None."""
    red = contraction.float_sum(op)
    if red is None or op.attrs.get(WINDOWED):
        return None
    facs, conds = [], []
    contraction._factors(red.source[0], facs, conds)
    loads = [f for f in facs if isinstance(f, Load)]
    if len(loads) != 2 or len(loads) + sum(isinstance(f, E.Const) for f in facs) != len(facs):
        return None
    return red, loads


def _window_loads(op):
    """``[(signature, position, roles)]``: the stage's loads (their positions among
    its two factors) that read through a window,
    when the stage runs on BLAS. ``roles``: per plain dimension whether its axis
    is a reduction axis, and per window dimension ``(pos, tap)`` axes."""
    cand = _candidate(op)
    if cand is None:
        return []
    red, loads = cand
    try:
        plan = matches.match(op)
    except Exception:  # noqa: BLE001 - the matcher's own errors: leave the stage alone
        return []
    if plan is None or not contraction.cost_ok(plan):
        return []
    axes = {id(v): v for v in list(op.axis) + list(red.axes)}
    reduce_ids = {id(v) for v in red.axes}
    out = []
    for i, ld in enumerate(loads):
        w = _window_of(ld, axes)
        if w is None:
            continue
        plain, windows = w
        # no larger than what the GEMMs read of the operand (a strided convolution's
        # dX reads its weights by taps: a window over (h, r_h) would be 100x that)
        size = math.prod(ld.tensor.shape[d] for d, _v in plain) * math.prod(
            (axes[pu].dom[1] - axes[pu].dom[0]) * (axes[tv].dom[1] - axes[tv].dom[0])
            for _d, pu, tv, _a, _b, _c in windows)
        if size > plan.operand_elements(i):
            continue
        # a window above window_max_bytes goes to DRAM and back (module docstring)
        if size * _itemsize(ld.tensor.dtype) > _opts().window_max_bytes:
            continue
        sig = (id(ld.tensor), tuple(d for d, _v in plain),
               tuple((d, a, b, c, axes[pu].dom, axes[tv].dom)
                     for d, pu, tv, a, b, c in windows))
        roles = ([(d, id(v) in reduce_ids) for d, v in plain], windows)
        out.append((sig, i, roles))
    return out


def _itemsize(dtype):
    """Bytes of one element of ``dtype`` (a tensor's dtype name); 8 when unknown."""
    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        return 8


def _window_of(ld, axes):
    """``(plain, windows)`` of a load: ``plain`` ``[(dim, axis)]``, ``windows``
    ``[(dim, pos id, tap id, a, b, c)]``; None when the load is not read through a
    window (module docstring)."""
    plain, windows, seen = [], [], set()
    for d, ix in enumerate(ld.args):
        f = _linear(ix)
        if f is None:
            return None
        coefs = {v: c for v, c in f[0].items() if c}
        if any(v not in axes for v in coefs):
            return None
        if len(coefs) == 1 and f[1] == 0 and next(iter(coefs.values())) == 1 \
                and isinstance(ix, E.Var):
            (v,) = coefs
            plain.append((d, axes[v]))
        elif len(coefs) == 2:
            (v1, c1), (v2, c2) = sorted(coefs.items(), key=lambda kv: (
                -(axes[kv[0]].dom[1] - axes[kv[0]].dom[0]), axes[kv[0]].name))
            if axes[v1].dom[1] - axes[v1].dom[0] == axes[v2].dom[1] - axes[v2].dom[0]:
                return None  # no position and tap to tell apart
            windows.append((d, v1, v2, c1, c2, f[1]))
        else:
            return None
        ids = list(coefs)
        if any(v in seen for v in ids):
            return None
        seen.update(ids)
    if not windows:
        return None
    return plain, windows


def _rewritten(op, orig, wanted, made):
    """The stage reading its windows (made as needed into ``made``), or None.
    ``orig``: the stage in the input graph, whose loads' tensors the signatures
    name (``op`` reads the rewritten producers: a stage behind a window has new
    tensors); ``op``'s loads are at the same places, over the same axes."""
    found = [(sig, i, roles) for sig, i, roles in _window_loads(orig) if sig in wanted]
    if not found:
        return None
    red = op.body[0]
    loads = _candidate(op)[1]
    mapping = {}
    for sig, i, roles in found:
        ld = loads[i]
        plain, windows = roles
        axes = {id(v): v for v in list(op.axis) + list(red.axes)}
        win = made.get(sig)
        if win is None:
            win = made[sig] = _window_stage(ld, plain, windows, axes)
        order = win.op.attrs[WINDOW_ORDER]
        idx = []
        for kind, d in order:
            if kind == "plain":
                idx.append(ld.args[d])
            else:
                w = next(x for x in windows if x[0] == d)
                v = axes[w[2]] if kind == "tap" else axes[w[1]]
                idx.append(v if v.dom[0] == 0 else v - v.dom[0])
        mapping[ld] = E.load(win, idx)
    body = substitute(red, mapping)
    return ComputeOp(op.name, op.axis, (body,), op.tag, dict(op.attrs, **{WINDOWED: True}))


def _window_stage(ld, plain, windows, axes):
    """The window stage (a Tensor) of a load (module docstring)."""
    t = ld.tensor
    lead = [(d, is_red) for d, is_red in plain if is_red]
    rest = [(d, is_red) for d, is_red in plain if not is_red]
    order = [("plain", d) for d, _ in lead] + [("tap", w[0]) for w in windows] + \
        [("plain", d) for d, _ in rest] + [("pos", w[0]) for w in windows]
    ivs, lo_of = [], {}
    for kind, d in order:
        if kind == "plain":
            n = t.shape[d]
            ivs.append(E.iter_var(0, n, f"i{d}", "spatial"))
        else:
            w = next(x for x in windows if x[0] == d)
            v = axes[w[2]] if kind == "tap" else axes[w[1]]
            # an axis over [lo, hi) (a reduction domain the simplifier shrank) is a
            # window axis over [0, hi - lo), read at v - lo
            ivs.append(E.iter_var(0, v.dom[1] - v.dom[0], f"{kind[0]}{d}", "spatial"))
            lo_of[(kind, d)] = v.dom[0]
    by = {key: (iv if lo_of.get(key, 0) == 0 else iv + lo_of[key]) for key, iv in zip(order, ivs)}
    args, cond, region = [], None, []
    for d in range(len(t.shape)):
        if ("plain", d) in by:
            args.append(by[("plain", d)])
            continue
        _d, _pu, _tv, a, b, c = next(x for x in windows if x[0] == d)
        ix = by[("pos", d)] * a + by[("tap", d)] * b
        ix = ix + c if c >= 0 else ix - (-c)
        args.append(ix)
        inside = E.logical_and(ix >= 0, ix < t.shape[d])
        cond = inside if cond is None else E.logical_and(cond, inside)
        # in the window's own coordinates (from 0)
        c0 = c + a * lo_of.get(("pos", d), 0) + b * lo_of.get(("tap", d), 0)
        region.append((order.index(("tap", d)), order.index(("pos", d)), a, b, c0, t.shape[d]))
    body = E.select(cond, E.load(t, args), E.const(0.0, t.dtype))
    wop = ComputeOp(f"{t.name}_window", ivs, (body,), "window",
                    {WINDOW: region, WINDOW_ORDER: order, "of": t.name})
    return wop.output(0)

