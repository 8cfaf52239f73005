"""Tap splitting (col2im): a contraction whose im2col copy would be large becomes
a GEMM over its channels and a sum over its kernel taps.

One job: rewrite, before scheduling, a contraction stage (:mod:`codegen.analysis.contraction`)
in which one operand is read at indices that mix output (spatial) axes with
reduction axes -- a convolution's input gradient,

    dX[n, c, h, w] = sum(H[n, o, h - kh + 1, w - kw + 1] * W[o, c, kh, kw],
                         axis=[o, kh, kw], where=<padding>)

-- into two stages when that moves less memory:

    dX_taps[c, kh, kw, n, g0, g1] = sum(H[n, o, g0, g1] * W[o, c, kh, kw], axis=[o])
    dX[n, c, h, w] = sum(dX_taps[c, kh, kw, n, h - kh + 1, w - kw + 1],
                         axis=[kh, kw], where=<padding>)

The first is a GEMM whose operands are views (no packing copy); the second
(col2im) adds each output point's taps (strided adds, :mod:`codegen.analysis.shifts`,
or else a loop nest). The GEMM path ran
the original as one GEMM over an im2col copy of ``H`` (every element of H
copied once per tap: ``n * o * 9 * h * w``); the split writes and reads
``dX_taps`` instead (``n * c * 9 * h * w``: half as much for conv2d_s1,
where ``c = 16`` and ``o = 32``). It is the classic col2im formulation of a
convolution's data gradient (Chellapilla, Puri, Simard, "High performance
convolutional neural networks for document processing", 2006; Caffe's
``col2im``), chosen here by pattern on any stage, never by operator name.

**The pattern.** A stage ``out[s] = sum(c * A[a(s, r)] * B[b(s, r)], axis=r,
where=w)`` that :func:`codegen.analysis.contraction.match` runs on BLAS (its cost rule
says so), where:

* ``A``'s *mixed* index dimensions are affine, or ``affine // c`` (a
  transposed convolution's ``X[n, c, (h + 1 - kh) // 2, ...]`` under ``(h +
  kh + 1) % 2 == 0``), each in at least one spatial and one reduction axis;
  the reduction axes there are the *taps* ``R_t``, the spatial axes there
  ``S_m``;
* ``A``'s other dimensions read neither taps nor ``S_m``, and ``B`` reads no
  ``S_m`` axis;
* every conjunct of ``w`` reads no data; one that reads a channel axis (a
  reduction axis not a tap) reads no ``S_m`` axis (it goes to the GEMM stage;
  the others go to the loop nest).

The GEMM stage's axes are the spatial axes not in ``S_m`` -- those both
operands read, then ``B``'s, in the output's order --, the taps (a tap over
``[lo, hi)`` as an axis over ``[0, hi - lo)``), the spatial axes only ``A``
reads, and one axis per mixed dimension over ``A``'s extent there: the GEMM
then writes its result in place, ``B`` giving its rows and ``A`` (an image)
its columns. The tap sum reads it at the mixed indices, under the original
conjuncts and those of the mixed indices' bounds that the conjuncts do not
imply (they do imply them: the GEMM path proves every load of the domain
inside its tensor).

**Cost rule** (:func:`_pays`): split only when the GEMM stage has fewer
elements than ``A``'s im2col copy (what the stage's GEMMs read of ``A``:
:meth:`codegen.backends.numpy_host.gemm.ContractionPlan.operand_elements`) or than the GEMM path's
packing copies of both operands, if more (a strided convolution's dX reads
``W`` at mixed indices but packs ``H`` once per residue class), the tap sum's
domain fills at least half its box or the tap sum runs as a shift plan, whose
moves visit only its domain's points (a strided convolution's taps are valid
at one point in ``stride`` per axis: a loop nest over the box would visit
mostly empty points), and the GEMM stage itself matches the GEMM path, pays,
and needs no zero padding or mask (data masks only where it is packed: they
apply on the exact path). Measured, in-process A/B of the whole value and
gradient (2026-12-05): conv2d_s2 4.85 -> 3.36 ms (its dX split);
conv2d_transpose_s2's value 1.6 ms as 4 residue-class GEMMs, 0.32 + 0.51 ms
as the taps' GEMM and the lattice moves (units alone).

**Exactness.** The terms are the original's: the GEMM stage's element at
``(s', taps, g)`` sums over the channels what the original sums for the
output points that read ``A`` at ``g`` with those taps, and the loop nest adds
exactly the taps the original visits. Only the order of the float additions
changes (the GEMM path reorders them already). A non-finite operand value
reaches the same outputs: the GEMM path computes a stage with infinities or
NaNs exactly, and the loop nest adds what it computed.
"""

import math

