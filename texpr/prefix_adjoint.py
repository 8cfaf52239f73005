"""The adjoint of a ``prod`` or user reducer over a triangle, as a reverse scan.

A one-axis reduction whose ``where=`` holds its axis ``k`` in a triangle with an
output axis ``i`` that nothing else mentions (``texpr.triangles``)::

    Y[.., i, ..] = (+)(x(k), axis=k, where=k - i <= c && w(k))    (a prefix)
    Y[.., i, ..] = (+)(x(k), axis=k, where=k - i >= c && w(k))    (a suffix)

is the recurrence ``Y[i] = Y[i - s] (+) x(i + c)`` (``s = 1`` for a prefix; a
suffix, ``s = -1``, combines ``x(i + c) (+) Y[i + 1]``, so the points meet in
row-major order and the new point is the earlier one): each point ``k`` enters
at the step ``i0(k) = k - c``. The chain rule through that recurrence is::

    G[i] = H[i] + G[i + s] * d(+)/d state (Y[i], x(i + s + c))     (reverse, n steps)
    dx(k) = G[i0] * d(+)/d new (Y[i0 - s], x(k))                   (one term per k)

``G`` (the adjoint of ``Y[i]`` through every later step) is a :class:`ScanOp`
run against the direction of the triangle. The contribution is then one term
per point instead of the rest stages' ``O(n^2)`` (:func:`texpr.jacobian.rest_stages`):
the prefix product ``P[r, i] = prod(X[r, j], where=j < i)`` (NeRF's
transmittance) has a gradient linear per row. No division: a zero factor is
exact. A selecting combine's ties go to the first point as in the general
rule (the combine is read through :func:`texpr.jacobian.tie_ordered`).

Only when every point enters at a step of its own (the first step holds at most
one point) and the reducer has one component; otherwise the general rule.
"""

from .expr import all_of, const, iter_var, select
from .rules import jvp
from .scan import ScanOp
from .tensor import ComputeOp, PlaceholderOp
from .triangles import conjunct_list, triangle_bound
from .visitor import free_vars, substitute


def _triangle(op, red):
    """``(pos, c0, s, rest)`` for a one-axis reduction over a triangle with the output
    axis ``op.axis[pos]``, or None."""
    if len(red.axes) != 1 or len(red.source) != 1 or len(red.combiner.lhs) != 1:
        return None
    k = red.axes[0]
    parts = conjunct_list(red.where)
    for ci, c in enumerate(parts):
        b = triangle_bound(c, k, op.axis)
        if b is None:
            continue
        j, c0, kind = b
        rest = parts[:ci] + parts[ci + 1:]
        if any(v is j for v in free_vars(list(red.source) + rest)):
            continue
        pos = next(d for d, a in enumerate(op.axis) if a is j)
        lo, hi = k.dom
        n = j.extent
        # the first step holds at most one point: none enters before step 0 (n - 1)
        if (kind == "prefix" and lo < c0) or (kind == "suffix" and hi - 1 > n - 1 + c0):
            return None
        return pos, c0, 1 if kind == "prefix" else -1, rest
    return None


def _partials(comb, result, s):
    """``(d/d state, d/d new, state var, new var)`` of the combine ``result`` (the
    tie-ordered one)."""
    state, new = (comb.lhs[0], comb.rhs[0]) if s == 1 else (comb.rhs[0], comb.lhs[0])
    d_state = jvp(result, {state: const(1, state.dtype)})
    d_new = jvp(result, {new: const(1, new.dtype)})
    return d_state, d_new, state, new


def _point(red, k_value, rest, mapping):
    """``(in the domain, x)`` of the point ``k = k_value`` with the other axes mapped."""
    k = red.axes[0]
    lo, hi = k.dom
    m = dict(mapping)
    m[k] = k_value
    guard = [k_value >= lo, k_value < hi] + [substitute(c, m) for c in rest]
    return all_of(guard), substitute(red.source[0], m)


