"""The Jacobian of one stage w.r.t. one input tensor, contracted with a head.

Two levels:

* :func:`derivative` -- ``D = d e / d A[j]`` for a scalar expression ``e``
  (a stage body's source): every load ``A[f(i)]`` of ``A`` contributes the
  indicator of ``f(i) == j`` times the partial derivative of ``e`` by that
  load (from the rules in :mod:`texpr.rules`)::

      D = sum over loads L of A in e:  select(all(f_L == j), de/dL, 0)

  so ``A[i, j] + A[j, i]`` gets both terms, and ``de/dL`` is only evaluated
  where the indicator holds (an infinite partial elsewhere cannot leak).
  Loads used only as integers (indices, conditions, casts to int) have no
  derivative: a data-dependent index ``X[I[k]]`` gives ``I`` nothing and
  gives ``X`` the indicator ``I[k] == j`` (duplicates in ``I`` accumulate).

* :func:`contribution` -- the adjoint contribution of a consumer stage ``out``
  to one of its inputs ``inp`` given ``out``'s adjoint ``head`` (shape
  ``prefix + out.shape``): ONE compute stage of shape ``prefix + inp.shape``
  (see :mod:`texpr.adjoint` for the exact raw form). The reducer of ``out``'s
  body selects the rule in :data:`REDUCTION_RULES`:

  - ``sum``: ``d out[i] / d src(i, k) = 1``.
  - ``max``/``min``: the **first** maximal (minimal) point in row-major order
    of the reduction axes gets the whole adjoint; tied points elsewhere get 0.
    NaN propagates (as numpy and PyTorch): a domain holding a NaN has the
    value NaN, and its first NaN point (row-major) is the argmax and gets the
    whole adjoint.
    An *argmax stage* (a tuple reducer over ``(value, flat index)`` in which
    the larger value, then the smaller flat index wins) computes that point
    once per output element, and the rule is ``select(flat(k) == argidx[i],
    head * D, 0)`` -- one pass over the windows, no re-scan, no tie counting.
  - ``prod`` and user ``comm_reducer`` s (tuple reducers included): for a
    combiner ``f`` and a reduction ``Y = f(rest_m, x_m)`` where ``rest_m`` is the
    reduction over every point but ``m`` (a *rest stage*, built with
    ``where= ... && k != m``), ``dY / dx_m = df(rest_m, x_m) / dx_m``. For
    ``prod`` that is the exclusive product: no division, right when factors
    are zero. A user reducer that selects one of its arguments (a hand-made
    argmax) gives tied points no gradient at all under this rule; use the
    built-in ``te.max``/``te.min`` for max-like reductions. Over a triangle
    (``where=j < i``: a prefix product, a running user reduction) the rule is
    instead the adjoint of the reduction's scan, one term per point
    (:mod:`texpr.prefix_adjoint`): linear per row, no rest stages. Over a
    triangle in each of several axes (``where=k <= y && l <= x``) the reduction
    is restated as a chain of 1-D triangles (:func:`_separable_triangle`) and
    the contribution runs down the chain: one reverse scan per axis.

  ``where=`` conditions of the reduction restrict the contribution's sum.

Sources: the algorithm follows TVM's tensor-expression autodiff (S. Grechanik,
"Automatic differentiation for tensor expressions", TVM RFC #1996 / PR #2498),
with symbolic zeros from JAX.
"""

import numpy as np

from . import dtypes as dt
from .errors import NotDifferentiableError, ShapeError, TexprError
from .expr import (Add, And, Call, Const, Div, Expr, FloorDiv, FloorMod, Load, Max, Min, Mul, Or,
                   Reduce, Select, Sub, Var, all_of, any_of, cast, const, iter_var, logical_not,
                   make_reduce, select)
from .reduction import CommReducer
from .prefix_adjoint import triangle_rule
from .triangles import nested_stages, triangle_split
from .printer import expr_str
from .rules import jvp, t_add
from .tensor import ComputeOp, PlaceholderOp, ScatterAddOp
from .visitor import loads, post_order, substitute

_BIG_INDEX = int(np.iinfo(np.int64).max)


# ---- D = d e / d A[j] ------------------------------------------------------------


def load_partials(expr, tensor):
    """``[(load, d expr / d load)]`` for every distinct load of ``tensor`` in ``expr``
    with a nonzero partial derivative."""
    out = []
    for ld in loads(expr, tensor):
        p = jvp(expr, {ld: const(1, ld.dtype)})
        if p is not None:
            out.append((ld, p))
    return out


