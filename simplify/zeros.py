"""Symbolic zeros made explicit: ``select(c, a, 0) * b`` becomes ``select(c, a * b, 0)``.

The simplifier reads a ``select(c, v, 0)`` factor as a *symbolic* zero: where
``c`` fails the product is 0, even if the other factor is inf or NaN
(docs/conventions.md, "Zeros"). Lifting writes that reading into a sum's
domain; everywhere else the product stays as written, and ``te.evaluate`` and
the kernels compute it in IEEE arithmetic: ``0 * NaN = NaN``. Where such a
value feeds a decision -- the maximum of a ``max`` reduction and its argmax, a
comparison in a select -- the choice was made on the IEEE value while the
derivative of the chosen term was read symbolically: neither the unsimplified
graph's IEEE gradient nor its symbolic one (fuzz seed 7001702771: a max whose
terms are ``select(valid, G[..], 0) * f(Y[..])`` with a NaN in ``Y``; the
argmax fell on a symbolically zero term, whose derivative is 0, where the
symbolic reading picks the next term, whose derivative is -0.25).

:func:`explicit_zero_products` rewrites every float product and quotient with a
``select(c, a, 0)`` operand, in every stage, so that the evaluator and the
kernels compute the symbolic reading itself: ``select(c, a * b, 0)``,
``select(c, a / b, 0)`` (the other operand is not evaluated where ``c``
fails). A zero the user wrote as a number (``x * 0.0``) is not a select and
keeps its IEEE meaning.
"""

from texpr import dtypes as dt
from texpr import expr as E
from texpr.tensor import ComputeOp, ScatterAddOp
from texpr.visitor import transform

from .graph import rebuild

__all__ = ["explicit_zero_products", "explicit_zeros"]


def _zero_select(e):
    """``e`` is ``select(c, a, 0)`` (a numeric zero on the false side)."""
    f = e.false_value if isinstance(e, E.Select) else None
    return (f is not None and isinstance(f, E.Const) and not isinstance(f.value, bool)
            and f.value == 0)


def _push(node):
    """``node`` with a select-zero operand of a float product or quotient lifted
    over it (recursively into the new product), or None when nothing changes."""
    if not dt.is_float(node.dtype):
        return None
    if isinstance(node, E.Mul):
        a, b = node.a, node.b
        if _zero_select(a):
            return _guarded(a.cond, E.mul(a.true_value, b), node.dtype)
        if _zero_select(b):
            return _guarded(b.cond, E.mul(a, b.true_value), node.dtype)
    elif isinstance(node, E.Div) and _zero_select(node.a):
        return _guarded(node.a.cond, E.div(node.a.true_value, node.b), node.dtype)
    return None


def _guarded(cond, inner, dtype):
    """``select(cond, inner, 0)``, ``inner`` rewritten again (it may hold another
    select-zero operand)."""
    pushed = _push(inner) if isinstance(inner, (E.Mul, E.Div)) else None
    return E.select(cond, inner if pushed is None else pushed, E.const(0, dtype))


def explicit_zeros(e):
    """``e`` (an Expr or a tuple of Exprs) with every float ``select(c, a, 0) * b``
    (either order) and ``select(c, a, 0) / b`` written ``select(c, a * b, 0)``,
    ``select(c, a / b, 0)``."""
    return transform(e, _push)


def explicit_zero_products(tensors):
    """The pass: :func:`explicit_zeros` on every compute stage's body and every
    scatter-add's value. Values are unchanged where every factor is finite;
    where one is inf or NaN under a failing condition the stage now computes
    the symbolic zero (see the module docstring)."""

    def fn(op, _orig, _tmap):
        if isinstance(op, ComputeOp):
            body = explicit_zeros(tuple(op.body))
            if all(a is b for a, b in zip(body, op.body)):
                return None
            new = ComputeOp(op.name, op.axis, body, op.tag, op.attrs)
            return new.outputs if len(new.outputs) > 1 else new.output(0)
        if isinstance(op, ScatterAddOp):
            value = explicit_zeros(op.value)
            if value is op.value:
                return None
            return ScatterAddOp(op.name, op.shape, op.dtypes[0], op.axis, op.indices, value,
                                op.where, op.init).output(0)
        return None

    return rebuild(tensors, fn)
