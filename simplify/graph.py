"""Tensor-graph plumbing shared by the passes: classifying stages, finding
consumers, and rebuilding a graph stage by stage.

A pass is a pure function ``list[Tensor] -> list[Tensor]``. Stages (operations)
are identity objects, so rewriting one stage means building new stages for it
and for every stage downstream of it; :func:`rebuild` does that bookkeeping:
it walks the graph producers-first, re-points every load at the rewritten
producers, and lets the pass replace any stage.
"""

from texpr import expr as E
from texpr.errors import DTypeError
from texpr.expr import Load, Reduce, iter_var
from texpr.scan import ScanOp
from texpr.tensor import ComputeOp, PlaceholderOp, ScatterAddOp, Tensor, topo_order
from texpr.visitor import post_order, substitute, transform


def is_reduction(op):
    """A compute stage whose body is a reduction (possibly a tuple reduction)."""
    return isinstance(op, ComputeOp) and isinstance(op.body[0], Reduce)


def is_sum_stage(op):
    """A single-output compute stage whose body is a ``sum`` reduction."""
    return (is_reduction(op) and op.num_outputs == 1
            and op.body[0].combiner.kind == "sum")


def is_elementwise(op):
    """A single-output compute stage without reduction."""
    return isinstance(op, ComputeOp) and op.num_outputs == 1 and not isinstance(op.body[0], Reduce)


def stage_exprs(op):
    """Every expression of a stage (body, or a scatter's indices/value/where)."""
    if isinstance(op, ComputeOp):
        return list(op.body)
    if isinstance(op, ScatterAddOp):
        return list(op.indices) + [op.value, op.where]
    return []


def accesses(outputs):
    """``{id(op): [(consumer_op, Load), ...]}``: every distinct load of every stage
    reachable from ``outputs`` (Tensors), by consumer."""
    out = {}
    for op in topo_order(outputs):
        for node in post_order(stage_exprs(op)):
            if isinstance(node, Load):
                out.setdefault(id(node.tensor.op), []).append((op, node))
        if isinstance(op, ScatterAddOp) and op.init is not None:
            out.setdefault(id(op.init.op), []).append((op, None))
        if isinstance(op, ScanOp):  # a scan reads its inputs whole, step by step
            for t in op.input_tensors():
                out.setdefault(id(t.op), []).append((op, None))
    return out


def remap_loads(e, tmap):
    """``e`` with every load of a tensor in ``tmap`` ({id(old): new Tensor}) re-pointed."""
    if not tmap:
        return e

    def fn(node):
        if isinstance(node, Load):
            new = tmap.get(id(node.tensor))
            if new is not None and new is not node.tensor:
                return E.load(new, node.args)
        return None

    return transform(e, fn)


def _remapped(op, tmap):
    """``op`` with its loads re-pointed (the same op when nothing changes)."""
    if isinstance(op, ComputeOp):
        body = tuple(remap_loads(b, tmap) for b in op.body)
        if all(a is b for a, b in zip(body, op.body)):
            return op
        return ComputeOp(op.name, op.axis, body, op.tag, op.attrs)
    if isinstance(op, ScatterAddOp):
        idx = tuple(remap_loads(i, tmap) for i in op.indices)
        value = remap_loads(op.value, tmap)
        where = remap_loads(op.where, tmap)
        init = None if op.init is None else tmap.get(id(op.init), op.init)
        if (all(a is b for a, b in zip(idx, op.indices)) and value is op.value
                and where is op.where and init is op.init):
            return op
        return ScatterAddOp(op.name, op.shape, op.dtypes[0], op.axis, idx, value, where, init)
    if isinstance(op, ScanOp):
        return op.rebuilt(tmap)
    return op


def _naming_stage(exc, op, fn):
    """``exc`` (a DTypeError a rewrite of ``op`` met: integer constants folded
    outside their dtype, e.g. an int64-limit coefficient times a solved index)
    with the stage and the pass in its message, when it does not name a stage."""
    msg = str(exc)
    if msg.startswith("stage "):
        return exc
    rewrite = getattr(fn, "__qualname__", "").split(".")[0] or "a rewrite"
    return type(exc)(f"stage {op.name}: {msg} (met by the simplifier's {rewrite} "
                     "while rewriting the stage)")


def rebuild(outputs, fn):
    """Rewrite a graph stage by stage, producers first.

    Args:
        outputs: list of Tensors.
        fn: ``fn(op, orig, tmap) -> None | Tensor | tuple of Tensors``: ``op`` is the
            stage with its loads re-pointed at rewritten producers, ``orig`` the
            stage of the input graph (analyse the input graph through it), ``tmap``
            maps ``id(old tensor)`` to its replacement so far. Returning Tensors
            replaces the stage's outputs (same count, shapes and dtypes); None keeps it.
    Returns:
        list of the rewritten output Tensors (placeholders are kept as they are).
    """
    tmap = {}
    for op in topo_order(outputs):
        if isinstance(op, PlaceholderOp):
            continue
        new_op = _remapped(op, tmap)
        try:
            res = fn(new_op, op, tmap)
        except DTypeError as exc:
            raise _naming_stage(exc, op, fn) from None
        if res is None:
            new_outs = new_op.outputs
        else:
            new_outs = (res,) if isinstance(res, Tensor) else tuple(res)
        for old, new in zip(op.outputs, new_outs):
            if new is not old:
                tmap[id(old)] = new
    return [tmap.get(id(t), t) for t in outputs]


def fresh_stage(name, axis, body, tag="", attrs=None):
    """A new ComputeOp with fresh copies of its spatial and reduction axes.

    ``axis`` and the reduction axes of ``body`` may be shared with other stages;
    the new stage gets its own IterVars (same names and bounds).
    """
    body = tuple(body) if isinstance(body, (tuple, list)) else (body,)
    mapping = {}
    for a in axis:
        mapping[a] = iter_var(a.dom[0], a.dom[1], a.name, "spatial")
    if isinstance(body[0], Reduce):
        for a in body[0].axes:
            mapping[a] = iter_var(a.dom[0], a.dom[1], a.name, "reduce")
    new_axis = tuple(mapping[a] for a in axis)
    new_body = tuple(substitute(b, mapping) for b in body)
    return ComputeOp(name, new_axis, new_body, tag, attrs)
