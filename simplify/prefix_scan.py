"""Prefix and suffix sums become scans: O(n) work instead of the triangle's O(n^2).

A reduction stage ::

    Y[.., j, ..] = sum(s(.., k), axis=k, where=k - j <= c && w(.., k))     (a prefix)
    Y[.., j, ..] = sum(s(.., k), axis=k, where=k - j >= c && w(.., k))     (a suffix)

whose summand ``s`` and other conditions ``w`` do not mention ``j`` is the
recurrence ``Y[j] = Y[j - 1] + [k = j + c in k's domain and w] s(k = j + c)``
(a suffix runs the other way). It becomes a scan (:mod:`texpr.scan`) over a
state with the time axis ``j`` first (in reversed order for a suffix):

* init: the original reduction at the first step (``j = 0``, or ``j = n - 1``),
  a reduction stage of one step;
* update: ``P[t, ..] = P[t - 1, ..] + select(guard, s(k = j(t) + c), 0)``;
* the result: ``Y[.., j, ..] = P[j or n - 1 - j, ..]``, a re-indexing the
  materialisation rule inlines into its consumers, or, when ``Y`` keeps a
  buffer, whose buffer the scan writes directly (its state lives there under
  the re-indexing: :func:`texpr.simplify.materialize.scan_view`), or, for a
  prefix over the first axis, the scan's output itself.

``prod`` reductions become ``P[t - 1] * factor`` the same way (exact with zero
factors: no division), and so does any single-component ``comm_reducer``
(``P[t - 1] (+) term`` with its combine; a suffix combines ``term (+) P[t - 1]``,
so the points keep the reduction's row-major order). The *before*/*after* rest
stages of a ``prod`` or user-reducer window's gradient
(:func:`texpr.jacobian.rest_stages`) are such prefixes and suffixes: the
gradient is linear per window.

A reduction over several axes whose ``where=`` holds one of them in a triangle
with an output axis that nothing else mentions (a summed-area table
``sum(I[k, l], where=k <= y && l <= x)``, its adjoint with ``>=``) is split into
a stage reduced over the other axes and a 1-D prefix over that axis
(:func:`_split_triangle`), each scanned in turn: one scan per axis, O(H * W). This covers cumsum, its adjoint (a suffix sum of the
head), exclusive and reverse sums and cumprod, alone or inside larger
expressions (the summand may be anything that does not mention ``j``). A
stage is rewritten only when the scan visits fewer points than the triangle.
"""

from texpr import expr as E
from texpr.errors import TexprError
from texpr.expr import Reduce, const, iter_var, select
from texpr.scan import ScanOp
from texpr.triangles import conjunct_list as _conjuncts, nested_stages, triangle_bound as _bound, \
    triangle_split
from texpr.tensor import ComputeOp, PlaceholderOp, topo_order
from texpr.visitor import free_vars, substitute

from .cleanup import _extreme_key
from .graph import rebuild
from .materialize import stage_count

_OPS = {"sum": lambda a, b: a + b, "prod": lambda a, b: a * b,
        "max": E.maximum, "min": E.minimum}
#: reducers whose points may be split at any axis (the others keep row-major order)
_ANY_ORDER = ("sum", "prod", "max", "min")


def _combine(comb, kind):
    """``(prev, term) -> exprs``: one step of the scan for the Combiner ``comb`` (tuples
    of its components), or None when the combiner has no scan form. ``sum``,
    ``prod``, ``max`` and ``min`` are their operators; a user reducer (tuple
    reducers included: the gradient's argmax stages) is its combine, with the state on
    the side of the points already combined: a prefix combines ``prev (+) term``
    (``term`` the later point), a suffix ``term (+) prev`` (``term`` the earlier
    point), so the points meet in the reduction's own row-major order and only
    associativity is used (a combine that keeps the accumulator at a tie keeps
    the first tied point, as the reduction does)."""
    if comb.kind in _OPS:
        op = _OPS[comb.kind]
        return lambda prev, term: (op(prev[0], term[0]),)
    if comb.kind != "custom":
        return None

    def step(prev, term):
        a, b = (prev, term) if kind == "prefix" else (term, prev)
        bind = dict(zip(comb.lhs, a))
        bind.update(zip(comb.rhs, b))
        return tuple(substitute(r, bind) for r in comb.result)

    return step