def indicator(ld, index):
    """The condition ``all(ld.indices[d] == index[d])`` (``True`` for a scalar tensor)."""
    return all_of([f == j for f, j in zip(ld.indices, index)])


def derivative(expr, tensor, index, skip=()):
    """``d expr / d tensor[index]`` as an expression, or ``None`` if structurally zero.

    Args:
        expr: an Expr without reductions.
        tensor: the Tensor differentiated by (float dtype).
        index: tuple of integer Exprs, one per dimension of ``tensor``.
        skip: loads left out (the data-dependent gathers, which get scatter-add
            stages instead: see :func:`gather_loads`).
    Returns:
        ``sum over loads L of tensor: select(all(L.indices == index), dexpr/dL, 0)``
        (the select folds away for a scalar tensor), of ``expr``'s dtype.
    """
    d = None
    for ld, p in load_partials(expr, tensor):
        if any(ld is s for s in skip):
            continue
        term = select(indicator(ld, index), p, const(0, p.dtype))
        d = t_add(d, term)
    return d


def quasi_affine_index(index):
    """Whether an integer index is quasi-affine in the loop variables: sums,
    products with a constant, ``//`` and ``%`` by a constant, min, max, selects
    of comparisons of such, integer casts; no load, no floating-point value
    anywhere inside. Its range is then a static property of the program (isl
    bounds it); any other index's range is known only where it is evaluated."""
    for n in post_order(index):
        if isinstance(n, (Const, Var)):
            if dt.is_float(n.dtype):
                return False
            continue
        if dt.is_float(n.dtype) or isinstance(n, (Load, Reduce, Call, Div)):
            return False
        if isinstance(n, Mul) and not (isinstance(n.a, Const) or isinstance(n.b, Const)):
            return False
        if isinstance(n, (FloorDiv, FloorMod)) and not isinstance(n.b, Const):
            return False
    return True


def gather_loads(exprs, tensor):
    """The distinct loads of ``tensor`` in ``exprs`` whose index is known only where
    it is evaluated: it reads data (``X[I[k]]``: a *data-dependent gather*), or
    it is computed through floating point or is not quasi-affine
    (``X[int64(floor(i * 0.6))]``, ``X[i * i]``; :func:`quasi_affine_index`).

    The indicator form ``select(I[k] == j, ..)`` of such a load would silently
    drop the terms of an index outside ``tensor`` -- while the forward load
    raises OutOfBoundsError for it. Their adjoint is a scatter-add instead
    (:func:`contribution`), whose index the evaluator and the kernel check.
    """
    out = []
    for e in exprs:
        for ld in loads(e, tensor):
            if not all(quasi_affine_index(i) for i in ld.indices) \
                    and not any(ld is o for o in out):
                out.append(ld)
    return out


def evaluation_guard(root, target):
    """The condition under which the node ``target`` is evaluated when ``root`` is:
    ``select`` evaluates a branch only where it is taken, ``a && b`` evaluates
    ``b`` only where ``a`` holds, ``a || b`` only where ``a`` does not (as
    :func:`texpr.evaluate` and the kernels do). The OR over every path from
    ``root`` to ``target`` of the conditions along it; ``True`` for an
    unconditional node."""
    guard = {id(root): const(True)}
    for n in reversed(post_order(root)):
        g = guard.get(id(n))
        if g is None:
            continue
        if isinstance(n, Select):
            edges = (const(True), n.args[0], logical_not(n.args[0]))
        elif isinstance(n, And):
            edges = (const(True), n.args[0])
        elif isinstance(n, Or):
            edges = (const(True), logical_not(n.args[0]))
        else:
            edges = (const(True),) * len(n.args)
        for c, edge in zip(n.args, edges):
            via = g if (isinstance(edge, Const) and edge.value is True) else all_of(g, edge)
            old = guard.get(id(c))
            guard[id(c)] = via if old is None else any_of(old, via)
    return guard.get(id(target), const(False))


# ---- the reduction rules ---------------------------------------------------------


def _flat(offsets, extents):
    flat = const(0, dt.INDEX_DTYPE)
    for o, n in zip(offsets, extents):
        flat = flat * n + o
    return flat


def offsets(axes):
    """The positions ``a - lo`` of the IterVars ``axes`` in their domains ``[lo, hi)``."""
    return tuple(a - a.dom[0] if a.dom[0] else a for a in axes)


def flat_index(axes):
    """Row-major flat position of the point ``axes`` (IterVars) in their box (int64)."""
    return _flat(offsets(axes), [a.extent for a in axes])


