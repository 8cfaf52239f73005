"""Contractions: a materialised stage that is a sum of products of two loads, run as GEMMs.

A stage matches when, after the inlined stages are substituted
(:func:`codegen.ir.schedule.inline_expand`), its body is

    out[s] = c * sum(A[f(s, r)] * B[g(s, r)], axis=r, where=w)

with ``c`` a constant (1 if absent; guards ``select(cond, x, 0)`` among the
factors join ``w``), ``A``, ``B`` loads of the reduction's float dtype, every
index quasi-affine in the spatial axes ``s`` and reduction axes ``r``, and
``w`` a conjunction of quasi-affine conditions: a box, a residue class
(``(h + kh + 1) % 2 == 0``), a triangle. The match is by this pattern alone,
never by operator name: dense, convolutions of every stride, dilation and
padding and their gradients, transposed and grouped convolutions, masked
attention scores, ... all reach it from their simplified bodies.

**How a stage becomes GEMMs** (:func:`match`, all decided at build time, with isl):

1. *Residue classes.* An index or condition that is not affine (``(h + 1 -
   kh) // 2``) is made affine by splitting the axes under the ``//`` and
   ``%`` into their residue classes (``h = 2h' + a``): one *piece* per class,
   empty classes dropped. Spatial classes write disjoint strided slices of
   the output; reduction classes add into the same slice.
2. *Taps.* Where a piece's iteration box is much larger than its domain
   (a strided convolution's dX: ``W[.., j - 2r + 1]`` with ``0 <= j - 2r + 1 < 3``
   visits 3 of 28 points), the spatial axes are split by the reduction axis's
   coefficient and the reduction axis is replaced by the kernel tap
   (``r = u + j'``): the box then holds the domain up to the borders.
3. *Operands.* Each operand is a view of its buffer over the piece's axes,
   ``np.lib.stride_tricks.as_strided`` of the flat buffer (the row-major
   offset is affine in the axes, checked by isl over the box: flatten's
   ``X[i, k // 49, k // 7 % 7, k % 7]`` is ``X.reshape(-1)[784 i + k]``).
   Where the box reaches outside the operand (a convolution's padding) the
   operand is copied into a zero-padded buffer first.
4. *The domain.* Every conjunct of ``w`` is either implied over the box by
   the operands' bounds (it holds wherever both loads are inside their
   tensors, so the padded zeros drop the terms outside it: convolution
   borders), or mentions spatial axes only (the output is zeroed outside
   it: the causal mask of scores), or mentions only axes of one operand (that
   operand's view is masked, a packed copy: the causal mask of dQ and dK).
   Else the stage does not match. isl also proves that the domain's loads
   stay inside their tensors (else the loop nest keeps the stage and its
   run-time checks).
5. *GEMM.* Axes in both operands and the output are batch axes, in one
   operand and the output M or N, in both operands K (reduction); a
   reduction axis of one operand is summed in that operand first. The views
   are transposed and reshaped to ``(batch, M, K)`` and ``(batch, K, N)``
   (a copy only where the strides do not merge: im2col), multiplied with
   ``np.matmul`` (numpy's BLAS, batched), and written (or, for reduction
   classes, added) into the output's strided slice, scaled by ``c``.

**Cost rule** (:func:`cost_ok`): a GEMM call pays for the packing and the
call only when there is work for it: BLAS runs a stage when its GEMMs have
at least ``options.blas_min_flop`` floating-point operations in all and each GEMM's
M, N and K (batch axes aside) are at least ``options.blas_min_dim``, and the GEMMs do
at most ``1 / options.blas_min_efficiency`` times the domain's multiply-adds (padding
and masked terms), and at least ``options.blas_mask_macs`` multiply-adds per element pass
of the data-dependent masks numpy evaluates on every run (:func:`mask_passes`).
Anything else (depthwise convolutions: N = 1; small dense
layers) keeps its loop nest. ``schedule[t].blas(True)`` runs a matching stage
on BLAS whatever its size, ``blas(False)`` keeps the loop nest.

**Numerics.** Sums are float32 (float64) BLAS sums: a different order of terms
than the loop nest, within float32 (float64) rounding of it. Padded and
masked terms are ``0 * x`` in the GEMMs; where an operand holds an infinity or
a NaN, the plan computes the affected output elements again exactly, so they
are the loop nest's (absent terms stay absent).

**Running.** A plan is plain data (:class:`codegen.ir.contraction_plan.ContractionPlan`,
picklable with its kernel); :mod:`codegen.backends.numpy_host.gemm` runs it: operand views and
packing, chunks, threads, the exact non-finite path.
"""

