"""Shift plans: a window stage or a tap-sum stage run as strided moves by one
precompiled function, instead of a loop nest compiled for the stage.

One job: turn the two kinds of stage that :mod:`codegen.rewrite.windows` and
:mod:`codegen.rewrite.tap_split` make -- a window (im2col) and the sum of a taps'
stage over its taps (col2im) -- into a :class:`ShiftPlan`: plain data, one
*move* per combination of tap values, each a copy (or an add) of a strided
view of one buffer into a strided view of another, plus the zeros around
it. :class:`ShiftPlan.run` hands the plan's table of moves to one compiled
function (:data:`MOVES_SOURCE`), the same for every plan of a dtype,
compiled and cached like a unit: once per cache directory, not once per stage.

Why not the stage's own loop nest: compiled, a window stage and a tap
sum cost 0.4-0.6 s of cold build time each (conv2d_s1's two: 1.3 s of compilation,
against a target of 1.1 s for its whole build). numpy's copies and adds of the
same views cost no compile but ran 1.3 ms (window) and 2.3 ms (tap sum) on
conv2d_s1's shapes, paying per innermost row of 27 elements. The moves ran
0.63 and 0.65 ms, the stages' loop nests 0.62 and 1.10 ms (alone, medians,
2026-12-05); the whole value and gradient in-process, A/B: 8.8 ms with the
moves, 10.0 with the loop nests.

**Which stages.** A window stage (``attrs[codegen.rewrite.windows.WINDOW]``) and a
tap-sum stage (``attrs[codegen.rewrite.tap_split.SPLIT]`` on a reduction) have a plan
when every move has at most ``RANK`` axes, the moves share their first axis
(the one the function's outer loop runs over) and read one source buffer,
there are at most ``MAX_MOVES`` tap combinations, and, for a tap sum, for
every combination of tap values its ``where`` is a box in the output's axes
(each conjunct affine in one output axis, the taps being constants) and its
load's indices are affine -- or, the *lattice* path (a transposed
convolution's tap sum: ``where (h + kh + 1) % 2 == 0``, a load at ``(h + 1 -
kh) // 2``), each output axis's valid values per tap combination form an
arithmetic progression (each conjunct reading one output axis, evaluated
exactly at every value) on which the load's indices are affine (proved by
isl): its moves add at that stride. Else the stage keeps its loop nest.

**Safety.** The compiled moves index without checks: every move's view is
checked to lie inside its buffer when the plan is made, and each run checks
that the buffers have the planned sizes and dtype.

**Numerics.** A copy is exact; the tap sum adds the taps in their row-major
order (a loop nest's order), each add IEEE: infinities and NaNs reach the
outputs whose taps read them, as in the loop nest.
"""

import math

import numpy as np

from texpr import expr as E
from texpr.errors import TexprError
from texpr.expr import Load, Reduce
from texpr.simplify.isl_bridge import VarSpace, box_set, isl
from texpr.visitor import free_vars, substitute

from ..ir.marks import TAP_SPLIT, WINDOW, WINDOW_ORDER
from .affine import affine_form, eval_cond, linear_coefs
from .contraction import _cond_affine, _conjuncts

__all__ = ["ShiftPlan", "plan_of", "MAX_MOVES", "LATTICE_BUDGET", "ENABLED"]

#: at most this many tap combinations (moves) per plan
MAX_MOVES = 1024
#: False: window and tap-sum stages keep their loop nests (for A/B timings,
#: benchmarks/bench_variants.py); the symbolic cache keys lowered programs by the graph, not
#: by this: set TEXPR_SYMBOLIC_CACHE=0 where it changes within a process
ENABLED = True