def _arg_reducer(kind):
    better = (lambda y, x: y > x) if kind == "max" else (lambda y, x: y < x)

    def combine(x, y):
        # NaN ranks above every number, as numpy's and PyTorch's max propagate it:
        # the first NaN point (smallest flat index) wins. Comparisons with a NaN
        # are false, so the second line never takes a number over a NaN.
        take = better(y[0], x[0]) | ((y[0] == x[0]) & (y[1] < x[1]))
        if dt.is_float(y[0].dtype):
            take = take | ((y[0] != y[0]) & ((x[0] == x[0]) | (y[1] < x[1])))
        return select(take, y[0], x[0]), select(take, y[1], x[1])

    def identity(vd, idd):
        return const(-np.inf if kind == "max" else np.inf, vd), const(_BIG_INDEX, idd)

    return CommReducer(combine, identity, name=f"arg{kind}", order_free=True)


#: tuple reducers (value, flat index): larger (smaller) value wins, then the smaller index
ARG_REDUCERS = {"max": _arg_reducer("max"), "min": _arg_reducer("min")}


def _axis_copy(axes, kind, prefix=""):
    """Fresh IterVars over the same domains ``[lo, hi)`` as ``axes`` (lower bounds
    kept: a scatter's axes, a reduction's axes may start above 0)."""
    return tuple(iter_var(a.dom[0], a.dom[1], prefix + a.name, kind) for a in axes)


def _spatial_copy(op):
    return _axis_copy(op.axis, "spatial")


def _reduce_copy(axes, prefix=""):
    return _axis_copy(axes, "reduce", prefix)


def arg_stage(out, cache=None):
    """The argmax (argmin) stage of a ``max`` (``min``) reduction stage ``out``.

    Returns an int64 Tensor of ``out.shape``: the row-major flat index of the
    first point of the reduction domain (where ``where=`` holds) at which the
    source reaches its maximum (minimum); ``2**63 - 1`` when the domain is empty.
    The stage's value component (``.op.output(0)``) equals ``out``.
    """
    op = out.op
    key = ("arg", id(op))
    if cache is not None and key in cache:
        return cache[key]
    red = op.body[0]
    axis = _spatial_copy(op)
    raxes = _reduce_copy(red.axes)
    mapping = dict(zip(op.axis + red.axes, axis + raxes))
    src = substitute(red.source[0], mapping)
    where = substitute(red.where, mapping)
    reducer = ARG_REDUCERS[red.combiner.kind]
    comb = reducer.combiner((src.dtype, dt.INDEX_DTYPE))
    body = tuple(make_reduce(comb, (src, flat_index(raxes)), raxes, where, v) for v in (0, 1))
    stage = ComputeOp(f"{op.name}_arg{red.combiner.kind}", axis, body, tag="argmax",
                      attrs={"of": op.name})
    result = stage.output(1)
    if cache is not None:
        cache[key] = result
    return result


def rest_stages(out, cache=None):
    """The *before* and *after* stages of a ``prod`` or custom reduction stage
    ``out``: for every output point ``i`` and reduction point ``m``, the reduction
    over the points before ``m`` (row-major flat order) and over those after it.

    Returns ``(before, after)``, each a tuple of Tensors (one per component of
    the reducer) of shape ``out.shape + extents of the reduction axes`` (indexed
    by ``m - lo``). Splitting the rest of the domain at ``m`` gives ties a
    definite winner: ``Y = (before_m (+) x_m) (+) after_m``, so a selecting
    reducer (a max written with ``comm_reducer``) sends the whole adjoint to the
    first point that wins, as the built-in ``max`` does.
    """
    op = out.op
    key = ("rest", id(op))
    if cache is not None and key in cache:
        return cache[key]
    red = op.body[0]
    axis = _spatial_copy(op)
    m_axis = tuple(iter_var(0, a.extent, "m_" + a.name, "spatial") for a in red.axes)
    parts = []
    for side, cmp in (("before", lambda f, g: f < g), ("after", lambda f, g: f > g)):
        raxes = _reduce_copy(red.axes)
        mapping = dict(zip(op.axis + red.axes, axis + raxes))
        srcs = tuple(substitute(s, mapping) for s in red.source)
        m_flat = _flat(m_axis, [a.extent for a in red.axes])
        where = substitute(red.where, mapping) & cmp(flat_index(raxes), m_flat)
        body = tuple(make_reduce(red.combiner, srcs, raxes, where, v) for v in range(len(srcs)))
        stage = ComputeOp(f"{op.name}_{side}", axis + m_axis, body, tag="reduction_rest",
                          attrs={"of": op.name, "side": side})
        parts.append(stage.outputs)
    result = tuple(parts)
    if cache is not None:
        cache[key] = result
    return result