import math

import numpy as np

from texpr import dtypes as dt
from texpr import expr as E
from texpr.errors import TexprError
from texpr.simplify.isl_bridge import VarSpace, box_set, card_within, isl, to_pwaff, to_set
from texpr.tensor import ComputeOp
from texpr.visitor import post_order, substitute

from .affine import affine_form as _affine
from .bounds import may_refuse
from .residues import _range, _residue_moduli, _split, _tap
from ..ir.contraction_plan import (TREE_OP_TYPES, ContractionPlan, GemmPiece, OperandView,
                                  byte_view as _byte_view, tree_nodes as _tree_nodes)
from ..ir.marks import WINDOW
from ..ir.schedule import inline_expand
from ..options import current as _opts

__all__ = ["match", "rekey", "ContractionPlan", "GemmPiece", "OperandView", "cost_ok",
           "float_sum", "mask_passes", "summand_factors"]

# options.blas_min_flop (default 1 << 17): below this many floating-point operations (all
#   GEMMs of a stage) the loop nest runs: a GEMM stage costs about 45 us of Python and numpy
#   calls whatever its size, a loop nest this small runs serially in 5-10 us (16x16x16,
#   32x32x16); from 2**17 up the GEMM was faster (32x64x32: 47 vs 59 us; 32x784x10, a
#   flattened image's dense layer: 53 vs 138 us) and compiles nothing (a loop nest: 1.3 s)
# options.blas_min_dim (default 8): a GEMM with an M, N or K below this is skinny: the loop
#   nest runs
# options.blas_min_efficiency (default 0.25): the GEMMs may do at most 1/this times the
#   domain's multiply-adds
# options.blas_max_pieces (default 64): at most this many pieces (non-empty residue classes)
#   per stage
# options.blas_max_classes (default 1024): at most this many residue classes are enumerated
#   (most are empty: a stride-3 transposed convolution has 81 classes of (h, kh, w, kw), 9
#   of them non-empty)
# options.blas_mask_macs (default 1): the GEMMs must do at least this many multiply-adds per
#   element pass of their data-dependent masks (:func:`mask_passes`). The main job's conv1
#   weight gradient behind its relu and max pool (4 residue-class GEMMs of 8x1024 @ 1024x9;
#   0.19 multiply-adds per pass) ran 1.9 ms on BLAS, 0.19 ms as a loop nest; a 32x16x28x28
#   convolution's weight gradient behind the same (3.3 per pass) 18.8 ms on BLAS, 24.3 ms as
#   a loop nest (the whole value and gradient 36.6 against 67.7 ms). 2026-12-05, one run
#   each
# options.blas_tap_efficiency (default 0.5): a piece whose box holds more than 1/this times
#   its domain's points tries taps
# options.blas_pad_max_ratio (default 4): the zero-padded copy of an operand
#   (:class:`codegen.ir.contraction_plan.OperandView`) may hold at most this many times
#   the elements of the operand, of what the GEMMs read of it and of the output together (or
#   ``options.blas_pad_min_elements``): a padding sized by the user's extents (``conv2d(...,
#   stride=10**6, padding=10**6)`` padded a 5 x 5 image to 2,000,005 x 2,000,005, 175 TiB)
#   leaves the stage its loop nest, which reads the operand in place; under ``blas(True)``
#   the build raises ScheduleError
# options.blas_pad_min_elements (default 1 << 20): padded copies up to this many elements
#   are always allowed (8 MB of float64)


class _NoMatch(Exception):
    """Internal: the stage is not a contraction (the message says why)."""


# ---- matching ----------------------------------------------------------------------------

class _Instance:
    """A contraction over axes (IterVars): ``spatial`` with their output strides,
    ``reduce``, two loads ``(tensor, args)``, the conjuncts of the domain, and
    what has been tried (``split``, ``tapped``)."""

    def __init__(self, spatial, out_strides, out_offset, reduce_, loads, conjuncts,
                 split=False, tapped=False, packed=False, n_where=0):
        self.spatial, self.out_strides, self.out_offset = list(spatial), list(out_strides), out_offset
        self.reduce, self.loads, self.conjuncts = list(reduce_), list(loads), list(conjuncts)
        self.split, self.tapped = split, tapped
        self.packed = packed  # the stage's packed operands apply its data masks
        # the first n_where conjuncts are the where's (te.evaluate evaluates each
        # where those before it hold); the rest are the summand's select conditions
        self.n_where = n_where

    @property
    def axes(self):
        return self.spatial + self.reduce

    def subst(self, mapping, spatial, out_strides, out_offset, reduce_, extra=(), **flags):
        loads = [(t, tuple(substitute(a, mapping) for a in args)) for t, args in self.loads]
        conj = [substitute(c, mapping) for c in self.conjuncts] + list(extra)
        kw = dict(split=self.split, tapped=self.tapped, packed=self.packed,
                  n_where=self.n_where)
        kw.update(flags)
        return _Instance(spatial, out_strides, out_offset, reduce_, loads, conj, **kw)


