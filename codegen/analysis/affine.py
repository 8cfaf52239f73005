"""Index expressions proved affine over an iteration box, and loads addressed by them.

One job: integer index arithmetic over axes. :func:`eval_int` and
:func:`eval_cond` evaluate an index expression and a condition on them
exactly at one point; :func:`affine_form` proves (with isl) that an integer
index expression equals ``const + sum(coef * axis)`` over a box of axes, from
its values at the
box's corner and one step along each axis (both live in
:mod:`texpr.simplify.affine_index`, which the materialisation policy shares);
:func:`affine_offsets` uses it for
the loads of a loop nest whose row-major offset is affine although their
indices are not (a flatten or reshape: ``X[i, k // 49, k // 7 % 7, k % 7]`` is
``X.reshape(-1)[784 i + k]``), so that the loop nest computes one affine
offset instead of floor divisions and remainders per element. The
contraction matcher (:mod:`codegen.analysis.contraction`) uses the same proof for its
operands' strided views.
"""

import numpy as np

from texpr import expr as E
from texpr.errors import TexprError
from texpr.simplify.affine_index import affine_form, eval_int, flat_offset
from texpr.simplify.isl_bridge import isl
from texpr.triangles import linear_form
from texpr.visitor import post_order

__all__ = ["affine_form", "affine_offsets", "eval_int", "eval_cond", "linear_coefs"]


def linear_coefs(e):
    """``({id(var): coef}, const)`` when the int expression ``e`` is written as a sum
    of constant multiples of variables (no proof needed: affine as written), else
    None. The syntactic form of :func:`texpr.triangles.linear_form`, keyed by id."""
    f = linear_form(e)
    if f is None:
        return None
    coefs, const = f
    return {k: c for k, (_, c) in coefs.items()}, const


def eval_cond(c, env):
    """The value of a condition over integer index arithmetic (comparisons of
    :func:`eval_int` expressions, ``&&``, ``||``, ``!``, constants) at ``env``
    (id(Var) -> int), a bool; None where it is anything else (a load, a float)."""
    if isinstance(c, E.Const) and isinstance(c.value, (bool, np.bool_)):
        return bool(c.value)
    if isinstance(c, (E.And, E.Or)):
        a = eval_cond(c.a, env)
        if a is None:
            return None
        if isinstance(c, E.And) != a:  # False && ..., True || ...
            return a
        return eval_cond(c.b, env)
    if isinstance(c, E.Not):
        a = eval_cond(c.args[0], env)
        return None if a is None else not a
    if isinstance(c, E.CmpOp):
        a, b = eval_int(c.a, env), eval_int(c.b, env)
        if a is None or b is None:
            return None
        return {E.EQ: a == b, E.NE: a != b, E.LT: a < b, E.LE: a <= b, E.GT: a > b,
                E.GE: a >= b}.get(type(c))
    return None


def affine_offsets(exprs, axes, space, box, skip=()):
    """``{id(load): offset}`` for the loads in ``exprs`` whose row-major offset
    into their tensor is, over ``box``, the affine expression ``offset`` of
    ``axes`` (proved by isl), where an index uses ``//`` or ``%`` (an affine
    index is emitted as it is). ``skip``: ids of loads left alone (those with
    a run-time bounds check). A load whose index reads data, or mentions a
    variable outside ``axes``, is left alone."""
    known = {id(a) for a in axes}
    out = {}
    for e in exprs:
        for n in post_order(e):
            if not isinstance(n, E.Load) or len(n.args) < 2 or id(n) in skip or id(n) in out:
                continue
            nodes = [x for a in n.args for x in post_order(a)]
            if not any(isinstance(x, (E.FloorDiv, E.FloorMod)) for x in nodes):
                continue
            if any(isinstance(x, E.Load) or (isinstance(x, E.Var) and id(x) not in known)
                   for x in nodes):
                continue
            try:
                found = affine_form(flat_offset(n.tensor, n.args), axes, space, box)
            except (TexprError, isl.Error):
                continue
            if found is None:
                continue
            coefs, const = found
            offset = E.const(int(const), "int64")
            for c, a in zip(coefs, axes):
                if c:
                    offset = offset + a * int(c)
            out[id(n)] = offset
    return out
