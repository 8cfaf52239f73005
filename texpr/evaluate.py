"""The reference evaluator: runs any tensor graph on numpy arrays.

It is the oracle every later stage (simplify, codegen) is checked against, so
it favours obvious correctness: each stage is evaluated over its whole index
grid at once (vectorised with numpy broadcasting: one array dimension per
axis, reduction axes trailing), in chunks of the first axis to bound memory.

Semantics it pins down:

* ``//`` and ``%`` floor (Python's); integer division by zero is an error.
* ``select`` evaluates each branch only where it is taken (under a mask), so
  the untaken branch can neither fail (out-of-bounds load) nor warn; ``&&`` and
  ``||`` short-circuit the same way. A reduction nested in a body (lifted into a
  stage of its own by ``te.compute``) is evaluated only at the points its
  consumer reads under that mask: a guarded nested reduction
  ``if_then_else(i >= 1, sum(X[i - 1, d]), 0)`` never runs at ``i = 0``.
* An unguarded load outside its tensor raises :class:`OutOfBoundsError` naming
  the tensor, the index expression, the bad index and the point.
* A reduction over an empty domain gives the reducer's identity.
* Integer ``+``, ``-``, ``*`` are exact: a result outside the dtype's range
  raises TexprError (never wraps around), as the kernels reject index
  arithmetic they cannot prove within int64.
* ``round`` rounds half to even (as numpy); ``sigmoid`` is ``1/(1+exp(-x))``.
"""

import math

import numpy as np

from . import dtypes as dt
from .errors import FeedError, OutOfBoundsError, TexprError, in_stage
from .expr import (Add, And, Call, Cast, Const, Div, EQ, FloorDiv, FloorMod, GE, GT, LE, LT,
                   INT_PRESERVING, Load, Max, Min, Mul, NE, Not, Or, Reduce, Select, Sub, Var)
from .printer import expr_str
from .scan import ScanOp
from .tensor import (NESTED_REDUCTION, ComputeOp, PlaceholderOp, ScatterAddOp, Tensor,
                     check_allocatable, check_input_array, topo_order)

#: elements of one chunk's index grid (stage points times reduction points)
CHUNK_ELEMENTS = 1 << 23

_erf = np.frompyfunc(math.erf, 1, 1)

_UNARY = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh, "abs": np.abs,
    "floor": np.floor, "ceil": np.ceil, "round": np.round, "trunc": np.trunc,
    "sin": np.sin, "cos": np.cos,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "erf": lambda x: _erf(x).astype(x.dtype if x.dtype.kind == "f" else np.float64),
    "stop_gradient": lambda x: x,
}
_BINARY = {Add: np.add, Sub: np.subtract, Mul: np.multiply, Min: np.minimum, Max: np.maximum,
           EQ: np.equal, NE: np.not_equal, LT: np.less, LE: np.less_equal, GT: np.greater,
           GE: np.greater_equal}


#: testing only (:func:`symbolic_zero_products`): a float product with a 0 factor is 0
_SYMBOLIC_ZEROS = [False]


def symbolic_zero_products():
    """A context in which :func:`evaluate` computes every float product with a
    zero factor as 0, even when the other factor is inf or NaN.

    Not IEEE, and not texpr's semantics: an oracle for tests. The simplifier reads
    a zero that says "this term does not exist" as a symbolic zero
    (docs/conventions.md, "Zeros"); the unsimplified graph holds such zeros as
    numbers (an indicator, an adjoint element no path reaches). Every element of a
    simplified gradient equals the raw graph's under IEEE arithmetic or under
    this one. Not thread-safe (a module switch)."""
    import contextlib

    @contextlib.contextmanager
    def ctx():
        old = _SYMBOLIC_ZEROS[0]
        _SYMBOLIC_ZEROS[0] = True
        try:
            yield
        finally:
            _SYMBOLIC_ZEROS[0] = old
    return ctx()


