"""Tests of a scan's step that every step passes (or fails): constants in its body.

A scan body's stages are evaluated at the steps ``L <= t < T`` only
(:mod:`texpr.scan`: ``L`` steps come from the init), each at its own step ``t``,
its leading axis. A comparison of the step alone -- both sides affine in ``t``,
such as ``t >= 1`` -- is monotone in ``t``, so it holds at every one of those
steps when it holds at ``L`` and at ``T - 1``; it is then the constant ``True``
there (likewise ``False``), and the ``&&`` / ``||`` above it folds.

The reverse scan of an adjoint keeps the guard ``tau >= 1`` that its body never
fails (its init is step 0). The simplifier writes such a conjunct into each
disjunct of a reduction's ``where=`` (``tau >= 1 && r == j || tau >= 1 && r + 8 ==
j``, the LSTM gate adjoint's), where ISL sees a union of pieces with a test per
point instead of the equalities alone. The scan-body simplification
(:mod:`texpr.simplify.scan_body`) folds these tests after each round of its
passes; the scan's lowering folds them again in the step it emits
(:mod:`codegen.loopnest.scan_lower`).
"""

from texpr import expr as E
from texpr.scan import affine_in
from texpr.tensor import ComputeOp
from texpr.visitor import transform

from .graph import rebuild

__all__ = ["fold_step_tests", "fold_body_step_tests"]

_COMPARE = {E.GE: lambda x, y: x >= y, E.GT: lambda x, y: x > y,
            E.LE: lambda x, y: x <= y, E.LT: lambda x, y: x < y}


def fold_step_tests(e, tv, L, T):
    """``e`` with each comparison of the step ``tv`` alone that holds, or fails, at every
    step ``L <= tv < T`` replaced by its constant, and the ``&&`` / ``||`` above it
    folded.

    Args:
        e: an expression (a stage's body, under which ``tv`` is the step).
        tv: the step variable (the stage's leading axis).
        L, T: the first step and the step count (ints, ``L < T``).
    Returns:
        the folded expression (``e`` itself when nothing folds).
    """
    def fn(node):
        cmp = _COMPARE.get(type(node))
        if cmp is not None:
            x, y = affine_in(node.args[0], tv), affine_in(node.args[1], tv)
            if x is None or y is None or (x[0] == 0 and y[0] == 0):
                return None
            ends = {cmp(x[0] * t + x[1], y[0] * t + y[1]) for t in (L, T - 1)}
            return E.const(ends.pop(), "bool") if len(ends) == 1 else None
        if isinstance(node, E.And):
            return E.logical_and(*node.args)
        if isinstance(node, E.Or):
            return E.logical_or(*node.args)
        return None

    return transform(e, fn)


def fold_body_step_tests(updates, L, T):
    """The body graph of a scan (its updates, reading placeholders only) with the step
    tests of every stage folded (:func:`fold_step_tests`).

    Args:
        updates: the update Tensors of a scan body whose external inputs are
            placeholders (every compute stage of the graph is a body stage).
        L, T: the scan's init extent and time extent.
    Returns:
        list of Tensors, equal to ``updates`` at every step ``L <= t < T``.
    """
    if L >= T:
        return list(updates)

    def fn(op, _orig, _tmap):
        if not isinstance(op, ComputeOp) or not op.axis or op.axis[0].dom != (0, T):
            return None
        tv = op.axis[0]
        body = tuple(fold_step_tests(e, tv, L, T) for e in op.body)
        if all(x is y for x, y in zip(body, op.body)):
            return None
        return ComputeOp(op.name, op.axis, body, op.tag, op.attrs).outputs

    return rebuild(list(updates), fn)