def _factors(e, out, conds, products=None):
    """Split a product into factors (loads, constants); ``select(c, x, 0)`` adds ``c``
    to ``conds``; ``products`` (a set, optional) receives the ids of the products
    descended through (the summand's own sub-products)."""
    if isinstance(e, E.Mul):
        if products is not None:
            products.add(id(e))
        _factors(e.a, out, conds, products)
        _factors(e.b, out, conds, products)
    elif isinstance(e, E.Select) and isinstance(e.false_value, E.Const) \
            and e.false_value.value == 0:
        conds.append(e.cond)
        _factors(e.true_value, out, conds, products)
    elif isinstance(e, E.Cast) and e.dtype == e.value.dtype:
        _factors(e.value, out, conds, products)
    else:
        out.append(e)


def summand_factors(e):
    """A summand as a product: ``(loads, constants, conditions)``, its factors that
    are loads and constants, and the conditions of its ``select(c, x, 0)`` guards
    (:func:`_factors`; a cast to the same dtype is looked through); None when a
    factor is anything else. The stage matcher and the scan step's GEMM
    (:mod:`codegen.loopnest.scan_gemm`) read a summand with it.

    Args:
        e: the summand (an expression).
    Returns:
        ``(loads, consts, conds)`` (lists, in the product's order), or None.
    """
    facs, conds = [], []
    _factors(e, facs, conds)
    loads = [f for f in facs if isinstance(f, E.Load)]
    consts = [f for f in facs if isinstance(f, E.Const)]
    if len(loads) + len(consts) != len(facs):
        return None
    return loads, consts, conds


def _conjuncts(c, out):
    if isinstance(c, E.And):
        _conjuncts(c.a, out)
        _conjuncts(c.b, out)
    elif not (isinstance(c, E.Const) and c.value is True):
        out.append(c)
    return out


def float_sum(op):
    """The body of a stage that is one float sum of one summand (a single-output
    ComputeOp, a ``Reduce`` with the sum combiner over float32 or float64), or
    None: the stages the GEMM path and its rewrites (:mod:`codegen.rewrite.operands`,
    :mod:`codegen.rewrite.tap_split`, :mod:`codegen.rewrite.windows`) consider."""
    if not isinstance(op, ComputeOp) or op.num_outputs != 1 or not op.reduce_axis:
        return None
    red = op.body[0]
    if not isinstance(red, E.Reduce) or red.combiner.kind != "sum" or len(red.source) != 1:
        return None
    return red if red.dtype in ("float32", "float64") else None


def _contraction_of(op, inlined):
    """The :class:`_Instance` of a stage, or raise _NoMatch."""
    if not isinstance(op, ComputeOp) or op.num_outputs != 1 or not op.reduce_axis:
        raise _NoMatch("not a single-output reduction")
    body = inline_expand(op.body[0], inlined)
    if not isinstance(body, E.Reduce) or body.combiner.kind != "sum" or len(body.source) != 1:
        raise _NoMatch("not a sum")
    dtype = body.dtype
    if dtype not in ("float32", "float64") or op.output(0).dtype != dtype:
        raise _NoMatch(f"a {dtype} sum")
    factors = summand_factors(body.source[0])
    if factors is None or len(factors[0]) != 2:
        raise _NoMatch("the summand is not a product of two loads (and constants)")
    loads, consts, conds = factors
    for ld in loads:
        if ld.dtype != dtype:
            raise _NoMatch(f"load of {ld.tensor.name} is {ld.dtype}, the sum {dtype}")
    scale = 1.0
    for c in consts:
        scale *= float(c.value)
    conj = []
    _conjuncts(body.where, conj)
    n_where = len(conj)
    for c in conds:
        _conjuncts(c, conj)
    for c in conj:
        if isinstance(c, E.Const) and c.value is False:
            raise _NoMatch("an empty domain")
    shape = op.output(0).shape
    strides = [int(np.prod(shape[d + 1:], dtype=np.int64)) for d in range(len(shape))]
    inst = _Instance(list(op.axis), strides, 0, list(body.axes),
                     [(ld.tensor, tuple(ld.args)) for ld in loads], conj,
                     packed=bool(op.attrs.get("texpr.packed_operands")), n_where=n_where)
    if len(set(id(a) for a in inst.axes)) != len(inst.axes):
        raise _NoMatch("an axis appears twice")
    return inst, scale, dtype


