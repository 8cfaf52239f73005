"""texpr graphs as PyTorch operators: ``texpr.torch.op(outputs, inputs)``.

Why ``torch.library.custom_op`` and not ``torch.autograd.Function``: a custom
op is opaque to ``torch.compile``. Dynamo puts it in the graph as one node,
AOTAutograd traces its backward through the registered autograd formula, and
fake tensors get their shapes from the registered fake kernel, so a compiled
model neither graph-breaks nor tries to trace the numpy and Numba code inside
it. An ``autograd.Function`` whose forward leaves torch (``.numpy()``, a Numba
call) makes Dynamo break the graph there. One custom op, ``texpr::kernel``,
serves every texpr op: it takes the input tensors and the int key of an
:class:`texpr.bridge.OpSpec`, and its backward formula calls the same custom
op with the spec's backward spec. That call is differentiable again, so
double backward works wherever texpr can differentiate the adjoint graph.

In eager mode (not under ``torch.compile``) the op skips the custom op's
Python dispatch, which costs several times a small kernel: with autograd
recording it runs as a ``torch.autograd.Function`` with the same forward and
backward; without, it calls the kernel directly. Both paths run the same
kernels; the tests check both (gradcheck eagerly, the custom op compiled).

Data: CPU tensors that are already contiguous are used in place (no copy);
other tensors are made contiguous first (that copies them). The outputs are
fresh tensors (``torch.empty``) that the kernel writes through their data
pointers, run by the compiled driver of :mod:`texpr.codegen.backends.numba_cpu.native_call`,
which calls the kernel's units without its Python driver. A kernel with a
unit that driver cannot call (a contraction run as a GEMM) runs on numpy
views of the tensors (``Tensor.numpy()``) instead, its outputs coming back
as tensors sharing their memory (``torch.from_numpy``).

This module imports torch. ``import texpr`` does not import it.
"""

from typing import List

import torch

from .bridge import SPECS, OpSpec
from .errors import FeedError, TexprError

__all__ = ["op", "TorchOp"]

_TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "int32": torch.int32,
                 "int64": torch.int64, "bool": torch.bool}
_TEXPR_DTYPES = {v: k for k, v in _TORCH_DTYPES.items()}


#: run kernels whose units are all numba units through the compiled driver
#: (:class:`texpr.codegen.backends.numba_cpu.native_call.Runner`, on the tensors' own memory) instead
#: of the kernel's Python driver on numpy views; False: always the latter
NATIVE = True


def _native(spec):
    """``(run, output (shape, dtype) list)`` of ``spec``'s compiled driver, or None."""
    got = None
    if NATIVE:
        from .codegen.native_call import runner

        r = runner(spec.kernel)
        if r is not None:
            got = (r.run, [(tuple(t.shape), _TORCH_DTYPES[t.dtype]) for t in spec.outputs])
    spec.cache["torch_native"] = got
    return got


def _outputs(spec, xs):
    """The outputs (a list of tensors) of ``spec`` for ``xs``: CPU tensors, C-contiguous,
    of the inputs' exact shapes and dtypes, not requiring grad or with grad
    mode off. Fresh tensors, never an input nor one tensor twice.

    A tensor with torch's negative bit set (a lazily negated view, e.g. the
    ``imag`` of ``z.conj()``; contiguous when it has one element) holds the
    values' negations in memory: it is materialised first, since the kernel
    reads memory."""
    for x in xs:
        if x.is_neg():
            xs = [x.resolve_neg() for x in xs]
            break
    nat = spec.cache.get("torch_native", False)
    if nat is False:
        nat = _native(spec)
    if nat is None:
        return [torch.from_numpy(a) for a in spec.kernel.run_exact([x.numpy() for x in xs])]
    run, specs = nat
    outs = [torch.empty(shape, dtype=dtype) for shape, dtype in specs]
    run([x.data_ptr() for x in xs] + [o.data_ptr() for o in outs])
    return outs


@torch.library.custom_op("texpr::kernel", mutates_args=())
def _kernel(xs: List[torch.Tensor], key: int) -> List[torch.Tensor]:
    # a compiled graph may hand the op strided inputs (the kernel reads dense memory)
    return _outputs(SPECS[key], [x.detach().contiguous() for x in xs])