#: integer arithmetic checked for wrap-around (:meth:`_StageEval._int_arith`)
_EXACT_INT = (Add, Sub, Mul)


def int_arith_exactly(kind, a, b, dtype, mask=None):
    """``a + b``, ``a - b``, ``a * b`` or ``a // b`` (``kind``: the expression class
    Add, Sub, Mul or FloorDiv; ``b`` nonzero for FloorDiv) of integer arrays, in
    ``dtype``, exactly.

    Returns ``(out, exact)``: ``out`` as numpy computes it (broadcast), and
    ``exact`` None, or the exact result (a Python int) at a point where ``mask``
    (a bool array or None: everywhere) holds and the result leaves ``dtype``:
    there numpy wraps around (``INT_MIN // -1`` is the one such floor
    division). The callers raise their error with it."""
    info = np.iinfo(np.dtype(dtype))
    if kind is FloorDiv:
        with np.errstate(all="ignore"):
            out = np.asarray(np.floor_divide(a, b))
        bad = (np.asarray(a) == info.min) & (np.asarray(b) == -1)
        if mask is not None:
            bad = bad & mask
        return out, (-int(info.min) if np.any(bad) else None)
    op = _BINARY[kind]
    with np.errstate(over="ignore"):
        out = np.asarray(op(a, b))
    lim = 2.0 ** (info.bits - 1)
    approx = op(np.asarray(a, np.float64), np.asarray(b, np.float64))
    # float64 is exact below 2**53; above 2**62 an int64 result may be off: check exactly
    risky = np.abs(approx) >= (lim if info.bits <= 32 else lim / 2)
    if mask is not None:
        risky = risky & mask
    if not np.any(risky):
        return out, None
    shape = np.broadcast_shapes(np.shape(a), np.shape(b), np.shape(risky))
    aa, bb = np.broadcast_to(a, shape), np.broadcast_to(b, shape)
    for pos in map(tuple, np.argwhere(np.broadcast_to(risky, shape))):  # 0-d too
        x, y = int(aa[pos]), int(bb[pos])
        exact = x + y if kind is Add else x - y if kind is Sub else x * y
        if not info.min <= exact <= info.max:
            return out, exact
    return out, None


def _and_mask(mask, cond):
    return cond if mask is None else (mask & cond)


