"""What the framework bridges (:mod:`texpr.torch`, :mod:`texpr.jax`) share: an
:class:`OpSpec` -- a texpr graph seen as a framework operator.

An OpSpec holds ``outputs`` and ``inputs`` (placeholders), compiles the
forward kernel on first use, and builds its *backward spec* on first use: the
operator that maps ``inputs + heads`` (one head placeholder per float output,
the ``grad_output``) to the adjoints of the float inputs, from
``te.differentiate(output, float_inputs, head=head)`` (simplified), summed
over the outputs. The backward spec is again an OpSpec, so its own backward
(second order) is built the same way, lazily, when a framework asks for it.

This module imports neither torch nor jax; it is framework-neutral.
"""

import itertools
import threading
import weakref

from . import dtypes as dt
from .errors import FeedError, TexprError
from .tensor import ComputeOp, PlaceholderOp, Tensor, as_tensor_list

__all__ = ["OpSpec", "SPECS"]

_KEYS = itertools.count()
#: held while a spec builds its kernel or its backward spec, and while a bridge
#: builds its per-spec objects (texpr.jax registers FFI targets): an op first
#: called (or differentiated) from several threads at once is built once, and
#: the symbolic machinery (sympy, islpy, the symbolic cache) runs in one thread
#: at a time. Reentrant: building a backward spec may build kernels.
BUILD_LOCK = threading.RLock()
#: key -> OpSpec (frameworks refer to a spec by its int key inside traced graphs).
#: Weak: a spec lives as long as its op (texpr.torch.TorchOp holds it) or an
#: autograd graph that recorded it (the bridge's context objects hold it);
#: dropping an op frees its spec, backward spec and kernels
SPECS = weakref.WeakValueDictionary()