def _cond_affine(c, axes, space, box):
    """A comparison as ``[(coefs, const, is_eq)]`` (``expr >= 0`` / ``== 0``), or None."""
    if not isinstance(c, (E.LT, E.LE, E.GT, E.GE, E.EQ)):
        return None
    if c.a.dtype not in ("int32", "int64") or c.b.dtype not in ("int32", "int64"):
        return None
    fa, fb = _affine(c.a, axes, space, box), _affine(c.b, axes, space, box)
    if fa is None or fb is None:
        return None
    d = [x - y for x, y in zip(fa[0], fb[0])]
    k = fa[1] - fb[1]
    if isinstance(c, E.GE):
        return [(d, k, False)]
    if isinstance(c, E.GT):
        return [(d, k - 1, False)]
    if isinstance(c, E.LE):
        return [([-x for x in d], -k, False)]
    if isinstance(c, E.LT):
        return [([-x for x in d], -k - 1, False)]
    return [(d, k, True)]


def _analyze(inst):
    """The :class:`GemmPiece` of an instance, None when its domain is empty, or
    raise _NoMatch (``args[1]``: "nonaffine", "inefficient" or "other")."""
    axes = inst.axes
    space = VarSpace(axes)
    box = box_set(space)
    dom = box
    data = []  # the data-dependent conjuncts (their domain is a superset: the affine part)
    for c in inst.conjuncts:
        s, resid = to_set(c, space)
        if resid is not None:
            data.append(c)
            continue
        dom = dom.intersect(s)
    refusing = [c for c in data if may_refuse(c)]
    if dom.is_empty():
        # te.evaluate evaluates a data condition where the conjuncts before it hold,
        # the domain's later ones aside: one that may raise, or read outside its
        # tensor, is the loop nest's to evaluate (or to refuse at build time)
        if refusing:
            raise _NoMatch("an empty domain behind a condition that may raise", "other")
        for c in data:
            _tree(c, axes, space, box, clip=inst.packed)
        return None
    inb = []
    for t, args in inst.loads:
        s = box
        for ix, n in zip(args, t.shape):
            pa = to_pwaff(ix, space)
            if pa is None:
                raise _NoMatch(f"an index of {t.name} is not quasi-affine", "other")
            s = s.intersect(pa.ge_set(space.const(0))).intersect(pa.lt_set(space.const(n)))
        inb.append(s)
    if not dom.is_subset(inb[0].intersect(inb[1])):
        raise _NoMatch("a load may leave its tensor (the loop nest checks it)", "other")
    both = inb[0].intersect(inb[1])
    # a window stage (codegen.rewrite.windows) is zero outside its valid region: a conjunct
    # that region implies is an absent term there, masked on the exact path only
    valid = [_window_region(t, args, space, box) for t, args in inst.loads]
    load_axes, out_masks, op_masks, op_data, nf_masks, placed = _place_conjuncts(
        inst, data, axes, space, box, both, valid)
    if refusing:
        _check_refusing_order(inst, placed, refusing)
    views = _views(inst, axes, space, box, load_axes, op_masks, op_data, nf_masks)
    piece_axes = [(a.dom[0], a.dom[1] - a.dom[0], a.kind) for a in axes]
    nsp = len(inst.spatial)
    out_masks = [(m[0][:nsp], m[1], m[2]) for m in out_masks]
    if any(any(m[0][nsp:]) for m in out_masks):
        raise _NoMatch("internal: an output mask on a reduction axis", "other")
    out_offset = inst.out_offset + sum(s * a.dom[0] for s, a in zip(inst.out_strides, inst.spatial))
    # a cost-model input: bounded (an upper bound, the box's points, where exact
    # counting would cost too much)
    points = card_within(dom).value
    piece = GemmPiece(piece_axes, out_offset, inst.out_strides, views[0], views[1],
                      out_masks, points)
    vol = int(np.prod([ax[1] for ax in piece_axes], dtype=np.int64))
    if points < _opts().blas_tap_efficiency * vol:
        piece.inefficient = True
    return piece