from texpr import expr as E
from texpr.errors import TexprError
from texpr.expr import Load
from texpr.reduction import sum as te_sum
from texpr.simplify.graph import rebuild
from texpr.simplify.isl_bridge import VarSpace, box_set, card_within, isl, to_set
from texpr.tensor import ComputeOp, topo_order
from texpr.visitor import free_vars, post_order, substitute

from ..analysis import contraction, matches
from ..ir.marks import PACKED, TAP_SPLIT
from ..analysis.affine import linear_coefs as _linear
from ..options import current as _opts

__all__ = ["split_taps", "SPLIT"]

#: the attrs key that marks a stage made by the split (never split again)
SPLIT = TAP_SPLIT
# options.tap_split (default True): False: no stage is split (for A/B timings,
#   benchmarks/bench_variants.py)
# options.tap_split_min_density (default 0.5): the loop nest's domain must fill at least
#   this fraction of its box


def split_taps(outputs, keep=()):
    """The graph of ``outputs`` (simplified Tensors) with the contractions that pay
    for it split into a GEMM stage and a col2im loop nest (module docstring).

    Args:
        outputs: list of Tensors.
        keep: ops of the input graph that the caller holds on to (the packed
            stages of :func:`codegen.rewrite.operands.pack_operands`, to be
            materialised); they are returned as the ops that replace them (a
            stage that reads a split stage is rebuilt).
    Returns ``(tensors, gemm_stages, kept)``: the output Tensors (the same objects
    where nothing changed), the ops of the new GEMM stages (to be
    materialised), and ``keep``'s ops in the rewritten graph (those still in
    it). Never raises for a stage it cannot rewrite: that stage is kept."""
    if not _opts().tap_split:
        return list(outputs), [], list(keep)
    made, replaced = [], {}

    def fn(op, orig, tmap):
        replaced[id(orig)] = op
        try:
            res = _split(op)
        except (TexprError, isl.Error):  # a rewrite it cannot make: the stage stays
            return None
        if res is None:
            return None
        made.append(res[0])
        replaced[id(orig)] = res[1]
        return res[1].output(0)

    outs = rebuild(list(outputs), fn)
    used = {id(op) for op in topo_order(outs)}
    kept = [replaced.get(id(op), op) for op in keep]
    return (outs, [op for op in made if id(op) in used],
            [op for op in kept if id(op) in used])


def _split(op):
    """``(gemm stage op, loop-nest op)`` replacing ``op``, or None."""
    red = contraction.float_sum(op)
    if red is None or op.attrs.get(SPLIT):
        return None
    dtype = red.dtype
    facs, conds = [], []
    contraction._factors(red.source[0], facs, conds)
    loads = [f for f in facs if isinstance(f, Load)]
    consts = [f for f in facs if isinstance(f, E.Const)]
    if len(loads) != 2 or len(loads) + len(consts) != len(facs):
        return None
    conj = contraction._conjuncts(red.where, [])
    for c in conds:
        contraction._conjuncts(c, conj)
    if not op.attrs.get(PACKED) and any(isinstance(n, Load) for c in conj for n in post_order(c)):
        return None  # (a packed stage's data conjuncts are its packed operand's)
    try:
        plan = matches.match(op)
    except Exception:  # noqa: BLE001 - the matcher's own errors: leave the stage alone
        return None
    if plan is None or not contraction.cost_ok(plan):
        return None
    # the elements the GEMM path copies: operands read as more elements than they
    # hold are packed (im2col) -- a strided convolution's dX packs its head, H,
    # once per residue class, while the operand read at mixed indices is W
    read = [plan.operand_elements(i) for i in range(2)]
    copied = sum(n for n, ld in zip(read, loads) if n > math.prod(ld.tensor.shape))
    for i, (a, b) in enumerate(((loads[0], loads[1]), (loads[1], loads[0]))):
        res = _try(op, red, a, b, consts, conj, dtype, max(read[i], copied))
        if res is not None:
            return res
    return None


