"""Stage lowering: one materialised stage -> its statements and loop nests (isl) -> source lines.

One job: the loops of one stage (its unit's body, see :mod:`codegen.loopnest.lower`). A
materialised stage becomes:

1. its body with the inlined stages substituted (:func:`schedule.inline_expand`);
2. its statements, each a point set over the stage's axes:
   * elementwise: ``S[s]`` over the spatial box, ``out[s] = body``;
   * reduction, loops ordered spatial-then-reduce (*scalar mode*): ``I[s]``
     (``acc = identity``), ``U[s, r]`` over the box intersected with the affine
     part of ``where`` (``acc = combine(acc, source)``), ``F[s]`` (``out[s] = acc``),
     scheduled ``[s, 0, 0..]``, ``[s, 1, r]``, ``[s, 2, 0..]``: the accumulator is a
     local scalar;
   * reduction with a reduction loop outside a spatial one (*buffer mode*): the
     output is filled with the identity, then ``U[s, r]``: ``out[s] = combine(out[s], ..)``;
   * scatter-add: the output is initialised (zeros or a copy of ``init``), then
     ``U[p]`` over its domain (intersected with the affine part of ``where``):
     ``out[indices] += value``; a support stage (identity indices: the simplifier's
     elementwise stage restricted to its support) is ``out[p] = value`` with its
     outermost loop parallel like an elementwise stage;
3. the schedule of each statement is the value of every leaf loop of the stage
   (splits are ``floor(v/f)`` and ``v mod f``), so isl's AST generator
   (:func:`texpr.simplify.loop_ast.generate`) gives the loops with exact bounds and
   strides, and solves equalities away;
4. the residual (data-dependent) part of ``where`` stays as an ``if``; loads
   whose indices isl cannot prove in bounds get a run-time check that sets an
   error flag (a ``raise`` would stop the compiler from parallelising the loop); loads
   proven out of bounds are reported at build time (:class:`OutOfBoundsError`).

Default schedule of a stage the user did not order: loops in definition order,
except for reductions, where the axis giving the most accesses that are unit
stride or invariant in it goes innermost (the output's store counts as
invariant in a reduction loop; before that, an axis along which the
reduction's data-dependent ``where`` does not vary, so that the condition is
tested once per innermost loop: ``options.condition_invariant``): a reduction axis (scalar mode) or a spatial axis (buffer mode, with
the reduction loops moved outside the spatial loops whose output tile is small
so that the innermost loop has independent iterations and vectorises without
reassociating floating-point sums). The outermost spatial loop runs in parallel
(``prange``; never a loop that accumulates into shared locations), unless the
stage visits fewer than ``options.parallel_min_points`` points.

Code shape (all exact: no reassociation the user did not ask for beyond a
sum's order of terms, which the evaluator does not fix either):

* buffers are passed flat; an element is ``buf[np.uint64(row-major offset)]``
  with the static extents as constants (no negative-index wrap-around code,
  unit strides visible to LLVM);
* the innermost loop of a floating-point sum (scalar mode) that LLVM's loop
  vectoriser takes (unit-stride loads, no branch, no run-time check) is written
  once, its accumulator updated by ``_radd``, an add LLVM may reassociate: the
  vectoriser keeps the partial sums in vector registers; any other is unrolled
  into ``options.unroll`` partial sums, added to the accumulator in a fixed tree;
* register blocking: in scalar mode, ``options.jam`` consecutive points of the innermost
  spatial axis share the reduction loops (when the domain does not depend on
  that axis and some load is shared), each with its own accumulator;
* in buffer mode a short innermost reduction loop (``<= options.max_lanes``) is unrolled
  inside the spatial loops where all its values are in the domain, so each
  output element is loaded and stored once for all of them; a long one with
  constant bounds is unrolled by groups of ``options.split_lanes`` values the same way
  (dense's dX and dW: 1.6-2.3 ms -> 1.0 ms; layernorm 0.7 -> 0.34 ms); where a
  ``where`` bounds it, the groups wholly inside the domain are unrolled and the
  cut ones run as plain loops (cumsum 6.5 -> 4.4 ms); the longest such
  reduction goes innermost when the loads along the innermost spatial axis
  are contiguous (conv2d: 16 input channels, not 3 kernel columns: 8.5 -> 8.0 ms;
  dilated 16 -> 12 ms);
* register blocking may take a spatial axis other than the innermost (moved
  innermost) where the innermost reduction loop is too short to unroll: a
  strided conv's dW blocks its input channels (8.4 -> 4.7 ms);
* a ``where`` condition ``e % m`` (or ``e // m``) that keeps several but not all
  residue classes of ``e`` (e.g. ``(h + 1) % 3 <= 1``: stride 3, two taps) splits
  the domain into one piece per class, each a strided loop, instead of a test in
  every iteration.
"""

import functools
import math
import re

import numpy as np

from texpr.simplify.isl_bridge import (VarSpace, box_set, card_within, isl,
                                      projected_cards_within, to_pwaff, to_set)
from texpr.simplify import loop_ast as LA
from texpr import dtypes as dt
from texpr import expr as E
from texpr.errors import TexprError
from texpr.printer import expr_str, tensor_str
from texpr.visitor import post_order, tree_sizes
from texpr.tensor import ScatterAddOp, row_major_strides

from ..options import current as _opts
from ..analysis.affine import affine_offsets
from ..analysis.bounds import _BoundsChecker
from .emit import ExprEmitter, const_str, element, fill_value, helper_int
from ..ir.schedule import inline_expand
from . import dialect as _dialect
from .plan import LoopPlan, Nest, StageChunks, decide_chunks

__all__ = ["default_order", "lift_zero_guards"]

# The knobs read here are fields of the active codegen Options (``_opts()``, read
# when the stage is lowered; docs/options.md). Why their defaults are what they are:
# options.rest_parallel_fraction (default 0.125): a second loop nest of a stage (the rest of
#   an unrolled or blocked nest: borders, partial groups) with fewer than this fraction of
#   the stage's points runs sequentially: the compiler compiles every parallel loop nest as
#   a function of its own (depthwise conv's border nests: about 1 s of compile time each,
#   for about 5% of the stage's run time)
# options.inline_nodes (default 16): a subexpression of at most this many tree nodes and no
#   run-time check stays inline in a large value's statements
#   (:meth:`_StageLowering._bind_branches`)
# options.short_contiguous (default True): when no loop of at least 4 trips walks memory
#   contiguously, a shorter one that does may go innermost: the main job's 3x3 convolution
#   of 4x4 images (batch 64) had its batch axis innermost, at a stride of a whole image: its
#   forward ran 1.52 -> 0.55 ms, its weight gradient 1.33 -> 0.78 ms, its input gradient
#   0.70 -> 1.33 ms (the training step 6.06 -> 5.53 ms); avgpool3s2's dX 6.95 -> 1.78 ms,
#   upsample2's dX 0.23 -> 0.07 ms, avgpool3s2's forward 0.56 -> 0.82 ms, the other suite
#   cases unchanged (bench_variants, one run)
# options.condition_invariant (default True): the innermost loop is, first, one along which
#   the reduction's data-dependent ``where`` does not vary (tested once per loop, not per
#   trip: see :func:`_data_condition_axes`), and a short contiguous loop may also go
#   innermost when every long one strides far or varies the condition (the scores' credit
#   for invariant loads had kept the main job's conv2 from options.short_contiguous: its batch axis
#   was innermost again). The main job's serial kernel, one run: conv2 0.98 -> 0.27 ms,
#   conv1's weight gradient 1.27 -> 0.19, the whole kernel 3.64 -> 1.86 ms. False: the
#   scores and options.short_contiguous alone
# options.speculate_selects (default True): a float select of an elementwise stage whose
#   arms are small, call nothing, run no check and read in bounds over the whole stage is
#   written ``_sel(c, a, b)``: both arms computed, then one LLVM select
#   (:func:`speculative_selects`). False: always ``a if c else b``, a branch
# options.speculate_max_nodes (default 16): the most nodes the two arms of a speculated
#   select have together
# options.sum_float64 (default True): a float32 sum of a loop nest (scalar mode: its
#   accumulators in registers) adds in float64 and rounds once when it stores: BatchNorm's
#   statistics and their gradients over 65,536 terms were 10x less accurate than PyTorch's
#   cascaded float32 sums (a small ResNet's gradients within 1.6e-5 of float64, PyTorch's
#   1.5e-6). The vectorised loop then holds half as many lanes per register. False: float32
#   accumulators
# options.select_where (default True): a reduction's data-dependent ``where`` over a value
#   that runs no check is a select of the combined value, not an ``if`` around it
#   (:meth:`_StageLowering._select_combine`: the loads leave the branch and the accumulators
#   vectorise). False: always the ``if``
# options.buffer_tile (default 4096): output tile (elements) below the reduction loops in
#   buffer mode
# options.parallel_min_points (default 1 << 16): stages visiting fewer points run
#   sequentially by default (waking the worker threads costs more than the loop)
# options.parallel_points (default 1 << 19): ... and, below ``options.parallel_points`` points,
#   whose *work* (its points times the expression nodes of its body; a reduction's summand
#   and condition) is below ``options.parallel_min_work``. Waking the second thread costs about 0.1
#   ms here (a parallel loop and a chunked unit's launch alike, OpenMP waiting passively:
#   the loop-nest backend's compiler), so a stage of few cheap points runs faster serially.
#   Calibrated on the suite's stages (2 cores, bench_variants, docs/stages.md): upsample2's
#   and pixel_shuffle2's copies and selects (0.4 M points, work 3-9 M) and layernorm's
#   stages (0.13 M points) lose in parallel; max_pool2d's forward max and argmax (0.8 M
#   points, work 7-14 M), avg_pool2d's and the depthwise convolution's stages (1.7-6.9 M
#   points) gain
# options.parallel_min_work (default 16_000_000): 
# options.chunks (default True): a parallel stage is a *chunked* serial unit whose parts of
#   its outermost spatial axis run at the same time (the backend's chunked units
#   (docs/stages.md)), where its loop nests allow it, instead of prange loops (the backend's
#   parallel-loop pass: about 0.5-1 s of compile time per unit)
# options.unroll_min_points (default 1 << 15): reductions whose iteration box has fewer
#   points are neither unrolled nor register-blocked
# options.unroll (default 8): partial sums in the innermost loop of a sum reduction (a power
#   of two)
# options.jam (default 4): points of the innermost spatial axis blocked together in a sum
#   (register blocking)
# options.jam_unroll (default 4): partial sums per blocked point of a register-blocked sum
#   (options.jam points x this many accumulators; options.unroll's 8 there made flatten_dense's dense unit
#   32 accumulators and 7.7 s of compile time)
# options.jam_move (default True): the blocked axis may be a spatial axis other than the
#   innermost (moved innermost)
# options.max_lanes (default 4): a reduction loop this short, innermost among the reductions
#   in buffer mode, is unrolled inside the spatial loops
# options.split_lanes (default 16): a longer innermost reduction loop in buffer mode
#   (constant bounds) is unrolled by groups of this many values inside the spatial loops
# options.max_residue_splits (default 2): at most this many residue splits of one stage's
#   domain (each doubles its code, about)
# options.reassociate (default True): the innermost loop of a float sum that LLVM's loop
#   vectoriser takes is written once with ``_radd`` accumulators instead of ``options.unroll``
#   copies (:meth:`_StageLowering._emit_reassociated_sum`)
# options.reassociate_min_trips (default 128): ... where its loop runs at least this many
#   times: the vectorised loop takes vector width x interleave (8 x 4 float32 lanes with
#   AVX2) terms a trip, and a shorter loop runs mostly in its scalar remainder, one
#   dependency chain. Depthwise conv's dW (a 28-value innermost loop): 0.72 ms unrolled,
#   1.57 ms written once (bench_variants, 2026-12-04)
#: a statement that branches, and the run-time checks (calls that may set the
#: error flag), which keep a sum's loop unrolled by copies
_BRANCH = re.compile(r"\s*(if|elif|else|while|for)\b")