class ShiftPlan:
    """A stage as moves: ``out_key`` (its buffer), ``shape``, ``dtype``, ``fill``
    (zero the output first), ``moves``: ``(mode, dst_offset, shape, dst_strides,
    src_key, src_offset, src_strides)`` in elements of the flat buffers, ``mode``
    ``"copy"``, ``"add"`` or ``"zero"`` (no source); ``lattice``: a tap sum whose
    moves add at a stride (:func:`_lattice_tap_sum_plan`). Plain data: it
    pickles with its kernel."""

    def __init__(self, stage, out_key, shape, dtype, fill, moves, src_shape=None,
                 lattice=False):
        self.stage, self.out_key, self.shape, self.dtype = stage, out_key, tuple(shape), dtype
        self.fill, self.moves, self.lattice = fill, list(moves), lattice
        keys = {m[4] for m in self.moves if m[4] is not None}
        if len(keys) > 1:
            raise _NoPlan()
        self.src_key = next(iter(keys), None)
        self.out_size = math.prod(self.shape)
        self.src_size = math.prod(src_shape) if src_shape is not None else 0
        # every move runs over one first axis (the threads' ranges) and has at most
        # RANK axes; each stays inside its buffers (checked here, once: the
        # compiled moves index without checks)
        firsts = {(m[2][0], m[3][0]) for m in self.moves if m[2]}
        if len(firsts) != 1 or any(not m[2] or len(m[2]) > RANK for m in self.moves):
            raise _NoPlan()
        (self.extent, _), = firsts
        rows = []
        for mode, doff, shape, dstr, key, soff, sstr in self.moves:
            if 0 in shape:
                continue
            _inside(doff, shape, dstr, self.out_size)
            if key is not None:
                _inside(soff, shape, sstr, self.src_size)
            pad = RANK - len(shape)
            sh = [shape[0]] + [1] * pad + list(shape[1:])
            ds = [dstr[0]] + [0] * pad + list(dstr[1:])
            ss = [0] * RANK if sstr is None else [sstr[0]] + [0] * pad + list(sstr[1:])
            rows.append([_MODES[mode], doff, soff] + sh + ds + ss)
        self._table = np.array(rows, dtype=np.int64).reshape(-1)

    def describe(self):
        """One line, for ``Kernel.source``."""
        kinds = {}
        for m in self.moves:
            kinds[m[0]] = kinds.get(m[0], 0) + 1
        shown = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        return f"shift plan: {len(self.moves)} strided moves ({shown}; one compiled " \
            "function shared by every shift plan)" + \
            ("; output zeroed first" if self.fill else "")

    def keys(self):
        """The buffers the plan reads and writes."""
        return {self.out_key} | {m[4] for m in self.moves if m[4] is not None}

    def __repr__(self):
        return f"ShiftPlan({self.stage}: {self.describe()})"


#: the most axes a move has (a window's or a tap sum's of a 2-D convolution: 4)
RANK = 4
_MODES = {"copy": 0, "add": 1, "zero": 2}
_WORDS = 3 + 3 * RANK  # per move in the table: mode, offsets, extents, strides

def _inside(offset, shape, strides, size):
    """Raise _NoPlan unless every element of the view lies in ``[0, size)``."""
    lo = hi = offset
    for n, s in zip(shape, strides):
        lo += min(0, (n - 1) * s)
        hi += max(0, (n - 1) * s)
    if lo < 0 or hi >= size:
        raise _NoPlan()


def _strides(shape):
    return [int(math.prod(shape[d + 1:])) for d in range(len(shape))]


def plan_of(op, key):
    """The :class:`ShiftPlan` of a window or tap-sum stage, or None (the stage keeps
    its loop nest). ``key``: tensor -> buffer key."""
    attrs = getattr(op, "attrs", {})
    if not ENABLED:
        return None
    try:
        if attrs.get(WINDOW):
            return _window_plan(op, key)
        if attrs.get(TAP_SPLIT) and op.reduce_axis:
            try:
                return _tap_sum_plan(op, key)
            except _NoPlan:
                return _lattice_tap_sum_plan(op, key)
    except (_NoPlan, TexprError, isl.Error):  # (an index isl cannot take: the loop nest)
        return None
    except KeyError:  # a source with no buffer of its own (inlined): the loop nest
        return None
    return None


class _NoPlan(Exception):
    pass