def _place_conjuncts(inst, data, axes, space, box, both, valid):
    """Where the GEMM applies each conjunct of ``inst`` (step 4 of the module
    docstring): implied by the operands' bounds (padding), spatial-only (an output
    mask), on one operand's axes (an operand mask; a data-dependent one as a tree),
    or a window stage's valid region (a mask of the exact path only).

    Returns ``(load_axes, out_masks, op_masks, op_data, nf_masks, placed)``: the
    ids of the axes each load reads; the affine masks of the output, per operand,
    the data masks per operand, the exact-path masks per operand; and per
    conjunct, in order, where it went. Raises _NoMatch for a conjunct that ties
    both operands or is not affine."""
    # the conjuncts: implied by the operands' bounds (padding), spatial-only
    # (output mask), or on one operand's axes (operand mask)
    load_axes = []
    for t, args in inst.loads:
        used = set()
        for ix in args:
            used |= {id(v) for v in post_order(ix) if isinstance(v, E.IterVar)}
        load_axes.append(used)
    sp_ids = {id(a) for a in inst.spatial}
    out_masks, op_masks, op_data, nf_masks = [], [[], []], [[], []], [[], []]
    placed = []  # per conjunct, in order: where the GEMM applies it
    for c in inst.conjuncts:
        cvars = {id(v) for v in post_order(c) if isinstance(v, E.IterVar)}
        if any(c is d for d in data):
            side = next((i for i in (0, 1) if cvars <= load_axes[i]), None)
            if side is None:
                raise _NoMatch("a data-dependent condition not on one operand's axes", "other")
            op_data[side].append(_tree(c, axes, space, box, clip=inst.packed))
            placed.append(("data", side))
            continue
        s, _ = to_set(c, space)
        if box.is_subset(s):
            placed.append(("box", None))
            continue
        if both.is_subset(s):
            placed.append(("bounds", None))
            continue
        aff = _cond_affine(c, axes, space, box)
        if aff is None:
            raise _NoMatch("a condition that is not affine", "nonaffine")
        side = next((i for i in (0, 1) if valid[i] is not None and cvars <= load_axes[i]
                     and both.intersect(valid[i]).is_subset(s)), None)
        if side is not None:
            nf_masks[side].extend(aff)
            placed.append(("op", side))
            continue
        if cvars <= sp_ids:
            out_masks.extend(aff)
            placed.append(("out", None))
        elif cvars <= load_axes[0]:
            op_masks[0].extend(aff)
            placed.append(("op", 0))
        elif cvars <= load_axes[1]:
            op_masks[1].extend(aff)
            placed.append(("op", 1))
        else:
            raise _NoMatch("a condition that ties both operands", "other")
    return load_axes, out_masks, op_masks, op_data, nf_masks, placed


def _views(inst, axes, space, box, load_axes, op_masks, op_data, nf_masks):
    """The two :class:`OperandView` s of ``inst`` (step 3 of the module docstring):
    each load's zero padding where the box reaches outside its tensor, its
    affine offset into the padded buffer over the axes it reads (or its masks
    read), and its masks (:func:`_place_conjuncts`). Raises _NoMatch
    ("nonaffine") when an offset is not affine."""
    views = []
    for (t, args), masks, dmasks, lax, nfm in zip(inst.loads, op_masks, op_data, load_axes,
                                                  nf_masks):
        pad, shape = [], tuple(t.shape)
        for ix, n in zip(args, shape):
            lo, hi = _range(to_pwaff(ix, space), box)
            pad.append((max(0, -lo), max(0, hi - (n - 1))))
        padded = tuple(n + a + b for n, (a, b) in zip(shape, pad))
        pstr = [int(np.prod(padded[d + 1:], dtype=np.int64)) for d in range(len(padded))]
        flat = E.const(int(sum(lo * s for (lo, _), s in zip(pad, pstr))))
        for ix, s in zip(args, pstr):
            flat = flat + ix * s
        aff = _affine(flat, axes, space, box) if args else ([0] * len(axes), 0)
        if aff is None:
            raise _NoMatch(f"the offset of {t.name} is not affine", "nonaffine")
        coefs, const = aff
        used = [k for k, c in enumerate(coefs) if c]
        mvars = [k for k in range(len(axes)) if any(m[0][k] for m in masks + nfm)]
        if dmasks:
            mvars += [k for k, a in enumerate(axes) if id(a) in lax]
        vaxes = sorted(set(used) | set(mvars))
        offset = const + sum(coefs[k] * axes[k].dom[0] for k in vaxes)
        vmasks = [([m[0][k] for k in vaxes], m[1], m[2]) for m in masks]
        views.append(OperandView(t, shape, pad if any(a or b for a, b in pad) else None,
                                 vaxes, offset, [coefs[k] for k in vaxes], vmasks, dmasks,
                                 [([m[0][k] for k in vaxes], m[1], m[2]) for m in nfm]))
    return views


