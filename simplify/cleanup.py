"""Algebraic cleanup and common-subexpression elimination.

* :func:`algebraic_cleanup` -- integer index expressions (load indices and the
  operands of integer comparisons) get the smallest of their ISL form
  (:func:`texpr.simplify.isl_bridge.canonical_quasi_affine`: nested divisions
  re-derived, ``j - 2*(j//2)`` -> ``j % 2``) and SymPy's canonical form
  (:func:`texpr.simplify.sympy_bridge.canonical_index`: ``0 - r + (h + r) // 3`` ->
  ``(h + r) // 3 - r``), when smaller than the original (SymPy is not asked
  when :func:`texpr.simplify.index_form.expanded_size_bound` shows its form
  cannot be smaller).
* :func:`eliminate_common_stages` -- stages with the same definition (same
  body up to renaming of their own axes, same inputs) are merged, and a
  ``max``/``min`` stage reads the value component of its argmax stage when
  the gradient computes that anyway. Within one expression, interning already
  makes equal subexpressions one node.
"""

import weakref

from texpr import expr as E
from texpr.expr import Reduce, iter_var
from texpr.scan import ScanOp
from texpr.tensor import ComputeOp, ScatterAddOp
from texpr.visitor import free_vars, post_order, substitute

from .graph import rebuild
from .index_form import expanded_size_bound
from .isl_bridge import canonical_quasi_affine
from .sympy_bridge import canonical_index

_INT = ("int32", "int64")
_INDEX_KINDS = (E.Const, E.Var, E.Add, E.Sub, E.Mul, E.FloorDiv, E.FloorMod, E.Min, E.Max)


def _is_index_tree(e):
    return e.dtype in _INT and all(isinstance(n, _INDEX_KINDS) for n in post_order(e))


def _clean_expr(e, memo):
    """Canonicalise the maximal integer index subtrees of ``e``."""

    def top(x):
        hit = memo.get(id(x))
        if hit is not None:
            return hit[1]
        if isinstance(x, (E.Const, E.Var)):
            out = x
        elif _is_index_tree(x):
            out = _known_form(x)
            if out is not None:
                memo[id(x)] = (x, out)
                return out
            out = x
            size = len(post_order(x))
            vars = free_vars(x)
            form = canonical_quasi_affine(x, vars)
            if form is not None and form is not out and len(post_order(form)) < size:
                out, size = form, len(post_order(form))
            # SymPy's form is kept only when smaller still: not asked when it cannot be
            bound = expanded_size_bound(x)
            form = canonical_index(x) if bound is None or bound < size else None
            if form is not None and form is not out and len(post_order(form)) < size:
                out, size = form, len(post_order(form))
            _remember_form(x, out)
        elif x.args:
            out = x.with_args(tuple(top(a) for a in x.args))
        else:
            out = x
        memo[id(x)] = (x, out)  # x stays alive: its id is not reused
        return out

    return top(e)


#: index tree (its id) -> (a weak reference to it, its clean form or None for itself),
#: across calls: interned nodes recur between rounds and gradients. The tree is held
#: weakly (its entry goes when it dies) and an index tree loads nothing, so no entry
#: keeps a tensor or its graph alive; it was a memo of every node of every body
#: cleaned, loads included, which kept each simplified graph alive until 100,000
#: entries had piled up (issue 52). Bounded all the same
_MEMO = {}
_MEMO_LIMIT = 100_000


def _known_form(x):
    """The clean form of the index tree ``x`` remembered across calls, or None."""
    hit = _MEMO.get(id(x))
    if hit is None or hit[0]() is not x:
        return None
    return x if hit[1] is None else hit[1]


def _remember_form(x, out):
    key = id(x)

    def forget(ref, memo=_MEMO):  # (bound now: at interpreter exit the global is None)
        hit = memo.get(key)
        if hit is not None and hit[0] is ref:
            memo.pop(key, None)

    if len(_MEMO) > _MEMO_LIMIT:
        _MEMO.clear()
    # the form is smaller than x, so it does not hold x: x dies with its graph
    _MEMO[key] = (weakref.ref(x, forget), None if out is x else out)


def algebraic_cleanup(tensors):
    """Canonical forms of integer index arithmetic (ISL and SymPy)."""
    memo = {}  # this call's: every node visited, kept alive while it runs

    def fn(op, _orig, _tmap):
        if isinstance(op, ComputeOp):
            body = tuple(_clean_expr(b, memo) for b in op.body)
            if all(a is b for a, b in zip(body, op.body)):
                return None
            return ComputeOp(op.name, op.axis, body, op.tag, op.attrs).outputs
        if isinstance(op, ScatterAddOp):
            idx = tuple(_clean_expr(i, memo) for i in op.indices)
            value, where = _clean_expr(op.value, memo), _clean_expr(op.where, memo)
            if all(a is b for a, b in zip(idx, op.indices)) and value is op.value \
                    and where is op.where:
                return None
            return ScatterAddOp(op.name, op.shape, op.dtypes[0], op.axis, idx, value, where,
                                op.init).output(0)
        return None

    return rebuild(tensors, fn)