def head_times(head_load, d):
    """``head_load * d`` with the head moved into the branches of ``d``'s selects:
    ``h * select(c, a, 0)`` is ``select(c, h * a, 0)``, so a head that is inf or
    NaN at points where the Jacobian is structurally zero does not turn those
    zeros into NaN. The simplifier lifts such conditions into domains (it never
    reads the head there), so raw and simplified adjoints agree on NaN patterns.
    A sum or difference of such terms (an input loaded at several places) gets
    the head in each term (:func:`symbolic_times`, the rule of every such product).
    """
    return symbolic_times(head_load, d)


def _is_zero(e):
    return isinstance(e, Const) and not isinstance(e.value, bool) and e.value == 0


def _has_symbolic_zero(e, memo):
    """Whether ``e`` is a select with a zero branch (or a branch that has one), or a
    sum, difference or product of terms one of which is. ``memo``: id -> (node,
    answer), so that a DAG is walked once (a chain of selects reading the level
    below several times is a tree exponential in its depth)."""
    hit = memo.get(id(e))
    if hit is not None:
        return hit[1]
    if isinstance(e, Select):
        out = any(_is_zero(x) or _has_symbolic_zero(x, memo)
                  for x in (e.true_value, e.false_value))
    elif isinstance(e, (Add, Sub, Mul)):
        out = any(_has_symbolic_zero(x, memo) for x in e.args)
    else:
        out = False
    memo[id(e)] = (e, out)  # (the node stays alive: its id is not reused meanwhile)
    return out


def symbolic_times(a, b, _memo=None):
    """``a * b`` where a ``select`` factor with a zero branch is a symbolic zero
    (docs/conventions.md, "Zeros"): ``select(c, x, 0) * b`` is ``select(c, x * b,
    0)``, so a NaN or inf in ``b`` does not leak where the factor is structurally
    zero, in the raw adjoint as in the simplified one (which lifts ``c`` into
    the domain). Used for the chain rule's products of local derivatives."""
    memo = {} if _memo is None else _memo
    key = ("times", id(a), id(b))
    hit = memo.get(key)
    if hit is not None:
        return hit[2]
    out = _symbolic_times(a, b, memo)
    memo[key] = (a, b, out)
    return out


def _symbolic_times(a, b, memo):
    for s, other, first in ((a, b, True), (b, a, False)):
        def times(x):
            return symbolic_times(x, other, memo) if first else symbolic_times(other, x, memo)
        if isinstance(s, Select) and _has_symbolic_zero(s, memo):
            def branch(x):
                return const(0, dt.promote(a.dtype, b.dtype)) if _is_zero(x) else times(x)
            return select(s.cond, branch(s.true_value), branch(s.false_value))
        if isinstance(s, (Add, Sub)) and _has_symbolic_zero(s, memo):
            # (select(c, x, 0) - select(d, y, 0)) * b: each term its own product
            x, y = times(s.args[0]), times(s.args[1])
            return x + y if isinstance(s, Add) else x - y
    if _is_zero(a) or _is_zero(b):
        return const(0, dt.promote(a.dtype, b.dtype))
    return a * b


def _rule_sum(out, red, ctx):
    return head_times(ctx.head_load, ctx.d_sources[0]) if ctx.d_sources[0] is not None else None


def _rule_argextreme(out, red, ctx):
    d = ctx.d_sources[0]
    if d is None:
        return None
    arg = arg_stage(out, ctx.cache)
    hit = flat_index(ctx.k_axes) == arg[offsets(ctx.i_axes)]
    term = head_times(ctx.head_load, d)
    return select(hit, term, const(0, term.dtype))