def _try(op, red, a, b, consts, conj, dtype, im2col):
    """The split with ``a`` as the operand read at mixed indices, or None. ``im2col``:
    the elements of ``a`` the stage's GEMMs read (its im2col copy), or the
    elements they copy of both operands, if more."""
    roles = _roles(op, red, a, b, conj)
    if roles is None:
        return None
    mixed, s_m, taps, channels, gemm_conds, nest_conds, data_conds = roles
    rest = [v for v in op.axis if id(v) not in s_m]
    # the GEMM stage's axes: the other spatial axes, the taps, one per mixed dimension
    new_rest = [E.iter_var(v.dom[0], v.dom[1], v.name, "spatial") for v in rest]
    # a tap over [lo, hi) (a reduction domain the simplifier shrank) is an axis
    # over [0, hi - lo) of the taps' stage, read at tap - lo
    new_taps = [E.iter_var(0, v.dom[1] - v.dom[0], v.name, "spatial") for v in taps]
    new_g = [E.iter_var(0, a.tensor.shape[d], f"g{k}", "spatial") for k, d in enumerate(mixed)]
    new_chan = [E.iter_var(v.dom[0], v.dom[1], v.name, "reduce") for v in channels]
    m1 = dict(zip(rest, new_rest))
    m1.update((v, _shifted(nv, v.dom[0])) for v, nv in zip(taps, new_taps))
    m1.update(zip(channels, new_chan))
    a_args = list(a.args)
    for k, d in enumerate(mixed):
        a_args[d] = new_g[k]
    a_args = [x if d in mixed else substitute(x, m1) for d, x in enumerate(a_args)]
    a2 = E.load(a.tensor, a_args)
    b2 = substitute(b, m1)
    summand = a2 * b2
    for c in consts:
        summand = summand * c
    where = None
    for c in gemm_conds:
        c2 = substitute(c, m1)
        where = c2 if where is None else E.logical_and(where, c2)
    # a packed stage's data conjuncts are functions of A's index (codegen.rewrite.operands):
    # at A's index in the taps' stage, its mixed dimensions the new axes
    t_ids = {id(v) for v in new_rest + new_taps + new_g + new_chan}
    for c in data_conds:
        c2 = substitute(substitute(c, {a.args[d]: new_g[k] for k, d in enumerate(mixed)}), m1)
        if any(id(v) not in t_ids for v in free_vars(c2) if isinstance(v, E.IterVar)):
            return None
        where = c2 if where is None else E.logical_and(where, c2)
    # the axes' order makes the GEMM stage's result one GEMM in place: axes both
    # operands read (batch) first, then B's (the rows), the taps (B's too), then
    # A's (the columns: an image's axes, contiguous in its buffer)
    a_ids = {id(v) for d, x in enumerate(a.args) if d not in mixed for v in free_vars(x)}
    b_ids = {id(v) for x in b.args for v in free_vars(x)}
    rank = {id(v): (0 if id(v) in a_ids and id(v) in b_ids else 2 if id(v) in a_ids else 1)
            for v in rest}
    order = sorted(range(len(rest)), key=lambda q: rank[id(rest[q])])
    lead = [q for q in order if rank[id(rest[q])] < 2]
    tail = [q for q in order if rank[id(rest[q])] == 2]
    t_axes = [new_rest[q] for q in lead] + new_taps + [new_rest[q] for q in tail] + new_g
    attrs = {SPLIT: True, "of": op.name}
    if op.attrs.get(PACKED):
        attrs[PACKED] = True  # (its packed operand is zero where the data conjuncts fail)
    t_op = ComputeOp(f"{op.name}_taps", t_axes, (te_sum(summand, new_chan, where),),
                     "tap_split", attrs)
    t = t_op.output(0)
    if t.dtype != dtype:
        return None
    # the loop nest: the original's spatial axes, the taps as its reduction axes
    nest_taps = [E.iter_var(v.dom[0], v.dom[1], v.name, "reduce") for v in taps]
    m2 = dict(zip(taps, nest_taps))
    idx = [rest[q] for q in lead] + [_shifted(v, -v.dom[0]) for v in nest_taps] + \
        [rest[q] for q in tail] + \
        [substitute(a.args[d], m2) for d in mixed]
    cond = None
    for c in nest_conds:
        c2 = substitute(c, m2)
        cond = c2 if cond is None else E.logical_and(cond, c2)
    cond = _with_bounds(cond, [(substitute(a.args[d], m2), a.tensor.shape[d]) for d in mixed],
                        list(op.axis) + nest_taps)
    if cond is None:
        return None
    body = te_sum(E.load(t, idx), nest_taps, cond)
    nest = ComputeOp(op.name, op.axis, (body,), op.tag, dict(op.attrs, **{SPLIT: True}))
    if not _pays(im2col, t, t_op, op, nest_taps, cond, nest):
        return None
    return t_op, nest


