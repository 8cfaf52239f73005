"""The derivative rules: one table from every expression kind to its rule.

Each rule is forward-mode (a JVP rule, as JAX's ``defjvp``): given a node and
the *tangents* of its children, it returns the node's tangent. A structurally
zero tangent is ``None`` (a *symbolic zero*): rules skip ``None`` terms, so a
derivative that is zero by construction is never built, and no rule forms
``0 + x`` or ``x * 0``. :func:`jvp` drives the table over an expression.

:data:`RULES` is the one table: it maps every kind of
:data:`texpr.expr.KINDS` and every intrinsic name of
:data:`texpr.expr.INTRINSICS` (the rows ``Call`` dispatches to) to a rule
``rule(node, tangents) -> tangent or None``. ``tests/test_rules.py`` asserts
that the table is complete and checks every rule alone against central
finite differences.

Declared zero (piecewise constant or integer valued): constants, variables,
comparisons, ``&&``/``||``/``!``, ``//`` (float ``//`` is a floor), casts to
int or bool, every integer- or bool-valued node (integer loads included: a
data-dependent index has no derivative), and the intrinsics ``floor``,
``ceil``, ``round``, ``trunc``. Float ``%`` is *not* piecewise constant:
``d(a % b) = da - db * floor(a / b)``.

Conventions where the derivative does not exist:

* ``max(a, b)`` (elementwise): ``a > b`` gives ``a`` the whole tangent, ``a < b``
  gives it to ``b``, and a tie (or a NaN operand) gives each half, as JAX and
  PyTorch do; ``min(a, b)`` likewise. So ``max(x, 0)`` has derivative 0.5 at
  ``x == 0`` (``te.nn.relu``, a ``select``, has 0 there), and ``max(a, b) +
  min(a, b)`` has derivative 1 in each operand at a tie.
* ``select(c, a, b)`` -> ``select(c, da, db)``: the untaken branch's derivative is
  never evaluated, let alone multiplied by 0, so its inf/NaN cannot leak
  (bug case C10; docs/conventions.md).
* ``sqrt``: the derivative at ``x == 0`` is **0** (``select(x == 0, 0, dx / (2 sqrt x))``),
  the minimum-norm subgradient of ``|v| = sqrt(v.v)`` at 0; it makes
  ``sqrt(sum x^2)^2`` have gradient 0 at x = 0 (bug cases C11B/C).
* ``power(a, b)``: ``d/da = b * a^(b-1)``, taken as 0 where ``b == 0`` (``a^0`` is
  constant; avoids ``0 * inf`` at ``a == 0``); ``d/db = a^b * log(a)``, taken as 0
  where ``a == 0`` (``0^b = 0`` is constant for ``b > 0``; bug case C11A). For
  ``a < 0`` ``log(a)`` is NaN, as in PyTorch.
* ``abs``: derivative ``sign(x)``, 0 at ``x == 0`` (as PyTorch).

:class:`~texpr.expr.Load` and :class:`~texpr.expr.Reduce` are structural:
a load's tangent is *seeded* by the caller (:mod:`texpr.jacobian` seeds each
load of the tensor being differentiated; indices are integers, so any other
load has a zero tangent), and reductions -- which by the compute invariant
appear only at the top of a stage's body -- are differentiated per stage by
the reduction rules of :mod:`texpr.jacobian` (``REDUCTION_RULES``).
"""

import math

from . import dtypes as dt
from .errors import TexprError
from .expr import (Add, And, Call, Cast, Const, Div, EQ, Expr, FloorDiv, FloorMod, GE, GT,
                   INTRINSICS, IterVar, KINDS, LE, LT, Load, Max, Min, Mul, NE, Not, Or, Reduce,
                   Select, Sub, Var, call, cast, const, select)
from .visitor import post_order

# ---- symbolic-zero arithmetic -----------------------------------------------------


def t_add(a, b):
    """``a + b`` of tangents, ``None`` being zero."""
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def t_neg(a):
    """``-a`` of a tangent."""
    return None if a is None else -a


def t_sub(a, b):
    """``a - b`` of tangents."""
    return t_add(a, t_neg(b))


