"""Bounds checks of a stage: which loads need a run-time check, and proofs that
the integer index arithmetic of the generated code is exact in int64.

One job: decide, from the stage's iteration domain (isl), which accesses are
proven in bounds, which are proven out of bounds (a build-time
:class:`OutOfBoundsError`), which are checked at run time (``_ck``), and which
loaded integers used in index arithmetic get a range check (``_rk``). The
run-time checks are the runtime helpers ``_ck``, ``_rk`` and ``_nz`` of
the backend's runtime helpers: they set the unit's error flag ``err`` (``[code,
offending value]``) instead of raising, so that the compiler can still parallelise
the loop.
"""

from texpr import expr as E
from texpr.errors import OutOfBoundsError, TexprError
from texpr.printer import expr_str
from texpr.simplify.isl_bridge import isl, to_pwaff, to_set
from texpr.visitor import post_order

__all__ = ["DATA_INDEX_LIMIT", "may_refuse", "int_arith_on_data"]

#: an int64 value loaded (or cast from a float) inside index arithmetic is checked
#: at run time to lie in [-DATA_INDEX_LIMIT, DATA_INDEX_LIMIT): the arithmetic
#: over it is then proven to stay in int64
DATA_INDEX_LIMIT = 1 << 31

_INT_RANGE = {"int64": (-(1 << 63), (1 << 63) - 1), "int32": (-(1 << 31), (1 << 31) - 1)}
_COMPARISONS = (E.EQ, E.NE, E.LT, E.LE, E.GT, E.GE)
_INDEX_ARITH = (E.Add, E.Sub, E.Mul, E.FloorDiv, E.FloorMod, E.Min, E.Max)
#: the value arithmetic that can leave its dtype (INT_MIN // -1 included)
_VALUE_ARITH = (E.Add, E.Sub, E.Mul, E.FloorDiv)


