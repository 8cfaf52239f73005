"""Shared head contractions: one reduction computed once for several factors' adjoints.

When several factors of one product under one sum are differentiated, each
factor's adjoint is the head contracted with the *other* factors. For

    out[r, c] = sum(A[r, k] * B[r, k] * C[r, k, c], axis=k)

the solved adjoints are

    d_A[r, k] = sum(H[r, c] * (B[r, k] * C[r, k, c]), axis=c)
    d_B[r, k] = sum(H[r, c] * (A[r, k] * C[r, k, c]), axis=c)

and each visits the whole ``(r, k, c)`` box. Their factors split in two: the
*free* ones, which no reduction axis reaches (``B[r, k]``, ``A[r, k]``: the
factor's partners at the factor's own point), and the *core*, the rest of the
product with the ``where=`` condition (``H[r, c] * C[r, k, c]``), which does
not depend on the factor differentiated. Stages whose cores are the same
reduction (up to the order of their spatial axes) read one stage

    U[r, k] = sum(H[r, c] * C[r, k, c], axis=c)

computed once, and become elementwise: ``d_A = B * U``, ``d_B = A * U`` (which
the materialisation rule then inlines into their consumers). This is the rule
of multi-term local derivatives (:mod:`texpr.simplify.inline`: a reduction
computed once, then scaled by each local factor), applied across stages.

The rewrite happens only where it lowers the iteration count: the core's points
plus the boxes of the stages that stay stages (requested ones, and those whose
free factors are not cheap to recompute: the others are inlined into their
consumers) must be fewer than the stages' points, so a core shared by two or
more stages. A
stage whose core has an empty reduction domain at some of its points, or a data
mask (a condition ISL cannot see, a select with a zero branch), is left alone:
its sum there is a structural zero, while ``free * 0`` is NaN for an infinite
free factor.
"""

import itertools

import numpy as np

from texpr import expr as E
from texpr.expr import Reduce, iter_var
from texpr.tensor import ComputeOp, topo_order
from texpr.visitor import free_vars, post_order, substitute

from . import isl_bridge as B
from .cleanup import _canon_var
from .domain import Domain, domain_count
from .graph import is_sum_stage, rebuild
from .isl_bridge import DomainError, isl
from .materialize import is_cheap

#: the most spatial axes of a core whose orders are all tried when matching cores
MAX_PERMUTED_AXES = 4


def _factors(e):
    """The factors of a product tree of one dtype (``e`` itself when not a product)."""
    if isinstance(e, E.Mul) and e.args[0].dtype == e.dtype and e.args[1].dtype == e.dtype:
        return _factors(e.args[0]) + _factors(e.args[1])
    return [e]


def _product(factors):
    out = factors[0]
    for f in factors[1:]:
        out = E.mul(out, f)
    return out


class _Split:
    """A sum stage's summand split into ``free`` factors (no reduction axis) and the
    ``core`` factors; ``axes`` are the spatial axes the core and ``where`` use, in
    the stage's order."""

    def __init__(self, op):
        red = op.body[0]
        raxes = {id(a) for a in red.axes}
        self.free, self.core = [], []
        for f in _factors(red.source[0]):
            hit = any(id(v) in raxes for v in free_vars(f))
            (self.core if hit else self.free).append(f)
        used = {id(v) for v in free_vars(self.core + [red.where])}
        self.axes = tuple(a for a in op.axis if id(a) in used)
        self.red = red


def _split(op):
    """The :class:`_Split` of a sum stage with both free and core factors, else None."""
    if not is_sum_stage(op):
        return None
    s = _Split(op)
    if not s.free or not s.core:
        return None
    if any(isinstance(n, Reduce) for n in post_order(s.free)):
        return None
    if any(isinstance(n, E.Select) and any(_zero(b) for b in n.args[1:])
           for n in post_order(s.core)):
        return None  # a symbolic zero in the core: see _full_projection
    return s


def _zero(e):
    return isinstance(e, E.Const) and not isinstance(e.value, bool) and e.value == 0