@_kernel.register_fake
def _kernel_fake(xs, key):
    # int(): under torch.compile(dynamic=True) Dynamo passes the key as a SymInt
    # (it makes int attributes dynamic); int() specialises the graph on it
    spec = SPECS[int(key)]
    return [torch.empty(t.shape, dtype=_TORCH_DTYPES[t.dtype]) for t in spec.outputs]


def _setup_context(ctx, inputs, output):
    xs, key = inputs
    # the graph holds the spec itself: SPECS holds it weakly, and the op may be
    # dropped before the backward runs
    ctx.spec = SPECS[int(key)]
    ctx.save_for_backward(*xs)


def _backward(ctx, grads):
    spec = ctx.spec
    return _grad_inputs(spec, ctx.saved_tensors, grads, lambda b, xs: _kernel(xs, b.key)), None


_kernel.register_autograd(_backward, setup_context=_setup_context)


_is_compiling = torch.compiler.is_compiling




def _grad_inputs(spec, xs, grads, apply):
    """The input gradients (None for int inputs) for output gradients ``grads``."""
    result = [None] * len(xs)
    if not spec.float_inputs or not spec.float_outputs:
        return result
    heads = []
    for k in spec.float_outputs:
        g, t = grads[k], spec.outputs[k]
        dtype = _TORCH_DTYPES[t.dtype]
        if g is None:
            g = torch.zeros(t.shape, dtype=dtype)
        if g.shape != tuple(t.shape):
            raise FeedError(f"{spec.who}: the gradient for output {t.name} has shape "
                            f"{tuple(g.shape)}, expected {tuple(t.shape)}")
        if g.dtype is not dtype or not g.is_cpu:
            g = g.to(device="cpu", dtype=dtype)
        heads.append(g.contiguous())
    back = spec.backward()
    for j, g in zip(spec.float_inputs, apply(back, list(xs) + heads)):
        result[j] = g
    return result


class _Eager(torch.autograd.Function):
    """The eager path: the same forward and backward as the custom op, with
    autograd.Function's lower per-call cost (the custom op's Python dispatch
    costs more than a small kernel). Its backward applies the backward spec
    through :func:`_apply`, so it records a graph again under ``create_graph``."""

    @staticmethod
    def forward(ctx, key, *xs):
        spec = SPECS[key]
        outs = _outputs(spec, xs)  # forward runs with grad mode off
        ctx.spec = spec  # (as in _setup_context: the graph keeps its spec alive)
        ctx.save_for_backward(*xs)
        if len(spec.float_outputs) != len(outs):
            ctx.mark_non_differentiable(*[o for k, o in enumerate(outs)
                                          if k not in spec.float_outputs])
        # one output as a tensor, not a 1-tuple: autograd wraps it faster (3 us)
        return outs[0] if len(outs) == 1 else tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        spec = ctx.spec
        return (None, *_grad_inputs(spec, ctx.saved_tensors, grads, _apply))


def _apply(spec, xs):
    """Run ``spec`` on contiguous CPU tensors ``xs``: under torch.compile as the
    custom op (opaque to Dynamo), in eager mode as :class:`_Eager` when autograd
    records, else the kernel alone."""
    if _is_compiling():
        return _kernel(xs, spec.key)
    if _functorch_active() or any(map(_functorch_wrapped, xs)):
        # neither path has the transforms' rules (setup_context, vmap, jvp): the
        # custom op's autograd raised deep in torch, and jvp through it gave zero
        # tangents without a word; the kernel would read a wrapper's missing storage
        raise TexprError(f"{spec.who}: torch.func transforms (grad, vjp, jacrev, jvp, vmap, "
                         "...) are not supported by texpr ops; use torch.autograd "
                         "(backward, autograd.grad, gradcheck) and a loop for batches")
    if torch.is_grad_enabled():
        for x in xs:
            if x.requires_grad:
                outs = _eager_apply(spec.key, *xs)
                return (outs,) if type(outs) is torch.Tensor else outs
    return _outputs(spec, xs)


#: autograd.Function's C ``apply`` for :class:`_Eager`, without the Python
#: wrapper of ``Function.apply`` (about 6 us a call here), which only matters
#: under torch.func transforms (it unwraps their dead wrappers); :func:`_apply`
#: refuses those
_eager_apply = getattr(super(torch.autograd.Function, _Eager), "apply", _Eager.apply)
_functorch_active = torch._C._are_functorch_transforms_active
_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


