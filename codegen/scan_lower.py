"""Lowering of a scan stage: a sequential time loop around its body's loop nests.

A :class:`texpr.scan.ScanOp` with states ``S_a`` of shape ``(T,) + R_a`` and
init extent ``L`` becomes::

    S_a[:L] = init_a                         (flat copies)
    for t in range(L, T):                    (sequential: step t reads earlier steps)
        <each materialised body stage at step t>   (its own loop nest, parallel over
                                                    its axes when it is big)

Each body stage is lowered by the ordinary stage lowering
(:class:`texpr.codegen.lower._StageLowering`) as a *step stage*: the body
stage without its time axis, the step ``t`` a bounded variable (``L <= t <
T``) that is not a loop of the stage. A step stage writes into a view of one
step: an update into ``S_a[t]`` (the state's own buffer), any other body stage
into a scratch buffer of one step allocated once before the loop (the body is
read only at the current step). Loads of the state at ``t - k`` read the
state's buffer (with a bounds check: isl does not see ``t``); loads of body
stages read the step buffers. Body stages follow the simplifier's
materialisation rule within the body (the updates always have buffers).
"""

import numpy as np

from texpr.expr import Load, iter_var, load
from texpr.tensor import ComputeOp
from texpr.visitor import substitute, transform

__all__ = ["lower_scan"]


def _step_ops(op):
    """``[(body op, step op)]`` and the step variable: each body stage without its
    time axis, the step a variable over ``[L, T)``, state loads re-pointed at the
    scan's outputs and body loads at the step stages."""
    T, L = op.time_extent, op.init_extent
    tv = iter_var(L, T, "t", "spatial")
    state_out = {id(s): o for s, o in zip(op.state_placeholder, op.outputs)}
    step_of = {}

    def remap(node):
        if not isinstance(node, Load):
            return None
        t = node.tensor
        out = state_out.get(id(t))
        if out is not None:
            return load(out, node.args)
        step = step_of.get(id(t))
        if step is not None:
            return load(step, node.args[1:])
        return None

    pairs = []
    for b in op.body_ops:
        axis = tuple(iter_var(0, n, a.name, "spatial") for n, a in zip(b.shape[1:], b.axis[1:]))
        mapping = dict(zip(b.axis, (tv,) + axis))
        body = tuple(transform(substitute(e, mapping), remap) for e in b.body)
        new = ComputeOp(b.name, axis, body, b.tag, b.attrs)
        for old, o in zip(b.outputs, new.outputs):
            step_of[id(old)] = o
        pairs.append((b, new))
    return pairs, tv


def _body_materialized(op):
    """Ids of the body stages that get a buffer (the simplifier's rule over the
    body graph, the updates always)."""
    from texpr.simplify import materialized_stages

    body_ids = {id(b) for b in op.body_ops}
    mat = {id(b) for b in materialized_stages(list(op.update)) if id(b) in body_ids}
    mat.update(id(u.op) for u in op.update)
    return mat


def lower_scan(sl, depth):
    """Emit the scan stage of the stage lowering ``sl`` (a
    :class:`texpr.codegen.lower._StageLowering` whose ``op`` is a ScanOp) at ``depth``."""
    from .lower import BufferInfo, _StageLowering
    from .schedule import Stage

    op, w, k = sl.op, sl.w, sl.k
    T, L = op.time_extent, op.init_extent
    for out, init in zip(op.outputs, op.init):
        n = int(np.prod(init.shape, dtype=np.int64))
        if n:
            w(depth, f"{sl.buffers[id(out)].name}[:{n}] = {sl.buffers[id(init)].name}[:{n}]")
    if T == L or any(d == 0 for out in op.outputs for d in out.shape[1:]):
        return
    pairs, tv = _step_ops(op)
    mat = _body_materialized(op)
    inlined = set(sl.inlined) | {id(s) for b, s in pairs if id(b) not in mat}
    buffers = dict(sl.buffers)
    tname = f"t{k}"
    views = []  # (name, state buffer, row size): the update's view of step t
    for j, (b, s) in enumerate(pairs):
        if id(b) not in mat:
            continue
        for c, (bo, so) in enumerate(zip(b.outputs, s.outputs)):
            a = next((a for a, u in enumerate(op.update) if u is bo), None)
            name = f"scan{k}_{j}_{c}"
            info = BufferInfo(name, so, "temp")
            buffers[id(so)] = info
            if a is not None:
                state = sl.buffers[id(op.outputs[a])]
                views.append((name, state.name, info.size))
            else:
                w(depth, f"{name} = np.empty({info.size}, dtype=np.{info.dtype})")
    w(depth, f"for {tname} in range({L}, {T}):")
    for name, state, size in views:
        w(depth + 1, f"{name} = {state}[{tname} * {size}:({tname} + 1) * {size}]")
    for j, (b, s) in enumerate(pairs):
        if id(b) not in mat:
            continue
        sub = _StageLowering(f"{k}s{j}", s, Stage(s), buffers, inlined, sl.errors,
                             sl.parallel_on, w)
        sub.names[id(tv)] = tname
        sub.run(depth + 1)
        sl.uses_prange |= sub.uses_prange
