"""The stages adjoint accumulation builds besides the contributions.

The identity head (``differentiate(..., head=None)``), the zeros stage of an
input that receives no contribution, and the elementwise sum of several
contributions. Both :mod:`texpr.adjoint` and :mod:`texpr.scan_adjoint` build
them; they sit below both.
"""

from .expr import all_of, const, iter_var, select
from .tensor import ComputeOp


def identity_head(out):
    """The identity head of ``out``: shape ``out.shape + out.shape``, dtype ``out.dtype``,
    ``I[p, i] = select(all(p == i), 1, 0)`` (tag ``"identity_head"``)."""
    p = tuple(iter_var(0, s, f"p{d}", "spatial") for d, s in enumerate(out.shape))
    i = tuple(iter_var(0, s, f"i{d}", "spatial") for d, s in enumerate(out.shape))
    one, zero = const(1, out.dtype), const(0, out.dtype)
    body = select(all_of([a == b for a, b in zip(p, i)]), one, zero)
    return ComputeOp(f"{out.name}_identity_head", p + i, (body,), tag="identity_head").output(0)


def zeros(shape, dtype, name):
    """A stage of zeros (tag ``"zeros"``): the adjoint of an input the output does not
    depend on differentiably."""
    axis = tuple(iter_var(0, s, f"j{d}", "spatial") for d, s in enumerate(shape))
    return ComputeOp(name, axis, (const(0, dtype),), tag="zeros").output(0)


def sum_stage(t, parts, name):
    """The adjoint of ``t`` from its several contributions ``parts`` (same shape): one
    elementwise stage ``parts[0][j] + parts[1][j] + ...`` named ``name`` (tag
    ``"adjoint_sum"``, ``attrs`` ``{"of": t.name}``)."""
    shape = parts[0].shape
    axis = tuple(iter_var(0, s, f"j{d}", "spatial") for d, s in enumerate(shape))
    body = parts[0][axis]
    for c in parts[1:]:
        body = body + c[axis]
    return ComputeOp(name, axis, (body,), tag="adjoint_sum", attrs={"of": t.name}).output(0)