class _StageEval:
    """Evaluates expressions of one stage chunk; ``env`` maps var ids to index arrays."""

    def __init__(self, stage_name, env, values, point_axes):
        self.stage_name, self.env, self.values = stage_name, env, values
        self.point_axes = point_axes  # [(name, var)] to report a failing point
        self.memo = {}

    def __call__(self, e, mask=None):
        # one value per node, with the points it covers (None: all): a node
        # reached again under a mask within them is not evaluated again, else
        # it is evaluated once more over both masks. Keyed by the mask's
        # identity, a select chain behind a gather evaluated its shared nodes
        # once per path (16x per level of a chain's gradient: 19 s at depth 5)
        hit = self.memo.get(id(e))
        if hit is not None:
            out, covered = hit
            if covered is None or covered is mask or (
                    mask is not None and not np.any(mask & ~covered)):
                return out
            if mask is not None:
                mask = mask | covered
        out = self._eval(e, mask)
        want = np.dtype(e.dtype)
        if out.dtype != want:
            out = out.astype(want)
        self.memo[id(e)] = (out, mask)  # (the node outlives the evaluation: its id is not reused)
        return out

    def _eval(self, e, mask):
        if isinstance(e, Const):
            return np.asarray(e.value, dtype=e.dtype)
        if isinstance(e, Var):
            try:
                return self.env[id(e)]
            except KeyError:
                raise TexprError(f"stage {self.stage_name}: variable `{e.name}` is not bound") from None
        cls = type(e)
        if cls in _EXACT_INT and dt.is_int(e.dtype):
            return self._int_arith(e, mask)
        if cls in _BINARY:
            a = self._operand(e.args[0], e.dtype, mask)
            b = self._operand(e.args[1], e.dtype, mask)
            out = _BINARY[cls](a, b)
            if cls is Mul and _SYMBOLIC_ZEROS[0] and dt.is_float(e.dtype):
                out = np.where((a == 0) | (b == 0), np.zeros((), out.dtype), out)
            return out
        if cls is Div:
            a, b = self._operand(e.args[0], e.dtype, mask), self._operand(e.args[1], e.dtype, mask)
            return np.true_divide(a.astype(e.dtype, copy=False), b.astype(e.dtype, copy=False))
        if cls in (FloorDiv, FloorMod):
            a, b = self(e.args[0], mask), self(e.args[1], mask)
            if dt.is_int(e.dtype):
                zero = np.broadcast_to(b == 0, np.broadcast_shapes(a.shape, b.shape, ()))
                if mask is not None:
                    zero = zero & mask
                if np.any(zero):
                    raise TexprError(
                        f"stage {self.stage_name}: integer division by zero in `{expr_str(e)}`")
                b = np.where(b == 0, 1, b)
                if cls is FloorDiv:
                    out, exact = int_arith_exactly(FloorDiv, a, b, e.dtype, mask)
                    if exact is not None:
                        raise self._wrap_error(e, exact)
                    return out
            return (np.floor_divide if cls is FloorDiv else np.mod)(a, b)
        if cls is And:
            a = self(e.args[0], mask)
            return a & self(e.args[1], _and_mask(mask, a))
        if cls is Or:
            a = self(e.args[0], mask)
            return a | self(e.args[1], _and_mask(mask, ~a))
        if cls is Not:
            return ~self(e.args[0], mask)
        if cls is Select:
            c = self(e.args[0], mask)
            t = self(e.args[1], _and_mask(mask, c))
            f = self(e.args[2], _and_mask(mask, ~c))
            return np.where(c, t, f)
        if cls is Cast:
            return self(e.args[0], mask).astype(e.dtype)
        if cls is Call:
            args = [self(a, mask) for a in e.args]
            if e.name == "power":
                return np.power(args[0].astype(e.dtype), args[1].astype(e.dtype))
            x = args[0]
            if e.name not in INT_PRESERVING:  # (their dtype is their argument's)
                x = x.astype(e.dtype, copy=False)
            return _UNARY[e.name](x)
        if cls is Load:
            return self._load(e, mask)
        if cls is Reduce:
            raise TexprError(f"stage {self.stage_name}: a reduction below the top of a body "
                             f"(`{expr_str(e)}`) reached the evaluator")
        raise TexprError(f"evaluate: unknown expression kind {cls.__name__}")

    def _operand(self, x, dtype, mask):
        """An operand of a float operation of ``dtype``: a constant (a weak Python
        scalar, typed float32 on its own) at the operation's precision, as the
        kernels write it (``i * 0.1`` in float64 multiplies by 0.1, not by
        float32(0.1)); anything else as evaluated."""
        if isinstance(x, Const) and dt.is_float(dtype) and not isinstance(x.value, bool):
            return np.asarray(x.value, dtype=dtype)
        return self(x, mask)

    def _int_arith(self, e, mask):
        """``+``, ``-``, ``*`` of integers, exactly: a result outside the dtype's
        range (where ``mask`` holds) raises instead of wrapping around, as the
        kernels reject index arithmetic they cannot prove within int64."""
        a, b = self(e.args[0], mask), self(e.args[1], mask)
        out, exact = int_arith_exactly(type(e), a, b, e.dtype, mask)
        if exact is not None:
            raise self._wrap_error(e, exact)
        return out

    def _wrap_error(self, e, exact):
        """The error of integer arithmetic ``e`` whose exact result ``exact`` (a
        Python int) leaves its dtype."""
        info = np.iinfo(np.dtype(e.dtype))
        return TexprError(
            f"stage {self.stage_name}: the integer arithmetic `{expr_str(e)}` reaches "
            f"{exact}, outside {e.dtype} [{info.min}, {info.max}] (it would wrap "
            "around); keep integer values and index expressions within range "
            "(smaller values, coefficients or extents)")

    def _load(self, e, mask):
        t = e.tensor
        arr = self.values.get(id(t))
        idx = None
        if isinstance(arr, _Deferred):
            # a nested reduction's stage: computed at the points read here
            idx = [self(i, mask) for i in e.args]
            arr = arr.at(t, idx, mask)
        if arr is None:
            raise TexprError(
                f"stage {self.stage_name}: reads {t.name}, which is not computed before it "
                "(the graph has a cycle, or a body was changed after te.compute built it)")
        if idx is None:
            idx = [self(i, mask) for i in e.args]
        if not idx:
            return arr[()]
        shape = np.broadcast_shapes(*(i.shape for i in idx), *(() if mask is None else (mask.shape,)))
        clipped = []
        bad_any = None
        for d, (i, n) in enumerate(zip(idx, t.shape)):
            bad = (i < 0) | (i >= n)
            if np.any(bad):
                bad = np.broadcast_to(bad, shape)
                if mask is not None:
                    bad = bad & mask
                if np.any(bad):
                    bad_any = (d, bad)
                    break
            clipped.append(np.clip(i, 0, max(n - 1, 0)) if n > 0 else i)
        if bad_any is not None:
            d, bad = bad_any
            # report at a point of the whole grid: an index may be constant (shape ())
            # while the stage's axes are not
            axes = [(name, self.env[id(v)]) for name, v in self.point_axes if id(v) in self.env]
            full = np.broadcast_shapes(shape, *(a.shape for _, a in axes))
            point = tuple(int(x) for x in np.argwhere(np.broadcast_to(bad, full))[0])
            values = [int(np.broadcast_to(i, full)[point]) for i in idx]
            where = ", ".join(f"{name}={int(np.broadcast_to(a, full)[point])}"
                              for name, a in axes) or "the only point"
            raise OutOfBoundsError(
                f"stage {self.stage_name}: load `{expr_str(e)}` reads {t.name} at index "
                f"{tuple(values)}, outside its shape {t.shape} (dimension {d}), at {where}; "
                "guard the load with te.if_then_else if the index can leave the tensor")
        if arr.size == 0:
            return np.zeros(shape, dtype=arr.dtype)
        return arr[tuple(clipped)]