def _roles(op, red, a, b, conj):
    """What the split of a stage with ``a`` read at mixed indices would be, or None:
    ``(mixed, s_m, taps, channels, gemm_conds, nest_conds, data_conds)``: the
    dimensions of ``a`` whose index mixes spatial and reduction axes, the ids of
    the spatial axes they read, the reduction axes they read (the taps) and the
    others (the channels, the taps' stage's reduction), and the conjuncts ``conj``
    by where they go: the taps' stage's GEMM (on the channels), the tap sum's
    loop nest, or the data-dependent ones of a packed stage (on ``a``'s index)."""
    spatial = {id(v): v for v in op.axis}
    reduce_ = {id(v): v for v in red.axes}
    forms = [_index_form(ix) for ix in a.args]
    if any(f is None for f in forms):
        return None
    mixed = [d for d, f in enumerate(forms)
             if any(v in spatial and c for v, c in f[0].items())
             and any(v in reduce_ and c for v, c in f[0].items())]
    if not mixed:
        return None
    s_m = {v for d in mixed for v, c in forms[d][0].items() if c and v in spatial}
    taps = [v for v in red.axes if any(forms[d][0].get(id(v)) for d in mixed)]
    tap_ids = {id(v) for v in taps}
    for d, f in enumerate(forms):
        if d not in mixed and any(c and (v in s_m or v in tap_ids) for v, c in f[0].items()):
            return None
    if any(id(v) in s_m for x in b.args for v in free_vars(x)):
        return None
    channels = [v for v in red.axes if id(v) not in tap_ids]
    if not channels:
        return None
    chan_ids = {id(v) for v in channels}
    gemm_conds, nest_conds, data_conds = [], [], []
    for c in conj:
        ids = {id(v) for v in free_vars(c)}
        if any(isinstance(n, Load) for n in post_order(c)):
            data_conds.append(c)  # a packed stage's: on A's index (below)
        elif ids & chan_ids:
            if ids & s_m:
                return None
            gemm_conds.append(c)
        else:
            nest_conds.append(c)
    return mixed, s_m, taps, channels, gemm_conds, nest_conds, data_conds


def _index_form(ix):
    """``({id(var): coef}, const)`` of an index that is affine, or of the numerator of
    ``affine // c`` (constant ``c > 0``): a transposed convolution reads its
    input at ``(h + 1 - kh) // 2`` where ``(h + kh + 1) % 2 == 0`` -- which axes
    the index mixes is all the split asks of it (the taps' stage reads ``A`` at
    new axes; the tap sum reads the taps' stage at the original index); None
    for any other index."""
    f = _linear(ix)
    if f is None and isinstance(ix, E.FloorDiv) and isinstance(ix.b, E.Const) \
            and isinstance(ix.b.value, int) and not isinstance(ix.b.value, bool) \
            and ix.b.value > 0:
        f = _linear(ix.a)
    return f


def _shifted(v, k):
    """``v + k`` (``v`` itself for ``k == 0``)."""
    if k == 0:
        return v
    return v + k if k > 0 else v - (-k)


def _with_bounds(cond, bounds, axes):
    """``cond`` and ``0 <= ix < n`` for each ``(ix, n)`` of ``bounds`` that ``cond``
    does not imply over the box of ``axes`` (the GEMM path proved the original
    reads inside ``A``, so they are implied; they are written only where isl
    cannot see it, which keeps the loop nest's text short). None when ``cond`` is
    not quasi-affine."""
    space = VarSpace(axes)
    box = box_set(space)
    dom = box
    if cond is not None:
        s, residual = to_set(cond, space)
        if residual is not None:
            return None
        dom = dom.intersect(s)
    for ix, n in bounds:
        inside = E.logical_and(ix >= 0, ix < n)
        s, residual = to_set(inside, space)
        if residual is not None:
            return None
        if not dom.is_subset(s):
            cond = inside if cond is None else E.logical_and(cond, inside)
            dom = dom.intersect(s)
    return cond if cond is not None else E.const(True)


def _moves_only_valid(nest):
    """Whether the tap sum runs as a shift plan (:mod:`codegen.analysis.shifts`), whose moves
    visit only the points of its domain: then a sparse domain (a strided
    convolution's dX, each output point reading 1 or 2 of its 14 taps per axis)
    costs nothing for the points it lacks."""
    from ..analysis.shifts import plan_of
    return plan_of(nest, id) is not None


def _pays(im2col, t, t_op, op, nest_taps, cond, nest):
    """The cost rule of the module docstring."""
    if math.prod(t.shape) >= im2col:
        return False
    space = VarSpace(list(op.axis) + nest_taps)
    box = box_set(space)
    dom, residual = to_set(cond, space)
    if residual is not None:
        return False
    points = card_within(dom.intersect(box)).value
    total = math.prod(v.dom[1] - v.dom[0] for v in list(op.axis) + nest_taps)
    if points < _opts().tap_split_min_density * total and not _moves_only_valid(nest):
        return False
    try:
        plan = matches.match(t_op)
    except Exception:  # noqa: BLE001
        return False
    if plan is None or not contraction.cost_ok(plan):
        return False
    packed = bool(t_op.attrs.get(PACKED))  # (data masks only on the exact path)
    return all(v.pad is None and not v.masks and (packed or not v.data_masks)
               for p in plan.pieces for v in (p.a, p.b)) and not any(
                   p.out_masks for p in plan.pieces)