def tie_ordered(comb):
    """The results of ``comb`` (a Combiner) with every ``max``/``min`` that compares an
    accumulator-side operand (``lhs``, the earlier points) with a new-side one
    (``rhs``) written as a ``select`` that breaks the tie by position.

    Elementwise ``max``/``min`` split a tie evenly (:mod:`texpr.rules`). The
    chain rule of :func:`_rule_generic` splits the domain at each point ``m``,
    ``Y = (B_m (+) x_m) (+) A_m``, and multiplies two such derivatives, which
    needs one consistent choice at a tie: at a three-point tie of a ``max``
    reducer the even split gives the points 1/2, 1/4 and 1/2 (their sum 1.25 is
    no subgradient). So inside a combine a tie is broken as if the earlier
    points were infinitesimally larger (infinitesimally smaller when the combine
    uses ``min`` and no ``max``): the first tied point of a ``max`` or a ``min``
    reducer gets the whole adjoint, and ``max(a, b)`` and ``min(a, b)`` of one
    combine stay a permutation of ``(a, b)``, so a combine smooth through the
    tie (``max(a, b) + min(a, b)``, a log-sum-exp or top-2 written with them) has
    its exact derivative there. This is simulation of simplicity (Edelsbrunner
    and Muecke, ACM TOG 9(1), 1990) with the flat position as the perturbation.
    A ``max``/``min`` whose operands are not one side each gives a tie to its
    first operand (one fixed choice, as before the even split).
    """
    sides = {id(v): const(True) for v in comb.lhs}  # from an earlier point?
    sides.update({id(v): const(False) for v in comb.rhs})
    nodes = post_order(comb.result)
    if not any(isinstance(n, (Max, Min)) for n in nodes):
        return comb.result
    lhs_larger = any(isinstance(n, Max) for n in nodes)
    # from_lhs: a boolean expression, whether the value is an earlier point's; a max or
    # min picks it by value and, at a tie, by position. Anything else mixing the two
    # sides has no position (_MIXED); a constant has no side (_NO_SIDE).
    from_lhs, new = {}, {}
    for n in nodes:
        args = tuple(new[id(c)] for c in n.args)
        rebuilt = n.with_args(args) if n.args else n
        where = [from_lhs[id(c)] for c in n.args]
        if id(n) in sides:
            origin = sides[id(n)]
        elif isinstance(n, (Max, Min)) and all(isinstance(w, Expr) for w in where):
            a, b = args
            pa, pb = where
            larger = isinstance(n, Max)
            # at a tie a wins when it is the larger (max) or smaller (min) by position
            a_pos = (any_of(pa, logical_not(pb)) if larger == lhs_larger
                     else any_of(logical_not(pa), pb))
            a_wins = _picks_first(a, b, larger, a_pos)
            rebuilt = select(a_wins, a, b)
            same = isinstance(pa, Const) and isinstance(pb, Const) and pa.value == pb.value
            origin = pa if same else select(a_wins, pa, pb)
        else:
            if isinstance(n, (Max, Min)):
                # an operand of no one side (m + m' of a best-pair-sum combine): the
                # first operand keeps the tie, one fixed choice (an even split here
                # is multiplied by another in the chain rule: 1/2, 1/4, ...)
                a, b = args
                rebuilt = select(_picks_first(a, b, isinstance(n, Max), const(True)), a, b)
            known = [w for w in where if w is not _NO_SIDE]
            if not known:
                origin = _NO_SIDE
            elif all(isinstance(w, Const) for w in known) and len({w.value for w in known}) == 1:
                origin = known[0]
            else:
                origin = _MIXED
        from_lhs[id(n)] = origin
        new[id(n)] = rebuilt
    return tuple(new[id(r)] for r in comb.result)


_NO_SIDE, _MIXED = object(), object()


def _picks_first(a, b, larger, a_pos):
    """Whether ``max(a, b)`` (``larger``) or ``min(a, b)`` picks ``a``: by value, at a
    tie by ``a_pos`` (a boolean expression), and a NaN operand wins as NaN
    propagates (the first by ``a_pos`` when both are NaN), so the derivative goes
    where the value came from, as for the built-in max and min reducers."""
    strict, loose = (a > b, a >= b) if larger else (a < b, a <= b)
    if isinstance(a_pos, Const):  # positions known statically
        by_value = loose if a_pos.value else strict
    else:
        by_value = any_of(strict, all_of(loose, a_pos))
    if not dt.is_float(a.dtype):
        return by_value
    a_nan = a != a  # IEEE: only NaN differs from itself
    b_number = b == b
    nan_wins = a_nan if isinstance(a_pos, Const) and a_pos.value else all_of(
        a_nan, any_of(b_number, a_pos))
    return any_of(by_value, nan_wins)