def _window_region(t, args, space, box):
    """The set where a load of the window stage ``t`` (:mod:`codegen.rewrite.windows`) reads
    its valid region, or None when ``t`` is no window stage."""
    region = getattr(t.op, "attrs", {}).get(WINDOW)
    if not region:
        return None
    s = box
    for tap, pos, a, b, c, n in region:
        pa = to_pwaff(args[pos] * a + args[tap] * b + c, space)
        if pa is None:
            return None
        s = s.intersect(pa.ge_set(space.const(0))).intersect(pa.lt_set(space.const(n)))
    return s


def _check_refusing_order(inst, placed, refusing):
    """Raise _NoMatch unless every data-dependent conjunct that may raise
    (:func:`codegen.analysis.bounds.may_refuse`: a divisor of 0, an integer leaving its
    dtype) is evaluated by the GEMM path exactly where ``te.evaluate`` evaluates
    it: ``&&`` evaluates a conjunct where the ones before it hold, and its view
    (:func:`codegen.backends.numpy_host.gemm._operand`) evaluates it on the box where the view's
    affine masks and its earlier data conditions hold. So the conjuncts before
    it must hold on the whole box or be its own operand's conditions, and none
    after it an affine mask of its operand; and the piece's box must be the
    stage's (no residue classes, no taps: their boxes cover other points). It
    must be the where's: a summand's ``select(c1, A, 0) * select(c2, B, 0)``
    evaluates ``c2`` whatever ``c1`` is."""
    if inst.split or inst.tapped:
        raise _NoMatch("a condition that may raise, in a split or tapped piece", "other")
    for j, c in enumerate(inst.conjuncts):
        if not any(c is r for r in refusing):
            continue
        if j >= inst.n_where:
            raise _NoMatch("a select condition in the summand that may raise", "other")
        side = placed[j][1]
        if any(p not in (("box", None), ("op", side), ("data", side)) for p in placed[:j]) \
                or ("op", side) in placed[j + 1:]:
            raise _NoMatch("a condition that may raise behind conditions the GEMM path "
                           "applies after it", "other")


def _tree(e, axes, space, box, clip=False):
    """A data-dependent condition as a plain tree over axis positions (picklable,
    evaluated by numpy on an operand's grid: :func:`_eval_tree`); loads must
    have quasi-affine indices inside their tensors over the whole box (the mask
    is evaluated there), unless ``clip``: then a load that may leave its tensor
    reads at its indices clipped into range (``"ldc"``; only for the masks of a
    stage with packed operands, applied where an operand is non-finite: outside
    the tensor the padded operand is absent whatever the mask says). Loads
    hold the Tensor until :func:`match` gives keys."""
    pos = {id(a): k for k, a in enumerate(axes)}

    def go(x):
        if isinstance(x, E.Const):
            return ("c", x.value, x.dtype if x.dtype != "bool" else "bool")
        if isinstance(x, E.IterVar):
            if id(x) not in pos:
                raise _NoMatch(f"a condition reads `{x.name}`", "other")
            return ("v", pos[id(x)])
        if isinstance(x, E.Load):
            for ix, n in zip(x.args, x.tensor.shape):
                pa = to_pwaff(ix, space)
                if pa is None:
                    raise _NoMatch("a condition loads at a data-dependent index", "other")
            outside = False
            for ix, n in zip(x.args, x.tensor.shape):
                lo, hi = _range(to_pwaff(ix, space), box)
                outside = outside or lo < 0 or hi >= n
            if outside and not clip:
                raise _NoMatch(f"a condition may read {x.tensor.name} outside its shape",
                               "other")
            return ("ldc" if outside else "ld", x.tensor, tuple(x.tensor.shape), x.dtype,
                    tuple(go(i) for i in x.args))
        if isinstance(x, E.Not):
            return ("not", go(x.a))
        if isinstance(x, E.Select):
            return ("sel", go(x.cond), go(x.true_value), go(x.false_value), x.dtype)
        if isinstance(x, E.Cast):
            return ("cast", go(x.value), x.dtype)
        if isinstance(x, E.Call) and x.name == "abs":
            return ("abs", go(x.args[0]), x.dtype)
        if isinstance(x, E.Call) and x.name == "stop_gradient":
            return go(x.args[0])  # the value of its argument
        if type(x) in TREE_OP_TYPES:
            if isinstance(x, (E.FloorDiv, E.FloorMod)) and dt.is_float(x.dtype):
                raise _NoMatch("a float floor division in a condition", "other")
            return (type(x), go(x.a), go(x.b), x.dtype)
        raise _NoMatch(f"a condition with {type(x).__name__}", "other")
    return go(e)


