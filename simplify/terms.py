"""Nonzeroness conditions: an expression as a sum of guarded terms.

:func:`guarded_terms` writes a (float) expression ``e`` as
``sum_t select(c_t, v_t, 0)``, pushing the conditions of ``select(c, v, 0)``
out through ``+``, ``-``, ``*``, ``/`` (numerator), nested selects and casts,
as in TVM's zero elimination (Grechanik, "Automatic differentiation for tensor
expressions", TVM RFC #1996). Conditions are kept as ordered tuples of
conjuncts: a conjunct may guard a load of a later one (``i >= 1 && I[i-1] == j``),
so their relative order is never changed.

Under the convention of symbolic zeros, ``select(c, v, 0) * w`` is zero where
``c`` fails even if ``w`` is infinite there (the raw adjoint's indicators say
"this term does not exist", not "multiply by 0.0"). A zero written as a
constant factor is a number: ``w * 0.0`` and ``0.0 / w`` stay one unguarded
term (IEEE: NaN for a non-finite ``w``), never an empty sum.
"""

from texpr import dtypes as dt
from texpr import expr as E
from texpr.visitor import post_order

#: give up splitting a product when it would have more terms than this
MAX_TERMS = 64


def conjuncts(cond):
    """The conjuncts of a boolean expression, in order (``True`` gives ``()``)."""
    if isinstance(cond, E.Const):
        return () if cond.value else (cond,)
    if isinstance(cond, E.And):
        return conjuncts(cond.a) + conjuncts(cond.b)
    return (cond,)


def conj(parts):
    """``all(parts)`` without duplicates (first occurrence kept)."""
    seen, out = set(), []
    for p in parts:
        for c in conjuncts(p) if isinstance(p, E.Expr) else (p,):
            if id(c) not in seen:
                seen.add(id(c))
                out.append(c)
    return tuple(out)


def all_expr(parts):
    """The conjunction of an iterable of boolean expressions (``te.all``)."""
    return E.all_of(tuple(parts))


def _is_zero(e):
    return isinstance(e, E.Const) and not isinstance(e.value, bool) and e.value == 0


def _literal_float_zero(e):
    """A float constant ``0.0`` (or ``-0.0``), possibly behind casts: multiplying by
    it or dividing it is not 0 for a non-finite operand."""
    while isinstance(e, E.Cast) and dt.is_float(e.dtype):
        e = e.value
    return _is_zero(e) and dt.is_float(e.dtype)


def _false(parts):
    """Whether the conjunction of ``parts`` is false as written: a ``False`` conjunct,
    or a conjunct next to its own negation (``c && !c``: the product of
    ``select(c, a, b)`` with ``select(c, a', b')`` pairs the branches; its two
    mixed terms can never hold, and keeping them doubled the terms at every
    level of a chain of selects)."""
    ids = {id(c) for c in parts}
    return any((isinstance(c, E.Const) and c.value is False)
               or (isinstance(c, E.Not) and id(c.a) in ids) for c in parts)


_COMPARISONS = (E.EQ, E.NE, E.LT, E.LE, E.GT, E.GE)


def _value_condition(c):
    """Whether ``c`` only compares float values (data, never an index: ISL and the
    equality solver have nothing to take from it)."""
    if isinstance(c, E.Not):
        return _value_condition(c.a)
    if isinstance(c, (E.And, E.Or)):
        return _value_condition(c.a) and _value_condition(c.b)
    return isinstance(c, _COMPARISONS) and dt.is_float(c.a.dtype)


def _loads(c):
    """Whether ``c`` reads a tensor (a load may leave its tensor, at a data index or
    an affine one, wherever the conditions that guarded it fail)."""
    return any(isinstance(n, E.Load) for n in post_order(c))


def evaluated_everywhere(e, given=()):
    """The ids of the nodes of ``e`` evaluated wherever ``e`` is and the conditions
    ``given`` (ids) hold: not those inside a select's branch whose condition is not
    given (the true branch needs the condition, the false one its negation), nor
    behind a short-circuit (``&&``'s, ``||``'s second operand)."""
    given = set(given)
    out, stack = set(), [e]
    while stack:
        x = stack.pop()
        if id(x) in out:
            continue
        out.add(id(x))
        if isinstance(x, E.Select):
            stack.append(x.cond)
            if id(x.cond) in given:
                stack.append(x.true_value)
            if ("not", id(x.cond)) in given:
                stack.append(x.false_value)
        elif isinstance(x, E.And):
            stack.append(x.a)
            if _holds(x.a, given):
                stack.append(x.b)
        elif isinstance(x, E.Or):
            stack.append(x.a)
        else:
            stack.extend(x.args)
    return out


def _holds(c, given):
    """Whether ``c`` holds wherever the conditions ``given`` (ids) do, as written:
    ``c`` given, or a conjunction of given conditions."""
    if isinstance(c, E.And):
        return _holds(c.a, given) and _holds(c.b, given)
    return id(c) in given


def hoistable(conds, e):
    """The conditions of ``conds`` (in order) that may be tested in front of ``e``, in
    order: each that loads is reached in ``e`` wherever the ones accepted before
    it hold (a load in a select's branch may read outside its tensor where the
    branch's conditions fail: attack helpers 20 and 22). Load-free conditions
    always are."""
    if not any(_loads(c) for c in conds):
        return list(conds)
    out, given, reached = [], set(), None
    for c in conds:
        base = c.a if isinstance(c, E.Not) else c
        if _loads(c):
            if reached is None:  # (walked again only once ``given`` has grown)
                reached = evaluated_everywhere(e, given)
            if id(base) not in reached:
                continue
        out.append(c)
        given.add(("not", id(c.a)) if isinstance(c, E.Not) else id(c))
        reached = None
    return out


