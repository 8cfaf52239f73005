"""Lowering: a scheduled graph -> loop nests (isl) -> the Python source of one kernel.

For every materialised stage, in producer-before-consumer order:

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
   error flag (a ``raise`` would stop numba from parallelising the loop); loads
   proven out of bounds are reported at build time (:class:`OutOfBoundsError`).

Default schedule of a stage the user did not order: loops in definition order,
except for reductions, where the axis giving the most unit-stride accesses goes
innermost: a reduction axis (scalar mode) or a spatial axis (buffer mode, with
the reduction loops moved outside the spatial loops whose output tile is small
so that the innermost loop has independent iterations and vectorises without
reassociating floating-point sums). The outermost spatial loop runs in parallel
(``prange``; never a loop that accumulates into shared locations), unless the
stage visits fewer than ``PARALLEL_MIN_POINTS`` points.

Code shape (all exact: no reassociation the user did not ask for beyond a
sum's order of terms, which the evaluator does not fix either):

* buffers are passed flat; an element is ``buf[np.uint64(row-major offset)]``
  with the static extents as constants (no negative-index wrap-around code,
  unit strides visible to LLVM);
* the innermost loop of a floating-point sum (scalar mode) is unrolled into
  ``UNROLL`` partial sums, added to the accumulator in a fixed tree;
* register blocking: in scalar mode, ``JAM`` consecutive points of the innermost
  spatial axis share the reduction loops (when the domain does not depend on
  that axis and some load is shared), each with its own accumulator;
* in buffer mode a short innermost reduction loop (``<= MAX_LANES``) is unrolled
  inside the spatial loops where all its values are in the domain, so each
  output element is loaded and stored once for all of them; a long one with
  constant bounds is unrolled by groups of ``SPLIT_LANES`` values the same way
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

import numpy as np

from texpr.simplify.isl_bridge import VarSpace, box_set, card, isl, to_pwaff, to_set
from texpr.simplify import loop_ast as LA
from texpr import dtypes as dt
from texpr import expr as E
from texpr.errors import OutOfBoundsError, TexprError
from texpr.printer import expr_str, tensor_str
from texpr.scan import ScanOp
from texpr.tensor import PlaceholderOp, ScatterAddOp

from .scan_lower import lower_scan
from .schedule import inline_expand
from .source import buffer_identifiers, comment_text, remove_dead_assignments, rename

__all__ = ["lower", "Program", "BufferInfo", "default_order", "ExprEmitter", "const_str",
           "element", "lift_zero_guards"]

#: output tile (elements) below the reduction loops in buffer mode
BUFFER_TILE = 4096
#: stages visiting fewer points run sequentially by default (waking the worker
#: threads costs more than the loop)
PARALLEL_MIN_POINTS = 1 << 16
#: partial sums in the innermost loop of a sum reduction (a power of two)
UNROLL = 8
#: points of the innermost spatial axis blocked together in a sum (register blocking)
JAM = 4
#: the blocked axis may be a spatial axis other than the innermost (moved innermost)
JAM_MOVE = True
#: a reduction loop this short, innermost among the reductions in buffer mode, is
#: unrolled inside the spatial loops
MAX_LANES = 4
#: a longer innermost reduction loop in buffer mode (constant bounds) is unrolled
#: by groups of this many values inside the spatial loops
SPLIT_LANES = 16
#: at most this many residue splits of one stage's domain (each doubles its code, about)
MAX_RESIDUE_SPLITS = 2
#: larger summands are not unrolled (compile time grows with the copies)
UNROLL_MAX_NODES = 64


class BufferInfo:
    """A buffer of the kernel: ``name`` in the source, ``tensor``, ``role``
    (input/output/temp), ``shape`` (0-d tensors are stored with shape ``(1,)``)."""

    def __init__(self, name, tensor, role):
        self.name, self.tensor, self.role = name, tensor, role
        self.shape = tuple(tensor.shape) if tensor.shape else (1,)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.dtype = tensor.dtype


class Program:
    """The lowered kernel: ``source`` (readable Python text defining ``kernel``:
    buffers named after their tensors, a comment with each stage's definition),
    ``module_source`` (the same lines with canonical identifiers and comments
    free of user names: the text that is compiled and cached, see
    :mod:`codegen.source`), ``buffers`` (argument order: inputs, outputs,
    temps, then the error flag), ``errors`` (flag code -> message), ``stages``
    (names of the materialised stages), ``parallel`` (whether the source uses
    prange)."""

    def __init__(self, source, buffers, errors, stages, parallel, module_source=None):
        self.source, self.buffers, self.errors = source, buffers, errors
        self.stages, self.parallel = stages, parallel
        self.module_source = source if module_source is None else module_source


# ---- small helpers -------------------------------------------------------------------

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
    ``2*r - 1 <= h <= 2*r + 1`` runs 3 times per value of ``r``)."""
    axes = list(spatial) + list(reduce_)
    red = next((e for e in exprs if isinstance(e, E.Reduce)), None)
    out = {id(a): float(a.extent) for a in axes}
    if red is None or (isinstance(red.where, E.Const) and red.where.value is True):
        return out
    try:
        space = VarSpace(axes)
        dom = box_set(space).intersect(to_set(red.where, space)[0])
        total = card(dom)
        if total == 0:
            return out
        for k, a in enumerate(axes):
            proj = card(dom.project_out(isl.dim_type.set, k, 1))
            out[id(a)] = total / max(proj, 1)
    except TexprError:
        pass
    return out


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
            if last in (1, -1) and all(o == 0 for o in others):
                s += 2
            elif any(o not in (0, None) for o in others) or last not in (0, 1, -1):
                s -= 1
        score[id(ax)] = s
    if spatial:
        score[id(spatial[-1])] = score.get(id(spatial[-1]), 0) + 2  # the store

    trip = _average_trips(exprs, spatial, reduce_)

    def key(ax):
        is_sp = ax.kind == "spatial"
        return (score[id(ax)], min(trip[id(ax)], 16), is_sp)

    cands = [a for a in list(spatial) + list(reduce_) if trip[id(a)] >= 4] or list(reduce_)
    best = max(cands, key=key)
    if best.kind == "reduce":
        rest = [a for a in reduce_ if a is not best]
        return list(spatial) + rest + [best]
    # buffer mode: spatial axes, then the reductions, then a small spatial tile
    sp = [a for a in spatial if a is not best]
    inner = [best]
    tile = best.extent
    while sp and len(sp) > 1 and tile * sp[-1].extent <= BUFFER_TILE:
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
    order, except that the longest one (``>= SPLIT_LANES``) whose bounds are
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
    ok = [a for a in reduce_ if a.extent >= SPLIT_LANES and a.dom[0] == 0
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
    """Points of a domain (barvinok), or a huge number when they cannot be counted."""
    try:
        return card(s)
    except TexprError:
        return 1 << 62


def _free(e):
    from texpr.visitor import free_vars
    return free_vars(e) if isinstance(e, E.Expr) else []


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
    return out[:MAX_RESIDUE_SPLITS]


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
        if a.extent < 2 * JAM or _mentions(red.where, a):
            continue
        if not any(not _mentions(ld, a) for ld in loads):
            continue
        return a
    return None


# ---- bounds checks --------------------------------------------------------------------

#: an int64 value loaded (or cast from a float) inside index arithmetic is checked
#: at run time to lie in [-DATA_INDEX_LIMIT, DATA_INDEX_LIMIT): the arithmetic
#: over it is then proven to stay in int64
DATA_INDEX_LIMIT = 1 << 31

_INT_RANGE = {"int64": (-(1 << 63), (1 << 63) - 1), "int32": (-(1 << 31), (1 << 31) - 1)}
_INDEX_ARITH = (E.Add, E.Sub, E.Mul, E.FloorDiv, E.FloorMod, E.Min, E.Max)


class _BoundsChecker:
    """Finds the loads of a statement that need a run-time bounds check, and
    proves its integer index arithmetic exact.

    Loads with quasi-affine indices on a path of affine conditions are checked by
    isl; proven out-of-bounds loads raise at build time.

    isl reasons in exact integers, the kernel in int64: every integer
    subexpression of an index or of a condition is bounded over the iteration
    domain (interval arithmetic from the axes' extents, refined by isl over the
    path for a quasi-affine subexpression whose interval is too wide) and must
    stay within its dtype, or the build fails with a TexprError naming the stage
    and the subexpression. A loaded int64 value (or a float cast to an int) used
    in such arithmetic has no static bound: it gets a run-time check
    (``values``) that it lies within ``+-DATA_INDEX_LIMIT``, and the arithmetic
    over it is proven with that bound (a product of three loaded values is
    rejected)."""

    def __init__(self, stage_name, space, domain):
        self.stage_name, self.space, self.domain = stage_name, space, domain
        self.need = set()   # ids of Load nodes to check at run time
        self.values = set()  # ids of int loads / float->int casts to range-check at run time
        self.var_ranges = {}  # id(Var) -> (lo, hi) for variables that are not axes
        self._seen = set()
        self._ranges = {}

    # -- int64 exactness ---------------------------------------------------------
    def index(self, e, path):
        """Prove the integer expression ``e`` (an index or a comparison operand)
        exact on ``path``; returns its range ``(lo, hi)``."""
        return self._range(e, path, top=True)

    def _range(self, e, path, top=False):
        key = (id(e), id(path), top)
        hit = self._ranges.get(key)
        if hit is not None:
            return hit[1]
        r = self._range_now(e, path, top)
        self._ranges[key] = (e, r)
        return r

    def _range_now(self, e, path, top):
        d = e.dtype
        full = _INT_RANGE.get(d)
        if full is None:
            return None
        if isinstance(e, E.Const):
            return (int(e.value), int(e.value))
        if isinstance(e, E.IterVar):
            return (e.dom[0], e.dom[1] - 1)
        if isinstance(e, E.Var):
            return self.var_ranges.get(id(e), full)
        if isinstance(e, (E.Load, E.Cast)):
            if isinstance(e, E.Load):
                for a in e.args:
                    self.index(a, path)
            elif e.value.dtype == "bool":
                return (0, 1)
            elif _INT_RANGE.get(e.value.dtype) is not None:
                inner = self._range(e.value, path)
                if full[0] <= inner[0] and inner[1] <= full[1]:
                    return inner
            # a loaded value, a float converted, or a narrowing int cast: no static bound
            if top or d == "int32":
                return full  # used as it is: the load's own check (or none) applies
            self.values.add(id(e))
            return (-DATA_INDEX_LIMIT, DATA_INDEX_LIMIT - 1)
        if isinstance(e, E.Select):
            if e.cond.dtype == "bool":
                self.condition(e.cond, path)
            a, b = self._range(e.true_value, path, top), self._range(e.false_value, path, top)
            if a is None or b is None:
                return full
            return (min(a[0], b[0]), max(a[1], b[1]))
        if not isinstance(e, _INDEX_ARITH):
            for c in e.args:
                if _INT_RANGE.get(c.dtype) is not None:
                    self._range(c, path)
            return full
        a, b = self._range(e.a, path), self._range(e.b, path)
        if a is None or b is None:
            return full
        if isinstance(e, E.Add):
            r = (a[0] + b[0], a[1] + b[1])
        elif isinstance(e, E.Sub):
            r = (a[0] - b[1], a[1] - b[0])
        elif isinstance(e, E.Mul):
            ps = [x * y for x in a for y in b]
            r = (min(ps), max(ps))
        elif isinstance(e, E.Min):
            r = (min(a[0], b[0]), min(a[1], b[1]))
        elif isinstance(e, E.Max):
            r = (max(a[0], b[0]), max(a[1], b[1]))
        elif isinstance(e, E.FloorMod):
            if b[0] > 0:
                r = (0, b[1] - 1)
            elif b[1] < 0:
                r = (b[0] + 1, 0)
            else:
                r = (min(b[0] + 1, 0), max(b[1] - 1, 0))
        else:  # floor division: by a divisor range not containing 0 (else the _nz check)
            cands = [x for x in (b[0], b[1], 1, -1) if b[0] <= x <= b[1] and x != 0]
            qs = [p // q for p in a for q in cands]
            r = (min(qs + [a[0], -a[1]]), max(qs + [a[1], -a[0]])) if cands else full
        if full[0] <= r[0] and r[1] <= full[1]:
            return r
        exact = self._isl_range(e, path)
        if exact is not None:
            r = exact
        if not (full[0] <= r[0] and r[1] <= full[1]):
            raise TexprError(
                f"stage {self.stage_name}: the index arithmetic `{expr_str(e)}` reaches "
                f"{r[0] if r[0] < full[0] else r[1]} on the iteration domain, outside {d} "
                f"[{full[0]}, {full[1]}]; the kernel would wrap around. Keep index "
                "expressions within int64 (smaller coefficients or extents)")
        return r

    def _isl_range(self, e, path):
        """The exact range of a quasi-affine ``e`` on ``path`` (isl), or None."""
        if self.space is None:
            return None
        try:
            pa = to_pwaff(e, self.space)
            if pa is None or path.is_empty():
                return None if pa is None else (0, 0)
            pa = pa.intersect_domain(path)
            lo, hi = pa.min_val(), pa.max_val()
            if not (lo.is_int() and hi.is_int()):
                return None
            return (lo.to_python(), hi.to_python())
        except (isl.Error, TexprError):
            return None

    def condition(self, c, path):
        """Prove the integer operands of the comparisons in condition ``c`` exact."""
        from texpr.visitor import post_order
        for n in post_order(c):
            if type(n) in _CMP:
                for x in n.args:
                    if _INT_RANGE.get(x.dtype) is not None:
                        self.index(x, path)

    def walk(self, e, path, resid):
        key = (id(e), id(path), resid)
        if key in self._seen:
            return
        self._seen.add(key)
        if type(e) in _CMP:
            for x in e.args:
                if _INT_RANGE.get(x.dtype) is not None:
                    self.index(x, path)
        if isinstance(e, E.Select):
            self.walk(e.cond, path, resid)
            s, r = to_set(e.cond, self.space)
            self.walk(e.true_value, path.intersect(s), resid or r is not None)
            if r is None:
                self.walk(e.false_value, path.intersect(s.complement()), resid)
            else:
                self.walk(e.false_value, path, True)
            return
        if isinstance(e, (E.And, E.Or)):
            self.walk(e.a, path, resid)
            s, r = to_set(e.a, self.space)
            if isinstance(e, E.Or):
                s = s.complement() if r is None else self.space.universe()
            self.walk(e.b, path.intersect(s), resid or r is not None)
            return
        for c in e.args:
            self.walk(c, path, resid)
        if isinstance(e, E.Load):
            self._check(e, path, resid)

    def _check(self, ld, path, resid):
        t = ld.tensor
        for ix in ld.args:
            self.index(ix, path)
        for d, (ix, n) in enumerate(zip(ld.args, t.shape)):
            pa = to_pwaff(ix, self.space)
            if pa is None:
                self.need.add(id(ld))
                return
            bad = pa.lt_set(self.space.const(0)).union(pa.ge_set(self.space.const(n)))
            bad = bad.intersect(path)
            if bad.is_empty():
                continue
            if resid:
                self.need.add(id(ld))
                return
            pt = bad.sample_point()
            where = ", ".join(
                f"{v.name}={pt.get_coordinate_val(isl.dim_type.set, k).to_python()}"
                for k, v in enumerate(self.space.vars))
            raise OutOfBoundsError(
                f"stage {self.stage_name}: load `{expr_str(ld)}` reads {t.name} outside its "
                f"shape {t.shape} (dimension {d}) at {where}; guard the load with "
                "te.if_then_else if the index can leave the tensor")


# ---- expression emission ----------------------------------------------------------------

_NP = {"float32": "np.float32", "float64": "np.float64", "int32": "np.int32",
       "int64": "np.int64", "bool": "np.bool_"}
_CMP = {E.EQ: "==", E.NE: "!=", E.LT: "<", E.LE: "<=", E.GT: ">", E.GE: ">="}
_ARITH = {E.Add: "+", E.Sub: "-", E.Mul: "*"}
_UNARY_NP = {"exp": "np.exp", "log": "np.log", "sqrt": "np.sqrt", "tanh": "np.tanh",
             "floor": "np.floor", "ceil": "np.ceil", "round": "np.rint", "trunc": "np.trunc",
             "sin": "np.sin", "cos": "np.cos"}


def const_str(value, dtype):
    """A Python literal of ``value`` typed as ``dtype`` inside numba code."""
    if dtype == "bool":
        return "True" if value else "False"
    if dt.is_int(dtype):
        v = int(value)
        return str(v) if dtype == "int64" else f"np.int32({v})"
    v = float(value)
    if v != v:
        text = "np.nan"
    elif v in (float("inf"), float("-inf")):
        text = "np.inf" if v > 0 else "-np.inf"
    else:
        text = repr(v)
    return text if dtype == "float64" else f"np.float32({text})"


class ExprEmitter:
    """Python source of IR expressions inside a numba kernel.

    ``names``: id(Var) -> source name; ``buffers``: id(Tensor) -> BufferInfo;
    ``checks``: ids of loads needing a bounds check; ``errors``: the error table
    (list of messages; the flag holds the 1-based code)."""

    def __init__(self, names, buffers, stage_name, errors):
        self.names, self.buffers, self.stage_name, self.errors = names, buffers, stage_name, errors
        self.checks = set()
        self.value_checks = set()  # ids of int loads / casts range-checked (DATA_INDEX_LIMIT)

    def _value_check(self, e, text):
        if id(e) not in self.value_checks:
            return text
        code = self._err(
            f"stage {self.stage_name}: the value of `{expr_str(e)}` is used in index "
            f"arithmetic and must lie in [-{DATA_INDEX_LIMIT}, {DATA_INDEX_LIMIT}) "
            "(the arithmetic is proven exact in int64 for such values only)")
        return f"_rk({text}, {DATA_INDEX_LIMIT}, err, {code})"

    def cast(self, e, dtype):
        s = self(e)
        if e.dtype == dtype:
            return s
        if isinstance(e, E.Const):
            return const_str(e.value, dtype)
        if dtype == "bool":
            return f"({s} != 0)"
        return f"{_NP[dtype]}({s})"

    def _err(self, msg):
        self.errors.append(msg)
        return len(self.errors)

    def __call__(self, e):
        cls = type(e)
        if cls is E.Const:
            return const_str(e.value, e.dtype)
        if isinstance(e, E.Var):
            try:
                return self.names[id(e)]
            except KeyError:
                raise TexprError(f"stage {self.stage_name}: variable `{e.name}` is not bound "
                                 "in the generated code") from None
        d = e.dtype
        if cls in _ARITH:
            out = f"({self.cast(e.a, d)} {_ARITH[cls]} {self.cast(e.b, d)})"
            return f"np.int32{out}" if d == "int32" else out
        if cls is E.Div:
            return f"({self.cast(e.a, d)} / {self.cast(e.b, d)})"
        if cls in (E.FloorDiv, E.FloorMod):
            op = "//" if cls is E.FloorDiv else "%"
            a, b = self.cast(e.a, d), self.cast(e.b, d)
            if dt.is_int(d) and not (isinstance(e.b, E.Const) and e.b.value != 0):
                code = self._err(f"stage {self.stage_name}: integer division by zero in "
                                 f"`{expr_str(e)}`")
                b = f"_nz({b}, err, {code})"
            out = f"({a} {op} {b})"
            return f"np.int32{out}" if d == "int32" else out
        if cls in (E.Min, E.Max):
            a, b = self.cast(e.a, d), self.cast(e.b, d)
            if dt.is_float(d):
                return f"_f{'min' if cls is E.Min else 'max'}({a}, {b})"
            return f"{'min' if cls is E.Min else 'max'}({a}, {b})"
        if cls in _CMP:
            return f"({self(e.a)} {_CMP[cls]} {self(e.b)})"
        if cls is E.And:
            op = "&" if _cheap_and_safe(e.b) else "and"
            return f"({self(e.a)} {op} {self(e.b)})"
        if cls is E.Or:
            op = "|" if _cheap_and_safe(e.b) else "or"
            return f"({self(e.a)} {op} {self(e.b)})"
        if cls is E.Not:
            return f"(not {self(e.a)})"
        if cls is E.Select:
            return f"({self(e.true_value)} if {self(e.cond)} else {self(e.false_value)})"
        if cls is E.Cast:
            return self._value_check(e, self.cast(e.value, d))
        if cls is E.Call:
            return self._call(e)
        if cls is E.Load:
            return self._value_check(e, self._load(e))
        if cls is E.Reduce:
            raise TexprError(f"stage {self.stage_name}: a reduction below the top of a body "
                             f"(`{expr_str(e)}`) reached code generation")
        raise TexprError(f"codegen: unknown expression kind {cls.__name__}")

    def _call(self, e):
        d, name = e.dtype, e.name
        if name == "abs":
            return f"abs({self.cast(e.args[0], d)})"
        if name == "power":
            return f"np.power({self.cast(e.args[0], d)}, {self.cast(e.args[1], d)})"
        x = self.cast(e.args[0], d)
        one = const_str(1.0, d)
        if name in _UNARY_NP:
            return f"{_UNARY_NP[name]}({x})"
        if name == "rsqrt":
            return f"({one} / np.sqrt({x}))"
        if name == "sigmoid":
            return f"({one} / ({one} + np.exp(-{x})))"
        if name == "erf":
            return f"{_NP[d]}(math.erf({x}))"
        raise TexprError(f"codegen: intrinsic {name} has no code generator")

    def _load(self, e):
        t = e.tensor
        buf = self.buffers[id(t)]
        if not e.args:
            return f"{buf.name}[0]"
        idx = [self(i) for i in e.args]
        if id(e) in self.checks:
            code = self._err(
                f"stage {self.stage_name}: load `{expr_str(e)}` reads {t.name} outside its "
                f"shape {t.shape}; guard the load with te.if_then_else if the index can leave "
                "the tensor")
            idx = [f"_ck({s}, {n}, err, {code})" for s, n in zip(idx, t.shape)]
        return element(buf, idx)


_SAFE_KINDS = (E.Const, E.Var, E.EQ, E.NE, E.LT, E.LE, E.GT, E.GE, E.And, E.Or, E.Not,
               E.Add, E.Sub, E.Mul, E.Min, E.Max)


def _cheap_and_safe(e):
    """Whether a condition may be evaluated even where the short-circuit would skip
    it: comparisons of variables and constants (no load, no division, no call),
    small. ``a & b`` of such conditions compiles to straight-line code (selects)
    where ``a and b`` branches: the argmax combine of max pooling's gradient
    runs 2.6x faster (NaN propagation adds a third clause)."""
    nodes = _nodes(e)
    return len(nodes) <= 16 and all(isinstance(n, _SAFE_KINDS) for n in nodes)


def element(buf, idx):
    """``buf[idx]`` for a buffer passed flat (1-D): the row-major offset with the
    (static) extents as constants, as an unsigned index (in bounds by construction
    or by check), so that numba emits no negative-index wrap-around and LLVM sees
    unit strides."""
    if not idx:
        return f"{buf.name}[0]"
    lin = idx[0]
    for s, n in zip(idx[1:], buf.shape[1:]):
        lin = f"({lin}) * {n} + {s}"
    return f"{buf.name}[np.uint64({lin})]"


# ---- the source writer -------------------------------------------------------------------

class _Writer:
    """Source lines. Comments are written twice: the canonical text (no user
    names: what the caches key on and what Python runs) and the readable text
    of ``Kernel.source`` (escaped with :func:`codegen.source.comment_text`)."""

    def __init__(self):
        self.lines = []
        self.comments = {}  # canonical comment line (stripped) -> readable text

    def __call__(self, depth, text):
        self.lines.append("    " * depth + text)

    def comment(self, depth, canonical, readable):
        line = f"# {canonical}"
        assert line not in self.comments
        self.comments[line] = f"# {comment_text(readable)}"
        self(depth, line)


HELPERS = '''
@njit(inline="always", cache=True)
def _fmax(a, b):
    return a if (a > b or a != a) else b


@njit(inline="always", cache=True)
def _fmin(a, b):
    return a if (a < b or a != a) else b


@njit(inline="always", cache=True)
def _ck(i, n, err, code):
    if i < 0 or i >= n:
        err[1] = i
        err[0] = code
        return 0
    return i


@njit(inline="always", cache=True)
def _rk(v, lim, err, code):
    if v < -lim or v >= lim:
        err[1] = v
        err[0] = code
        return 0
    return v


@njit(inline="always", cache=True)
def _nz(b, err, code):
    if b == 0:
        err[0] = code
        return 1
    return b
'''


class _StageLowering:
    """Lowers one materialised stage to source lines."""

    def __init__(self, k, op, stage, buffers, inlined, errors, parallel_on, w):
        self.k, self.op, self.stage, self.buffers = k, op, stage, buffers
        self.inlined, self.errors, self.parallel_on, self.w = inlined, errors, parallel_on, w
        self.names = {}
        self.uses_prange = False
        self.unroll = None
        self.jam_dim = None
        self.lanes = None  # (loop dimension, count) of an unrolled reduction loop
        self.residues = []  # [(e, m)]: split the domains on the residues of e % m

    def run(self, depth):
        op = self.op
        w = self.w
        w.comment(depth, f"---- stage {self.k}",
                  f"---- stage {op.name}: {tensor_str(op.output(0))}")
        if isinstance(op, ScatterAddOp):
            return self._scatter(depth)
        if isinstance(op, ScanOp):
            return lower_scan(self, depth)
        spatial = list(op.axis)
        body = [inline_expand(b, self.inlined) for b in op.body]
        red = body[0] if isinstance(body[0], E.Reduce) else None
        reduce_ = list(op.reduce_axis)
        for d, a in enumerate(spatial):
            self.names[id(a)] = f"i{self.k}_{d}"
        for d, a in enumerate(reduce_):
            self.names[id(a)] = f"r{self.k}_{d}"
        order, par = self._order(body, spatial, reduce_)
        outs = [self.buffers[id(t)] for t in op.outputs]
        sp_space = VarSpace(spatial)
        sp_box = box_set(sp_space)
        if red is None:
            if not self.stage.parallel_set and int(np.prod(op.shape)) < PARALLEL_MIN_POINTS:
                par = []
            em = self._emitter()
            ck = _BoundsChecker(op.name, sp_space, sp_box)
            for b in body:
                ck.walk(b, sp_box, False)
            em.checks, em.value_checks = ck.need, ck.values

            def write_all(d):
                # every output of the stage: a tuple reduction whose domain the
                # simplifier collapsed (one point, equalities solved) is an
                # elementwise stage with several outputs (BUGS.md C14)
                for o, b in zip(outs, body):
                    w(d, f"{self._store(o)} = {em.cast(b, o.dtype)}")

            stmts = {"S": write_all}
            st = [LA.Statement(f"S{self.k}", spatial, sp_box, [self._val(a) for a in order])]
            loop_pos = {id(a): p for p, a in enumerate(order)}
            return self._emit_nest(depth, st, len(order), stmts,
                                   {loop_pos[id(a)] for a in par})
        # reduction
        full = spatial + reduce_
        space = VarSpace(full)
        box = box_set(space)
        red = lift_zero_guards(red, space)
        wset, resid = to_set(red.where, space)
        dom = box.intersect(wset)
        self.residues = _residue_candidates(red.where, space, dom)
        if not self.stage.parallel_set and par and _points(dom) < PARALLEL_MIN_POINTS:
            par = []
        em = self._emitter()
        ck = _BoundsChecker(op.name, space, box)
        ck.walk(red.where, box, False)
        for s in red.source:
            ck.walk(s, dom, resid is not None)
        em.checks, em.value_checks = ck.need, ck.values
        comb = red.combiner
        ncomp = len(comb.identity)
        acc = [f"acc{self.k}_{c}" for c in range(ncomp)]
        n_sp = sum(1 for a in order if a.kind == "spatial")
        scalar_mode = all(a.kind == "spatial" for a in order[:n_sp])
        combine = self._combine_lines(comb, red, em, resid)
        if scalar_mode:
            sp_order, rd_order = order[:n_sp], order[n_sp:]
            from texpr.visitor import post_order
            small = len(post_order(red.source[0])) <= UNROLL_MAX_NODES
            sum_ok = comb.kind == "sum" and ncomp == 1 and dt.is_float(comb.dtypes[0]) and small
            u_n = UNROLL if comb.dtypes[0] == "float32" else UNROLL // 2
            if sum_ok and rd_order and rd_order[-1].extent >= 2 * u_n:
                self.unroll = (combine, acc[0], comb.dtypes[0], u_n)
            jam = None
            if sum_ok and not self.stage.ordered and rd_order:
                # moving another spatial axis innermost pays where the reduction
                # loop is short (strided conv dW: 8.4 -> 4.7 ms), not where it is
                # unrolled (conv dW stride 1: 7.8 -> 14.5 ms)
                move = JAM_MOVE and not self.stage.vectorize_axes and self.unroll is None
                jam = _jam_axis(sp_order, red, par if move else sp_order[:-1])
                if jam is not None and jam is not sp_order[-1]:
                    sp_order = [a for a in sp_order if a is not jam] + [jam]

            def init(d, lane=None):
                for a, c in zip(acc, comb.identity):
                    w(d, f"{_lane(a, lane)} = {const_str(c.value, c.dtype)}")

            def fin(d, lane=None):
                for o, a in zip(outs, acc):
                    w(d, f"{self._store(o)} = {_lane(a, lane)}")

            stmts = {"I": init, "U": lambda d, lane=None: combine(d, [_lane(acc[0], lane)]
                                                                  + acc[1:]), "F": fin}
            pos = {id(a): p for p, a in enumerate(sp_order)}
            pos.update({id(a): n_sp + 1 + p for p, a in enumerate(rd_order)})
            par_dims = {pos[id(a)] for a in par}
            zeros_r = [0] * len(rd_order)
            rest_sp, rest_dom = sp_box, dom
            if jam is not None:
                # register blocking: JAM consecutive points of the innermost spatial
                # axis share the reduction loops (one accumulator each), over the
                # full tiles; the last partial tile runs unblocked below
                n_full = jam.extent // JAM * JAM
                in_sp = to_set(jam < n_full, sp_space)[0]
                in_full = to_set(jam < n_full, space)[0]

                def sv(a):
                    return jam // JAM if a is jam else self._val(a)

                lane = [jam % JAM]
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
        # buffer mode
        for o, c in zip(outs, comb.identity):
            w(depth, f"{o.name}.fill({const_str(c.value, c.dtype)})")
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
        if not self.stage.ordered and order[-1].kind == "spatial":
            rd = [a for a in order if a.kind == "reduce"]
            used = rd and any(_mentions(ld, rd[-1]) for ld in _loads(red.source))
            # (a loop of one value is no loop: isl substitutes it away)
            if used and 2 <= rd[-1].extent <= MAX_LANES and rd[-1].dom[0] == 0:
                lane_axis = rd[-1]
            elif used and rd[-1].extent >= SPLIT_LANES and rd[-1].dom[0] == 0 \
                    and (resid is None or not _mentions(red.where, rd[-1])) \
                    and sum(len(_nodes(x)) for x in red.source) <= UNROLL_MAX_NODES:
                split_axis = rd[-1]
        if split_axis is not None:
            # a long innermost reduction loop whose bounds are constant: its groups
            # of SPLIT_LANES consecutive values are unrolled inside the spatial
            # loops (the output element is loaded and stored once per group; the
            # terms are added in the same order), the last partial group runs below
            r, f = split_axis, SPLIT_LANES
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
        """A function ``(depth, targets)`` writing ``targets = combine(targets, source)``."""
        w = self.w
        d0 = comb.dtypes[0]

        def emit(depth, targets):
            if resid is not None:
                w(depth, f"if {em(resid)}:")
                depth += 1
            if comb.kind in ("sum", "prod"):
                op = "+=" if comb.kind == "sum" else "*="
                w(depth, f"{targets[0]} {op} {em.cast(red.source[0], d0)}")
            elif comb.kind in ("max", "min"):
                fn = ("_f" if dt.is_float(d0) else "") + comb.kind
                w(depth, f"{targets[0]} = {fn}({targets[0]}, {em.cast(red.source[0], d0)})")
            else:
                ys = [f"y{self.k}_{c}" for c in range(len(comb.rhs))]
                for y, s, v in zip(ys, red.source, comb.rhs):
                    w(depth, f"{y} = {em.cast(s, v.dtype)}")
                names = dict(self.names)
                names.update({id(v): t for v, t in zip(comb.lhs, targets)})
                names.update({id(v): y for v, y in zip(comb.rhs, ys)})
                cem = ExprEmitter(names, self.buffers, self.op.name, self.errors)
                news = [f"n{self.k}_{c}" for c in range(len(comb.result))]
                for n, r, v in zip(news, comb.result, comb.lhs):
                    w(depth, f"{n} = {cem.cast(r, v.dtype)}")
                for t, n in zip(targets, news):
                    w(depth, f"{t} = {n}")
        return emit

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
                    classes.append(piece)
            if len(classes) in (0, 1, m):
                return statements, ndims, par_dims
            for i, piece in enumerate(classes):
                out.append(LA.Statement(f"{st.name}r{i}", st.vars, piece,
                                        st.schedule[:t] + (i,) + st.schedule[t:]))
        return out, ndims + 1, {d + (d >= t) for d in par_dims}, t

    def _emit_nest(self, depth, statements, ndims, stmt_code, par_dims):
        saved = self.jam_dim, self.lanes
        try:
            for cand in self.residues:
                split = self._split_residues(cand, statements, ndims, par_dims)
                if len(split) != 4:
                    continue
                statements, ndims, par_dims, t = split
                if self.jam_dim is not None:
                    self.jam_dim += self.jam_dim >= t
                if self.lanes is not None:
                    self.lanes = (self.lanes[0] + (self.lanes[0] >= t), self.lanes[1])
            return self._emit_nest_now(depth, statements, ndims, stmt_code, par_dims)
        finally:
            self.jam_dim, self.lanes = saved

    def _emit_nest_now(self, depth, statements, ndims, stmt_code, par_dims):
        loop_vars = [E.var(f"c{self.k}_{d}") for d in range(ndims)]
        for v in loop_vars:
            self.names[id(v)] = v.name
        tree = LA.generate(statements, loop_vars)
        if tree is None:
            self.w(depth, "pass")
            return
        self._check_loop_arithmetic(tree, statements, loop_vars)
        par_vars = {id(loop_vars[d]) for d in par_dims}
        stmt_vars = {st.name: st.vars for st in statements}
        self._emit_tree(tree, depth, par_vars, stmt_vars, stmt_code)

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
            lanes = range(JAM if self.lanes is None else self.lanes[1])
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
            if node.degenerate:
                w(depth, f"{v} = {lo}")
                self._emit_tree(node.body, depth, par_vars, stmt_vars, stmt_code)
                return
            if id(node.var) in par_vars:
                self.uses_prange = True
                if node.stride == 1:
                    w(depth, f"for {v} in prange({lo}, {hi}):")
                else:
                    s = node.stride
                    w(depth, f"for {v}_t in prange(({hi} - {lo} + {s - 1}) // {s}):")
                    w(depth + 1, f"{v} = {lo} + {v}_t * {s}")
            elif (self.unroll is not None and node.stride == 1 and (
                    (isinstance(node.body, LA.Stmt) and node.body.name.startswith("U"))
                    or (isinstance(node.body, LA.For) and self._is_lane_loop(node.body)
                        and isinstance(node.body.body, LA.Stmt)
                        and node.body.body.name.startswith("U")))):
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

    def _is_lane_loop(self, node):
        if self.lanes is not None:
            dim, n = self.lanes
            return (node.var.name == f"c{self.k}_{dim}" and isinstance(node.lo, E.Const)
                    and node.lo.value == 0 and isinstance(node.hi, E.Const)
                    and node.hi.value == n and node.stride == 1)
        if self.jam_dim is None or node.var.name != f"c{self.k}_{self.jam_dim}":
            return False
        if not (isinstance(node.lo, E.Const) and node.lo.value == 0
                and isinstance(node.hi, E.Const) and node.hi.value == JAM and node.stride == 1):
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

    def _emit_unrolled_sum(self, node, v, lo, hi, depth, stmt_vars):
        """The innermost loop of a sum, with ``u_n`` independent partial sums per
        accumulator (the dependency chain of one accumulator no longer bounds the
        speed, and the copies vectorise without the compiler reassociating
        anything), then the remainder, then the partial sums added to the
        accumulator in a fixed tree. With register blocking, each lane of the
        blocked spatial axis has its own accumulator and partial sums."""
        w = self.w
        combine, acc, dtype, u_n = self.unroll
        lane_loop = node.body if isinstance(node.body, LA.For) else None
        stmt = lane_loop.body if lane_loop is not None else node.body
        lanes = list(range(JAM)) if lane_loop is not None else [None]
        w(depth, f"{v}_lo = {lo}")
        w(depth, f"{v}_hi = {hi}")
        w(depth, f"{v}_m = {v}_lo + max({v}_hi - {v}_lo, 0) // {u_n} * {u_n}")
        parts = {ln: [f"{_lane(acc, ln)}_p{u}" for u in range(u_n)] for ln in lanes}
        for ln in lanes:
            for p in parts[ln]:
                w(depth, f"{p} = {const_str(0, dtype)}")
        em = self._emitter()

        def body(d, ln, target):
            if lane_loop is not None:
                self.names[id(lane_loop.var)] = str(ln)
            for var, a in zip(stmt_vars[stmt.name], stmt.args):
                w(d, f"{self.names[id(var)]} = {em(a)}")
            combine(d, [target])

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
        if lane_loop is not None:
            self.names[id(lane_loop.var)] = lane_loop.var.name

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
            w(depth, f"{out.name}[:] = {src.name}")
        else:
            w(depth, f"{out.name}.fill({const_str(0, out.dtype)})")
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
        em.checks, em.value_checks = ck.need, ck.values
        order = list(self.stage.leaf_axes) if self.stage.ordered else axes
        par_dims = set()
        if support and self.parallel_on:
            st = self.stage
            if st.parallel_set:
                par = [a for a in st.parallel_axes if any(a is b for b in order)]
            else:
                par = order[:1] if _points(dom) >= PARALLEL_MIN_POINTS else []
            par_dims = {k for k, a in enumerate(order) if any(a is b for b in par)}

        def upd(d):
            if resid is not None:
                w(d, f"if {em(resid)}:")
                d += 1
            if support:
                w(d, f"{self._store(out)} = {em.cast(op.value, out.dtype)}")
                return
            if not op.indices:
                w(d, f"{element(out, [])} += {em.cast(op.value, out.dtype)}")
                return
            idx = [em(i) for i in op.indices]
            tgt = []
            for k, (s, n) in enumerate(zip(idx, op.shape)):
                pa = to_pwaff(op.indices[k], space)
                safe = False
                if pa is not None:
                    bad = pa.lt_set(space.const(0)).union(pa.ge_set(space.const(n))).intersect(dom)
                    safe = bad.is_empty()
                if safe:
                    tgt.append(s)
                else:
                    self.errors.append(
                        f"scatter-add {op.name}: index {k} `{expr_str(op.indices[k])}` leaves "
                        f"the shape {op.shape}")
                    tgt.append(f"_ck({s}, {n}, err, {len(self.errors)})")
            w(d, f"{element(out, tgt)} += {em.cast(op.value, out.dtype)}")

        st = [LA.Statement(f"U{self.k}", axes, dom, [self.stage.axis_value(a) for a in order])]
        self._emit_nest(depth, st, len(order), {"U": upd}, par_dims)


def lower(schedule, inputs, materialized, inlined, parallel=True):
    """Lower a resolved schedule to a :class:`Program`.

    ``materialized``/``inlined``: sets of op ids (from
    :func:`schedule.default_materialized`); ``inputs``: the placeholder Tensors
    in argument order.
    """
    buffers = {}
    order = []
    for k, t in enumerate(inputs):
        b = BufferInfo(f"in{k}", t, "input")
        buffers[id(t)] = b
        order.append(b)
    for k, t in enumerate(schedule.outputs):
        if id(t) in buffers:
            continue
        b = BufferInfo(f"out{k}", t, "output")
        buffers[id(t)] = b
        order.append(b)
    ntmp = 0
    mat_ops = [op for op in schedule.ops if id(op) in materialized]
    for op in schedule.ops:
        if isinstance(op, PlaceholderOp) and id(op.output(0)) not in buffers:
            raise TexprError(f"build: placeholder {op.name} (shape {op.shape}) is read by the "
                             "outputs but not listed in inputs")
    for op in mat_ops:
        for t in op.outputs:
            if id(t) not in buffers:
                b = BufferInfo(f"tmp{ntmp}", t, "temp")
                ntmp += 1
                buffers[id(t)] = b
                order.append(b)
    errors = []
    w = _Writer()
    args = [b.name for b in order] + ["err"]
    w(0, f"def kernel({', '.join(args)}):")
    uses_prange = False
    names = []
    for k, op in enumerate(mat_ops):
        sl = _StageLowering(k, op, schedule[op], buffers, inlined, errors, parallel, w)
        try:
            sl.run(1)
        except isl.Error as exc:
            raise TexprError(f"stage {op.name}: isl failed while lowering it ({exc}); "
                             "please report the program") from None
        uses_prange |= sl.uses_prange
        names.append(op.name)
    w(1, "return 0")
    deco = (f"@njit(parallel={uses_prange}, fastmath=False, cache=True, error_model='numpy', "
            "nogil=True)")
    idents = buffer_identifiers([b.tensor.name for b in order])
    head = _Writer()
    for k, (b, ident) in enumerate(zip(order, idents)):
        head.comment(0, f"argument {k}",
                     f"{ident}: {b.role} {b.tensor.name}, shape {tuple(b.tensor.shape)}, "
                     f"{b.dtype}")
    head.comment(0, "argument err", "err: the error flag (0, or the code of the first "
                 "failed check)")
    src = ("import math\n\nimport numpy as np\nfrom numba import njit, prange\n"
           + HELPERS + "\n\n" + "\n".join(head.lines) + "\n" + deco + "\n"
           + "\n".join(w.lines) + "\n")
    src = remove_dead_assignments(src)
    comments = dict(head.comments, **w.comments)
    readable = rename(src, dict(zip([b.name for b in order], idents)))
    readable = "".join(
        ln[:len(ln) - len(ln.lstrip())] + comments[ln.strip()] + "\n"
        if ln.strip() in comments else ln for ln in readable.splitlines(keepends=True))
    return Program(readable, order, errors, names, uses_prange, module_source=src)