def _keyed(t, key):
    """A tree with its Tensors replaced by buffer keys."""
    if t[0] in ("ld", "ldc"):
        return (t[0], key(t[1]), t[2], t[3], tuple(_keyed(i, key) for i in t[4]))
    return tuple(_keyed(x, key) if isinstance(x, tuple) else x for x in t)


def _pieces(inst, depth=0):
    if depth > 6:
        raise _NoMatch("too many transformations")
    try:
        piece = _analyze(inst)
    except _NoMatch as exc:
        if len(exc.args) > 1 and exc.args[1] == "nonaffine" and not inst.split:
            moduli = _residue_moduli(inst)
            if not moduli or int(np.prod(list(moduli.values()))) > _opts().blas_max_classes:
                raise
            out = []
            for sub in _split(inst, moduli):
                out.extend(_pieces(sub, depth + 1))
                if len(out) > _opts().blas_max_pieces:
                    raise _NoMatch(f"more than {_opts().blas_max_pieces} residue classes") from None
            return out
        raise
    if piece is None:
        return []
    if getattr(piece, "inefficient", False):
        subs = _tap(inst)
        if subs is not None:
            try:
                out = []
                for sub in subs:
                    out.extend(_pieces(sub, depth + 1))
                return out
            except _NoMatch:
                pass
    return [piece]


def match(op, inlined=(), key=None, why=None):
    """The :class:`ContractionPlan` of a stage, or None when it is not a contraction.

    Args:
        op: the stage's ComputeOp.
        inlined: ids of the inlined ops (their bodies are substituted first).
        key: ``tensor -> buffer key`` (the keys :meth:`ContractionPlan.run` looks
            up); default: the tensor's name.
        why: a list; when the stage does not match, the reason is appended.
    Returns:
        A plan (whatever its cost: see :func:`cost_ok`), or None.
    """
    key = key or (lambda t: t.name)
    try:
        inst, scale, dtype = _contraction_of(op, set(inlined))
        pieces = _pieces(inst)
        if len(pieces) > _opts().blas_max_pieces:
            raise _NoMatch(f"{len(pieces)} pieces")
        for p in pieces:
            # a reduction axis neither operand reads counts its points (a factor
            # of its extent, or fewer under a condition): a GEMM would drop it
            if any(p.axes[q][2] != "spatial" and p.axes[q][1] != 1 for q in p.roles()[6]):
                raise _NoMatch("a reduction axis that neither operand reads")
        _check_padding(pieces, op.output(0))
    except _NoMatch as exc:
        if why is not None:
            why.append(exc.args[0])
        return None
    except (isl.Error, TexprError) as exc:
        if why is not None:
            why.append(f"isl: {exc}")
        return None
    # a stage whose packed operands are zero wherever its data-dependent conjuncts
    # fail (codegen.rewrite.operands): those masks matter only on the exact non-finite path
    packed = bool(op.attrs.get("texpr.packed_operands"))
    for p in pieces:
        for v in (p.a, p.b):
            v.key = key(v.key)
            v.data_masks = [_keyed(t, key) for t in v.data_masks]
            v.masks_only_non_finite = packed
    out = op.output(0)
    return ContractionPlan(op.name, key(out), out.shape, dtype, scale, pieces,
                           not _partition(pieces, out.shape))


def rekey(plan, key):
    """A copy of ``plan`` whose buffer keys are ``key(k)`` of its keys (the plan
    itself is left as it is: a memoised plan, :mod:`codegen.analysis.matches`, is
    keyed anew for every reader).

    Args:
        plan: a :class:`ContractionPlan`.
        key: ``old key -> new key`` (a tensor -> its buffer's position).
    Returns:
        A :class:`ContractionPlan` sharing nothing mutable with ``plan``.
    """
    def view(v):
        return OperandView(key(v.key), v.shape, v.pad, v.axes, v.offset, v.strides, v.masks,
                           [_keyed(t, key) for t in v.data_masks], v.exact_masks)

    pieces = []
    for p in plan.pieces:
        a, b = view(p.a), view(p.b)
        q = GemmPiece(p.axes, p.out_offset, p.out_strides, a, b, p.out_masks, p.points)
        for old, new in ((p.a, a), (p.b, b), (p, q)):
            for name, value in vars(old).items():  # (flags set after construction)
                if name not in vars(new) and not name.startswith("_"):
                    setattr(new, name, value)
        pieces.append(q)
    return ContractionPlan(plan.stage, key(plan.out_key), plan.shape, plan.dtype, plan.scale,
                           pieces, plan.fill)