def _interval(e, a, b):
    """The exact range of ``e`` (``+ - * // % min max``) over operands in the
    ranges ``a`` and ``b`` (``(lo, hi)``, Python ints: no wrap-around). A divisor
    of 0 is the kernel's ``_nz`` failure, which divides by 1."""
    if isinstance(e, E.Add):
        return (a[0] + b[0], a[1] + b[1])
    if isinstance(e, E.Sub):
        return (a[0] - b[1], a[1] - b[0])
    if isinstance(e, E.Mul):
        ps = [x * y for x in a for y in b]
        return (min(ps), max(ps))
    if isinstance(e, E.FloorMod):
        if b[0] > 0:
            return (0, b[1] - 1)
        if b[1] < 0:
            return (b[0] + 1, 0)
        return (min(b[0] + 1, 0), max(b[1] - 1, 0))
    if isinstance(e, E.FloorDiv):
        # floor(x / y) is extreme at a corner of each part of the divisor's range
        # on one side of 0 ([b0, -1] and [1, b1]): -1 gives -a0 (-INT_MIN wraps)
        ds = [y for y in (b[0], b[1], 1, -1) if b[0] <= y <= b[1] and y != 0] or [1]
        qs = [x // y for x in a for y in ds]
        return (min(qs), max(qs))
    pick = min if isinstance(e, E.Min) else max
    return (pick(a[0], b[0]), pick(a[1], b[1]))


def may_refuse(e):
    """Whether evaluating ``e`` exactly (``te.evaluate``'s integer rules, which
    the GEMM path's conditions follow) can raise for some values of what it
    reads: an integer ``+ - * //`` whose range leaves its dtype ("would wrap
    around"; a loaded integer may be anything its dtype holds, an axis ranges
    over its extent), or an integer ``//`` or ``%`` whose divisor's range holds
    0. Loads themselves (their indices) are not considered.

    Args:
        e: an Expr (or a list of them).
    Returns:
        bool.
    """
    ck = _BoundsChecker("", None, None)
    for n in post_order(e if isinstance(e, list) else [e]):
        if _INT_RANGE.get(n.dtype) is None:
            continue
        if type(n) in _VALUE_ARITH:
            ck.value_range(n)
        if isinstance(n, (E.FloorDiv, E.FloorMod)):
            lo, hi = ck.value_range(n.b)
            if lo <= 0 <= hi:
                return True
    return bool(ck.arith)


def int_arith_on_data(e):
    """Whether ``e`` holds integer arithmetic (``+ - * // % min max``) over a
    loaded value or a float converted to an integer: in a condition or an index
    a kernel range-checks such a value at run time (``DATA_INDEX_LIMIT``) or
    refuses the arithmetic at build time (int32), so a stage computing ``e`` at
    points its consumer never reads may refuse where the consumer would not.

    Args:
        e: an Expr (or a list of them).
    Returns:
        bool.
    """
    data = set()  # ids of the nodes with a loaded or converted value under them
    for n in post_order(e if isinstance(e, list) else [e]):
        if isinstance(n, E.Load) or (isinstance(n, E.Cast) and n.value.dtype != "bool"
                                     and _INT_RANGE.get(n.value.dtype) is None):
            data.add(id(n))
        elif any(id(c) in data for c in n.args):
            if type(n) in _INDEX_ARITH and _INT_RANGE.get(n.dtype) is not None:
                return True
            data.add(id(n))
    return False


def _narrow(path, s):
    """``path`` within the set ``s``: the same object where ``s`` is plainly the
    universe (a float comparison), so that :meth:`_BoundsChecker.walk`'s memo (by
    the path's id) sees a DAG once, not a chain of selects as a tree of O(2^d)
    paths (isl ran out of memory on a depth-8 chain over a gathered load)."""
    return path if s.plain_is_universe() else path.intersect(s)


_NOT_A_LEAF = object()


def _leaf_range(e, full, var_ranges):
    """``(lo, hi)`` of a constant, an axis or a bound variable (``var_ranges``:
    id -> range; else ``full``, its dtype's); ``_NOT_A_LEAF`` for anything else."""
    if isinstance(e, E.Const):
        return (int(e.value), int(e.value))
    if isinstance(e, E.IterVar):
        return (e.dom[0], e.dom[1] - 1)
    if isinstance(e, E.Var):
        return var_ranges.get(id(e), full)
    return _NOT_A_LEAF


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
        #: ids of integer + - * on values (not in an index or a comparison) that
        #: may leave their dtype: computed by a checked helper (the backend's runtime helpers)
        self.arith = set()
        self._value_ranges = {}
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
        r = _leaf_range(e, full, self.var_ranges)
        if r is not _NOT_A_LEAF:
            return r
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
        r = _interval(e, a, b)
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
        for n in post_order(c):
            if type(n) in _COMPARISONS:
                for x in n.args:
                    if _INT_RANGE.get(x.dtype) is not None:
                        self.index(x, path)

    def walk(self, e, path, resid, value=True):
        """Find the loads of ``e`` to check at run time on ``path``, prove its index
        and comparison arithmetic, and mark the value arithmetic to check
        (``value``: ``e`` is a value, not inside an index or a comparison)."""
        key = (id(e), id(path), resid, value)
        if key in self._seen:
            return
        self._seen.add(key)
        if value and type(e) in _VALUE_ARITH and _INT_RANGE.get(e.dtype) is not None:
            self.value_range(e)
        # what the index proof covers: the integer operands of a comparison or a
        # load's index, down to the first node that is not an integer (a cast to
        # float or bool hides the integer arithmetic under it from the proof:
        # that is a value again, `cast(N[i] * N[i], float64) > 1.0`)
        if type(e) in _COMPARISONS:
            for x in e.args:
                if _INT_RANGE.get(x.dtype) is not None:
                    self.index(x, path)
            value = False
        elif isinstance(e, E.Load):
            value = False
        else:
            value = value or _INT_RANGE.get(e.dtype) is None
        if isinstance(e, E.Select):
            self.walk(e.cond, path, resid, value)
            s, r = to_set(e.cond, self.space)
            self.walk(e.true_value, _narrow(path, s), resid or r is not None, value)
            if r is None:
                self.walk(e.false_value, _narrow(path, s.complement()), resid, value)
            else:
                self.walk(e.false_value, path, True, value)
            return
        if isinstance(e, (E.And, E.Or)):
            self.walk(e.a, path, resid, value)
            s, r = to_set(e.a, self.space)
            if isinstance(e, E.Or):
                s = s.complement() if r is None else self.space.universe()
            self.walk(e.b, _narrow(path, s), resid or r is not None, value)
            return
        for c in e.args:
            self.walk(c, path, resid, value)
        if isinstance(e, E.Load):
            self._check(e, path, resid)

    def value_range(self, e):
        """The range of the integer value ``e`` (a stage's value, not an index:
        a loaded value may be anything its dtype holds), from interval
        arithmetic. A ``+ - * //`` that may leave its dtype goes into ``arith``: the
        kernel checks it at run time, as ``te.evaluate`` does, instead of
        wrapping around (``-N[i]`` or ``N[i] // -1`` at ``N[i] = -2**63``)."""
        hit = self._value_ranges.get(id(e))
        if hit is not None:
            return hit[1]
        r = self._value_range_now(e)
        self._value_ranges[id(e)] = (e, r)
        return r

    def _value_range_now(self, e):
        full = _INT_RANGE.get(e.dtype)
        if full is None:
            return None
        r = _leaf_range(e, full, self.var_ranges)
        if r is not _NOT_A_LEAF:
            return r
        if isinstance(e, E.Cast) and e.value.dtype == "bool":
            return (0, 1)
        if isinstance(e, E.Cast) and _INT_RANGE.get(e.value.dtype) is not None:
            inner = self.value_range(e.value)
            return inner if full[0] <= inner[0] and inner[1] <= full[1] else full
        if isinstance(e, E.Select):
            a, b = self.value_range(e.true_value), self.value_range(e.false_value)
            return (min(a[0], b[0]), max(a[1], b[1]))
        if isinstance(e, _INDEX_ARITH):
            r = _interval(e, self.value_range(e.a), self.value_range(e.b))
            if not (full[0] <= r[0] and r[1] <= full[1]):
                self.arith.add(id(e))  # checked at run time: never outside the dtype
                r = (max(r[0], full[0]), min(r[1], full[1]))
            return r
        return full

    def value_arith(self, exprs):
        """Range the integer value arithmetic of ``exprs`` (values whose operands may
        be anything their dtypes hold: a custom reducer's combine) and return
        ``arith``: the ids of the ``+ - * //`` to check at run time."""
        for n in post_order(list(exprs)):
            if type(n) in _VALUE_ARITH and _INT_RANGE.get(n.dtype) is not None:
                self.value_range(n)
        return self.arith

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
