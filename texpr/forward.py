"""Forward mode over tensor graphs: the tangent stage of every stage (raw form).

Given tangents ``dX`` of some tensors ``X`` (same shapes), every stage ``Y``
that depends on them gets a *tangent stage* ``dY`` of ``Y``'s shape, in
topological order:

* elementwise ``Y[i] = e(i)``: ``dY[i] = jvp(e)`` by the rules of
  :mod:`texpr.rules`, each load ``X[f(i)]`` of a tensor with a tangent seeded
  with ``dX[f(i)]`` (loads are interned: one seed per distinct load);
* a reduction ``Y[i] = R_k src(i, k)``: ``dY[i] = sum_k dY/dsrc(i, k) * dsrc(i, k)``
  where ``dY/dsrc`` is the reduction rule of :data:`texpr.jacobian.REDUCTION_RULES`
  with a unit head (``sum``: 1; ``max``/``min``: the indicator of the first
  extreme point, from the argmax stage; ``prod``/custom: the chain rule
  through the rest stages), under the reduction's ``where=``;
* a scatter-add ``Y = init; Y[idx(q)] += v(q)``: ``dY = dinit; dY[idx(q)] += dv(q)``;
* a scan (:mod:`texpr.scan`): one scan over the states and their tangents together,
  the tangent body the tangent stages of the body (``dS[t]`` reads ``dS[t - k]``).

Integer and bool tensors have no tangent; a stage none of whose float inputs
has a tangent has a symbolic zero tangent (no stage is built). The entry point
:func:`texpr.jvp` (in :mod:`texpr.differentiate`) simplifies the result like
adjoints.
"""

from . import dtypes as dt
from .errors import NotDifferentiableError, ShapeError, TexprError
from .expr import Load, Reduce, const, iter_var
from .jacobian import REDUCTION_RULES, _Context, _reduce_copy
from .rules import jvp
from .scan import ScanOp, check_not_in_a_body
from .tensor import ComputeOp, PlaceholderOp, ScatterAddOp, as_tensor_list, topo_order
from .visitor import post_order, substitute

__all__ = ["tangents"]




def _seeds(expr, tan):
    seeds = {}
    for node in post_order(expr):
        if isinstance(node, Load) and dt.is_float(node.dtype):
            d = tan.get(id(node.tensor))
            if d is not None:
                seeds[node] = d[node.args]
    return seeds


def _zeros(shape, dtype, name):
    axis = tuple(iter_var(0, s, f"j{d}", "spatial") for d, s in enumerate(shape))
    return ComputeOp(name, axis, (const(0, dtype),), tag="zeros").output(0)


def _scan_tangents(op, tan, cache):
    """The tangents of a scan's states: one scan over the states and their tangents
    together (``dS[t]`` reads ``dS[t - k]`` where ``S[t]`` reads ``S[t - k]``, and the
    forward values of the same step), ``{id(state output): tangent}``."""
    from .scan import ScanOp, check_not_in_a_body

    states = op.state_placeholder
    dstates = [PlaceholderOp(f"t_{s.name}", tuple(s.shape), s.dtype).output(0) for s in states]
    local = dict(tan)
    for s, ds in zip(states, dstates):
        local[id(s)] = ds
    for b in op.body_ops:
        for out in b.outputs:
            if dt.is_float(out.dtype):
                d = _tangent_of(out, local, cache)
                if d is not None:
                    local[id(out)] = d
    dinits = [tan.get(id(i)) or _zeros(i.shape, i.dtype, f"t_{i.name}") for i in op.init]
    dupdates = [local.get(id(u)) or _zeros(u.shape, u.dtype, f"t_{u.name}") for u in op.update]
    joint = ScanOp(f"t_{op.name}", list(op.init) + dinits, list(op.update) + dupdates,
                   list(states) + dstates, tag="scan_tangent", attrs={"of": op.name})
    n = len(states)
    return {id(out): joint.outputs[n + a] for a, out in enumerate(op.outputs)
            if dt.is_float(out.dtype)}


