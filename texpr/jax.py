"""texpr graphs as JAX functions: ``texpr.jax.op(outputs, inputs)``.

The forward is an XLA FFI custom call (``jax.ffi.ffi_call``) whose handler
runs the compiled texpr kernel on XLA's own CPU buffers, without copies: the
compiled driver of :mod:`texpr.codegen.backends.numba_cpu.native_call` (no Python on the call
path; the call's one attribute is the kernel's descriptor), or for a kernel it
cannot run (a contraction run as a GEMM) a Python handler
(:mod:`texpr.jax_ffi`); ``jax.pure_callback`` on JAX versions without
``jax.ffi``. So the function works under ``jit`` (the call is a node of the
compiled program; shapes and dtypes come from the texpr graph) and under
``vmap`` (the call runs once per batch element, ``vmap_method="sequential"``).
A kernel's error (e.g. an ``OutOfBoundsError`` for a data-dependent index)
is raised as itself by an eager call; under the caller's own ``jit`` JAX
raises it as its runtime error, whose message names it.
Reverse mode is a ``jax.custom_vjp`` whose backward is the same construction
for the backward spec (:meth:`texpr.bridge.OpSpec.backward`: the simplified
adjoint kernel with the cotangents as heads), so ``grad`` of ``grad`` works
wherever texpr can differentiate the adjoint graph. Forward mode (``jvp``,
``jacfwd``) is not available on a ``custom_vjp`` function: JAX allows one
custom rule per function.

float64 and int64 placeholders need JAX's 64-bit mode
(``jax.config.update("jax_enable_x64", True)``): without it JAX makes every
value 32-bit, and the call raises a FeedError that says so.

This module imports jax. ``import texpr`` does not import it.
"""

import os
import re

import jax
import numpy as np

from .bridge import BUILD_LOCK, OpSpec
from .errors import FeedError

__all__ = ["op"]


def _has_ffi():
    ffi = getattr(jax, "ffi", None)
    return all(hasattr(ffi, n) for n in ("ffi_call", "register_ffi_target", "pycapsule"))


#: run kernels whose units are all numba units from a compiled FFI handler
#: (:mod:`texpr.codegen.backends.numba_cpu.native_call`: no Python on the call path); False keeps
#: the Python handler for every kernel
NATIVE = True


def _native_handler(kernel):
    """``(keepalive, address, descriptor address)`` of the compiled FFI handler
    for ``kernel`` (:mod:`texpr.codegen.backends.numba_cpu.native_call`), or None."""
    from . import jax_ffi
    from .codegen.backends.unit_errors import unit_error
    from .codegen.native_call import ffi_handler

    units = kernel.units
    on_error, on_error_address = jax_ffi.error_callback(
        lambda u, code, value: unit_error(units[u] if u >= 0 else None, code, value))
    found = ffi_handler(kernel, on_error_address)
    if found is None:
        return None
    desc, address = found
    return (desc, on_error, kernel), address, int(desc.ctypes.data)


#: FFI target names carry a per-process token: a program compiled in another
#: process (JAX's persistent cache) finds no target, never one of this
#: process's handlers or descriptors under a reused name
_TOKEN = os.urandom(6).hex()
#: what the registered FFI targets' addresses point into (handlers, descriptors,
#: kernels): XLA keeps a target for the life of the process, so they are kept too
_FFI_KEPT = []


def _host_call(spec, result_types):
    """``call(*arrays) -> tuple of arrays``: the compiled kernel of ``spec`` as a node
    of JAX programs. An XLA FFI custom call whose handler runs the kernel on
    XLA's own buffers (:mod:`texpr.jax_ffi`) where ``jax.ffi`` has it, else
    ``jax.pure_callback`` (copies the operands; older JAX)."""
    if _has_ffi():
        from . import jax_ffi

        kernel = spec.kernel
        found = _native_handler(kernel) if NATIVE else None
        name = f"texpr_op_{_TOKEN}_{spec.key}"  # keys are unique in a process
        if found is not None:
            keep, addr, desc = found
            name += "_native"
            attrs = {"texpr_descriptor": np.int64(desc)}
        else:
            def run(xs, ys):
                # XLA's operand and result buffers: exact shapes and dtypes, distinct
                kernel.run_into(xs, ys)

            keep, addr = jax_ffi.register(run, [(t.shape, t.dtype) for t in spec.inputs],
                                          [(t.shape, t.dtype) for t in spec.outputs])
            attrs = {}
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(addr), platform="cpu")
        # XLA holds the addresses only, and a target is never unregistered (a
        # compiled program may call it after the op is dropped): kept for the process
        _FFI_KEPT.append(keep)
        spec.cache["jax_ffi_handler"] = keep
        call = jax.ffi.ffi_call(name, list(result_types), vmap_method="sequential")
        return lambda *xs: tuple(call(*xs, **attrs))

    def host(*arrays):
        # np.asarray, not np.ascontiguousarray: that one makes 0-d arrays 1-d
        return tuple(spec.run([np.asarray(a) for a in arrays]))

    return lambda *xs: jax.pure_callback(host, result_types, *xs, vmap_method="sequential")


def _function(spec):
    """The custom_vjp function of ``spec`` (arrays in, a tuple of arrays out); cached."""
    fn = spec.cache.get("jax")
    if fn is not None:
        return fn
    with BUILD_LOCK:  # once per spec: one FFI target per name, one live descriptor
        fn = spec.cache.get("jax")
        if fn is None:
            fn = spec.cache["jax"] = _make_function(spec)
    return fn


def _make_function(spec):
    """The custom_vjp function of ``spec`` (see :func:`_function`), made anew."""
    result_types = tuple(jax.ShapeDtypeStruct(t.shape, np.dtype(t.dtype)) for t in spec.outputs)
    call = _host_call(spec, result_types)

    def forward(*xs):
        try:
            spec.check(xs, lambda v: v.shape, _dtype_name, "jax")
        except FeedError as exc:
            if jax.config.jax_enable_x64 or not re.search(r"expects dtype (int|float)64", str(exc)):
                raise
            raise FeedError(f"{exc} (JAX makes 64-bit values 32-bit unless its 64-bit mode is "
                            "on: jax.config.update('jax_enable_x64', True), or declare the "
                            "placeholder 32-bit)") from None
        return call(*xs)

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
        try:
            outs = self._fn(*xs)
            if not any(isinstance(o, jax.core.Tracer) for o in outs):
                # eager: wait here, so that a kernel's error is raised by this call
                outs = jax.block_until_ready(outs)
        except Exception as exc:  # noqa: BLE001 - a kernel's own error comes back as itself
            from .jax_ffi import pop_error
            orig = pop_error(exc)
            if orig is None:
                raise
            raise orig from None
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