def _check_padding(pieces, out):
    """Raise _NoMatch when a piece's zero-padded operand copy would exceed its
    bound (``options.blas_pad_max_ratio``, ``options.blas_pad_min_elements``); ``pieces`` still
    name their operands by tensor."""
    out_elements = math.prod(out.shape)
    for p in pieces:
        for v in (p.a, p.b):
            if v.pad is None:
                continue
            padded = math.prod(v.padded_shape())
            reads = math.prod(p.axes[q][1] for q in v.axes)
            opts = _opts()
            bound = max(opts.blas_pad_min_elements,
                        opts.blas_pad_max_ratio * (math.prod(v.shape) + reads + out_elements))
            if padded > bound:
                name = getattr(v.key, "name", v.key)
                raise _NoMatch(
                    f"its operand {name} {v.shape} would be copied zero-padded to "
                    f"{v.padded_shape()} ({padded:,} elements), more than {opts.blas_pad_max_ratio} "
                    f"times the operand, its {reads:,} elements read and the output "
                    "(options.blas_pad_max_ratio); the loop nest reads it in place", "padding")


def _partition(pieces, shape):
    """Whether the pieces' output slices cover every output element exactly once
    (else the output is zeroed first and every piece adds into it)."""
    size = int(np.prod(shape, dtype=np.int64))
    c_strides = tuple(int(np.prod(shape[d + 1:], dtype=np.int64)) for d in range(len(shape)))
    if len(pieces) == 1:  # the usual case: one GEMM writes the whole output in order
        p = pieces[0]
        ext = tuple(ax[1] for ax in p.axes if ax[2] == "spatial")
        if p.out_offset == 0 and ext == tuple(shape) and tuple(p.out_strides) == c_strides:
            return True
    if size > 1 << 24:
        return False  # too large to count: zero the output, every piece adds
    count = np.zeros(size, dtype=np.int32)
    for p in pieces:
        ext = [ax[1] for ax in p.axes if ax[2] == "spatial"]
        _byte_view(count, p.out_offset, ext, p.out_strides, writeable=True)[...] += 1
    return bool((count == 1).all())


def mask_passes(plan):
    """Element passes the GEMM path spends on data-dependent masks per run.

    Args:
        plan: a :class:`ContractionPlan`.
    Returns an int: per piece, per operand view whose data masks apply on every
    run (not only on the exact path: a packed operand's), its elements times
    its masks' tree nodes -- numpy evaluates a mask node by node over the
    operand's grid (:func:`codegen.backends.numpy_host.gemm._operand`). The cost rule weighs it
    against the GEMMs' multiply-adds (``options.blas_mask_macs``)."""
    total = 0
    for p in plan.pieces:
        for v in (p.a, p.b):
            if v.data_masks and not getattr(v, "masks_only_non_finite", False):
                size = math.prod(p.axes[q][1] for q in v.axes)
                total += size * sum(1 for t in v.data_masks for _ in _tree_nodes(t))
    return total


def cost_ok(plan):
    """The cost rule of the module docstring: whether BLAS pays for ``plan``."""
    return cost_refusal(plan) is None


def cost_refusal(plan):
    """Why the cost rule keeps ``plan`` off BLAS (a short phrase), or None when BLAS
    pays (:func:`cost_ok`)."""
    if plan.flop < _opts().blas_min_flop:
        return (f"too small for BLAS ({plan.flop:,.0f} FLOP < options.blas_min_flop "
                f"{_opts().blas_min_flop:,})")
    passes = mask_passes(plan)
    if plan.flop / 2 < _opts().blas_mask_macs * passes:
        return (f"fewer multiply-adds ({plan.flop / 2:,.0f}) than the element passes of its "
                f"data masks ({passes:,})")
    if plan.flop / 2 * _opts().blas_min_efficiency > plan.points:
        return (f"the GEMMs would multiply {plan.flop / 2:,.0f} terms for "
                f"{plan.points:,} points of the domain")
    for p in plan.pieces:
        _b, m, n, k = p.gemm_dims()
        if min(m, n, k) < _opts().blas_min_dim:
            return f"a GEMM dimension below options.blas_min_dim ({m}x{k} @ {k}x{n})"
    return None