def _compact(x, terms):
    """``terms`` of ``x``, or ``[(common, x)]`` when value conditions are all that tell them apart.

    ``common`` is the conjuncts every term has: then ``x == select(all(common), x, 0)``
    exactly, and splitting ``x`` further only separates comparisons of float
    values, which ISL and the equality solver cannot use. Kept split, such terms
    multiply at every level of a chain: the derivative of six piecewise
    activations behind a guarded gather (fuzz seed 7016100177) became 72 terms
    and a 439 KB unit that numba compiled for 6 minutes; compact, it stays as
    written, its index conditions still lifted."""
    if len(terms) < 2:
        return terms
    common = set.intersection(*({id(c) for c in cs} for cs, _v in terms))
    rest = [c for cs, _v in terms for c in cs if id(c) not in common]
    if not rest or not all(_value_condition(c) for c in rest):
        return terms
    # (a condition that loads, tested by ``x`` only inside a branch, stays inside)
    return [(tuple(hoistable([c for c in terms[0][0] if id(c) in common], x)), x)]


def guarded_terms(e):
    """``e`` as a list of ``(conjuncts, value)`` with ``e == sum select(all(c), v, 0)``.

    Only float and int arithmetic is split; anything else is one term with no
    condition. Values keep ``e``'s dtype (casts are inserted where needed).
    """
    memo = {}

    def go(x):
        hit = memo.get(id(x))
        if hit is None:
            hit = _compact(x, _go(x))
            memo[id(x)] = hit
        return hit

    def _go(x):
        if _is_zero(x):
            return []
        if isinstance(x, E.Select):
            c = x.cond
            if _value_condition(c) and not _is_zero(x.true_value) and not _is_zero(x.false_value):
                # a choice between two values by comparing floats: splitting it brings
                # no zero to lift and no index condition to solve, unless a branch
                # holds one; it only multiplies the terms (a chain of d such selects
                # in one body gave 2^d terms, each repeating every level)
                branches = go(x.true_value) + go(x.false_value)
                if all(_value_condition(cj) for cs, _v in branches for cj in cs):
                    return [((), x)]
            out = []
            for cs, v in _whole(go(x.true_value), x.true_value):
                parts = conj((c,) + cs)
                if not _false(parts):
                    out.append((parts, v))
            if not _is_zero(x.false_value):
                nc = E.logical_not(c)
                for cs, v in _whole(go(x.false_value), x.false_value):
                    parts = conj((nc,) + cs)
                    if not _false(parts):
                        out.append((parts, v))
            return out
        if isinstance(x, (E.Add, E.Sub)) and x.dtype not in ("bool",):
            ta, tb = go(x.a), go(x.b)
            if isinstance(x, E.Sub):
                tb = [(c, E.sub(E.const(0, v.dtype), v)) for c, v in tb]
            return [(c, _to(v, x.dtype)) for c, v in ta + tb]
        if isinstance(x, E.Mul):
            ta, tb = _whole(go(x.a), x.a), _whole(go(x.b), x.b)
            if (not ta and _literal_float_zero(x.a)) or (not tb and _literal_float_zero(x.b)):
                # ``w * 0.0`` is NaN for an infinite or NaN ``w`` (IEEE): a zero the
                # user wrote is a number, not a symbolic zero
                return [((), x)]
            if not ta or not tb:
                return []
            if len(ta) * len(tb) > MAX_TERMS:
                return [((), x)]
            out = []
            for ca, va in ta:
                for cb, vb in tb:
                    parts = conj(ca + cb)
                    if not _false(parts):
                        out.append((parts, _to(E.mul(va, vb), x.dtype)))
            return out
        if isinstance(x, E.Div):
            if _literal_float_zero(x.a):
                return [((), x)]  # 0.0 / w is NaN where w is 0 or NaN
            return [(c, _to(E.div(v, x.b), x.dtype)) for c, v in go(x.a)]
        if isinstance(x, E.Cast):
            if x.value.dtype == "bool":
                return [((x.value,), E.const(1, x.dtype))]
            return [(c, E.cast(v, x.dtype)) for c, v in go(x.value)]
        return [((), x)]

    return go(e)


def _unguarded(terms):
    return all(not cs for cs, _ in terms)


def _whole(terms, x):
    """``x``'s terms with those of equal conditions summed into one (``x`` itself
    when none has a condition): a product is never distributed over a sum whose
    terms share their condition. ``w * (1 - t)`` is not ``w - w * t`` in IEEE
    arithmetic: for an infinite ``w`` the first is +-inf (NaN only where
    ``1 - t`` is), the second NaN (fuzz seed 7000001231, tanh's derivative)."""
    if len(terms) > 1 and _unguarded(terms):
        return [((), x)]
    if len(terms) > 1:
        return group_terms(terms)
    return terms


def _to(v, dtype):
    return v if v.dtype == dtype else E.cast(v, dtype)


def group_terms(terms):
    """Merge terms with the same set of conjuncts: ``[(conjuncts, value)]`` in first-seen order."""
    groups, order = {}, []
    for cs, v in terms:
        key = frozenset(id(c) for c in cs)
        if key in groups:
            c0, v0 = groups[key]
            groups[key] = (c0, E.add(v0, v))
        else:
            groups[key] = (cs, v)
            order.append(key)
    return [groups[k] for k in order]


def rebuild_sum(terms, dtype):
    """``sum select(all(c), v, 0)`` of a term list (0 when empty)."""
    out = None
    for cs, v in terms:
        c = all_expr(cs)
        t = E.select(c, v, E.const(0, v.dtype)) if not (isinstance(c, E.Const) and c.value) else v
        out = t if out is None else E.add(out, t)
    if out is None:
        return E.const(0, dtype)
    return _to(out, dtype)