def _keys(s):
    """``[(key, order)]``: the core's canonical key when its axes are taken in
    ``order`` (a permutation of ``s.axes``), the stage's own order first."""
    red = s.red
    rmap = {a: _canon_var(d, a, "reduce") for d, a in enumerate(red.axes)}
    orders = ([tuple(range(len(s.axes)))] if len(s.axes) > MAX_PERMUTED_AXES
              else list(itertools.permutations(range(len(s.axes)))))
    out = []
    for order in orders:
        mapping = dict(rmap)
        mapping.update({s.axes[p]: _canon_var(d, s.axes[p], "spatial")
                        for d, p in enumerate(order)})
        core = [substitute(f, mapping) for f in s.core]
        where = substitute(red.where, mapping)
        doms = tuple(s.axes[p].dom for p in order) + tuple(a.dom for a in red.axes)
        key = (red.source[0].dtype, doms, tuple(sorted(id(c) for c in core)), id(where))
        # (the nodes ride along: their ids are the key only while they live)
        out.append((key, order, core, where))
    return out


def _full_projection(s):
    """Whether every point of the core's spatial box has a nonempty reduction domain
    (and the condition is quasi-affine, so ISL can tell). Where it is empty, or
    where a data mask (a residual condition, a select with a zero branch) may
    leave no term, the sum is a structural zero that ``free * U`` would turn
    into NaN for an infinite free factor (docs/conventions.md, "Zeros")."""
    try:
        dom = Domain(s.axes + s.red.axes, s.red.where)
        if dom.residual is not None:
            return False
        proj = B.project_onto_first(dom.set, len(s.axes))
        box = int(np.prod([a.extent for a in s.axes], dtype=np.int64))
        return B.card(proj) == box
    except (isl.Error, DomainError):
        return False


def _plan(tensors):
    """``{id(op): (group, order)}`` for the stages rewritten (module docstring)."""
    groups, members, alive = {}, {}, []
    outputs = {id(t.op) for t in tensors}
    for op in topo_order(tensors):
        s = _split(op)
        if s is None:
            continue
        keys = _keys(s)
        alive.append(keys)
        for key, order, _core, _where in keys:
            if key in groups:
                groups[key].append((op, s, order))
                break
        else:
            key, order = keys[0][0], keys[0][1]
            groups[key] = [(op, s, order)]
    plan = {}
    for key, group in groups.items():
        if len(group) < 2:
            continue
        s0 = group[0][1]
        try:
            core = domain_count(s0.axes + s0.red.axes, s0.red.where)
            before = sum(domain_count(op.axis + s.red.axes, s.red.where) for op, s, _o in group)
        except DomainError:
            continue
        # a member stays a stage of its own (a box's points) when it is requested or
        # its free factors are not cheap; else the consumers compute it inline
        boxes = sum(int(np.prod(op.shape, dtype=np.int64)) for op, s, _o in group
                    if id(op) in outputs or not is_cheap(_product(s.free)))
        if core + boxes >= before or not _full_projection(s0):
            continue
        cell = [None]  # the shared stage, built at the first member rebuilt
        for op, _s, order in group:
            members[id(op)] = (cell, order)
    return members


def _shared_stage(op, s, order):
    """``U``: the core of ``op`` (split ``s``) over its axes taken in ``order``."""
    axes = [iter_var(0, s.axes[p].extent, s.axes[p].name, "spatial") for p in order]
    mapping = {s.axes[p]: a for p, a in zip(order, axes)}
    for a in s.red.axes:
        mapping[a] = iter_var(a.dom[0], a.dom[1], a.name, "reduce")
    src = substitute(_product(s.core), mapping)
    where = substitute(s.red.where, mapping)
    body = E.make_reduce(s.red.combiner, (src,), tuple(mapping[a] for a in s.red.axes),
                         where, 0)
    return ComputeOp(f"{op.name}_shared", axes, (body,), tag="shared_head",
                     attrs={"of": op.name}).output(0)


def share_head_contractions(tensors):
    """Sum stages with the same core read one stage computing it (module docstring)."""
    plan = _plan(tensors)
    if not plan:
        return list(tensors)

    def fn(op, orig, _tmap):
        hit = plan.get(id(orig))
        if hit is None:
            return None
        cell, order = hit
        s = _split(op)
        if s is None:  # (the rebuilt stage has the analysed one's form)
            return None
        if cell[0] is None:
            cell[0] = (_shared_stage(op, s, order), order)
        shared, _first = cell[0]
        value = E.mul(_product(s.free), shared[tuple(s.axes[p] for p in order)])
        if value.dtype != op.dtypes[0]:
            value = E.cast(value, op.dtypes[0])
        return ComputeOp(op.name, op.axis, (value,), op.tag, op.attrs).output(0)

    return rebuild(tensors, fn)