_CANON = {}


def _canon_var(pos, v, kind):
    key = (pos, v.dom, kind)
    c = _CANON.get(key)
    if c is None:
        c = iter_var(v.dom[0], v.dom[1], f"c{kind[0]}{pos}", kind)
        _CANON[key] = c
    return c


def stage_key(op):
    """A hashable key equal for two stages with the same definition."""
    if isinstance(op, ComputeOp):
        mapping = {a: _canon_var(d, a, "spatial") for d, a in enumerate(op.axis)}
        if isinstance(op.body[0], Reduce):
            mapping.update({a: _canon_var(d, a, "reduce") for d, a in enumerate(op.body[0].axes)})
        body = tuple(substitute(b, mapping) for b in op.body)
        return ("compute", op.shape, op.dtypes, tuple(id(b) for b in body), body)
    if isinstance(op, ScatterAddOp):
        mapping = {a: _canon_var(d, a, "spatial") for d, a in enumerate(op.axis)}
        parts = tuple(substitute(x, mapping) for x in op.indices + (op.value, op.where))
        return ("scatter", op.shape, op.dtypes, id(op.init), tuple(id(p) for p in parts), parts)
    if isinstance(op, ScanOp):
        return scan_key(op)
    return None


def scan_key(op):
    """A hashable key equal for two scans with the same definition: the same inits
    and external inputs (by identity) and the same body (printed canonically)."""
    from texpr.printer import _Names, _stage_str

    names = _Names(canonical=True)
    for s in op.state_placeholder:
        names.tensor(s)
    text = "\n".join(_stage_str(b.output(0), names) for b in op.body_ops)
    ext = tuple(sorted((names.tensors[id(t)], id(t)) for t in op.externals
                       if id(t) in names.tensors))
    updates = tuple(names.tensor(u) for u in op.update)
    return ("scan", op.shapes, op.dtypes, op.init_extent, tuple(id(t) for t in op.init), ext,
            updates, text, op)


def _canonical_reduce(op, value_index=0):
    """(source, where) of a reduction stage with its axes renamed canonically."""
    red = op.body[0]
    mapping = {a: _canon_var(d, a, "spatial") for d, a in enumerate(op.axis)}
    mapping.update({a: _canon_var(d, a, "reduce") for d, a in enumerate(red.axes)})
    return (substitute(red.source[value_index], mapping), substitute(red.where, mapping))


def _extreme_key(op):
    """A key shared by a ``max``/``min`` stage and the argmax/argmin stage over the
    same source (whose value component is that maximum), else None."""
    if not isinstance(op, ComputeOp) or not isinstance(op.body[0], Reduce):
        return None
    comb = op.body[0].combiner
    if op.num_outputs == 1 and comb.kind in ("max", "min"):
        kind = comb.kind
    elif op.tag == "argmax" and op.num_outputs == 2 and comb.name in ("argmax", "argmin"):
        kind = comb.name[3:]
    else:
        return None
    src, where = _canonical_reduce(op)
    return (kind, op.shape, op.dtypes[0], id(src), id(where)), (src, where)


def eliminate_common_stages(tensors):
    """Merge stages with identical definitions; a ``max``/``min`` stage whose
    argmax stage is computed anyway reads its value component instead (one pass
    over the windows, not two)."""
    from texpr.tensor import PlaceholderOp, topo_order

    from .graph import _remapped

    ops = [op for op in topo_order(tensors) if not isinstance(op, PlaceholderOp)]
    args = {}
    for op in ops:
        k = _extreme_key(op)
        if k is not None and op.num_outputs == 2:
            args.setdefault(k[0], (op, k[1]))
    seen = {}
    built = {}  # id(orig argmax op) -> its rebuilt op

    def fn(op, orig, tmap):
        if id(orig) in built:
            return built[id(orig)].outputs
        k = _extreme_key(orig)
        if k is not None and orig.num_outputs == 1 and k[0] in args:
            arg = args[k[0]][0]
            new_arg = _remapped(arg, tmap)
            built[id(arg)] = new_arg
            return new_arg.output(0)
        key = stage_key(op)
        if key is None:
            return None
        kk = key[:-1]
        hit = seen.get(kk)
        if hit is not None and hit[0] is not op:
            return hit[0].outputs
        seen[kk] = (op, key)  # the key's expressions stay alive while their ids are used
        return None

    return rebuild(tensors, fn)