def _grid(axes, ndim, first_range=None):
    env = {}
    for d, a in enumerate(axes):
        lo, hi = a.dom
        if d == 0 and first_range is not None:
            lo, hi = lo + first_range[0], lo + first_range[1]
        shape = [1] * ndim
        shape[d] = hi - lo
        env[id(a)] = np.arange(lo, hi, dtype=np.int64).reshape(shape)
    return env


def _reduce_builtin(kind, src, mask, red_dims, combiner, dtype):
    ident = combiner.identity[0].value
    if mask is not None:
        src = np.where(mask, src, np.asarray(ident, dtype=dtype))
    if kind == "sum":
        return np.sum(src, axis=red_dims, dtype=dtype)
    if kind == "prod":
        return np.prod(src, axis=red_dims, dtype=dtype)
    fn = np.max if kind == "max" else np.min
    return fn(src, axis=red_dims, initial=ident)


def _combine_text(comb):
    """The combine of ``comb`` as text, its variables named by position (``lhs`` then
    ``rhs``): equal for two instances of one reducer, whatever their variables."""
    from .printer import _Names

    names = _Names(True)
    for v in comb.lhs + comb.rhs:
        names.var(v)
    return tuple(expr_str(r, _names=names) for r in comb.result)


def _arg_kind(comb):
    """``"max"``/``"min"`` for the argmax/argmin reducers of the gradient's argmax stages
    (:data:`texpr.jacobian.ARG_REDUCERS`), else None. Compared by structure, not by
    identity: a graph loaded from the symbolic cache has its own copy of the
    combiner (:meth:`Combiner.__reduce__` rebuilds a custom one)."""
    from .jacobian import ARG_REDUCERS

    if not comb.order_free or comb.kind != "custom" or len(comb.lhs) != 2:
        return None
    for kind, reducer in ARG_REDUCERS.items():
        ref = reducer.combiner(comb.dtypes)
        if comb is ref or (comb.name == ref.name and _combine_text(comb) == _combine_text(ref)
                           and [c.value for c in comb.identity] == [c.value for c in ref.identity]):
            return kind
    return None