def _rule_generic(out, red, ctx):
    """Chain rule through ``Y = (B_m (+) x_m) (+) A_m`` (``B``/``A`` the reductions
    before/after the point ``m``, see :func:`rest_stages`)::

        dY_v/dx_c = sum_c' d(+)_v(u, A)/du_c' * d(+)_c'(B, x)/dx_c,   u = B (+) x

    No division (a zero factor of ``prod`` is fine) and ties of a selecting
    reducer go to the first winner (:func:`tie_ordered`).
    """
    comb = red.combiner
    result = tie_ordered(comb)
    v = out.value_index
    if not any(d is not None for d in ctx.d_sources):
        return None
    tri = triangle_rule(out, red, ctx, result[0], symbolic_times)
    if tri is not None:  # over a triangle: the adjoint of its scan, one term per point
        return tri
    before, after = rest_stages(out, ctx.cache)
    m_index = offsets(ctx.i_axes) + offsets(ctx.k_axes)
    n = len(comb.lhs)
    bind_inner = {}
    for c in range(n):
        bind_inner[comb.lhs[c]] = before[c][m_index]
        bind_inner[comb.rhs[c]] = ctx.sources[c]
    u = [substitute(comb.result[c], bind_inner) for c in range(n)]
    bind_outer = {}
    for c in range(n):
        bind_outer[comb.lhs[c]] = u[c]
        bind_outer[comb.rhs[c]] = after[c][m_index]
    total = None
    for c, d in enumerate(ctx.d_sources):
        if d is None:
            continue
        chain = None
        for c2 in range(n):
            outer = jvp(result[v], {comb.lhs[c2]: const(1, comb.lhs[c2].dtype)})
            inner = jvp(result[c2], {comb.rhs[c]: const(1, comb.rhs[c].dtype)})
            if outer is None or inner is None:
                continue
            chain = t_add(chain, symbolic_times(substitute(outer, bind_outer),
                                                substitute(inner, bind_inner)))
        if chain is not None:
            total = t_add(total, symbolic_times(chain, d))
    return None if total is None else head_times(ctx.head_load, total)


#: combiner kind -> rule(out, reduce node, context) -> the summand (or None)
REDUCTION_RULES = {
    "sum": _rule_sum,
    "max": _rule_argextreme,
    "min": _rule_argextreme,
    "prod": _rule_generic,
    "custom": _rule_generic,
}


class _Context:
    """What a reduction rule sees: the fresh axes, the head load, the sources and
    their derivatives, and the per-differentiation cache of helper stages."""

    def __init__(self, i_axes, k_axes, head_load, sources, d_sources, cache):
        self.i_axes, self.k_axes = i_axes, k_axes
        self.head_load, self.sources, self.d_sources = head_load, sources, d_sources
        self.cache = cache


# ---- the contribution stage --------------------------------------------------------


def _out_axes(prefix, inp):
    p = tuple(iter_var(0, n, f"p{d}", "spatial") for d, n in enumerate(prefix))
    j = tuple(iter_var(0, n, f"j{d}", "spatial") for d, n in enumerate(inp.shape))
    return p, j


def _finish(name, p, j, term, axes, where, dtype, tag="adjoint_contribution", attrs=None):
    from .reduction import sum as te_sum

    if term is None:
        return None
    if term.dtype != dtype:
        term = cast(term, dtype)
    if axes:
        body = te_sum(term, axis=list(axes), where=where)
    elif isinstance(where, Const) and where.value is True:
        body = term
    else:
        body = select(where, term, const(0, term.dtype))
    return ComputeOp(name, p + j, (body,), tag=tag, attrs=attrs).output(0)


def check_head(out, head):
    """The prefix of ``head`` (shape ``prefix + out.shape``).

    Raises:
        ShapeError: ``head``'s shape does not end with ``out.shape``.
    """
    hs, os_ = tuple(head.shape), tuple(out.shape)
    if len(hs) < len(os_) or hs[len(hs) - len(os_):] != os_:
        raise ShapeError(
            f"the head (adjoint) {head.name} of {out.name} has shape {hs}; expected "
            f"prefix + {out.name}.shape = (..., {', '.join(map(str, os_))})")
    return hs[:len(hs) - len(os_)]