def _reduction_parts(op):
    """The Reduce of the reduction stage ``op`` when every output is one component of
    it (a tuple reducer's stage), else None."""
    if not isinstance(op, ComputeOp) or not isinstance(op.body[0], Reduce):
        return None
    red = op.body[0]
    n = len(red.source)
    if op.num_outputs != n or len(red.combiner.lhs) != n:
        return None
    for v, b in enumerate(op.body):
        if not (isinstance(b, Reduce) and b.value_index == v and b.combiner is red.combiner
                and b.axes == red.axes and b.where is red.where
                and all(x is y for x, y in zip(b.source, red.source))):
            return None
    return red


def _as_scan(op):
    """The scan form of the reduction stage ``op`` (a tuple of Tensors of ``op``'s
    shape, one per output), or None."""
    red = _reduction_parts(op)
    if red is None or len(red.axes) != 1:
        return None
    if _combine(red.combiner, "prefix") is None:
        return None
    k = red.axes[0]
    found, rest = None, []
    for c in _conjuncts(red.where):
        b = _bound(c, k, op.axis) if found is None else None
        if b is not None:
            found = b
        else:
            rest.append(c)
    if found is None:
        return None
    j, c0, kind = found
    srcs = red.source
    mentions = {id(v) for v in free_vars(list(srcs) + rest)}
    if id(j) in mentions:
        return None
    n = j.extent
    p = next(d for d, a in enumerate(op.axis) if a is j)
    others = [a for a in op.axis if a is not j]
    # the states: time axis (j, or reversed j) first, then the other axes
    states = [PlaceholderOp(f"{op.name}_state" + (f"{v}" if v else ""),
                            (n,) + tuple(a.extent for a in others), dtype).output(0)
              for v, dtype in enumerate(op.dtypes)]
    first = 0 if kind == "prefix" else n - 1

    def axes_of(shape_axes):
        return [iter_var(0, a.extent, a.name, "spatial") for a in shape_axes]

    # init: the reduction at the first step
    i_axes = axes_of([j] + others)
    t0 = iter_var(0, 1, "t0", "spatial")
    k_first = c0 if kind == "prefix" else n - 1 + c0  # the one point the first step may add
    one_point = (k_first - k.dom[0] + 1 if kind == "prefix" else k.dom[1] - k_first) <= 1
    if len(srcs) > 1 and one_point:
        # a tuple reducer's first step holds at most one point: one elementwise stage
        # per component (identity (+) x is x), which the scan takes into its states'
        # first steps; one stage of several outputs would be stored on its own
        at = {k: const(k_first, k.dtype), **dict(zip(others, i_axes[1:]))}
        guard = E.all_of([const(k.dom[0] <= k_first < k.dom[1])]
                         + [substitute(c, at) for c in rest])
        init = tuple(
            ComputeOp(f"{op.name}_first" + (f"{v}" if v else ""), [t0] + i_axes[1:],
                      (select(guard, substitute(src, at), const(ident.value, dtype)),),
                      tag="scan_init").output(0)
            for v, (src, ident, dtype) in enumerate(zip(srcs, red.combiner.identity,
                                                        op.dtypes)))
    else:
        mapping = {j: const(first, j.dtype)}
        mapping.update(zip(others, i_axes[1:]))
        init = ComputeOp(f"{op.name}_first", [t0] + i_axes[1:],
                         tuple(substitute(b, mapping) for b in op.body), tag="scan_init").outputs
    # update: the previous step combined with the new term
    u_axes = axes_of([j] + others)
    t = u_axes[0]
    jt = t if kind == "prefix" else (n - 1) - t
    kv = jt + c0
    # k = j + c0 runs over [c0, n - 1 + c0]: test only the ends of k's domain it leaves
    in_dom = ([kv >= k.dom[0]] if c0 < k.dom[0] else []) + \
        ([kv < k.dom[1]] if n - 1 + c0 >= k.dom[1] else [])
    at = {k: kv, **dict(zip(others, u_axes[1:]))}
    guard = E.all_of(in_dom + [substitute(c, at) for c in rest])
    new_terms = tuple(select(guard, substitute(src, at), const(ident.value, dtype))
                      for src, ident, dtype in zip(srcs, red.combiner.identity, op.dtypes))
    prev = tuple(st[tuple([t - 1] + list(u_axes[1:]))] for st in states)
    upd = ComputeOp(f"{op.name}_step", u_axes, _combine(red.combiner, kind)(prev, new_terms),
                    tag="scan_update").outputs
    scan = ScanOp(f"{op.name}_scan", list(init), list(upd), states, tag="prefix_scan",
                  attrs={"of": op.name, "kind": kind})
    if kind == "prefix" and p == 0:
        return scan.outputs
    y_axes = axes_of(op.axis)
    yj = y_axes[p] if kind == "prefix" else (n - 1) - y_axes[p]
    idx = tuple([yj] + [a for d, a in enumerate(y_axes) if d != p])
    # one re-indexing per component (one stage of several outputs would be stored)
    return tuple(ComputeOp(op.name + (f"_v{v}" if v else ""), y_axes, (o[idx],), tag=op.tag,
                           attrs=op.attrs).output(0) for v, o in enumerate(scan.outputs))