def _reduce_arg(kind, comb, srcs, m):
    """The argmax (argmin) reducer over the last axis, without a step per point: what
    its combine gives in any order (``order_free``): a NaN ranks above every number
    (the NaN point of smallest index wins), then the largest (smallest) value, ties
    to the smallest index; no point at all gives the identity. One Python step per
    reduction point made a 1.2M-point max's gradient take 155 s in te.evaluate."""
    values, index = srcs
    valid = np.ones(values.shape, dtype=bool) if m is None else m
    ident_v, ident_i = (c.value for c in comb.identity)
    nan = valid & (values != values) if dt.is_float(values.dtype.name) else \
        np.zeros(values.shape, dtype=bool)
    num = valid & ~nan
    pick = np.max if kind == "max" else np.min
    w = np.where(num, values, np.asarray(ident_v, dtype=values.dtype))
    best = pick(w, axis=-1, initial=ident_v)
    cand = num & (w == best[..., None])
    big = np.asarray(ident_i, dtype=index.dtype)
    at_nan = np.where(nan, index, big).min(axis=-1, initial=ident_i)
    at_best = np.where(cand, index, big).min(axis=-1, initial=ident_i)
    has_nan = nan.any(axis=-1)
    any_best = cand.any(axis=-1)
    ident = np.asarray(ident_v, dtype=values.dtype)
    out_v = np.where(any_best, best, ident)
    if nan.any():
        out_v = np.where(has_nan, np.asarray(np.nan, dtype=values.dtype), out_v)
    out_i = np.where(has_nan, at_nan, np.where(any_best, at_best, big))
    return [out_v.astype(comb.dtypes[0]), out_i.astype(comb.dtypes[1])]


def _reduce_custom(ev, comb, srcs, mask, grid_shape, n):
    """Fold a user combiner over the flattened reduction points, one vectorised step each
    (the gradient's argmax stages in one step, :func:`_reduce_arg`)."""
    out_shape = grid_shape[:n]
    r = int(np.prod(grid_shape[n:], dtype=np.int64))
    srcs = [np.broadcast_to(s, grid_shape).reshape(out_shape + (r,)) for s in srcs]
    m = None if mask is None else np.broadcast_to(mask, grid_shape).reshape(out_shape + (r,))
    kind = _arg_kind(comb)
    if kind is not None:
        return _reduce_arg(kind, comb, srcs, m)
    acc = [np.full(out_shape, c.value, dtype=c.dtype) for c in comb.identity]
    for k in range(r):
        env = dict(ev.env)
        for v, a in zip(comb.lhs, acc):
            env[id(v)] = a
        for v, s in zip(comb.rhs, srcs):
            env[id(v)] = s[..., k]
        step = _StageEval(ev.stage_name, env, ev.values, ())
        # the combine runs where the where= condition holds only (its integer
        # errors too: a point the condition excludes is never combined)
        mk = None if m is None else m[..., k]
        new = [step(res, mk) for res in comb.result]
        if mk is not None:
            new = [np.where(mk, x, a) for x, a in zip(new, acc)]
        acc = [np.broadcast_to(x, out_shape).astype(a.dtype) for x, a in zip(new, acc)]
    return acc