def contribution(out, inp, head, cache=None, name=None):
    """The adjoint contribution of the stage ``out`` to its input ``inp``.

    Args:
        out: a Tensor defined by a ComputeOp or ScatterAddOp that reads ``inp``.
        inp: a float Tensor read by ``out``.
        head: the adjoint of ``out``: a Tensor of shape ``prefix + out.shape``.
        cache: a dict shared within one differentiation (argmax/rest stages).
        name: the stage's name (default ``d_<inp>__<out>``).
    Returns:
        A Tensor of shape ``prefix + inp.shape`` and dtype
        ``promote(head.dtype, out.dtype)``, or ``None`` when the contribution
        is structurally zero (``inp`` only used as an integer, for example).
    Raises:
        NotDifferentiableError: ``inp`` or ``out`` is not a float tensor.
        ShapeError: ``head`` has the wrong shape.
        TexprError: ``out`` is a placeholder or does not read ``inp``.
    """
    for t in (inp, out):
        if not dt.is_float(t.dtype):
            raise NotDifferentiableError(
                f"tensor {t.name} has dtype {t.dtype}: only float tensors have adjoints")
    op = out.op
    if isinstance(op, PlaceholderOp):
        raise TexprError(f"contribution: {out.name} is a placeholder; it reads no tensor")
    if not any(t is inp for t in op.input_tensors()):
        body = (expr_str(op.body[out.value_index]) if isinstance(op, ComputeOp)
                else expr_str(op.value))
        raise TexprError(f"contribution: stage {out.name} = `{body}` does not read "
                         f"{inp.name}; expected one of its input tensors "
                         f"({', '.join(t.name for t in op.input_tensors())})")
    prefix = check_head(out, head)
    name = name or f"d_{inp.name}__{out.name}"
    dtype = dt.promote(head.dtype, out.dtype)
    p, j = _out_axes(prefix, inp)
    attrs = {"out": out.name, "inp": inp.name}
    if isinstance(op, ScatterAddOp):
        return _scatter_contribution(out, inp, head, p, j, name, dtype, attrs)

    body = op.body[out.value_index]
    red = body if isinstance(body, Reduce) else None
    chain = _separable_triangle(out, red, cache)
    if chain is not None:  # one reverse scan per axis (see _separable_triangle)
        h = head
        for a, b in zip(chain, chain[1:]):
            h = contribution(a, b, h, cache)
            if h is None:
                return None
        return contribution(chain[-1], inp, h, cache, name)
    i_axes = _reduce_copy(op.axis, "r_")
    k_axes = _reduce_copy(red.axes, "r_") if red is not None else ()
    mapping = dict(zip(op.axis + (red.axes if red is not None else ()), i_axes + k_axes))
    head_load = head[p + offsets(i_axes)]
    if red is None:
        e = substitute(body, mapping)
        exprs = (e,)
        gathers = gather_loads(exprs, inp)
        d = derivative(e, inp, j, skip=gathers)
        term = None if d is None else head_times(head_load, d)
        where = const(True)

        def term_of(ld):
            dl = jvp(e, {ld: const(1, ld.dtype)})
            return None if dl is None else head_times(head_load, dl)
    else:
        exprs = sources = tuple(substitute(s, mapping) for s in red.source)
        gathers = gather_loads(sources, inp)
        d_sources = tuple(derivative(s, inp, j, skip=gathers) if dt.is_float(s.dtype) else None
                          for s in sources)
        where = substitute(red.where, mapping)
        rule = REDUCTION_RULES[red.combiner.kind]
        term = rule(out, red, _Context(i_axes, k_axes, head_load, sources, d_sources, cache))

        def term_of(ld):
            ds = tuple(jvp(s, {ld: const(1, ld.dtype)}) if dt.is_float(s.dtype) else None
                       for s in sources)
            if all(x is None for x in ds):
                return None
            return rule(out, red, _Context(i_axes, k_axes, head_load, sources, ds, cache))
    pieces = [(term, ld) for ld in gathers for term in [term_of(ld)] if term is not None]
    dense = _finish(name if not pieces else name + "_dense", p, j, term, i_axes + k_axes,
                    where, dtype, attrs=attrs)
    return _gather_scatters(dense, name, p, inp, pieces, exprs, i_axes + k_axes, where, dtype)


def _separable_triangle(out, red, cache):
    """The chain ``[Y', T_1, .., T_m]`` restating a ``prod`` or user reduction ``out``
    over several axes whose ``where=`` holds one axis ``k`` in a triangle with an
    output axis that nothing else mentions (``P[y, x] = prod(X[k, l], where=k <= y
    && l <= x)``), else None: ``Y'`` (equal to ``out``) is the 1-D triangle over
    ``k`` of ``T_1[k, ..]``, the reduction over the other axes, itself restated the
    same way while it splits (:func:`texpr.triangles.nested_stages`); the last
    stage reads the source. The contribution of ``out`` is the chain of the
    contributions of each stage to the next: each a 1-D triangle's reverse scan
    (:mod:`texpr.prefix_adjoint`), so the adjoint is one reverse scan per axis,
    linear in the domain's box, with no division (zeros exact), where the rest
    stages of the general rule are quadratic. The forward the reverse scans read
    is the chain itself (one scan per axis), so every level reads the values of
    the stage it restates. A user reducer splits at its first axis only (its
    points keep their row-major order); ``prod`` at any axis."""
    if red is None or red.combiner.kind not in ("prod", "custom") or len(red.axes) < 2 \
            or len(red.source) != 1 or len(red.combiner.lhs) != 1:
        return None
    key = ("triangle_split", id(out.op))
    if cache is not None and key in cache:
        return cache[key]
    top, chain = _restated(out.op, red.combiner.kind == "prod")
    result = chain if len(chain) > 1 else None
    if cache is not None:
        cache[key] = result
    return result