def _adjoint_scan(out, red, result, head, prefix_n, tri):
    """``G`` of the module docstring: a Tensor of ``head``'s shape."""
    op = out.op
    pos, c0, s, rest = tri
    d_state, _d_new, state_v, new_v = _partials(red.combiner, result, s)
    n = op.axis[pos].extent
    others = [a for d, a in enumerate(op.axis) if d != pos]
    p_ext = tuple(head.shape[:prefix_n])
    dtype = head.dtype
    shape = (n,) + p_ext + tuple(a.extent for a in others)
    st = PlaceholderOp(f"{out.name}_adj_state", shape, dtype).output(0)

    def axes(name_t, ext_t):
        t = iter_var(0, ext_t, name_t, "spatial")
        p = [iter_var(0, e, f"p{d}", "spatial") for d, e in enumerate(p_ext)]
        o = [iter_var(0, a.extent, a.name, "spatial") for a in others]
        return t, p, o

    def at(i_val, p, o, tensor, with_prefix):
        idx = list(o)
        idx.insert(pos, i_val)
        return tensor[tuple((list(p) if with_prefix else []) + idx)]

    last = n - 1 if s == 1 else 0
    t0, p0, o0 = axes("t0", 1)
    init = ComputeOp(f"{out.name}_adj_last", [t0] + p0 + o0,
                     (at(const(last, t0.dtype), p0, o0, head, True),),
                     tag="scan_init").output(0)
    t, p, o = axes("t", n)
    i_t = (n - 1) - t if s == 1 else t
    prev = st[tuple([t - 1] + p + o)]  # G at the step after i_t
    body = at(i_t, p, o, head, True)
    if d_state is not None:
        in_dom, x = _point(red, i_t + s + c0, rest, dict(zip(others, o)))
        factor = substitute(d_state, {state_v: at(i_t, p, o, out, False), new_v: x})
        body = body + prev * select(in_dom, factor, const(1, factor.dtype))
    upd = ComputeOp(f"{out.name}_adj_step", [t] + p + o, (body,),
                    tag="scan_update").output(0)
    scan = ScanOp(f"{out.name}_adj", [init], [upd], [st], tag="prefix_adjoint",
                  attrs={"of": out.name})
    g_p = [iter_var(0, e, f"p{d}", "spatial") for d, e in enumerate(p_ext)]
    g_i = [iter_var(0, a.extent, a.name, "spatial") for a in op.axis]
    i_g = g_i[pos]
    tt = (n - 1) - i_g if s == 1 else i_g
    idx = [tt] + g_p + [a for d, a in enumerate(g_i) if d != pos]
    return ComputeOp(f"{out.name}_adj_head", g_p + g_i,
                     (scan.output(0)[tuple(idx)],)).output(0)


def triangle_rule(out, red, ctx, result, times):
    """The summand of the contribution of ``out`` for a reduction over a triangle
    (module docstring), or None when the general rule applies.

    Args:
        out: the reduction stage's output Tensor.
        red: its Reduce node.
        ctx: the rule context of :mod:`texpr.jacobian` (fresh axes, head load,
            sources and their derivatives, the cache).
        result: the combine's value (component 0) with ties ordered
            (:func:`texpr.jacobian.tie_ordered`).
        times: the product that keeps symbolic zeros
            (:func:`texpr.jacobian.symbolic_times`).
    Returns:
        An Expr over ``ctx.i_axes + ctx.k_axes`` (zero but at ``i == k - c``), or
        None.
    """
    op = out.op
    tri = _triangle(op, red)
    if tri is None or ctx.d_sources[0] is None:
        return None
    pos, c0, s, _rest = tri
    head = ctx.head_load.tensor
    prefix_n = len(ctx.head_load.indices) - len(op.axis)
    key = ("prefix_adjoint", id(op), id(head))
    g = ctx.cache.get(key) if ctx.cache is not None else None
    if g is None:
        g = _adjoint_scan(out, red, result, head, prefix_n, tri)
        if ctx.cache is not None:
            ctx.cache[key] = g
    _d_state, d_new, state_v, new_v = _partials(red.combiner, result, s)
    if d_new is None:
        return None
    i_axes, k = ctx.i_axes, ctx.k_axes[0]
    i0 = k - c0
    before = i0 - s
    n = op.axis[pos].extent
    y_idx = list(i_axes)
    y_idx[pos] = before
    ident = red.combiner.identity[0]
    y_prev = select((before >= 0) & (before < n), out[tuple(y_idx)], ident)
    g_load = g[tuple(ctx.head_load.indices)]
    chain = times(g_load, substitute(d_new, {state_v: y_prev, new_v: ctx.sources[0]}))
    term = times(chain, ctx.d_sources[0])
    return select(i_axes[pos] == i0, term, const(0, term.dtype))