@functools.lru_cache(maxsize=None)
def _check_call(names):
    """A regex finding a call of one of the check helpers ``names``."""
    return re.compile(r"\b(" + "|".join(names) + r")\(")


# options.unroll_max_nodes (default 64): larger summands are not unrolled (compile time
#   grows with the copies)
# options.cse (default True): repeated subexpressions of a statement are computed once, and
#   large selects inside it by if statements of their own (:mod:`codegen.loopnest.cse`)
# options.invariant_free (default True): in the default order's scores, a load invariant in
#   a loop counts as much as a unit-stride one, and the output's store is invariant in a
#   reduction loop (layernorm's variance: ``mean[i]`` and the store no longer pull ``i``
#   innermost, which read X at stride 512 and unrolled 16 lanes; value and gradient compile
#   time 3.8 -> 3.0 s); first, though, the innermost loop walks the fewest tensors at a far
#   stride (:func:`_far_strided`). False: the earlier scores alone
# options.affine_offsets (default True): loads whose row-major offset isl proves affine over
#   the iteration box are addressed by that offset, not by their ``//`` and ``%`` indices
#   (:mod:`codegen.analysis.affine`)


def _coef(e, v):
    """Coefficient of ``v`` in ``e`` if ``e`` is affine in ``v`` (0 if absent), else None."""
    if e is v:
        return 1
    if isinstance(e, (E.Const, E.Var)):
        return 0
    if isinstance(e, E.Add):
        a, b = _coef(e.a, v), _coef(e.b, v)
        return None if a is None or b is None else a + b
    if isinstance(e, E.Sub):
        a, b = _coef(e.a, v), _coef(e.b, v)
        return None if a is None or b is None else a - b
    if isinstance(e, E.Mul):
        for c, o in ((e.a, e.b), (e.b, e.a)):
            if isinstance(c, E.Const):
                k = _coef(o, v)
                return None if k is None else k * c.value
        return None if _mentions(e, v) else 0
    return None if _mentions(e, v) else 0


def _mentions(e, v):
    from texpr.visitor import post_order
    return any(n is v for n in post_order(e))


def _nodes(e):
    from texpr.visitor import post_order
    return post_order(e)


def _loads(exprs):
    from texpr.visitor import post_order
    return [n for n in post_order(exprs) if isinstance(n, E.Load)]


def _average_trips(exprs, spatial, reduce_):
    """id(axis) -> the average trip count of a loop over it inside all the other
    loops of the stage's domain (points / points of the projection): the extent,
    unless the reduction's ``where`` ties the axis to others (e.g. a spatial axis
    ``2*r - 1 <= h <= 2*r + 1`` runs 3 times per value of ``r``). The counts are
    bounded in cost (:func:`~texpr.simplify.isl_bridge.projected_cards_within`:
    barvinok took minutes on a 30x300x300 domain with two modulus conditions);
    an axis whose counts are not exact keeps its extent."""
    axes = list(spatial) + list(reduce_)
    red = next((e for e in exprs if isinstance(e, E.Reduce)), None)
    out = {id(a): float(a.extent) for a in axes}
    if red is None or (isinstance(red.where, E.Const) and red.where.value is True):
        return out
    try:
        space = VarSpace(axes)
        dom = box_set(space).intersect(to_set(red.where, space)[0])
        total, projs = projected_cards_within(dom)
        if not total.exact or total.value == 0:
            return out
        for a, proj in zip(axes, projs):
            if proj.exact:
                out[id(a)] = total.value / max(proj.value, 1)
    except TexprError:
        pass
    return out


# options.near_stride (default 4): a stride (in elements) up to which consecutive iterations
#   of the innermost loop still share cache lines (rows of 3 per-row statistics read along
#   the rows)


def _far_strided(op, loads, spatial, reduce_):
    """id(axis) -> how many tensors (each counted once; the output's store too,
    for a spatial axis) a loop over the axis walks at a stride above
    ``options.near_stride`` elements, or an unknown one: the first key of the
    default order, so that the invariant loads the scores credit never put a
    loop that strides through a large tensor innermost (``sum_k A[k, i] *
    S[i, 0]``: ``k`` innermost read A by columns, 11.7x slower at 3000x3000)."""
    far = {}
    for ax in list(spatial) + list(reduce_):
        hit = set()
        for ld in loads:
            if not ld.args:
                continue
            coefs = [_coef(i, ax) for i in ld.args]
            if any(c is None for c in coefs):
                hit.add(id(ld.tensor))
                continue
            step = sum(c * st for c, st in zip(coefs, row_major_strides(ld.tensor.shape)))
            if abs(step) > _opts().near_stride:
                hit.add(id(ld.tensor))
        if ax.kind == "spatial" and op.axis:
            pos = next((d for d, a in enumerate(op.axis) if a is ax), None)
            if pos is not None and row_major_strides(op.shape)[pos] > _opts().near_stride:
                hit.add("store")
        far[id(ax)] = len(hit)
    return far


def _data_condition_axes(exprs):
    """ids of the axes that the reduction's data-dependent ``where`` (its loads:
    a relu's ``conv[n, c, h, w] > 0``, a max pool's argmax) varies along: an
    innermost loop along none of them tests the condition once for the whole
    loop (the compiler hoists it), one along them tests it every trip."""
    red = next((e for e in exprs if isinstance(e, E.Reduce)), None)
    if red is None:
        return set()
    return {id(n) for ld in _loads([red.where]) for i in ld.args for n in _nodes(i)
            if isinstance(n, E.IterVar)}


def default_order(op, exprs, spatial, reduce_):
    """The default leaf order (see the module docstring); returns a list of axes."""
    if not reduce_:
        return list(spatial)
    score = {}
    loads = _loads(exprs)
    accesses = [ld.args for ld in loads]
    for ax in list(spatial) + list(reduce_):
        s = 0
        for idx in accesses:
            if not idx:
                continue
            last = _coef(idx[-1], ax)
            others = [_coef(i, ax) for i in idx[:-1]]
            free = (1, -1, 0) if _opts().invariant_free else (1, -1)
            if last in free and all(o == 0 for o in others):
                # unit stride, or invariant: the loop keeps the value in a register
                # (layernorm's mean[i] is free in a loop over the reduction axis)
                s += 2
            elif any(o not in (0, None) for o in others) or last not in (0, 1, -1):
                s -= 1
        score[id(ax)] = s
    if spatial:
        score[id(spatial[-1])] = score.get(id(spatial[-1]), 0) + 2  # the store
    for ax in reduce_ if _opts().invariant_free else ():
        score[id(ax)] += 2  # the store is invariant in a reduction loop (an accumulator)

    trip = _average_trips(exprs, spatial, reduce_)
    far = _far_strided(op, loads, spatial, reduce_) if _opts().invariant_free else {}
    varies = _data_condition_axes(exprs) if _opts().condition_invariant else set()

    def key(ax):
        is_sp = ax.kind == "spatial"
        return (id(ax) not in varies, -far.get(id(ax), 0), score[id(ax)],
                min(trip[id(ax)], 16), is_sp)

    axes = list(spatial) + list(reduce_)
    cands = [a for a in axes if trip[id(a)] >= 4] or list(reduce_)
    if _opts().short_contiguous and all(score[id(a)] <= 0 or (_opts().condition_invariant and (
            far.get(id(a), 0) or id(a) in varies)) for a in cands):
        # no long loop walks memory contiguously: a short one that does may beat a
        # long strided one (see options.short_contiguous)
        cands += [a for a in axes if 2 <= trip[id(a)] < 4 and score[id(a)] > 0]
    best = max(cands, key=key)
    if best.kind == "reduce":
        rest = [a for a in reduce_ if a is not best]
        return list(spatial) + rest + [best]
    # buffer mode: spatial axes, then the reductions, then a small spatial tile
    sp = [a for a in spatial if a is not best]
    inner = [best]
    tile = best.extent
    while sp and len(sp) > 1 and tile * sp[-1].extent <= _opts().buffer_tile:
        tile *= sp[-1].extent
        inner.insert(0, sp.pop())
    return sp + _split_last(exprs, reduce_, best) + inner


def _partial_groups(where, axes, r, f, box):
    """The points of the box (over ``axes``) whose group of ``f`` consecutive values
    of ``r`` (``r // f`` fixed) has a value outside ``where`` (quasi-affine)."""
    from texpr.visitor import substitute
    r2 = E.iter_var(r.dom[0], r.dom[1], r.name + "_mate", "reduce")
    space2 = VarSpace(list(axes) + [r2])
    box2 = box_set(space2)
    inside = to_set(substitute(where, {r: r2}), space2)[0]
    mates = to_set(E.floordiv(r2, f) == E.floordiv(r, f), space2)[0]
    bad = box2.subtract(inside).intersect(mates)
    return bad.project_out(isl.dim_type.set, len(axes), 1).intersect(box)


