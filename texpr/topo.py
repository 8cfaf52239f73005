"""The order of a graph's stages: :func:`topo_order`, producers before consumers.

It walks ``tensor.op`` and ``op.input_tensors()`` only, so it sits below the
stage classes (:mod:`texpr.tensor`, which re-exports it) and the printer.
"""

from .errors import TexprError


def topo_order(outputs):
    """Operations reachable from ``outputs``, producers before consumers.

    Args:
        outputs: a Tensor or an iterable of Tensors.
    Returns:
        list of the operations (each once).
    Raises:
        TexprError: the graph has a cycle.
    """
    if hasattr(outputs, "op"):  # one Tensor
        outputs = [outputs]
    seen, done, order = set(), set(), []
    stack = [(t.op, False) for t in reversed(list(outputs))]
    while stack:
        op, expanded = stack.pop()
        if expanded:
            order.append(op)
            done.add(id(op))
            continue
        if id(op) in seen:
            continue
        seen.add(id(op))
        stack.append((op, True))
        for t in reversed(op.input_tensors()):
            if id(t.op) not in seen:
                stack.append((t.op, False))
            elif id(t.op) not in done:  # on the current path: a cycle
                raise TexprError(
                    f"stage {op.name} reads {t.name}, which depends on {op.name} itself: the "
                    "graph has a cycle (was a body or an input list changed after "
                    "te.compute built it?)")
    return order