class TorchOp:
    """A texpr graph as a differentiable PyTorch function (see :func:`op`).

    ``op(*tensors)`` returns one tensor (the op was made from one output
    Tensor) or a tuple. Attributes: ``spec`` (the :class:`texpr.bridge.OpSpec`),
    ``kernel`` (the compiled forward kernel).
    """

    def __init__(self, spec):
        self.spec = spec
        self._key = spec.key
        self._expect = [(tuple(t.shape), _TORCH_DTYPES[t.dtype], t) for t in spec.inputs]

    @property
    def kernel(self):
        return self.spec.kernel

    def __reduce__(self):
        return (TorchOp, (self.spec,))

    def __call__(self, *xs):
        if len(xs) != len(self._expect):
            raise FeedError(f"{self.spec.who}: expected {len(self._expect)} tensors "
                            f"({', '.join(t.name for t in self.spec.inputs)}), got {len(xs)}")
        args = []
        for x, (shape, dtype, t) in zip(xs, self._expect):
            if type(x) is torch.Tensor and x.dtype is dtype and x.shape == shape and x.is_cpu:
                # the common case in a few attribute reads (the checks below say why not)
                try:
                    args.append(x if x.is_contiguous() else x.contiguous())
                    continue
                except RuntimeError:  # not strided (sparse, mkldnn): the checks below say so
                    pass
            if not isinstance(x, torch.Tensor):
                raise FeedError(f"{self.spec.who}: the value for {t.name} must be a torch "
                                f"tensor, got {type(x).__name__}")
            if x.dtype != dtype:
                raise FeedError(f"{self.spec.who}: placeholder {t.name} expects dtype "
                                f"{t.dtype}, got a torch tensor of dtype {x.dtype}")
            if tuple(x.shape) != shape:
                raise FeedError(f"{self.spec.who}: placeholder {t.name} expects shape {shape}, "
                                f"got a torch tensor of shape {tuple(x.shape)}")
            if x.device.type != "cpu":
                raise FeedError(f"{self.spec.who}: placeholder {t.name}: texpr kernels run on "
                                f"the CPU, got a tensor on {x.device}")
            if x.layout is not torch.strided:
                raise FeedError(f"{self.spec.who}: placeholder {t.name} expects a dense "
                                f"(strided) tensor, got one of layout {x.layout}")
            args.append(x if x.is_contiguous() else x.contiguous())
        outs = _apply(self.spec, args)
        return outs[0] if self.spec.single else tuple(outs)

    def __repr__(self):
        return f"texpr.torch.op({self.spec.signature()})"


def op(outputs, inputs):
    """Turn the texpr graph ``outputs`` <- ``inputs`` into a PyTorch operator.

    Args:
        outputs: a Tensor (the op returns a tensor) or a list of Tensors (the op
            returns a tuple, in this order).
        inputs: the placeholder Tensors the op takes, in order.
    Returns:
        A :class:`TorchOp`: called with CPU torch tensors of the inputs' exact
        shapes and dtypes (``float32`` -> ``torch.float32`` and so on), it runs
        the compiled forward kernel (:func:`texpr.codegen.build`, compiled on the
        first call) and returns tensors of the outputs' shapes and dtypes.
        Differentiable by torch autograd: the backward runs the compiled,
        simplified adjoint kernel (``te.differentiate`` with ``grad_output`` as
        the head, summed over the outputs); double backward differentiates the
        adjoint graph again (built on first use). Integer and bool inputs get no
        gradient. Works under ``torch.compile`` (see the module docstring).
        ``torch.func`` transforms (``grad``, ``vjp``, ``jacrev``, ``jvp``,
        ``vmap``) raise TexprError: use ``torch.autograd``.
    Raises:
        TexprError: non-Tensor outputs, inputs that are not distinct placeholders.
        FeedError (on call): wrong number of tensors, a wrong dtype or shape, a
        non-CPU tensor. NotDifferentiableError (on backward): texpr cannot
        differentiate the graph (e.g. a second time through some reduction).
    """
    return TorchOp(OpSpec(outputs, inputs, who="texpr.torch.op"))