def _split_last(exprs, reduce_, inner):
    """The reduction loops of a buffer-mode stage, outermost first: in definition
    order, except that the longest one (``>= options.split_lanes``) whose bounds are
    constant (the ``where`` does not mention it) and that a load reads goes
    innermost, where its values are unrolled by groups (one load and store of
    the output element per group: conv2d's input channels rather than its
    3 kernel columns) -- when every load along the innermost spatial axis
    ``inner`` is contiguous (a strided conv's loads along ``w`` are not, and
    its kernel columns' unrolled loads are faster: 3.5 ms vs 7 ms)."""
    red = next((e for e in exprs if isinstance(e, E.Reduce)), None)
    if red is None or len(reduce_) < 2:
        return list(reduce_)
    loads = _loads(red.source)
    for ld in loads:
        if ld.args and _mentions(ld, inner) and _coef(ld.args[-1], inner) not in (1, -1):
            return list(reduce_)
    ok = [a for a in reduce_ if a.extent >= _opts().split_lanes and a.dom[0] == 0
          and not _mentions(red.where, a) and any(_mentions(ld, a) for ld in loads)]
    if not ok:
        return list(reduce_)
    best = max(ok, key=lambda a: a.extent)
    return [a for a in reduce_ if a is not best] + [best]


def lift_zero_guards(red, space):
    """``sum(select(c, a, 0) * b, where=w)`` -> ``sum(a * b, where=w && c)`` for the
    affine conditions ``c`` of guards in the product of a sum's source: the
    guard becomes a loop bound instead of a test in the innermost loop (the
    terms dropped are zero, as in the simplifier's zero elimination)."""
    if red.combiner.kind != "sum" or len(red.source) != 1:
        return red
    conds = []

    def strip(e):
        if isinstance(e, E.Select) and isinstance(e.false_value, E.Const) \
                and e.false_value.value == 0:
            _, r = to_set(e.cond, space)
            if r is None:
                conds.append(e.cond)
                return strip(e.true_value)
            return e
        if isinstance(e, E.Mul):
            return E.mul(strip(e.a), strip(e.b))
        if isinstance(e, E.Cast) and dt.is_float(e.dtype):
            inner = strip(e.value)
            return E.cast(inner, e.dtype)
        return e

    src = strip(red.source[0])
    if not conds:
        return red
    where = E.all_of([red.where] + conds)
    src = E.cast(src, red.dtype) if src.dtype != red.dtype else src
    return E.make_reduce(red.combiner, (src,), red.axes, where, 0)


def _points(s):
    """Points of a domain for the parallel rules, at a bounded cost
    (:func:`~texpr.simplify.isl_bridge.card_within`: exact, or where counting
    would cost too much the points of its bounding box, the extents' product),
    or a huge number when they cannot be counted."""
    try:
        return card_within(s).value
    except TexprError:
        return 1 << 62


def _worth_parallel(points, exprs):
    """Whether a stage of ``points`` points whose body is ``exprs`` is worth its
    parallel launch (``options.parallel_min_points``, ``options.parallel_points``,
    ``options.parallel_min_work``)."""
    if points < _opts().parallel_min_points:
        return False
    if points >= _opts().parallel_points:
        return True
    from texpr.visitor import post_order

    nodes = sum(len(post_order(x)) for x in exprs if isinstance(x, E.Expr))
    return points * max(nodes, 1) >= _opts().parallel_min_work


def _free(e):
    from texpr.visitor import free_vars
    return free_vars(e) if isinstance(e, E.Expr) else []


def _order_sensitive(red):
    """Whether the result of the reduction ``red`` (a Reduce, or another body)
    can depend on the order of its points beyond rounding: a user's tuple reducer
    (``te.comm_reducer``), whose combine may keep the accumulator at a tie. The
    kernels then visit the points in row-major order of the reduction axes, as
    ``te.evaluate`` does (docs/conventions.md)."""
    return (isinstance(red, E.Reduce) and red.combiner.kind == "custom"
            and not red.combiner.order_free)


def _residue_candidates(where, space, dom):
    """The ``(e, m)`` of the ``e % m`` and ``e // m`` in ``where`` (constant
    ``m >= 2``, ``e`` quasi-affine over the stage's axes) whose residues in the
    domain are more than one class and fewer than ``m``: conditions a single
    stride cannot express."""
    from texpr.visitor import post_order
    out = []
    for n in post_order(where):
        if not (isinstance(n, (E.FloorMod, E.FloorDiv)) and isinstance(n.b, E.Const)
                and isinstance(n.b.value, int) and n.b.value >= 2):
            continue
        if to_pwaff(n.a, space) is None or any(n.a is e for e, _ in out):
            continue
        m = n.b.value
        k = sum(1 for r in range(m)
                if not dom.intersect(to_set(E.floormod(n.a, m) == r, space)[0]).is_empty())
        if 1 < k < m:
            out.append((n.a, m))
    return out[:_opts().max_residue_splits]


def _lane(name, lane):
    return name if lane is None else f"{name}_l{lane}"


def _jam_axis(sp_order, red, fixed=()):
    """The spatial axis to block, innermost first, if register blocking pays and
    is exact: the reduction's domain does not depend on it, and some load of the
    summand does not either (it is then shared by the blocked points). An axis
    other than the innermost (e.g. conv2d dW's input channel, when the kernel
    column is tied to the image by the ``where``) is moved innermost by the
    caller; axes in ``fixed`` (the parallel loop) stay where they are."""
    loads = _loads(red.source)
    for k in range(len(sp_order) - 1, -1, -1):
        a = sp_order[k]
        if any(a is f for f in fixed):
            continue
        if a.extent < 2 * _opts().jam or _mentions(red.where, a):
            continue
        if not any(not _mentions(ld, a) for ld in loads):
            continue
        return a
    return None



def speculative_selects(name, exprs, space, box, em):
    """ids of the float selects of ``exprs`` (an elementwise stage's body over ``box``)
    written ``_sel(c, a, b)``: both arms computed, then chosen by one LLVM select.
    A select in the generated text is a branch; on a data-dependent condition (a
    relu's mask, ``select(x > 0, dy, 0)``) half its branches are mispredicted, and
    LLVM cannot make it a blend itself, for it may not load an array element the
    branch does not reach. Speculated: arms of at most
    ``options.speculate_max_nodes`` nodes together, with no call, no division, no
    integer load and no run-time check (:attr:`ExprEmitter.checks` and the
    others), whose loads isl proves in bounds over the whole stage, not only
    where the condition holds (a padding select, ``select(h >= 1, X[h - 1],
    0)``, keeps its branch), and whose nested selects are speculated too. The
    value is the branch's: an arm not taken is computed and dropped (a NaN or
    an infinity in it never reaches the result)."""
    out = set()
    if not _opts().speculate_selects:
        return out
    for n in post_order(list(exprs)):
        if not isinstance(n, E.Select) or not dt.is_float(n.dtype):
            continue
        arms = [n.true_value, n.false_value]
        nodes = post_order(arms)
        if len(nodes) > _opts().speculate_max_nodes:
            continue
        if any(isinstance(x, (E.Call, E.Div, E.Reduce))
               or (isinstance(x, E.Select) and id(x) not in out)
               or (isinstance(x, E.Load) and not dt.is_float(x.dtype))
               or em._has_own_check(x) for x in nodes):
            continue
        ck = _BoundsChecker(name, space, box)
        try:
            for a in arms:
                ck.walk(a, box, False)
        except (TexprError, isl.Error):
            continue
        if ck.need or ck.values or ck.arith:
            continue
        out.add(id(n))
    return out


def _runs_parallel(nest):
    """Whether the planned ``nest``, written with parallel loops, has one: a loop
    of a parallel dimension that isl did not reduce to one value."""
    if nest.tree is None or not nest.par_prange:
        return False
    par = {id(nest.loop_vars[d]) for d in nest.par_prange}
    return any(isinstance(x, LA.For) and id(x.var) in par and not x.degenerate
               for x in LA.walk(nest.tree))