def _eval_compute(op, values):
    for t in op.outputs:
        check_allocatable(t, "evaluate")
    shape = op.shape
    n = len(shape)
    outs = [np.empty(shape, dtype=d) for d in op.dtypes]
    if any(s == 0 for s in shape):
        return outs
    body = op.body
    red = body[0] if isinstance(body[0], Reduce) else None
    red_extents = tuple(a.extent for a in red.axes) if red is not None else ()
    per_row = int(np.prod(shape[1:] + red_extents, dtype=np.int64)) if n else 1
    rows = max(1, CHUNK_ELEMENTS // max(per_row, 1)) if n else 1
    for start in range(0, shape[0] if n else 1, rows):
        _eval_rows(op, values, outs, start, min(start + rows, shape[0]) if n else 1)
    return outs


def _eval_rows(op, values, outs, start, stop, points=None):
    """Evaluate the rows ``start <= axis0 < stop`` of the compute stage ``op`` into
    ``outs`` (the whole stage for a scalar). ``points`` (a reduction's stage only):
    None, or a bool array over those rows: the reduction runs only there (its
    condition, sources and combine), other points get its identity."""
    shape = op.shape
    n = len(shape)
    body = op.body
    red = body[0] if isinstance(body[0], Reduce) else None
    red_axes = red.axes if red is not None else ()
    ndim = n + len(red_axes)
    red_extents = tuple(a.extent for a in red_axes)
    point_axes = [(a.name, a) for a in op.axis] + [(a.name, a) for a in red_axes]
    env = _grid(op.axis, ndim, (start, stop) if n else None)
    for k, a in enumerate(red_axes):
        s = [1] * ndim
        s[n + k] = a.extent
        env[id(a)] = np.arange(a.dom[0], a.dom[1], dtype=np.int64).reshape(s)
    ev = _StageEval(op.name, env, values, point_axes)
    chunk_shape = ((stop - start,) + shape[1:]) if n else ()
    sl = (slice(start, stop),) if n else ()
    if red is None:
        for o, b in zip(outs, body):
            o[sl] = np.broadcast_to(ev(b), chunk_shape)
        return
    grid_shape = chunk_shape + red_extents
    where = red.where
    mask = None
    if points is not None:
        mask = np.broadcast_to(points.reshape(points.shape + (1,) * len(red_axes)), grid_shape)
    if not (isinstance(where, Const) and where.value is True):
        cond = np.broadcast_to(ev(where, mask), grid_shape)
        mask = cond if mask is None else cond & mask
    srcs = [ev(s, mask) for s in red.source]
    red_dims = tuple(range(n, ndim))
    if red.combiner.kind != "custom":
        src = np.broadcast_to(srcs[0], grid_shape)
        outs[0][sl] = _reduce_builtin(red.combiner.kind, src, mask, red_dims, red.combiner,
                                      op.dtypes[0])
    else:
        res = _reduce_custom(ev, red.combiner, srcs, mask, grid_shape, n)
        for o, r in zip(outs, res):
            o[sl] = r


class _Deferred:
    """A nested reduction's stage (:data:`texpr.tensor.NESTED_REDUCTION`), computed
    where its consumers read it: :meth:`at` evaluates the points a load reads
    (under its mask) that no earlier load read, :meth:`full` all of them."""

    def __init__(self, op, values):
        self.op, self.values = op, values
        for t in op.outputs:
            check_allocatable(t, "evaluate")
        self.outs = [np.zeros(op.shape, dtype=d) for d in op.dtypes]
        self.done = np.zeros(op.shape, dtype=bool)

    def at(self, t, idx, mask):
        """The array of output ``t``, right at the points ``idx`` (index arrays,
        one per dimension) where ``mask`` (None: everywhere) holds."""
        if not idx:  # a scalar stage: needed if the load is reached anywhere
            self._compute(np.asarray(mask is None or bool(np.any(mask))) & ~self.done)
            return self.outs[t.value_index]
        shape = np.broadcast_shapes(*(i.shape for i in idx),
                                    *(() if mask is None else (mask.shape,)))
        pts = [np.broadcast_to(i, shape) for i in idx]
        if mask is not None:
            m = np.broadcast_to(mask, shape)
            pts = [p[m] for p in pts]
        ok = np.ones(np.shape(pts[0]), dtype=bool)
        for p, n in zip(pts, self.op.shape):
            ok &= (p >= 0) & (p < n)  # (a load outside raises in _load, as any other)
        needed = np.zeros(self.op.shape, dtype=bool)
        needed[tuple(p[ok] for p in pts)] = True
        self._compute(needed & ~self.done)
        return self.outs[t.value_index]

    def full(self, t):
        """The array of output ``t``, every point computed."""
        self._compute(~self.done)
        return self.outs[t.value_index]

    def _compute(self, points):
        op = self.op
        if not np.any(points):
            return
        if not op.shape:  # a scalar stage
            _eval_rows(op, self.values, self.outs, 0, 1)
            self.done[()] = True
            return
        red_extents = tuple(a.extent for a in op.body[0].axes)
        per_row = int(np.prod(op.shape[1:] + red_extents, dtype=np.int64))
        rows = max(1, CHUNK_ELEMENTS // max(per_row, 1))
        fresh = [np.zeros(op.shape, dtype=d) for d in op.dtypes]
        for start in range(0, op.shape[0], rows):
            stop = min(start + rows, op.shape[0])
            if np.any(points[start:stop]):
                _eval_rows(op, self.values, fresh, start, stop, points[start:stop])
        for o, f in zip(self.outs, fresh):
            np.copyto(o, f, where=points)
        self.done |= points


def _value(values, t):
    """The array of tensor ``t`` in ``values`` (a deferred stage computed whole)."""
    v = values[id(t)]
    return v.full(t) if isinstance(v, _Deferred) else v


def _eval_scan(op, values):
    """A scan: the inits' steps, then one step at a time the body stages at that
    step (each vectorised over its other axes), the updates written into the states."""
    for t in op.outputs:
        check_allocatable(t, "evaluate")
    for b in op.body_ops:
        for t in b.outputs:
            check_allocatable(t, "evaluate")
    T, L = op.time_extent, op.init_extent
    states = [np.empty(t.shape, dtype=t.dtype) for t in op.outputs]
    local = dict(values)
    for st, s, init in zip(states, op.state_placeholder, op.init):
        st[:L] = _value(values, init)
        local[id(s)] = st
    update_of = {id(u): st for u, st in zip(op.update, states)}
    bufs = {}
    for b in op.body_ops:
        # an update's buffer is its state: step t writes it, later steps read it
        arrays = [update_of.get(id(o)) for o in b.outputs]
        arrays = [np.empty(o.shape, dtype=o.dtype) if a is None else a
                  for o, a in zip(b.outputs, arrays)]
        bufs[id(b)] = arrays
        for o, a in zip(b.outputs, arrays):
            local[id(o)] = a
    if any(d == 0 for t in op.outputs for d in t.shape[1:]):
        return states
    for t in range(L, T):
        for b in op.body_ops:
            _eval_rows(b, local, bufs[id(b)], t, t + 1)
    return states


def _eval_scatter(op, values):
    check_allocatable(op.output(0), "evaluate")
    out = (np.array(_value(values, op.init), dtype=op.dtypes[0], copy=True) if op.init is not None
           else np.zeros(op.shape, dtype=op.dtypes[0]))
    dom = tuple(a.extent for a in op.axis)
    if any(d == 0 for d in dom):
        return [out]
    env = _grid(op.axis, len(dom))
    ev = _StageEval(op.name, env, values, [(a.name, a) for a in op.axis])
    mask = np.broadcast_to(ev(op.where), dom)
    idx = [np.broadcast_to(ev(i, mask), dom)[mask] for i in op.indices]
    val = np.broadcast_to(ev(op.value, mask), dom)[mask]
    for d, (i, n) in enumerate(zip(idx, op.shape)):
        if np.any((i < 0) | (i >= n)):
            raise OutOfBoundsError(
                f"stage {op.name}: scatter-add index {d} `{expr_str(op.indices[d])}` leaves "
                f"the shape {op.shape}")
    if not idx:  # a 0-d output: every point adds into the one element
        for v in val:
            out[()] += v
        return [out]
    np.add.at(out, tuple(idx), val)
    return [out]


def _check_feed(op, feed_by_id):
    t = op.output(0)
    if id(t) not in feed_by_id:
        raise FeedError(f"evaluate: no value fed for placeholder {t.name} "
                        f"(shape {t.shape}, {t.dtype})")
    return check_input_array(t, feed_by_id[id(t)], "evaluate", convert=True)


def _feed_by_id(feed, order):
    """``feed`` keyed by the placeholders' ids; a str key names a placeholder of the
    graph ``order`` (its operations)."""
    out = {}
    by_name = None
    for k, v in feed.items():
        if isinstance(k, str):
            if by_name is None:
                by_name = {}
                for op in order:
                    if isinstance(op, PlaceholderOp):
                        by_name.setdefault(op.output(0).name, []).append(op.output(0))
            found = by_name.get(k, [])
            if not found:
                raise FeedError(f"evaluate: no placeholder of the graph is named {k!r} "
                                f"(placeholders: {', '.join(sorted(by_name)) or 'none'})")
            if len(found) > 1:
                raise FeedError(f"evaluate: several placeholders are named {k!r}; feed "
                                "them by the placeholder tensors")
            k = found[0]
        elif not isinstance(k, Tensor):
            raise FeedError(f"evaluate: a feed key must be a placeholder Tensor or its name, "
                            f"got {type(k).__name__}")
        if id(k) in out:
            raise FeedError(f"evaluate: placeholder {k.name} is fed twice (by the tensor "
                            "and by its name)")
        out[id(k)] = v
    return out


def evaluate(outputs, feed):
    """Run a tensor graph on numpy arrays.

    Args:
        outputs: a Tensor or a list of Tensors.
        feed: dict placeholder -> numpy array for every placeholder the outputs
            depend on (shape and dtype exactly as declared; Python lists and
            scalars are converted to the declared dtype). A key may be the
            placeholder itself or its name (a str), as a kernel takes
            ``kernel(X=x)``.
    Returns:
        One numpy array (for a Tensor) or a list of arrays, with the declared
        shapes and dtypes.
    Raises:
        FeedError: a missing placeholder or a value of the wrong shape/dtype; a
            name that no placeholder of the graph has, or that several have.
        OutOfBoundsError: an unguarded load outside its tensor.
        TexprError: integer division by zero.
    """
    single = isinstance(outputs, Tensor)
    outs = [outputs] if single else list(outputs)
    for o in outs:
        if not isinstance(o, Tensor):
            raise TexprError(f"evaluate: outputs must be Tensors, got {type(o).__name__}")
    if not isinstance(feed, dict):
        raise FeedError("evaluate: feed must be a dict Tensor -> numpy array")
    order = topo_order(outs)
    feed_by_id = _feed_by_id(feed, order)
    values = {}
    with np.errstate(all="ignore"):
        for op in order:
            if isinstance(op, PlaceholderOp):
                arrays = [_check_feed(op, feed_by_id)]
            elif isinstance(op, ComputeOp) and op.attrs.get(NESTED_REDUCTION):
                arrays = [_Deferred(op, values)] * len(op.outputs)
            elif isinstance(op, (ComputeOp, ScatterAddOp, ScanOp)):
                try:
                    arrays = (_eval_compute(op, values) if isinstance(op, ComputeOp) else
                              _eval_scatter(op, values) if isinstance(op, ScatterAddOp) else
                              _eval_scan(op, values))
                except TexprError as exc:  # named as the compiled kernel names it
                    raise in_stage(op.name, exc) from None
            else:
                raise TexprError(f"evaluate: unknown operation {type(op).__name__}")
            for t, a in zip(op.outputs, arrays):
                values[id(t)] = a
    with np.errstate(all="ignore"):
        results = [_value(values, o) for o in outs]
    return results[0] if single else results