def _restated(op, any_axis):
    """``(Y', chain)``: the one-output reduction stage ``op`` split at its triangles
    as long as they split (:func:`_separable_triangle`); ``Y'`` its restated
    output, ``chain`` the stages from ``Y'`` down to the one reading the source."""
    red = op.body[0]
    split = triangle_split(op, any_axis) if len(red.axes) >= 2 else None
    if split is None:
        return op.output(0), [op.output(0)]
    below = []

    def restate(inner):
        t, chain = _restated(inner[0].op, any_axis)
        below.extend(chain)
        return (t,)

    _inner, outer = nested_stages(op, split, inner_hook=restate)
    return outer.output(0), [outer.output(0)] + below


def _gather_scatters(acc, name, p, inp, pieces, exprs, dom_axes, where, dtype):
    """Add to ``acc`` (the indicator-form contribution, or None) one scatter-add stage
    per data-dependent gather (see :func:`gather_loads`): for a load ``L = inp[idx]``
    with the contribution ``term`` (the head times ``d / dL``), ``out[p, idx] +=
    term`` over the prefix and ``dom_axes``, where ``where`` holds and where ``L``
    is evaluated at all (:func:`evaluation_guard`: an index guarded by a select,
    ``select(I[k] < n, X[I[k]], 0)``, is only read where the forward reads it).
    The scatter's index is checked (the evaluator and the kernels raise
    OutOfBoundsError), as the forward gather's is. The last stage is ``name``."""
    for n, (term, ld) in enumerate(pieces):
        guard = any_of([evaluation_guard(e, ld) for e in exprs])
        fresh = {a: iter_var(a.dom[0], a.dom[1], a.name, "spatial") for a in tuple(p) + dom_axes}
        idx = tuple(substitute(i, fresh) for i in ld.indices)
        # an argmax/argmin stage's sentinel (an empty domain: the forward read
        # nothing) drops the term, as the simplifier's scatters do (simplify/scatter.py)
        empty = [x < _BIG_INDEX for i in idx for x in post_order(i)
                 if isinstance(x, Load) and getattr(x.tensor.op, "tag", None) == "argmax"]
        cond = all_of(empty + [substitute(where, fresh), substitute(guard, fresh)])
        value = substitute(term if term.dtype == dtype else cast(term, dtype), fresh)
        stage = name if n == len(pieces) - 1 else f"{name}_g{n}"
        acc = ScatterAddOp(stage, tuple(a.extent for a in p) + tuple(inp.shape), dtype,
                           tuple(fresh[a] for a in tuple(p) + dom_axes),
                           tuple(fresh[a] for a in p) + idx, value, cond, acc).output(0)
    return acc


def _scatter_contribution(out, inp, head, p, j, name, dtype, attrs):
    """``out = init; out[idx(q)] += value(q)``: ``init`` gets ``head`` itself, a tensor
    read by ``value`` gets ``sum_q head[p, idx(q)] * d value(q) / d inp[j]``."""
    op = out.op
    q_axes = _reduce_copy(op.axis, "r_")  # the scatter's domain, lower bounds kept
    mapping = dict(zip(op.axis, q_axes))
    value = substitute(op.value, mapping)
    where = substitute(op.where, mapping)
    idx = tuple(substitute(i, mapping) for i in op.indices)
    gathers = gather_loads((value,), inp)
    d = derivative(value, inp, j, skip=gathers)
    term = None if d is None else head[p + idx] * d
    pieces = [(head_times(head[p + idx], dl), ld) for ld in gathers
              for dl in [jvp(value, {ld: const(1, ld.dtype)})] if dl is not None]
    from_value = _finish(name if not pieces else name + "_dense", p, j, term, q_axes, where,
                         dtype, attrs=attrs)
    from_value = _gather_scatters(from_value, name, p, inp, pieces, (value,), q_axes, where,
                                  dtype)
    if op.init is not inp:
        return from_value
    if from_value is None:
        return head
    return ComputeOp(name + "_init", p + j, (head[p + j] + from_value[p + j],),
                     tag="adjoint_sum").output(0)