class _StageLowering:
    """Lowers one materialised stage to source lines written by ``w``
    (:class:`codegen.loopnest.emit._Writer`) at ``depth``: ``run`` emits the stage,
    ``uses_prange`` tells whether a loop runs in parallel, ``errors`` (shared
    list) receives the messages of its run-time checks (code = position + 1).

    ``k`` prefixes the local identifiers (``i{k}_0``, ``acc{k}_0``, ...): the
    program lowers every stage as a unit of its own with ``k = 0``, so the text
    depends on the stage's structure alone. ``buffers`` maps ``id(tensor)`` to
    the :class:`codegen.loopnest.lower.BufferInfo` whose ``name`` the text uses.

    Dispatch: :meth:`run` picks the lowering by the op's kind (scatter-add,
    reduction, elementwise); a new op kind adds a branch there (or a method
    like :meth:`_scatter`).
"""

    def __init__(self, k, op, stage, buffers, inlined, errors, parallel_on, w):
        self.k, self.op, self.stage, self.buffers = k, op, stage, buffers
        self._temps = 0  # numbers the temporaries of statements (_fresh)
        self.inlined, self.errors, self.parallel_on, self.w = inlined, errors, parallel_on, w
        self.names = {}
        self.uses_prange = False
        # a where= written as a chain of flag blocks binding values one block reads
        # from another (_guard): the backend's parallel-loop pass miscompiles such a body
        self.split_guard = False
        # chunked lowering (the backend's chunked units): the parallel loop over ``chunk_axis``
        # runs the part ``part[0] <= value < part[1]`` of its range only
        self.chunking = False  # asked for by the unit; after planning: the unit is chunked
        self.chunk_axis = None  # the one spatial axis every chunked loop runs over
        self.chunk_align = 1  # parts start at multiples of this (tiles of the axis)
        self._chunk_div = {}  # id(loop var) -> d: the loop runs the values axis // d
        self._chunks = StageChunks(op)  # what plan.decide_chunks reads besides the nests
        # the planned stage, in the order it is written: plan.Nest records and
        # functions writing lines (a buffer-mode reduction's fill)
        self.items = []
        self.loop_plan = None  # the plan.LoopPlan, once planned
        # (combine, accumulator, dtype, partial sums, the innermost reduction axis's
        # extent) of a float sum whose innermost loop is unrolled or written with _radd
        self.unroll = None
        self.jam_dim = None
        self.lanes = None  # (loop dimension, count) of an unrolled reduction loop
        # what the lowering chose, for the stage's plan (codegen.strategy.with_loops):
        # the loop order (IterVars), the parallel axes, (axis name, count) of lanes
        self.chosen_order = self.chosen_parallel = self.chosen_lanes = None
        self.chosen_sum = None  # how the innermost sum loop was written: "unroll N", ...
        self.residues = []  # [(e, m)]: split the domains on the residues of e % m
        self.stage_points = None  # points of a reduction stage's domain

    def header(self, depth):
        """The stage's comment line (its definition, in the readable source only)."""
        self.w.comment(depth, "---- stage",
                       f"---- stage {self.op.name}: {tensor_str(self.op.output(0))}")

    def run(self, depth):
        """Write the stage's loop nests (a scan is lowered by
        :func:`codegen.loopnest.scan_lower.lower_stage`, which calls this for the rest):
        every nest planned first (:meth:`_plan`), then how the unit runs them
        decided (:meth:`_decide`), then each written once."""
        self.header(depth)
        self._plan(depth)
        self._decide()
        for item in self.items:
            if isinstance(item, Nest):
                self._write_nest(item)
            else:
                item()

    def _decide(self):
        """Chunked or not (:func:`codegen.loopnest.plan.decide_chunks`), from the
        planned nests; then the stage's :class:`LoopPlan`."""
        if self.chunking:
            nests = [n for n in self.items if isinstance(n, Nest)]
            d = decide_chunks(self._chunks, nests, self)
            self.chunking = d.chunked
            if d.chunked:
                self.chunk_axis, self.chunk_align, self._chunk_div = d.axis, d.align, d.divs
        par = self.chosen_parallel
        if self.chunking:
            execution = "chunked"
        elif any(_runs_parallel(n) for n in self.items if isinstance(n, Nest)):
            execution = "prange"
        else:
            execution = "serial"
        self.loop_plan = LoopPlan(
            None if self.chosen_order is None else tuple(self.chosen_order),
            None if par is None else tuple(par), self.chosen_lanes, execution,
            self.chunk_axis if self.chunking else None, self.chunk_align if self.chunking else 1)

    def _plan(self, depth):
        """Plan the stage's loop nests into :attr:`items` (nothing written but a
        scatter-add's initialisation, which every way of running it shares)."""
        op = self.op
        w = self.w
        if isinstance(op, ScatterAddOp):
            return self._scatter(depth)
        spatial = list(op.axis)
        body = [inline_expand(b, self.inlined) for b in op.body]
        red = body[0] if isinstance(body[0], E.Reduce) else None
        self._chunks.ok = True
        reduce_ = list(op.reduce_axis)
        for d, a in enumerate(spatial):
            self.names[id(a)] = f"i{self.k}_{d}"
        for d, a in enumerate(reduce_):
            self.names[id(a)] = f"r{self.k}_{d}"
        order, par = self._order(body, spatial, reduce_)
        self.chosen_order, self.chosen_parallel = order, par  # (the stage's plan records them)
        outs = [self.buffers[id(t)] for t in op.outputs]
        sp_space = VarSpace(spatial)
        sp_box = box_set(sp_space)
        if red is None:
            return self._run_pointwise(depth, op, w, spatial, body, order, par, outs, sp_space,
                                       sp_box)
        # reduction
        full = spatial + reduce_
        space = VarSpace(full)
        box = box_set(space)
        red = lift_zero_guards(red, space)
        wset, resid = to_set(red.where, space)
        dom = box.intersect(wset)
        self.residues = _residue_candidates(red.where, space, dom)
        sensitive = _order_sensitive(red)
        if sensitive:
            # a residue split runs the classes one after the other: only over the
            # spatial axes, which keeps each element's points in row-major order
            self.residues = [(e, m) for e, m in self.residues
                             if all(v.kind == "spatial" for v in _free(e)
                                    if isinstance(v, E.IterVar))]
        # counting a domain's points can cost (barvinok on modulus conditions;
        # _points bounds it): only where the parallel rules need it
        self.stage_points = _points(dom) if par else None
        if not self.stage.parallel_set and par and not _worth_parallel(
                self.stage_points, list(red.source) + [red.where]):
            par = self.chosen_parallel = []
        em = self._emitter()
        ck = _BoundsChecker(op.name, space, box)
        ck.walk(red.where, box, False)
        for s in red.source:
            ck.walk(s, dom, resid is not None)
        em.checks, em.value_checks, em.arith_checks = ck.need, ck.values, ck.arith
        if _opts().affine_offsets:
            em.flat = affine_offsets([red.where] + list(red.source), full, space, box, ck.need)
        comb = red.combiner
        ncomp = len(comb.identity)
        acc = [f"acc{self.k}_{c}" for c in range(ncomp)]
        n_sp = sum(1 for a in order if a.kind == "spatial")
        scalar_mode = all(a.kind == "spatial" for a in order[:n_sp])
        combine = self._combine_lines(comb, red, em, resid)
        if scalar_mode:
            return self._run_scalar_reduction(depth, w, spatial, red, order, par, outs, sp_space,
                                              sp_box, full, space, dom, comb, ncomp, acc, n_sp,
                                              combine)
        return self._run_buffer_reduction(depth, op, w, red, order, par, outs, full, space, box,
                                          resid, dom, sensitive, comb, ncomp, combine)

    def _run_pointwise(self, depth, op, w, spatial, body, order, par, outs, sp_space, sp_box):
        """An elementwise stage's loop nest (every output written at each point)."""
        if not self.stage.parallel_set and not _worth_parallel(int(np.prod(op.shape)), body):
            par = self.chosen_parallel = []
        em = self._emitter()
        ck = _BoundsChecker(op.name, sp_space, sp_box)
        for b in body:
            ck.walk(b, sp_box, False)
        em.checks, em.value_checks, em.arith_checks = ck.need, ck.values, ck.arith
        em.speculative = speculative_selects(op.name, body, sp_space, sp_box, em)
        if _opts().affine_offsets:
            em.flat = affine_offsets(body, spatial, sp_space, sp_box, ck.need)

        def write_all(d):
            # every output of the stage: a tuple reduction whose domain the
            # simplifier collapsed (one point, equalities solved) is an
            # elementwise stage with several outputs (BUGS.md C14)
            bound = self._bind_shared(em, d, body)
            for o, b in zip(outs, body):
                bound += self._bind_branches(em, d, b)
                w(d, f"{self._store(o)} = {em.cast(b, o.dtype)}")
            em.unbind(bound)

        stmts = {"S": write_all}
        st = [LA.Statement(f"S{self.k}", spatial, sp_box, [self._val(a) for a in order])]
        loop_pos = {id(a): p for p, a in enumerate(order)}
        return self._emit_nest(depth, st, len(order), stmts,
                               {loop_pos[id(a)] for a in par})

    def _run_scalar_reduction(self, depth, w, spatial, red, order, par, outs, sp_space, sp_box,
                              full, space, dom, comb, ncomp, acc, n_sp, combine):
        """A reduction whose spatial loops are outermost: per output point, accumulators
        initialised, updated over the reduction loops (unrolled, jammed) and stored."""
        sp_order, rd_order = order[:n_sp], order[n_sp:]
        from texpr.visitor import post_order
        small = len(post_order(red.source[0])) <= _opts().unroll_max_nodes
        sum_ok = comb.kind == "sum" and ncomp == 1 and dt.is_float(comb.dtypes[0]) and small
        u_n = _opts().unroll if comb.dtypes[0] == "float32" else _opts().unroll // 2
        # a float32 sum accumulates in float64, rounded once when it is stored
        acc_dt = ("float64" if _opts().sum_float64 and comb.kind == "sum" and ncomp == 1
                  and comb.dtypes[0] == "float32" else None)
        # a small stage runs in microseconds either way: unrolled and blocked
        # copies would only cost compile time (the main job's 64-term loss sum
        # with its checked gather: 1.8 s of compilation unrolled)
        sum_ok = sum_ok and self._box_points(full) >= _opts().unroll_min_points
        if sum_ok and rd_order and rd_order[-1].extent >= 2 * u_n:
            self.unroll = (combine, acc[0], acc_dt or comb.dtypes[0], u_n,
                           rd_order[-1].extent)
        jam = None
        if sum_ok and not self.stage.ordered and rd_order:
            # moving another spatial axis innermost pays where the reduction
            # loop is short (strided conv dW: 8.4 -> 4.7 ms), not where it is
            # unrolled (conv dW stride 1: 7.8 -> 14.5 ms)
            move = _opts().jam_move and not self.stage.vectorize_axes and self.unroll is None
            jam = _jam_axis(sp_order, red, par if move else sp_order[:-1])
            if jam is not None and jam is not sp_order[-1]:
                sp_order = [a for a in sp_order if a is not jam] + [jam]
                self.chosen_order = sp_order + rd_order
            if jam is not None and self.unroll is not None:
                u_j = _opts().jam_unroll
                u_j = u_j if comb.dtypes[0] == "float32" else max(1, u_j // 2)
                if u_j < self.unroll[3]:
                    self.unroll = self.unroll[:3] + (u_j,) + self.unroll[4:]

        def init(d, lane=None):
            for a, c in zip(acc, comb.identity):
                w(d, f"{_lane(a, lane)} = {const_str(c.value, acc_dt or c.dtype)}")

        def fin(d, lane=None):
            for o, a in zip(outs, acc):
                v = _lane(a, lane)
                w(d, f"{self._store(o)} = {f'np.float32({v})' if acc_dt else v}")

        stmts = {"I": init, "U": lambda d, lane=None: combine(d, [_lane(acc[0], lane)]
                                                              + acc[1:]), "F": fin}
        pos = {id(a): p for p, a in enumerate(sp_order)}
        pos.update({id(a): n_sp + 1 + p for p, a in enumerate(rd_order)})
        par_dims = {pos[id(a)] for a in par}
        zeros_r = [0] * len(rd_order)
        rest_sp, rest_dom = sp_box, dom
        if jam is not None:
            # register blocking: options.jam consecutive points of the innermost spatial
            # axis share the reduction loops (one accumulator each), over the
            # full tiles; the last partial tile runs unblocked below
            n_full = jam.extent // _opts().jam * _opts().jam
            in_sp = to_set(jam < n_full, sp_space)[0]
            in_full = to_set(jam < n_full, space)[0]

            def sv(a):
                return jam // _opts().jam if a is jam else self._val(a)

            lane = [jam % _opts().jam]
            sts = [LA.Statement(f"I{self.k}", spatial, sp_box.intersect(in_sp),
                                [sv(a) for a in sp_order] + [0] + zeros_r + lane),
                   LA.Statement(f"U{self.k}", full, dom.intersect(in_full),
                                [sv(a) for a in sp_order] + [1]
                                + [self._val(a) for a in rd_order] + lane),
                   LA.Statement(f"F{self.k}", spatial, sp_box.intersect(in_sp),
                                [sv(a) for a in sp_order] + [2] + zeros_r + lane)]
            self.jam_dim = len(order) + 1
            self._emit_nest(depth, sts, len(order) + 2, stmts, par_dims)
            self.jam_dim = None
            rest_sp = sp_box.intersect(in_sp.complement())
            rest_dom = dom.intersect(in_full.complement())
        sched_i = [self._val(a) for a in sp_order] + [0] + zeros_r
        sched_u = [self._val(a) for a in sp_order] + [1] + [self._val(a) for a in rd_order]
        sched_f = [self._val(a) for a in sp_order] + [2] + zeros_r
        sts = [LA.Statement(f"I{self.k}", spatial, rest_sp, sched_i),
               LA.Statement(f"U{self.k}", full, rest_dom, sched_u),
               LA.Statement(f"F{self.k}", spatial, rest_sp, sched_f)]
        return self._emit_nest(depth, sts, len(order) + 1, stmts, par_dims)

    def _run_buffer_reduction(self, depth, op, w, red, order, par, outs, full, space, box, resid,
                              dom, sensitive, comb, ncomp, combine):
        """A reduction with a reduction loop outside a spatial one: the outputs are
        filled with the identity and updated in place (lanes, split groups)."""
        # (a view's layout is another tensor's: no rows of its own to slice)
        sliced = bool(par and par[0] is op.axis[0] and not any(hasattr(o, "perm") for o in outs))
        if self.chunking and par:
            if sliced:
                self._chunks.fill_axis = op.axis[0]  # every nest must chunk the rows filled
            else:
                self._chunks.broken = True  # a chunk could not fill its own part only
        row = math.prod(op.shape[1:])

        def fill():
            for o, c in zip(outs, comb.identity):
                # chunked: each chunk fills its own rows (the leading axis is the chunks')
                target = (f"{o.name}[part[0] * {row}:part[1] * {row}]"
                          if sliced and self.chunking else o.name)
                w(depth, f"_fill_{o.dtype}({target}, {fill_value(c.value, o.dtype)})")

        self.items.append(fill)
        targets = [self._store(o) for o in outs]
        stmts = {"U": lambda d, lane=None: combine(d, targets)}
        rest = dom
        temps = [f"t{self.k}_{c}" for c in range(ncomp)]
        # inside an unrolled lane loop the update goes to the element's scalar copy;
        # a statement isl placed outside one (a residue split, a loop of one
        # value substituted away) updates the element itself
        lane_stmts = {
            "U": lambda d, lane=None: combine(d, targets if lane is None else temps),
            "load": lambda d: [w(d, f"{t} = {g}") for t, g in zip(temps, targets)],
            "store": lambda d: [w(d, f"{g} = {t}") for t, g in zip(temps, targets)]}
        lane_axis = split_axis = None
        if not self.stage.ordered and order[-1].kind == "spatial" and not sensitive:
            # (the unrolled groups and the rest run one after the other: not for
            # a reducer whose result depends on the order of the points)
            rd = [a for a in order if a.kind == "reduce"]
            used = rd and any(_mentions(ld, rd[-1]) for ld in _loads(red.source))
            # (a loop of one value is no loop: isl substitutes it away)
            if used and 2 <= rd[-1].extent <= _opts().max_lanes and rd[-1].dom[0] == 0:
                lane_axis = rd[-1]
            elif used and rd[-1].extent >= _opts().split_lanes and rd[-1].dom[0] == 0 \
                    and self._box_points(full) >= _opts().unroll_min_points \
                    and (resid is None or not _mentions(red.where, rd[-1])) \
                    and sum(len(_nodes(x)) for x in red.source) <= _opts().unroll_max_nodes:
                split_axis = rd[-1]
        if split_axis is not None:
            # a long innermost reduction loop whose bounds are constant: its groups
            # of options.split_lanes consecutive values are unrolled inside the spatial
            # loops (the output element is loaded and stored once per group; the
            # terms are added in the same order), the last partial group runs below
            r, f = split_axis, _opts().split_lanes
            n_full = r.extent // f * f
            main = dom.intersect(to_set(r < n_full, space)[0])
            if _mentions(red.where, r):
                # a group is unrolled where all its values are in the domain (e.g.
                # cumsum's k <= j: the groups wholly below j)
                main = main.subtract(_partial_groups(red.where, full, r, f, box))
            rest = dom.subtract(main)
            sched = [r // f if a is r else self._val(a) for a in order] + [r % f]
            pos = {id(a): p for p, a in enumerate(order)}
            self.lanes = (len(order), f)
            self.chosen_lanes = (r.name, f)
            self._emit_nest(depth, [LA.Statement(f"U{self.k}", full, main, sched)],
                            len(order) + 1, lane_stmts, {pos[id(a)] for a in par})
            self.lanes = None
        if lane_axis is not None:
            # the short innermost reduction loop moves inside the spatial loops and
            # is unrolled (each output element is loaded and stored once for all its
            # lanes) where every lane is in the domain; the rest runs as it is
            k_ax = next(i for i, a in enumerate(full) if a is lane_axis)
            bad = box.subtract(dom).project_out(isl.dim_type.set, k_ax, 1)
            bad = bad.insert_dims(isl.dim_type.set, k_ax, 1).intersect(box)
            main = dom.subtract(bad)
            rest = dom.intersect(bad)
            lane_order = [a for a in order if a is not lane_axis] + [lane_axis]
            pos = {id(a): p for p, a in enumerate(lane_order)}
            self.lanes = (len(order) - 1, lane_axis.extent)
            self.chosen_lanes = (lane_axis.name, lane_axis.extent)
            self._emit_nest(depth, [LA.Statement(f"U{self.k}", full, main,
                                                 [self._val(a) for a in lane_order])],
                            len(order), lane_stmts, {pos[id(a)] for a in par})
            self.lanes = None
        pos = {id(a): p for p, a in enumerate(order)}
        return self._emit_nest(depth, [LA.Statement(f"U{self.k}", full, rest,
                                                    [self._val(a) for a in order])],
                               len(order), stmts, {pos[id(a)] for a in par})

    # -- pieces --------------------------------------------------------------
    def _emitter(self):
        return ExprEmitter(self.names, self.buffers, self.op.name, self.errors)

    def _val(self, leaf):
        return self.stage.axis_value(leaf)

    def _store(self, buf):
        if not self.op.axis:
            return f"{buf.name}[0]"
        return element(buf, [self.names[id(a)] for a in self.op.axis])

    def _order(self, body, spatial, reduce_):
        st = self.stage
        if st.ordered:
            order = list(st.leaf_axes)
        else:
            order = default_order(self.op, body, spatial, reduce_)
            if body and _order_sensitive(body[0]):
                # a tuple reducer keeps the first of tied points in row-major order
                # of its reduction axes (its combine need not be symmetric): the
                # reduction loops keep their declared order, nested where the
                # default order put them
                declared = iter(reduce_)
                order = [next(declared) if a.kind == "reduce" else a for a in order]
        for v in st.vectorize_axes:
            if any(v is a for a in order) and order[-1] is not v:
                order = [a for a in order if a is not v] + [v]
        par = []
        if self.parallel_on:
            if st.parallel_set:
                par = [a for a in st.parallel_axes if any(a is b for b in order)]
            else:
                for a in order:
                    if a.kind == "spatial":
                        par = [a]
                        break
                    break  # a reduction loop outermost: nothing to parallelise safely
        return order, par

    def _combine_lines(self, comb, red, em, resid):
        """A function ``(depth, targets, reassoc=False)`` writing ``targets =
        combine(targets, source)`` (a sum's add as ``_radd`` where ``reassoc``)."""
        w = self.w
        d0 = comb.dtypes[0]

        def emit(depth, targets, reassoc=False):
            bound = []
            if resid is not None and self._select_combine(comb, red, em, resid):
                self._combine_selected(em, depth, targets, comb, red, resid, reassoc)
                return
            if resid is not None:
                depth, bound = self._guard(em, depth, resid, list(red.source))
            bound += self._bind_shared(em, depth, red.source)
            for src in red.source:
                bound += self._bind_branches(em, depth, src)
            if comb.kind == "sum" and reassoc:
                w(depth, f"{targets[0]} = _radd({targets[0]}, {em.cast(red.source[0], d0)})")
            elif comb.kind in ("sum", "prod"):
                op = "+=" if comb.kind == "sum" else "*="
                w(depth, f"{targets[0]} {op} {em.cast(red.source[0], d0)}")
            elif comb.kind in ("max", "min"):
                fn = f"_f{comb.kind}_{d0}" if dt.is_float(d0) else comb.kind
                w(depth, f"{targets[0]} = {fn}({targets[0]}, {em.cast(red.source[0], d0)})")
            else:
                ys = [f"y{self.k}_{c}" for c in range(len(comb.rhs))]
                for y, s, v in zip(ys, red.source, comb.rhs):
                    w(depth, f"{y} = {em.cast(s, v.dtype)}")
                names = dict(self.names)
                names.update({id(v): t for v, t in zip(comb.lhs, targets)})
                names.update({id(v): y for v, y in zip(comb.rhs, ys)})
                cem = ExprEmitter(names, self.buffers, self.op.name, self.errors)
                # the combine's operands are any values of their dtypes: its integer
                # + - * // that may leave the dtype are checked, as te.evaluate does
                cem.arith_checks = _BoundsChecker(self.op.name, None, None).value_arith(
                    comb.result)
                # a deep combiner is written in parts (the text height bound)
                cbound = self._bind_shared(cem, depth, comb.result)
                # the condition every component selects on (an argmax's tie rule):
                # written once, where the first component would evaluate it first
                first = comb.result[0]
                if (len(comb.result) > 1 and isinstance(first, E.Select)
                        and id(first.cond) not in cem.bound
                        and all(isinstance(r, E.Select) and r.cond is first.cond
                                for r in comb.result)):
                    flag = f"sel{self.k}_{self._fresh()}"
                    w(depth, f"{flag} = {cem(first.cond)}")
                    cem.bound[id(first.cond)] = flag
                    cbound.append(id(first.cond))
                news = [f"n{self.k}_{c}" for c in range(len(comb.result))]
                for n, r, v in zip(news, comb.result, comb.lhs):
                    w(depth, f"{n} = {cem.cast(r, v.dtype)}")
                cem.unbind(cbound)
                for t, n in zip(targets, news):
                    w(depth, f"{t} = {n}")
            em.unbind(bound)
        return emit

    def _select_combine(self, comb, red, em, resid):
        """Whether the data-dependent ``where`` ``resid`` of ``red`` is written as a
        select of the combined value (``acc += v if c else 0``) rather than an
        ``if`` around the combine: a built-in combiner, one small source and
        condition (no statement of their own), and a source that runs no
        run-time check (a bounds check, a checked integer operation: evaluated
        where ``c`` fails, it would report what the program never reads) and
        reads nothing but floats. Then the source's loads are not behind a
        branch: LLVM turns the select into a blend and vectorises the
        accumulators (a relu-masked per-channel sum of 2 M floats: 10.9 ->
        1.6 ms), where a load behind the ``if`` kept every element a branch.
        The combined values are the same: a sum adds ``+0.0`` where ``c`` fails
        (its accumulator, from ``+0.0``, is never ``-0.0``), a product
        multiplies by 1, a max or min keeps its accumulator."""
        if not _opts().select_where or comb.kind not in ("sum", "prod", "max", "min") \
                or len(red.source) != 1:
            return False
        if em.tree_nodes([resid] + list(red.source)) > _opts().let_tree_nodes:
            return False
        for n in post_order(red.source[0]):
            if em._has_own_check(n) or (isinstance(n, E.Load) and not dt.is_float(n.dtype)):
                return False
        return True

    def _combine_selected(self, em, depth, targets, comb, red, resid, reassoc):
        """The combine of :meth:`_select_combine`: the value, then the select."""
        w = self.w
        d0 = comb.dtypes[0]
        v = f"v{self.k}_{self._fresh()}"
        w(depth, f"{v} = {em.cast(red.source[0], d0)}")
        cond = em(resid)
        t = targets[0]
        if comb.kind in ("sum", "prod"):
            unit = const_str(0 if comb.kind == "sum" else 1, d0)
            term = f"({v} if {cond} else {unit})"
            if comb.kind == "sum" and reassoc:
                w(depth, f"{t} = _radd({t}, {term})")
            else:
                w(depth, f"{t} {'+=' if comb.kind == 'sum' else '*='} {term}")
        else:
            fn = f"_f{comb.kind}_{d0}" if dt.is_float(d0) else comb.kind
            w(depth, f"{t} = {fn}({t}, {v}) if {cond} else {t}")

    def _guard(self, em, depth, cond, later):
        """Write ``if cond:`` before a statement whose values are ``later``; returns the
        depth inside it and the ids :meth:`ExprEmitter.bind_shared` bound. A large
        condition (a where holding a chain of selects, lifted from a gradient) is
        a sequence of conjuncts, each computed into a flag only where the ones
        before it held (``and``'s short circuit, without nesting a block per
        conjunct), after binding the shared subexpressions it computes first."""
        w = self.w
        if em.tree_nodes([cond] + later) <= _opts().let_tree_nodes:
            w(depth, f"if {em(cond)}:")
            return depth + 1, []
        parts, stack = [], [cond]
        while stack:  # the conjuncts, in order
            c = stack.pop()
            if isinstance(c, E.And):
                stack += [c.b, c.a]
            else:
                parts.append(c)
        flag = f"ok{self.k}_{self._fresh()}"
        bound = []
        for j, c in enumerate(parts):
            d = depth
            if j:
                w(depth, f"if {flag}:")
                d += 1
            new = self._bind_shared(em, d, [c], later=parts[j + 1:] + later)
            new += self._bind_branches(em, d, c)
            self.split_guard |= bool(new) and j + 1 < len(parts)
            bound += new
            w(d, f"{flag} = {em(c)}")
        w(depth, f"if {flag}:")
        return depth + 1, bound

    def _bind_branches(self, em, depth, e):
        """After :meth:`_bind_shared`, a value ``e`` still larger than
        ``options.let_tree_nodes`` as a tree is computed before its statement as statements
        in its own order of evaluation: a select whose branches compute something
        worth a name becomes ``if c: v = a`` / ``else: v = b`` (an ``and``/``or``
        likewise), and within each block every node with a run-time check and
        every shared node (of at least ``options.let_min_nodes`` tree nodes) gets a
        variable at its first evaluation on that path; a branch's variables are
        forgotten after it. ``e`` is emitted by name from then on.

        That is a chain of selects behind a guarded load (a gather at a data
        index, its load checked, read only where the index is in range):
        :meth:`ExprEmitter.bind_shared` binds only what the statement always
        evaluates, so the chain and its derivative stayed trees of O(3^d) text (a
        fuzzed gradient scatter, seed 7007400007: 430 KB of source, the compiler out of
        memory at 23 GB). Checks run in the value's order (each in a statement of
        its own, in order), so the one that fails first stays the one reported.
        A value whose text would nest deeper than ``options.text_max_height`` parentheses is
        written the same way, a node at that height bound (a derivative's sum of
        216 terms, each in a branch of its own: fuzz seed 7007500472).
        Returns the ids to unbind after the statement."""
        order, size, uses = tree_sizes([e])
        # too deep to parse is written in parts whatever its size (an attack: a select
        # over a 2,000-node tree and a chain of 45 checked gathers was a SyntaxError)
        if em.unbound_height([e]) <= _opts().text_max_height and (
                em.unbound_tree_nodes([e]) <= _opts().let_tree_nodes
                or len(order) > _opts().let_max_dag_nodes):
            return []
        vc = em.value_checks
        checked = {}  # id -> whether emitting the node runs a check not bound yet
        heights = {}  # id -> how deep the node's text nests now (a bound node: 0)

        def height(n):
            hit = heights.get(id(n))
            if hit is None:
                hit = 0 if id(n) in em.bound else em.text_weight(n) + max(
                    map(height, n.args), default=0)
                heights[id(n)] = hit
            return hit

        def has_check(n):
            hit = checked.get(id(n))
            if hit is None:
                hit = id(n) not in em.bound and (
                    em._has_own_check(n) or any(has_check(c) for c in n.args))
                checked[id(n)] = hit
            return hit

        def worth(n):  # the node would write a statement of its own
            return (id(n) not in em.bound and id(n) not in vc
                    and (has_check(n) or size[id(n)] > _opts().inline_nodes))

        def first_in(arm, hoisted):
            """The nodes worth a statement that ``arm`` evaluates before any check
            outside ``hoisted`` (ids), in its order of evaluation."""
            out, pending = [], [False]

            def walk(n):
                if pending[0] or id(n) in em.bound:
                    return
                if id(n) in vc:
                    pending[0] = True
                    return
                if not worth(n):
                    return
                if id(n) in hoisted:  # computed before the if: its checks come first
                    out.append(n)
                    return
                if isinstance(n, E.Select):
                    walk(n.cond)
                    late = has_check(n.true_value) or has_check(n.false_value)
                elif isinstance(n, (E.And, E.Or)):
                    walk(n.a)
                    late = has_check(n.b)
                else:
                    for c in n.args:
                        walk(c)
                    late = em._has_own_check(n) or any(id(c) in vc for c in n.args)
                if not pending[0]:
                    out.append(n)
                pending[0] = pending[0] or late

            walk(arm)
            return out

        def in_both_arms(n):
            """What both branches of the select ``n`` compute first (before any other
            check of theirs): computed once before its ``if``, checks in order."""
            hoisted = set()
            while True:  # grows: a hoisted node's checks no longer hold later ones back
                b = {id(x) for x in first_in(n.false_value, hoisted)}
                both = [x for x in first_in(n.true_value, hoisted) if id(x) in b]
                if {id(x) for x in both} == hoisted:
                    return both
                hoisted = {id(x) for x in both}

        prefix = f"s{self.k}_{self._fresh()}_"
        count = [0]
        w = self.w

        def bind(n, d, text, scope):
            name = f"{prefix}{count[0]}"
            count[0] += 1
            w(d, f"{name} = {text}")
            em.bound[id(n)] = name
            heights[id(n)] = 0
            scope.append(id(n))

        def block(n, d, scope):  # the statements of n at depth d
            if not worth(n):
                return
            if isinstance(n, E.Select) and (worth(n.true_value) or worth(n.false_value)):
                block(n.cond, d, scope)
                for c in in_both_arms(n):  # before the if, once (not 2^depth times)
                    block(c, d, scope)
                name = f"{prefix}{count[0]}"
                count[0] += 1
                w(d, f"if {em(n.cond)}:")
                for k, arm in enumerate((n.true_value, n.false_value)):
                    if k:
                        w(d, "else:")
                    inner = []
                    block(arm, d + 1, inner)
                    w(d + 1, f"{name} = {em.cast(arm, n.dtype)}")
                    em.unbind(inner)
                    checked.clear()  # a branch's names are gone: recount
                    heights.clear()
                em.bound[id(n)] = name
                scope.append(id(n))
                return
            if isinstance(n, (E.And, E.Or)) and worth(n.b):
                block(n.a, d, scope)
                name = f"{prefix}{count[0]}"
                count[0] += 1
                w(d, f"{name} = {em(n.a)}")
                w(d, f"if {name}:" if isinstance(n, E.And) else f"if not {name}:")
                inner = []
                block(n.b, d + 1, inner)
                w(d + 1, f"{name} = {em(n.b)}")
                em.unbind(inner)
                checked.clear()
                heights.clear()
                em.bound[id(n)] = name
                scope.append(id(n))
                return
            if isinstance(n, E.Select):
                kids = (n.cond,)  # branches inline: nothing in them worth a statement
            elif isinstance(n, (E.And, E.Or)):
                kids = (n.a,)
            else:
                kids = n.args
            for c in kids:
                block(c, d, scope)
            if (em._has_own_check(n) or any(id(c) in vc for c in n.args)
                    or (uses.get(id(n), 0) >= 2 and size[id(n)] >= _opts().let_min_nodes)
                    or height(n) >= _opts().text_max_height):
                bind(n, d, em(n), scope)

        bound = []
        block(e, depth, bound)
        return bound

    def _bind_shared(self, em, depth, exprs, checked_before=False, later=()):
        """:meth:`ExprEmitter.bind_shared` for a statement written at ``depth`` (names
        ``let<k>_<n>_<j>``: unique in the unit, the same in every build)."""
        inner = []
        names = em.bind_shared(exprs, lambda text: self.w(depth, text),
                               f"let{self.k}_{self._fresh()}_", checked_before, later,
                               expand=lambda n: inner.extend(self._bind_branches(em, depth, n)))
        return names + inner

    def _fresh(self):
        """A number for the temporaries of one statement, new in the stage (the text
        stays the same in every build: statements are written in a fixed order)."""
        self._temps += 1
        return self._temps

    def _split_residues(self, cand, statements, ndims, par_dims):
        """Split the statements on the residue classes of a ``(e % m)`` of the
        ``where`` that keeps more than one and fewer than ``m`` classes (e.g.
        ``(h + 1) % 3 <= 1``): each class gets loops of its own, in which isl turns
        the condition into a stride instead of a test in every iteration. The
        classes run one after the other, at the loop level where ``e``'s last
        variable is scheduled. Returns ``(statements, ndims, par_dims)``."""
        e, m = cand
        evars = [v for v in _free(e)]
        owner = next((st for st in statements if all(any(v is x for x in st.vars)
                                                     for v in evars)), None)
        if owner is None:
            return statements, ndims, par_dims
        # the schedule position where all of e's variables are fixed
        t = None
        for idx in range(len(owner.schedule)):
            seen = [x for sch in owner.schedule[:idx + 1] for x in _free(sch)]
            if all(any(v is x for x in seen) for v in evars):
                t = idx
                break
        if t is None:
            return statements, ndims, par_dims
        out = []
        for st in statements:
            if not all(any(v is x for x in st.vars) for v in evars):
                out.append(LA.Statement(st.name, st.vars, st.domain,
                                        st.schedule[:t] + (0,) + st.schedule[t:]))
                continue
            space = VarSpace(st.vars)
            classes = []
            for r in range(m):
                piece = st.domain.intersect(to_set(E.floormod(e, m) == r, space)[0])
                if not piece.is_empty():
                    classes.append((r, piece))
            if len(classes) in (0, 1, m):
                return statements, ndims, par_dims
            # the class's schedule position is its residue r, the same for every
            # statement: a reduction's update pieces (fewer classes than its init
            # and final ones) run between the init and final of their class
            # (numbering the non-empty classes put an update with another
            # class's init: fuzz seed 7000802849, a silently wrong gradient)
            for r, piece in classes:
                out.append(LA.Statement(f"{st.name}r{r}", st.vars, piece,
                                        st.schedule[:t] + (r,) + st.schedule[t:]))
        return out, ndims + 1, {d + (d >= t) for d in par_dims}, t

    @staticmethod
    def _box_points(axes):
        """Points of the iteration box (an upper bound of the domain's: exact, cheap)."""
        return math.prod(a.extent for a in axes)

    def _emit_nest(self, depth, statements, ndims, stmt_code, par_dims):
        """Plan one loop nest (a :class:`codegen.loopnest.plan.Nest` appended to
        :attr:`items`): the statements split on residues, the loop tree generated
        and its arithmetic checked; :meth:`_write_nest` writes it."""
        par_prange = par_dims
        if par_dims and not self.stage.parallel_set and self.stage_points:
            # parallel loops: a small rest nest runs serially (a chunked unit's
            # parts run every nest: each must run its part only)
            points = sum(_points(st.domain) for st in statements if st.name.startswith("U"))
            if points < _opts().rest_parallel_fraction * self.stage_points:
                par_prange = set()
        jam_dim, lanes = self.jam_dim, self.lanes
        for cand in self.residues:
            split = self._split_residues(cand, statements, ndims, par_dims)
            if len(split) != 4:
                continue
            statements, ndims, par_dims, t = split
            par_prange = {d + (d >= t) for d in par_prange}
            if jam_dim is not None:
                jam_dim += jam_dim >= t
            if lanes is not None:
                lanes = (lanes[0] + (lanes[0] >= t), lanes[1])
        loop_vars = [E.var(f"c{self.k}_{d}") for d in range(ndims)]
        for v in loop_vars:
            self.names[id(v)] = v.name
        tree = LA.generate(statements, loop_vars)
        if tree is not None:
            self._check_loop_arithmetic(tree, statements, loop_vars)
        self.items.append(Nest(depth, statements, loop_vars, tree, stmt_code, par_dims,
                               par_prange, jam_dim, lanes))

    def _write_nest(self, nest):
        """Write the planned ``nest``: its parallel loops chunked when the unit is
        chunked (:meth:`_decide`), else parallel loops."""
        saved = self.jam_dim, self.lanes
        self.jam_dim, self.lanes = nest.jam_dim, nest.lanes
        try:
            if nest.tree is None:
                self.w(nest.depth, "pass")
                return
            par = nest.par_chunked if self.chunking else nest.par_prange
            par_vars = {id(nest.loop_vars[d]) for d in par}
            stmt_vars = {st.name: st.vars for st in nest.statements}
            self._emit_tree(nest.tree, nest.depth, par_vars, stmt_vars, nest.stmt_code)
        finally:
            self.jam_dim, self.lanes = saved

    def _check_loop_arithmetic(self, tree, statements, loop_vars):
        """The loop bounds, guards and statement arguments isl generated stay in
        int64 (intervals: each loop variable ranges over the values of its
        schedule dimension); else a TexprError as for the stage's own indices."""
        ck = _BoundsChecker(self.op.name, None, None)
        for d, lv in enumerate(loop_vars):
            lo = hi = None
            for st in statements:
                x = st.schedule[d]
                r = ck.index(x if isinstance(x, E.Expr) else E.const(int(x)), None)
                lo = r[0] if lo is None else min(lo, r[0])
                hi = r[1] if hi is None else max(hi, r[1])
            if lo is not None:
                ck.var_ranges[id(lv)] = (lo, hi)
        for node in LA.walk(tree):
            if isinstance(node, LA.For):
                ck.index(node.lo, None)
                ck.index(node.hi, None)
            elif isinstance(node, LA.If):
                ck.condition(node.cond, None)
            elif isinstance(node, LA.Stmt):
                for a in node.args:
                    ck.index(a, None)

    def _emit_tree(self, node, depth, par_vars, stmt_vars, stmt_code):
        w = self.w
        em = self._emitter()
        if isinstance(node, LA.Block):
            for c in node.body:
                self._emit_tree(c, depth, par_vars, stmt_vars, stmt_code)
        elif isinstance(node, LA.For) and self._is_lane_loop(node):
            lanes = range(_opts().jam if self.lanes is None else self.lanes[1])
            if self.lanes is not None:
                # buffer mode: the output element is read once into a scalar, takes
                # every lane in order, and is written back once
                self.names[id(node.var)] = "0"
                self._emit_stmt(node.body, depth, stmt_vars, {"U": stmt_code["load"]})
            for lane in lanes:
                self.names[id(node.var)] = str(lane)
                self._emit_stmt(node.body, depth, stmt_vars, stmt_code, lane)
            if self.lanes is not None:
                stmt_code["store"](depth)
            self.names[id(node.var)] = node.var.name
        elif isinstance(node, LA.For):
            v = self.names[id(node.var)]
            lo, hi = em(node.lo), em(node.hi)
            if self.chunking and id(node.var) in par_vars:
                # a chunk: the values of the loop whose axis value is in
                # part[0] <= a < part[1] (the loop runs a // d; parts start at
                # multiples of d)
                d = self._chunk_div.get(id(node.var), 1)
                p0, p1 = ("part[0]", "part[1]") if d == 1 else \
                    (f"(part[0] // {d})", f"((part[1] + {d - 1}) // {d})")
                if node.degenerate:
                    w(depth, f"{v} = {lo}")
                    w(depth, f"if {p0} <= {v} < {p1}:")
                elif node.stride == 1:
                    w(depth, f"for {v} in range(max({lo}, {p0}), min({hi}, {p1})):")
                else:
                    s = node.stride
                    w(depth, f"for {v} in range({lo} + (max({p0}, {lo}) - ({lo}) + {s - 1})"
                             f" // {s} * {s}, min({hi}, {p1}), {s}):")
                self._emit_tree(node.body, depth + 1, par_vars, stmt_vars, stmt_code)
                return
            if node.degenerate:
                w(depth, f"{v} = {lo}")
                self._emit_tree(node.body, depth, par_vars, stmt_vars, stmt_code)
                return
            if id(node.var) in par_vars:
                self.uses_prange = True
                if node.stride == 1:
                    w(depth, f"for {v} in {_dialect.current().parallel_range}({lo}, {hi}):")
                else:
                    s = node.stride
                    prange = _dialect.current().parallel_range
                    w(depth, f"for {v}_t in {prange}(({hi} - {lo} + {s - 1}) // {s}):")
                    w(depth + 1, f"{v} = {lo} + {v}_t * {s}")
            elif self._writes_sum(node):
                self._emit_unrolled_sum(node, v, lo, hi, depth, stmt_vars)
                return
            else:
                step = f", {node.stride}" if node.stride != 1 else ""
                w(depth, f"for {v} in range({lo}, {hi}{step}):")
            self._emit_tree(node.body, depth + 1, par_vars, stmt_vars, stmt_code)
        elif isinstance(node, LA.If):
            w(depth, f"if {em(node.cond)}:")
            self._emit_tree(node.then, depth + 1, par_vars, stmt_vars, stmt_code)
            if node.orelse is not None:
                w(depth, "else:")
                self._emit_tree(node.orelse, depth + 1, par_vars, stmt_vars, stmt_code)
        else:
            self._emit_stmt(node, depth, stmt_vars, stmt_code)

    def _writes_sum(self, node):
        """Whether the (not parallel) loop ``node`` is a float sum's innermost loop,
        written by :meth:`_emit_unrolled_sum` (unrolled, or once with ``_radd``)."""
        return (self.unroll is not None and node.stride == 1 and self._long(node) and (
            (isinstance(node.body, LA.Stmt) and node.body.name.startswith("U"))
            or (isinstance(node.body, LA.For) and self._is_lane_loop(node.body)
                and isinstance(node.body.body, LA.Stmt)
                and node.body.body.name.startswith("U"))))

    def _long(self, node):
        """Whether the loop ``node`` may run ``2 * u_n`` times or more (its trip count
        ``hi - lo`` is not a smaller constant): unrolling a loop that always runs
        fewer times than it has copies (upsample2's dX: 2 of a 28-value axis per
        output) only adds code for the compiler to compile."""
        from texpr.simplify.sympy_bridge import constant_difference  # (SymPy: a build's
        # lowering only, never a warm run's, which loads the lowered program)
        trips = constant_difference(node.hi, node.lo)
        return trips is None or trips >= 2 * self.unroll[3]

    def _is_lane_loop(self, node):
        if self.lanes is not None:
            dim, n = self.lanes
            return (node.var.name == f"c{self.k}_{dim}" and isinstance(node.lo, E.Const)
                    and node.lo.value == 0 and isinstance(node.hi, E.Const)
                    and node.hi.value == n and node.stride == 1)
        if self.jam_dim is None or node.var.name != f"c{self.k}_{self.jam_dim}":
            return False
        if not (isinstance(node.lo, E.Const) and node.lo.value == 0
                and isinstance(node.hi, E.Const) and node.hi.value == _opts().jam
                and node.stride == 1):
            raise TexprError(f"stage {self.op.name}: internal: a register-blocked loop with "
                             f"bounds {expr_str(node.lo)}..{expr_str(node.hi)}")
        return True

    def _emit_stmt(self, node, depth, stmt_vars, stmt_code, lane=None):
        if not isinstance(node, LA.Stmt):
            raise TexprError(f"stage {self.op.name}: internal: a register-blocked loop "
                             "around more than one statement")
        em = self._emitter()
        kind = node.name[0]
        for v, a in zip(stmt_vars[node.name], node.args):
            self.w(depth, f"{self.names[id(v)]} = {em(a)}")
        if lane is None:
            stmt_code[kind](depth)
        else:
            stmt_code[kind](depth, lane)

    def _sum_lanes(self, node, stmt_vars):
        """The pieces both ways of writing a sum's innermost loop ``node`` share:
        ``(lanes, body)``, where ``lanes`` are the register-blocked lanes (``[None]``
        without blocking) and ``body(d, ln, target, reassoc=False)`` writes lane
        ``ln``'s statement at depth ``d``, its combine into ``target`` (with
        ``_radd`` where ``reassoc``). Call ``body.done()`` after the last lane."""
        combine = self.unroll[0]
        lane_loop = node.body if isinstance(node.body, LA.For) else None
        stmt = lane_loop.body if lane_loop is not None else node.body
        em = self._emitter()

        def body(d, ln, target, reassoc=False):
            if lane_loop is not None:
                self.names[id(lane_loop.var)] = str(ln)
            for var, a in zip(stmt_vars[stmt.name], stmt.args):
                self.w(d, f"{self.names[id(var)]} = {em(a)}")
            combine(d, [target], reassoc=reassoc)

        def done():
            if lane_loop is not None:
                self.names[id(lane_loop.var)] = lane_loop.var.name

        body.done = done
        return (list(range(_opts().jam)) if lane_loop is not None else [None]), body

    def _emit_unrolled_sum(self, node, v, lo, hi, depth, stmt_vars):
        """The innermost loop of a sum, with ``u_n`` independent partial sums per
        accumulator (the dependency chain of one accumulator no longer bounds the
        speed, and the copies vectorise without the compiler reassociating
        anything), then the remainder, then the partial sums added to the
        accumulator in a fixed tree. With register blocking, each lane of the
        blocked spatial axis has its own accumulator and partial sums."""
        if _opts().reassociate and self._emit_reassociated_sum(node, v, lo, hi, depth, stmt_vars):
            return
        w = self.w
        _combine, acc, dtype, u_n, _extent = self.unroll
        lanes, body = self._sum_lanes(node, stmt_vars)
        self.chosen_sum = f"unroll {u_n}"  # (the stage's plan records it)
        w(depth, f"{v}_lo = {lo}")
        w(depth, f"{v}_hi = {hi}")
        w(depth, f"{v}_m = {v}_lo + max({v}_hi - {v}_lo, 0) // {u_n} * {u_n}")
        parts = {ln: [f"{_lane(acc, ln)}_p{u}" for u in range(u_n)] for ln in lanes}
        for ln in lanes:
            for p in parts[ln]:
                w(depth, f"{p} = {const_str(0, dtype)}")
        w(depth, f"for {v} in range({v}_lo, {v}_m, {u_n}):")
        saved = self.names[id(node.var)]
        for u in range(u_n):
            lane_var = f"{v}_u{u}"
            w(depth + 1, f"{lane_var} = {v} + {u}")
            self.names[id(node.var)] = lane_var
            for ln in lanes:
                body(depth + 1, ln, parts[ln][u])
        self.names[id(node.var)] = saved
        w(depth, f"for {v} in range({v}_m, {v}_hi):")
        for ln in lanes:
            body(depth + 1, ln, _lane(acc, ln))
        for ln in lanes:
            ps = parts[ln]
            while len(ps) > 1:
                ps = [f"({ps[i]} + {ps[i + 1]})" for i in range(0, len(ps), 2)]
            w(depth, f"{_lane(acc, ln)} += {ps[0]}")
        body.done()

    def _emit_reassociated_sum(self, node, v, lo, hi, depth, stmt_vars):
        """The innermost loop of a float sum written once, each accumulator (one per
        lane of a register-blocked axis) updated by ``_radd`` (an add LLVM may
        reassociate, the backend's ``_radd``): LLVM's loop
        vectoriser keeps the partial sums in vector registers, so the copies of
        :meth:`_emit_unrolled_sum` are not needed. Written, and True, only where
        the vectoriser will take the loop and gain: at least
        ``options.reassociate_min_trips`` trips (the constant trip count, else the
        reduction axis's extent), every subscript moves by -1, 0 or +1
        per iteration (:meth:`codegen.loopnest.dialect.Dialect.unit_stride_loop`, the rule that
        turns the vectoriser on for the unit) and the body has no branch and no
        run-time check (a call that may set the error flag,
        :attr:`codegen.loopnest.dialect.Dialect.check_names`). Otherwise nothing is written and
        the caller unrolls. Measured (benchmarks/bench_variants.py, 2026-12-04,
        ``reassociate=False`` against the default in one process): layernorm's
        value and gradient 0.23 -> 0.10 ms, the other suite cases within noise."""
        from texpr.simplify.sympy_bridge import constant_difference
        trips = constant_difference(node.hi, node.lo)
        acc, extent = self.unroll[1], self.unroll[4]
        if (trips if trips is not None else extent) < _opts().reassociate_min_trips:
            return False
        w = self.w
        lanes, body = self._sum_lanes(node, stmt_vars)
        start = len(w.lines)
        w(depth, f"for {v} in range({lo}, {hi}):")
        for ln in lanes:
            body(depth + 1, ln, _lane(acc, ln), reassoc=True)
        body.done()
        written = w.lines[start:]
        text = "\n".join(line[4 * depth:] for line in written)
        checks = _check_call(_dialect.current().check_names)
        if (any(_BRANCH.match(line) for line in written[1:]) or checks.search(text)
                or not _dialect.current().unit_stride_loop(text)):
            del w.lines[start:]
            return False
        self.chosen_sum = "reassociated"  # (the stage's plan records it)
        return True

    def _scatter(self, depth):
        """A scatter-add stage: the output initialised (zeros or a copy of ``init``),
        then ``out[indices] += value`` over the domain. A *support stage*
        (:func:`texpr.simplify.is_support_stage`: identity indices, each element written
        at most once) is an elementwise stage over its support: ``out[axes] =
        value``, no index checks, and its outermost loop may run in parallel."""
        from texpr.simplify.support import is_support_stage
        op, w = self.op, self.w
        support = is_support_stage(op)
        out = self.buffers[id(op.output(0))]
        if op.init is not None:
            src = self.buffers[id(op.init)]
            if src.dtype != out.dtype:
                raise TexprError(f"scatter-add {op.name}: its init is {src.dtype}, its "
                                 f"output {out.dtype}")
            w(depth, f"_copy_{out.dtype}({out.name}, {src.name})")
        else:
            w(depth, f"_fill_{out.dtype}({out.name}, {fill_value(0, out.dtype)})")
        axes = list(op.axis)
        for d, a in enumerate(axes):
            self.names[id(a)] = f"p{self.k}_{d}"
        space = VarSpace(axes)
        box = box_set(space)
        wset, resid = to_set(op.where, space)
        dom = box.intersect(wset)
        self.residues = _residue_candidates(op.where, space, dom)
        em = self._emitter()
        ck = _BoundsChecker(op.name, space, box)
        ck.walk(op.where, box, False)
        for e in ([] if support else list(op.indices)) + [op.value]:
            ck.walk(e, dom, resid is not None)
        for e in op.indices:
            ck.index(e, dom)
        em.checks, em.value_checks, em.arith_checks = ck.need, ck.values, ck.arith
        order = list(self.stage.leaf_axes) if self.stage.ordered else axes
        par_dims = set()
        if support and self.parallel_on:
            st = self.stage
            if st.parallel_set:
                par = [a for a in st.parallel_axes if any(a is b for b in order)]
            else:
                par = order[:1] if _points(dom) >= _opts().parallel_min_points else []
            par_dims = {k for k, a in enumerate(order) if any(a is b for b in par)}

        def upd(d):
            guard = []
            if resid is not None:
                d, guard = self._guard(em, d, resid, list(op.indices) + [op.value])
            upd_body(d)
            em.unbind(guard)

        def upd_body(d):
            if support or not op.indices:
                bound = self._bind_shared(em, d, [op.value])
                bound += self._bind_branches(em, d, op.value)
                target = self._store(out) if support else element(out, [])
                w(d, f"{target} {'=' if support else '+='} {em.cast(op.value, out.dtype)}")
                em.unbind(bound)
                return
            safe_index = []
            for k, n in enumerate(op.shape):
                pa = to_pwaff(op.indices[k], space)
                safe = False
                if pa is not None:
                    bad = pa.lt_set(space.const(0)).union(pa.ge_set(space.const(n))).intersect(dom)
                    safe = bad.is_empty()
                safe_index.append(safe)
            idx = [em(i) for i in op.indices]
            tgt = []
            for k, (s, n) in enumerate(zip(idx, op.shape)):
                if safe_index[k]:
                    tgt.append(s)
                else:
                    self.errors.append(
                        f"stage {op.name}: scatter-add index {k} `{expr_str(op.indices[k])}` "
                        f"leaves the shape {op.shape}")
                    tgt.append(f"_ck({helper_int(s)}, np.int64({n}), err, "
                               f"np.int64({len(self.errors)}))")
            bound = []
            if em.tree_nodes([op.value]) > _opts().let_tree_nodes:
                # a large value shares its subexpressions (ExprEmitter.bind_shared):
                # the target's indices and their checks first, as Python evaluates
                # ``out[target] += value``, then the value's bindings
                tag = self._fresh()
                for k in range(len(tgt)):
                    w(d, f"ix{self.k}_{tag}_{k} = {tgt[k]}")
                    tgt[k] = f"ix{self.k}_{tag}_{k}"
                bound = self._bind_shared(em, d, [op.value])
                bound += self._bind_branches(em, d, op.value)
            w(d, f"{element(out, tgt)} += {em.cast(op.value, out.dtype)}")
            em.unbind(bound)

        st = [LA.Statement(f"U{self.k}", axes, dom, [self.stage.axis_value(a) for a in order])]
        self._emit_nest(depth, st, len(order), {"U": upd}, par_dims)