def _split_triangle(op):
    """A reduction over several axes, one of which (``k``) is held only by a
    triangle ``k - j <= c`` (or ``>=``) with an output axis ``j`` that nothing
    else mentions, as two stages (a tuple of Tensors of ``op``'s shape), or None::

        T[k, ..] = reduce(s, axis=the other axes, where=the other conditions)
        Y[.., j, ..] = reduce(T[k, ..], axis=k, where=k - j <= c)

    The outer stage is a 1-D prefix (suffix) and becomes a scan; the inner one
    is split or scanned again when it has the same form (a summed-area table
    ``sum(I[k, l], where=k <= y && l <= x)``: one prefix sum per axis, in
    O(H * W), and its adjoint, the same with ``>=``). ``sum``, ``prod``, ``max``,
    ``min`` and order-free tuple reducers (the gradient's argmax stages) split at
    any axis; a user reducer only at its first axis, so that its points keep
    their row-major order (texpr.triangles builds the two stages)."""
    red = _reduction_parts(op)
    if red is None or len(red.axes) < 2 or _combine(red.combiner, "prefix") is None:
        return None
    comb = red.combiner
    split = triangle_split(op, comb.kind in _ANY_ORDER or getattr(comb, "order_free", False))
    if split is None:
        return None
    _inner, outer = nested_stages(op, split, inner_hook=_cheapest)
    return _as_scan(outer)


def _cheapest(ts):
    """``ts`` (a reduction stage's outputs) as a scan, or split and scanned, when that
    visits fewer points; else ``ts``."""
    new = _scanned(ts[0].op)
    return ts if new is None else new


def _new_cost(new, op):
    """Points the stages of ``new`` that ``op``'s inputs do not hold visit; a stage
    that only re-indexes a scan's output costs nothing (the scan writes that buffer
    through a view, materialize.scan_view, or it is inlined), and a scan's first
    step is the scan's (a cheap one is computed into its state)."""
    old = {id(o) for o in topo_order(op.input_tensors())}
    total = 0
    for o in topo_order(list(new)):
        if id(o) in old or isinstance(o, PlaceholderOp) or getattr(o, "tag", "") == "scan_init":
            continue
        if isinstance(o, ComputeOp) and isinstance(o.body[0], E.Load) \
                and isinstance(o.body[0].tensor.op, ScanOp):
            continue
        total += stage_count(o)
    return total


def _scanned(op):
    """The scan form of the reduction stage ``op`` (:func:`_as_scan`, or
    :func:`_split_triangle` for several axes) when it visits fewer points, else None."""
    try:
        new = _as_scan(op)
        if new is None:
            new = _split_triangle(op)
    except TexprError:  # a form the scan cannot take (its checks say why): keep the sum
        return None
    if new is None or _new_cost(new, op) >= stage_count(op):
        return None
    return tuple(new)


def prefix_sums_to_scans(tensors):
    """Prefix/suffix sums and products (triangular domains) become scans (module docstring)."""

    # a max (min) whose argmax (argmin) stage is computed anyway reads its value
    # component (cleanup.eliminate_common_stages): only the argmax stage is scanned
    args, alive = set(), []
    for op in topo_order(tensors):
        k = _extreme_key(op)
        if k is not None and op.num_outputs == 2:
            args.add(k[0])
            alive.append(k)

    def fn(op, orig, _tmap):
        if not isinstance(op, ComputeOp) or not isinstance(op.body[0], Reduce):
            return None
        k = _extreme_key(orig)
        if k is not None and orig.num_outputs == 1 and k[0] in args:
            return None
        return _scanned(op)

    return rebuild(tensors, fn)