def _tangent_of(out, tan, cache):
    """The raw tangent stage of ``out`` (a ComputeOp or ScatterAddOp output), or None."""
    op = out.op
    name = f"t_{out.name}"
    attrs = {"of": out.name}
    if isinstance(op, ScatterAddOp):
        q = tuple(iter_var(0, a.extent, a.name, "spatial") for a in op.axis)
        mapping = dict(zip(op.axis, q))
        value = substitute(op.value, mapping)
        dv = jvp(value, _seeds(value, tan))
        dinit = None if op.init is None else tan.get(id(op.init))
        if dv is None and dinit is None:
            return None
        if dv is None:
            return dinit
        if dv.dtype != out.dtype:
            from .expr import cast

            dv = cast(dv, out.dtype)
        idx = tuple(substitute(i, mapping) for i in op.indices)
        where = substitute(op.where, mapping)
        return ScatterAddOp(name, op.shape, out.dtype, q, idx, dv, where, dinit).output(0)
    body = op.body[out.value_index]
    axis = tuple(iter_var(0, a.extent, a.name, "spatial") for a in op.axis)
    if not isinstance(body, Reduce):
        e = substitute(body, dict(zip(op.axis, axis)))
        d = jvp(e, _seeds(e, tan))
    else:
        red = body
        k_axes = _reduce_copy(red.axes)
        mapping = dict(zip(op.axis + red.axes, axis + k_axes))
        sources = tuple(substitute(s, mapping) for s in red.source)
        d_sources = tuple(jvp(s, _seeds(s, tan)) if dt.is_float(s.dtype) else None
                          for s in sources)
        if all(x is None for x in d_sources):
            return None
        where = substitute(red.where, mapping)
        ctx = _Context(axis, k_axes, const(1, out.dtype), sources, d_sources, cache)
        term = REDUCTION_RULES[red.combiner.kind](out, red, ctx)
        if term is None:
            return None
        from .reduction import sum as te_sum

        d = te_sum(term, axis=list(k_axes), where=where)
    if d is None:
        return None
    if d.dtype != out.dtype:
        from .expr import cast

        d = cast(d, out.dtype)
    return ComputeOp(name, axis, (d,), tag="tangent", attrs=attrs).output(0)


def tangents(outputs, inputs, tangent_tensors):
    """Raw forward-mode tangents (see the module docstring).

    Args:
        outputs: a list of float Tensors.
        inputs: a list of float Tensors (placeholders or intermediate tensors).
        tangent_tensors: one float Tensor per input, of that input's shape.
    Returns:
        A list with one Tensor per output, of the output's shape and dtype: its
        tangent (a zeros stage where it does not depend on the inputs).
    Raises:
        NotDifferentiableError: an output, input or tangent is not float.
        ShapeError: a tangent's shape differs from its input's.
        TexprError: bad arguments, or as many tangents as inputs not given.
    """
    outs = as_tensor_list(outputs, "jvp: outputs")
    ins = as_tensor_list(inputs, "jvp: inputs")
    tans = as_tensor_list(tangent_tensors, "jvp: tangents")
    if len(tans) != len(ins):
        raise TexprError(f"jvp: {len(ins)} inputs ({', '.join(t.name for t in ins)}) but "
                         f"{len(tans)} tangents")
    for what, group in (("output", outs), ("input", ins), ("tangent", tans)):
        for t in group:
            if not dt.is_float(t.dtype):
                raise NotDifferentiableError(
                    f"jvp: {what} {t.name} has dtype {t.dtype}; only float tensors have "
                    "tangents")
    check_not_in_a_body(ins, topo_order(outs), "jvp")
    tan = {}
    for x, dx in zip(ins, tans):
        if tuple(dx.shape) != tuple(x.shape):
            raise ShapeError(f"jvp: the tangent {dx.name} of {x.name} has shape {dx.shape}; "
                             f"expected {x.name}.shape = {x.shape}")
        if id(x) in tan:
            raise TexprError(f"jvp: input {x.name} is listed twice")
        if dx.dtype != x.dtype:
            from .expr import cast

            axis = tuple(iter_var(0, s, f"j{d}", "spatial") for d, s in enumerate(x.shape))
            dx = ComputeOp(f"{dx.name}_as_{x.dtype}", axis,
                           (cast(dx[axis], x.dtype),)).output(0)
        tan[id(x)] = dx
    cache = {}
    for op in topo_order(outs):
        if isinstance(op, PlaceholderOp) or any(id(o) in tan for o in op.outputs):
            continue
        if not any(id(t) in tan for t in op.input_tensors()):
            continue
        if isinstance(op, ScanOp):
            tan.update(_scan_tangents(op, tan, cache))
            continue
        for out in op.outputs:
            if dt.is_float(out.dtype):
                d = _tangent_of(out, tan, cache)
                if d is not None:
                    tan[id(out)] = d
    result = []
    for y in outs:
        d = tan.get(id(y))
        if d is None:
            axis = tuple(iter_var(0, s, f"j{k}", "spatial") for k, s in enumerate(y.shape))
            d = ComputeOp(f"t_{y.name}", axis, (const(0, y.dtype),), tag="zeros").output(0)
        result.append(d)
    return result