def _window_plan(op, key):
    """A window stage (codegen.rewrite.windows): per combination of taps, the valid box of
    positions copied from the source, the rest zeros."""
    region = op.attrs[WINDOW]
    order = op.attrs[WINDOW_ORDER]
    body = op.body[0]
    if not isinstance(body, E.Select) or not isinstance(body.true_value, Load):
        raise _NoPlan()
    src_t = body.true_value.tensor
    shape = op.output(0).shape
    ws = _strides(shape)
    ss = _strides(src_t.shape)
    dims = [d for kind, d in order if kind == "pos"]  # source dims, in region order
    taps = [r[0] for r in region]
    free = [q for q in range(len(shape)) if q not in taps]
    combos = math.prod(shape[t] for t in taps)
    if combos > MAX_MOVES:
        raise _NoPlan()
    moves = []
    for combo in np.ndindex(*[shape[t] for t in taps]):
        ranges, soff = {}, 0
        for (tap, pos, a, b, c, n), d, tv in zip(region, dims, combo):
            p = np.arange(shape[pos])
            ok = np.nonzero((a * p + b * tv + c >= 0) & (a * p + b * tv + c < n))[0]
            lo, hi = (int(ok[0]), int(ok[-1]) + 1) if ok.size else (0, 0)
            if ok.size and ok.size != hi - lo:
                raise _NoPlan()
            ranges[pos] = (lo, hi)
            soff += (a * lo + b * tv + c) * ss[d]
        base = sum(t * ws[q] for q, t in zip(taps, combo))
        # the valid box: copied
        if all(hi > lo for lo, hi in ranges.values()):
            dshape, dstr, sstr, doff = [], [], [], base
            for q in free:
                kind, d = order[q]
                if kind == "plain":
                    dshape.append(shape[q])
                    sstr.append(ss[d])
                else:
                    lo, hi = ranges[q]
                    dshape.append(hi - lo)
                    doff += lo * ws[q]
                    k = next(i for i, r in enumerate(region) if r[1] == q)
                    sstr.append(region[k][2] * ss[dims[k]])
                dstr.append(ws[q])
            moves.append(("copy", doff, dshape, dstr, key(src_t), soff, sstr))
        # the zeros: per position axis, the slabs below and above its valid range
        for q, (lo, hi) in ranges.items():
            for a, b in ((0, lo), (hi, shape[q])) if hi > lo else ((0, shape[q]),):
                if b <= a:
                    continue
                dshape = [shape[x] if x != q else b - a for x in free]
                moves.append(("zero", base + a * ws[q], dshape, [ws[x] for x in free],
                              None, 0, None))
    return ShiftPlan(op.name, key(op.output(0)), shape, op.output(0).dtype, False, moves,
                     src_t.shape)


def _tap_sum_parts(op):
    """``(reduce, load, output axes, taps)`` of a tap-sum stage: a sum of one load
    over its taps; else _NoPlan."""
    red = op.body[0]
    if not isinstance(red, Reduce) or red.combiner.kind != "sum" or len(red.source) != 1 \
            or not isinstance(red.source[0], Load):
        raise _NoPlan()
    return red, red.source[0], list(op.axis), list(red.axes)


