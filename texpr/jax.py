"""texpr graphs as JAX functions: ``texpr.jax.op(outputs, inputs)``.

The forward is a ``jax.pure_callback`` to the compiled texpr kernel on the
host (CPU), so the function works under ``jit`` (the callback is a node of
the compiled program; shapes and dtypes come from the texpr graph) and under
``vmap`` (the callback runs once per batch element, ``vmap_method="sequential"``).
Reverse mode is a ``jax.custom_vjp`` whose backward is the same construction
for the backward spec (:meth:`texpr.bridge.OpSpec.backward`: the simplified
adjoint kernel with the cotangents as heads), so ``grad`` of ``grad`` works
wherever texpr can differentiate the adjoint graph. Forward mode (``jvp``,
``jacfwd``) is not available on a ``custom_vjp`` function: JAX allows one
custom rule per function.

float64 placeholders need JAX's 64-bit mode (``jax.config.update("jax_enable_x64", True)``).

This module imports jax. ``import texpr`` does not import it.
"""

import jax
import numpy as np

from .bridge import OpSpec

__all__ = ["op"]


def _function(spec):
    """The custom_vjp function of ``spec`` (arrays in, a tuple of arrays out); cached."""
    fn = spec.cache.get("jax")
    if fn is not None:
        return fn
    result_types = tuple(jax.ShapeDtypeStruct(t.shape, np.dtype(t.dtype)) for t in spec.outputs)

    def host(*arrays):
        # np.asarray, not np.ascontiguousarray: that one makes 0-d arrays 1-d
        return tuple(spec.run([np.asarray(a) for a in arrays]))

    def forward(*xs):
        spec.check(xs, lambda v: v.shape, _dtype_name, "jax")
        return jax.pure_callback(host, result_types, *xs, vmap_method="sequential")

    @jax.custom_vjp
    def f(*xs):
        return forward(*xs)

    def f_fwd(*xs):
        # f, not forward: an outer differentiation (second order) differentiates
        # this rule, and f carries the custom rule where the callback has none
        return f(*xs), xs

    def f_bwd(xs, cts):
        grads = []
        if spec.float_inputs and spec.float_outputs:
            heads = [cts[k] for k in spec.float_outputs]
            back = spec.backward()
            gs = _function(back)(*xs, *heads)
            by_pos = dict(zip(spec.float_inputs, gs))
        else:
            by_pos = {}
        for j, (x, t) in enumerate(zip(xs, spec.inputs)):
            g = by_pos.get(j)
            if g is None:
                dtype = np.dtype(t.dtype) if j in spec.float_inputs else jax.dtypes.float0
                g = np.zeros(t.shape, dtype=dtype)
            grads.append(g)
        return tuple(grads)

    f.defvjp(f_fwd, f_bwd)
    spec.cache["jax"] = f
    return f


def _dtype_name(v):
    d = getattr(v, "dtype", None)
    if d is None or not hasattr(v, "shape"):
        return None
    return np.dtype(d).name


class JaxOp:
    """A texpr graph as a differentiable JAX function (see :func:`op`)."""

    def __init__(self, spec):
        self.spec = spec
        self._fn = _function(spec)

    @property
    def kernel(self):
        return self.spec.kernel

    def __reduce__(self):
        return (JaxOp, (self.spec,))

    def __call__(self, *xs):
        outs = self._fn(*xs)
        return outs[0] if self.spec.single else tuple(outs)

    def __repr__(self):
        return f"texpr.jax.op({self.spec.signature()})"


def op(outputs, inputs):
    """Turn the texpr graph ``outputs`` <- ``inputs`` into a JAX function.

    Args:
        outputs: a Tensor (the function returns an array) or a list of Tensors
            (it returns a tuple, in this order).
        inputs: the placeholder Tensors the function takes, in order.
    Returns:
        A callable on jax (or numpy) arrays of the inputs' exact shapes and
        dtypes, returning arrays of the outputs' shapes and dtypes, computed on
        the CPU by the compiled texpr kernel (compiled on the first call). It
        works under ``jax.jit``, ``jax.vmap`` and ``jax.grad``/``jax.vjp``
        (a ``jax.custom_vjp``: the cotangents are the heads of the simplified
        adjoint kernel; second order differentiates the adjoint graph again).
        Integer inputs get ``float0`` cotangents.
    Raises:
        TexprError: non-Tensor outputs, inputs that are not distinct placeholders.
        FeedError (on call or trace): wrong number of arrays, a wrong dtype or
        shape (float64 needs ``jax_enable_x64``). NotDifferentiableError (on
        grad): texpr cannot differentiate the graph.
    """
    return JaxOp(OpSpec(outputs, inputs, who="texpr.jax.op"))
