"""Integer index expressions evaluated exactly, and proved affine over a box.

One job: integer index arithmetic over axes, shared by the materialisation
policy (:mod:`texpr.simplify.materialize`: is a re-indexing a strided view of
its tensor?) and the code generator (``texpr.codegen.analysis.affine``, which
re-exports these: loops addressed by an affine offset, GEMM operands as
strided views). :func:`eval_int` evaluates an index expression exactly at one
point; :func:`affine_form` proves (with isl) that it equals ``const + sum(coef
* axis)`` over a box of axes, from its values at the box's corner and one step
along each axis; :func:`flat_offset` is a load's row-major offset into its
tensor.
"""

import numpy as np

from texpr import expr as E
from texpr.errors import TexprError
from texpr.visitor import post_order

from .isl_bridge import VarSpace, box_set, isl, to_pwaff

__all__ = ["affine_form", "eval_int", "flat_offset", "is_scattered"]


def eval_int(e, env):
    """The value of an integer index expression at ``env`` (id(Var) -> int), Python
    floor semantics; None where it is not plain integer arithmetic."""
    if isinstance(e, E.Const):
        return int(e.value) if isinstance(e.value, (int, np.integer)) and not isinstance(
            e.value, bool) else None
    if isinstance(e, E.Var):
        return env.get(id(e))
    kids = [eval_int(a, env) for a in e.args]
    if any(k is None for k in kids):
        return None
    if isinstance(e, E.Add):
        return kids[0] + kids[1]
    if isinstance(e, E.Sub):
        return kids[0] - kids[1]
    if isinstance(e, E.Mul):
        return kids[0] * kids[1]
    if isinstance(e, E.FloorDiv):
        return None if kids[1] == 0 else kids[0] // kids[1]
    if isinstance(e, E.FloorMod):
        return None if kids[1] == 0 else kids[0] % kids[1]
    if isinstance(e, E.Min):
        return min(kids)
    if isinstance(e, E.Max):
        return max(kids)
    return None


def affine_form(e, axes, space, box):
    """``(coefs, const)`` with ``e == const + sum(coefs[k] * axes[k])`` on ``box``
    (proved by isl), or None. The candidate comes from the values at the box's
    corner and one step along each axis."""
    pa = to_pwaff(e, space)
    if pa is None:
        return None
    base = {id(a): a.dom[0] for a in axes}
    v0 = eval_int(e, base)
    if v0 is None:
        return None
    coefs = []
    for a in axes:
        if a.dom[1] - a.dom[0] < 2:
            coefs.append(0)
            continue
        env = dict(base)
        env[id(a)] = a.dom[0] + 1
        v1 = eval_int(e, env)
        if v1 is None:
            return None
        coefs.append(v1 - v0)
    const = v0 - sum(c * a.dom[0] for c, a in zip(coefs, axes))
    ce = E.const(int(const))
    for c, a in zip(coefs, axes):
        if c:
            ce = ce + a * int(c)
    cand = to_pwaff(ce, space)
    if not pa.ne_set(cand).intersect(box).is_empty():
        return None
    return coefs, const


def flat_offset(tensor, indices):
    """The row-major offset of ``tensor`` at ``indices`` (index expressions)."""
    flat = indices[0]
    for ix, size in zip(indices[1:], tensor.shape[1:]):
        flat = flat * int(size) + ix
    return flat


def is_scattered(tensor, indices, axes):
    """Whether ``tensor`` read at ``indices`` (index expressions over ``axes``, IterVars)
    is read at a row-major offset that is no affine function of ``axes`` although
    the indices divide (``//``, ``%``): a reshape after a transpose (attention's
    heads merged into ``(B*T, C)``), which no strided view of the tensor is. A
    flatten (``X[n, k // 49, k // 7 % 7, k % 7]`` is ``X.reshape(-1)[784 n +
    k]``) is not scattered, nor is an index without division, one that reads
    data or one over other variables (False: nothing is known)."""
    nodes = [n for i in indices for n in post_order(i)]
    if not any(isinstance(n, (E.FloorDiv, E.FloorMod)) for n in nodes):
        return False
    known = {id(a) for a in axes}
    if any(isinstance(n, E.Load) or (isinstance(n, E.Var) and id(n) not in known)
           for n in nodes):
        return False
    try:
        space = VarSpace(axes)
        return affine_form(flat_offset(tensor, indices), axes, space, box_set(space)) is None
    except (TexprError, isl.Error):
        return False