def _tap_sum_plan(op, key):
    """A tap-sum stage (codegen.rewrite.tap_split): per combination of taps, the box of
    output points where the ``where`` holds gets the taps' stage added."""
    red, ld, spatial, taps = _tap_sum_parts(op)
    # the load's indices and the where's comparisons as affine forms over the
    # stage's axes (codegen.analysis.affine, checked by isl over the box), keyed by axis
    axes = spatial + taps
    space = VarSpace(axes)
    box = box_set(space)

    def keyed(coefs):
        return {id(a): k for a, k in zip(axes, coefs) if k}
    idx = []
    for ix in ld.args:
        f = affine_form(ix, axes, space, box)
        if f is None:
            raise _NoPlan()
        idx.append((keyed(f[0]), f[1]))
    conds = []  # sum(coefs * v) + const >= 0
    for c in _conjuncts(red.where, []):
        if isinstance(c, E.Const):
            if not c.value:
                raise _NoPlan()
            continue
        aff = _cond_affine(c, axes, space, box)
        if aff is None or any(is_eq for _, _, is_eq in aff):
            raise _NoPlan()
        conds.extend((keyed(coefs), const) for coefs, const, _ in aff)
    shape = op.output(0).shape
    os_ = _strides(shape)
    ts = _strides(ld.tensor.shape)
    sp_ids = [id(v) for v in spatial]
    combos = math.prod(t.dom[1] - t.dom[0] for t in taps)
    if combos > MAX_MOVES:
        raise _NoPlan()
    moves = []
    for combo in np.ndindex(*[t.dom[1] - t.dom[0] for t in taps]):
        tval = {id(t): t.dom[0] + c for t, c in zip(taps, combo)}
        box = [[0, n] for n in shape]
        empty = False
        for coefs, const in conds:
            k = const + sum(c * tval[v] for v, c in coefs.items() if v in tval)
            sv = [(v, c) for v, c in coefs.items() if v not in tval and c]
            if not sv:
                empty = empty or k < 0
                continue
            if len(sv) != 1:
                raise _NoPlan()
            v, c = sv[0]
            d = sp_ids.index(v)
            if c > 0:  # c * s + k >= 0: s >= ceil(-k / c)
                box[d][0] = max(box[d][0], -(k // c))
            else:      # s <= floor(k / -c)
                box[d][1] = min(box[d][1], k // (-c) + 1)
        if empty or any(hi <= lo for lo, hi in box):
            continue
        doff = sum(lo * s for (lo, _), s in zip(box, os_))
        soff, sstr = 0, [0] * len(spatial)
        for (coefs, const), st in zip(idx, ts):
            soff += (const + sum(c * tval[v] for v, c in coefs.items() if v in tval)) * st
            for d, v in enumerate(sp_ids):
                sstr[d] += coefs.get(v, 0) * st
        soff += sum(lo * s for (lo, _), s in zip(box, sstr))
        moves.append(("add", doff, [hi - lo for lo, hi in box], os_, key(ld.tensor), soff, sstr))
    return ShiftPlan(op.name, key(op.output(0)), shape, op.output(0).dtype, True, moves,
                     ld.tensor.shape)


#: the lattice path evaluates the conjuncts at most this many times in all (tap
#: combinations times the values of the output axes they read; a few us each):
#: a plan is made inside the build
LATTICE_BUDGET = 1 << 15


def _lattice_tap_sum_plan(op, key):
    """A tap-sum stage whose ``where`` holds on a residue class per tap combination
    (a transposed convolution's: ``(h + kh + 1) % 2 == 0``) and whose load
    reads at ``affine // c``: per combination of taps, each output axis's valid
    values (its conjuncts evaluated exactly, each conjunct reading at most one
    output axis) must be an arithmetic progression ``lo + step * t``, and the
    load's indices, with the axes written so, affine in ``t`` (proved by isl,
    :func:`codegen.analysis.affine.affine_form`): the move adds the taps' stage into
    the output at stride ``step``."""
    red, ld, spatial, taps = _tap_sum_parts(op)
    shape = op.output(0).shape
    combos = math.prod(t.dom[1] - t.dom[0] for t in taps)
    if combos > MAX_MOVES:
        raise _NoPlan()
    sp_ids = [id(v) for v in spatial]
    per_axis = [[] for _ in spatial]
    fixed = []  # conjuncts of the taps alone
    for c in _conjuncts(red.where, []):
        on = {id(v) for v in free_vars(c)} & set(sp_ids)
        if len(on) > 1:
            raise _NoPlan()
        if on:
            per_axis[sp_ids.index(on.pop())].append(c)
        else:
            fixed.append(c)
    if combos * sum(n * len(cs) for n, cs in zip(shape, per_axis)) > LATTICE_BUDGET:
        raise _NoPlan()
    os_, ts = _strides(shape), _strides(ld.tensor.shape)
    moves = []
    for combo in np.ndindex(*[t.dom[1] - t.dom[0] for t in taps]):
        env = {id(t): t.dom[0] + c for t, c in zip(taps, combo)}
        if not all(eval_cond(c, env) for c in fixed):
            if any(eval_cond(c, env) is None for c in fixed):
                raise _NoPlan()
            continue
        prog = []
        for d, conds in enumerate(per_axis):
            if not conds:
                prog.append((0, 1, shape[d]) if shape[d] else None)
                continue
            vals = []
            for v in range(shape[d]):
                env[sp_ids[d]] = v
                ok = [eval_cond(c, env) for c in conds]
                if any(x is None for x in ok):
                    raise _NoPlan()
                if all(ok):
                    vals.append(v)
            env.pop(sp_ids[d], None)  # (never set where the axis is empty)
            if not vals:
                prog.append(None)
                continue
            step = vals[1] - vals[0] if len(vals) > 1 else 1
            if vals != list(range(vals[0], vals[0] + step * len(vals), step)):
                raise _NoPlan()  # not a progression: no strided move
            prog.append((vals[0], step, len(vals)))
        if any(p is None for p in prog):
            continue
        sub = {t: E.const(int(env[id(t)])) for t in taps}
        axes = [E.iter_var(0, n, f"t{d}", "spatial") for d, (_lo, _s, n) in enumerate(prog)]
        sub.update((v, (ax * step + lo) if step != 1 else ax + lo)
                   for v, ax, (lo, step, _n) in zip(spatial, axes, prog))
        space = VarSpace(axes)
        box = box_set(space)
        soff, sstr = 0, [0] * len(spatial)
        for ix, st in zip(ld.args, ts):
            ix = substitute(ix, sub)
            f = linear_coefs(ix)  # a sum of multiples is affine as written: no proof needed
            if f is not None and set(f[0]) <= {id(ax) for ax in axes}:
                f = ([f[0].get(id(ax), 0) for ax in axes], f[1])
            else:
                f = affine_form(ix, axes, space, box)
            if f is None:
                raise _NoPlan()
            soff += f[1] * st
            for d, k in enumerate(f[0]):
                sstr[d] += k * st
        doff = sum(lo * s for (lo, _st, _n), s in zip(prog, os_))
        moves.append(("add", doff, [n for _lo, _st, n in prog],
                      [st * s for (_lo, st, _n), s in zip(prog, os_)], key(ld.tensor), soff,
                      sstr))
    return ShiftPlan(op.name, key(op.output(0)), shape, op.output(0).dtype, True, moves,
                     ld.tensor.shape, lattice=True)