class OpSpec:
    """A texpr graph as an operator: ``outputs`` from ``inputs``.

    Attributes: ``outputs``, ``inputs`` (lists of Tensors), ``single`` (the
    caller gave one output Tensor: the op returns a tensor, not a tuple),
    ``float_inputs`` / ``float_outputs`` (their positions: the differentiable
    ones), ``key`` (an int naming this spec in :data:`SPECS`, while the spec
    lives: that registry holds it weakly), ``who`` (the name used in errors).

    Raises (construction): TexprError for outputs that are not Tensors or
    inputs that are not distinct placeholders.
    """

    def signature(self):
        """``"X, W -> Y"``: the input and output names, for reprs and messages."""
        return (f"{', '.join(t.name for t in self.inputs)} -> "
                f"{', '.join(t.name for t in self.outputs)}")

    def __init__(self, outputs, inputs, who="op"):
        self.single = isinstance(outputs, Tensor)
        outs = [outputs] if self.single else as_tensor_list(outputs, f"{who}: outputs")
        ins = [inputs] if isinstance(inputs, Tensor) else as_tensor_list(inputs, f"{who}: inputs")
        if not outs:
            raise TexprError(f"{who}: no outputs")
        for t in ins:
            if not isinstance(t.op, PlaceholderOp):
                raise TexprError(f"{who}: inputs must be placeholders, got {t.name} "
                                 f"(a {type(t.op).__name__})")
        if len({id(t) for t in ins}) != len(ins):
            raise TexprError(f"{who}: a placeholder is listed twice in inputs "
                             f"{[t.name for t in ins]}")
        self.outputs, self.inputs, self.who = outs, ins, who
        self.float_inputs = [j for j, t in enumerate(ins) if dt.is_float(t.dtype)]
        self.float_outputs = [k for k, t in enumerate(outs) if dt.is_float(t.dtype)]
        self._kernel = None
        self._backward = None
        self.key = next(_KEYS)
        SPECS[self.key] = self
        #: per-framework caches (e.g. the jax function of this spec)
        self.cache = {}

    def __reduce__(self):
        # keys are per process: a loaded spec registers itself under a new key;
        # its kernel comes back from the compile cache on first use
        return (OpSpec, (self.outputs[0] if self.single else self.outputs, self.inputs, self.who))

    @property
    def kernel(self):
        """The compiled forward :class:`texpr.codegen.Kernel` (built on first use)."""
        if self._kernel is None:
            from .codegen import build

            with BUILD_LOCK:
                if self._kernel is None:
                    self._kernel = build(self.outputs, self.inputs)
        return self._kernel

    def run(self, arrays):
        """The outputs (a list of numpy arrays) for the input ``arrays`` (numpy,
        C-contiguous, exact shapes and dtypes). An output listed twice comes back
        as two arrays (never aliases)."""
        # the kernel never returns one array twice, nor an input array
        return list(self.kernel.run_exact(arrays))

    def backward(self):
        """The backward OpSpec: inputs ``self.inputs + heads`` (a head per float
        output, of its shape and dtype), outputs the adjoints of the float inputs
        (each of its input's shape and dtype), the sum over outputs of
        ``te.differentiate(out, float_inputs, head)``. Built on first use.

        Raises NotDifferentiableError when texpr cannot differentiate the graph.
        """
        if self._backward is None:
            with BUILD_LOCK:
                if self._backward is None:
                    self._backward = self._make_backward()
        return self._backward

    def _make_backward(self):
        """The backward OpSpec (see :meth:`backward`), built anew."""
        from .differentiate import differentiate

        fins = [self.inputs[j] for j in self.float_inputs]
        heads, parts = [], [[] for _ in fins]
        for k in self.float_outputs:
            out = self.outputs[k]
            head = _placeholder_like(out, f"head_{out.name}")
            heads.append(head)
            if not fins:
                continue
            res = differentiate(out, fins, head=head)
            for j, g in enumerate(res.result):
                parts[j].append(g)
        if not fins:
            raise TexprError(f"{self.who}: no float input, nothing to differentiate")
        grads = [_sum_cast(p, t) for p, t in zip(parts, fins)]
        return OpSpec(grads, self.inputs + heads, who=f"{self.who} (backward)")

    def check(self, values, shape_of, dtype_of, kind):
        """Check framework values for ``inputs``: their number, shapes and dtypes.

        ``shape_of(v)`` / ``dtype_of(v)`` give a value's shape tuple and numpy
        dtype name (None when it is not a ``kind`` value). Raises FeedError
        naming the placeholder and what was expected.
        """
        if len(values) != len(self.inputs):
            raise FeedError(f"{self.who}: expected {len(self.inputs)} {kind} tensors "
                            f"({', '.join(t.name for t in self.inputs)}), got {len(values)}")
        for t, v in zip(self.inputs, values):
            d = dtype_of(v)
            if d is None:
                raise FeedError(f"{self.who}: the value for {t.name} must be a {kind} tensor, "
                                f"got {type(v).__name__}")
            if tuple(shape_of(v)) != tuple(t.shape):
                raise FeedError(f"{self.who}: placeholder {t.name} expects shape {t.shape}, "
                                f"got a {kind} tensor of shape {tuple(shape_of(v))}")
            if d != t.dtype:
                raise FeedError(f"{self.who}: placeholder {t.name} expects dtype {t.dtype}, "
                                f"got a {kind} tensor of dtype {d}")




def _placeholder_like(t, name):
    from .tensor import placeholder

    return placeholder(t.shape, name=name, dtype=t.dtype)


def _sum_cast(parts, like):
    """One tensor of ``like``'s shape and dtype: the sum of ``parts`` (zeros if none)."""
    from .expr import cast, const, iter_var

    axis = tuple(iter_var(0, s, f"j{d}", "spatial") for d, s in enumerate(like.shape))
    if not parts:
        body = const(0, like.dtype)
    elif len(parts) == 1 and parts[0].dtype == like.dtype:
        return parts[0]
    else:
        body = parts[0][axis]
        for p in parts[1:]:
            body = body + p[axis]
        if body.dtype != like.dtype:
            body = cast(body, like.dtype)
    return ComputeOp(f"grad_{like.name}", axis, (body,), tag="adjoint_sum").output(0)