def t_scale(a, factor):
    """``a * factor``: ``a`` a tangent (``None`` stays ``None``), ``factor`` any expression."""
    return None if a is None else a * factor


def t_select(cond, a, b, dtype):
    """``select(cond, a, b)`` of tangents; ``None`` when both are zero."""
    if a is None and b is None:
        return None
    zero = const(0, dtype)
    return select(cond, zero if a is None else a, zero if b is None else b)


def _fit(t, node):
    """Cast a tangent to the node's dtype (tangents have the dtype of their primal)."""
    if t is None:
        return None
    if isinstance(t, Const) and t.value == 0:
        return None
    return t if t.dtype == node.dtype else cast(t, node.dtype)


# ---- rules for the expression kinds -----------------------------------------------


def _zero(node, tangents):
    return None


def _add(node, tangents):
    return t_add(*tangents)


def _sub(node, tangents):
    return t_sub(*tangents)


def _mul(node, tangents):
    a, b = node.args
    da, db = tangents
    return t_add(t_scale(da, b), t_scale(db, a))


def _div(node, tangents):
    # d(a / b) = (da - (a / b) db) / b
    a, b = node.args
    da, db = tangents
    num = t_sub(da, t_scale(db, node))
    return None if num is None else num / b


def _floormod(node, tangents):
    # float a % b = a - b * floor(a / b), floor piecewise constant
    a, b = node.args
    da, db = tangents
    if not dt.is_float(node.dtype):
        return None
    return t_sub(da, t_scale(db, call("floor", a / b)))


def _balanced(wins_a, wins_b, tangents, dtype):
    """Tangent of an elementwise max or min: ``a``'s where ``wins_a``, ``b``'s where
    ``wins_b``, half of each elsewhere (a tie, or a NaN operand).

    The even split is JAX's and PyTorch's rule for ``maximum``/``minimum``; it keeps
    compositions that are smooth through a tie exact there: ``max(a, b) + min(a, b)``
    (that is ``a + b``) has derivative 1 in each operand at ``a == b``, and a
    log-sum-exp written with ``max`` gets ``0.5`` each, not ``1`` and ``0``.
    """
    ta, tb = tangents
    half = t_scale(t_add(ta, tb), const(0.5, dtype))
    return t_select(wins_a, ta, t_select(wins_b, tb, half, dtype), dtype)


def _max(node, tangents):
    a, b = node.args
    return _balanced(a > b, a < b, tangents, node.dtype)


def _min(node, tangents):
    a, b = node.args
    return _balanced(a < b, a > b, tangents, node.dtype)


def _select(node, tangents):
    return t_select(node.args[0], tangents[1], tangents[2], node.dtype)


def _cast(node, tangents):
    d = tangents[0]
    if d is None or not dt.is_float(node.dtype):
        return None
    return cast(d, node.dtype)


def _call(node, tangents):
    # intrinsics have their own rows in the table, keyed by name
    return RULES[node.name](node, tangents)


def _load(node, tangents):
    # seeds come from the caller (texpr.jacobian); indices are integers
    return None


def _reduce(node, tangents):
    from .printer import expr_str

    raise TexprError(
        f"a reduction `{expr_str(node)}` below the top of a stage's body reached the "
        "derivative rules; reductions are differentiated per stage by "
        "texpr.jacobian.REDUCTION_RULES (te.compute lifts nested reductions into stages)")


# ---- rules for the intrinsics -----------------------------------------------------


def _exp(node, tangents):
    return t_scale(tangents[0], node)


def _log(node, tangents):
    d = tangents[0]
    return None if d is None else d / node.args[0]


def _sqrt(node, tangents):
    (x,), (d,) = node.args, tangents
    if d is None:
        return None
    return select(x == 0, const(0, node.dtype), d / (2.0 * node))


def _rsqrt(node, tangents):
    # x^(-1/2) -> -1/2 x^(-3/2) = -1/2 rsqrt(x)^3
    return t_scale(tangents[0], -0.5 * node * node * node)


def _tanh(node, tangents):
    return t_scale(tangents[0], 1.0 - node * node)


def _sigmoid(node, tangents):
    return t_scale(tangents[0], node * (1.0 - node))


def _abs(node, tangents):
    (x,), (d,) = node.args, tangents
    if d is None or not dt.is_float(node.dtype):
        return None
    return select(x > 0, d, select(x < 0, -d, const(0, node.dtype)))


def _sin(node, tangents):
    return t_scale(tangents[0], call("cos", node.args[0]))


def _cos(node, tangents):
    return t_neg(t_scale(tangents[0], call("sin", node.args[0])))


def _erf(node, tangents):
    x = node.args[0]
    return t_scale(tangents[0], (2.0 / math.sqrt(math.pi)) * call("exp", -(x * x)))


def _power(node, tangents):
    a, b = node.args
    da, db = tangents
    zero = const(0, node.dtype)
    term_a = None
    if da is not None:
        if isinstance(b, Const):
            bv = b.value
            if bv == 0:
                term_a = None
            elif bv == 1:
                term_a = da
            elif bv == 2:
                term_a = da * (2.0 * a)
            else:
                term_a = da * (bv * call("power", a, const(bv - 1, b.dtype)))
        else:
            term_a = select(b == 0, zero, da * (b * call("power", a, b - 1)))
    term_b = None
    if db is not None:
        term_b = select(a == 0, zero, db * (node * call("log", a)))
    return t_add(term_a, term_b)


#: THE table: expression kind, or intrinsic name (for Call nodes), ->
#: rule(node, tangents) -> tangent or None
RULES = {
    Const: _zero, Var: _zero, IterVar: _zero,
    Add: _add, Sub: _sub, Mul: _mul, Div: _div,
    FloorDiv: _zero, FloorMod: _floormod,
    Min: _min, Max: _max,
    EQ: _zero, NE: _zero, LT: _zero, LE: _zero, GT: _zero, GE: _zero,
    And: _zero, Or: _zero, Not: _zero,
    Select: _select, Cast: _cast, Call: _call,
    Load: _load, Reduce: _reduce,
    # intrinsics (dispatched from Call)
    "exp": _exp, "log": _log, "sqrt": _sqrt, "rsqrt": _rsqrt, "tanh": _tanh,
    "sigmoid": _sigmoid, "abs": _abs, "power": _power, "sin": _sin, "cos": _cos,
    "erf": _erf,
    # piecewise constant: declared zero
    "floor": _zero, "ceil": _zero, "round": _zero, "trunc": _zero,
    # a constant to differentiation by definition
    "stop_gradient": _zero,
}

assert set(RULES) == set(KINDS) | set(INTRINSICS), "every kind and intrinsic needs a rule"


def jvp(root, seeds):
    """Forward-mode derivative (tangent) of the expression ``root``.

    Args:
        root: an Expr without reductions (a stage body's source or an
            elementwise body).
        seeds: dict ``{node: tangent Expr}``: the tangents of chosen
            subexpressions (typically loads of the tensor being differentiated,
            or a combiner's variables); every other leaf has tangent zero.
    Returns:
        The tangent of ``root`` (an Expr of ``root``'s dtype), or ``None`` when it
        is structurally zero. Integer- and bool-valued nodes always have a zero
        tangent.
    Raises:
        TexprError: a seeded tangent reaches a reduction inside ``root``.
    """
    by_id = {id(k): v for k, v in seeds.items()}
    tangent = {}
    for node in post_order(root):
        seed = by_id.get(id(node))
        if seed is not None:
            tangent[id(node)] = _fit(seed, node) if dt.is_float(node.dtype) else None
            continue
        if not dt.is_float(node.dtype):
            tangent[id(node)] = None
            continue
        kids = [tangent[id(c)] for c in node.args]
        if all(k is None for k in kids):
            tangent[id(node)] = None
            continue
        tangent[id(node)] = _fit(RULES[type(node)](node, kids), node)
    return tangent[id(root)]


def partial(root, wrt):
    """``d root / d wrt`` for a subexpression ``wrt`` of ``root`` (``None`` if zero)."""
    if not isinstance(wrt, Expr):
        raise TexprError(f"partial: expected an expression to differentiate by, got {wrt!r}")
    return jvp(root, {wrt: const(1, wrt.dtype if dt.is_float(wrt.dtype) else dt.DEFAULT_FLOAT)})
