"""Tensors and the operations that define them: placeholders, compute stages,
scatter-add stages.

A :class:`Tensor` is one output of an :class:`Operation`. Tensors (and
operations) are identity objects: two computes with the same body are two
different stages. Invariant kept by :func:`compute`: a :class:`Reduce` appears
only at the top of a compute body (nested reductions are lifted into stages
of their own), so every stage is either elementwise or one reduction.
"""

import inspect
import itertools
import math
import sys

import numpy as np

from . import dtypes as dt
from .errors import AxisError, DTypeError, FeedError, OutOfBoundsError, ShapeError, TexprError
from .expr import (Const, Expr, IterVar, Load, NeedsValue, Reduce, Var, as_expr, const,
                   iter_var, load)
from .printer import REPR_WIDTH, expr_str, tensor_str
from .topo import topo_order  # noqa: F401 - re-exported: texpr.tensor.topo_order
from .visitor import MAX_DEPTH, depth, free_vars, post_order, substitute

_NAME_COUNTER = itertools.count()


def _fresh_name(prefix):
    return f"{prefix}{next(_NAME_COUNTER)}"


def check_name(name, what, prefix=None):
    """A validated name: any ``str`` is accepted as it is (names reach generated code
    only as escaped comments, see :mod:`texpr.codegen.loopnest.source`); ``None`` or ``""``
    gives a fresh ``prefix<n>`` when ``prefix`` is given. Anything else raises
    :class:`TexprError` naming ``what`` (e.g. ``"placeholder"``) and the value."""
    if prefix is not None and (name is None or (isinstance(name, str) and not name)):
        return _fresh_name(prefix)
    if not isinstance(name, str):
        raise TexprError(f"{what}: name must be a str, got {type(name).__name__}: {name!r}")
    return name


def _check_shape(shape, what):
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        shape = tuple(shape)
    except TypeError:
        raise ShapeError(f"{what}: shape must be a tuple of ints, got {shape!r}") from None
    out = []
    for d in shape:
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
            raise ShapeError(f"{what}: shape {shape!r} has a non-integer extent {d!r}")
        if d < 0:
            raise ShapeError(f"{what}: shape {shape!r} has a negative extent {d}")
        if d > MAX_EXTENT:
            raise ShapeError(f"{what}: shape {shape!r} has the extent {d}, more than an int64 "
                             f"index can address (at most {MAX_EXTENT})")
        out.append(int(d))
    return tuple(out)


#: the largest extent of an axis: index arithmetic is int64
MAX_EXTENT = 2**63 - 1


def check_allocatable(tensor, who):
    """Raise ShapeError when ``tensor`` (exact size, a Python int, times its item
    size) cannot be allocated in this process's address space (``sys.maxsize``
    bytes, numpy's limit); ``who`` names the caller in the message."""
    nbytes = tensor.size * np.dtype(tensor.dtype).itemsize
    if nbytes > sys.maxsize:
        raise ShapeError(f"{who}: tensor {tensor.name} of shape {tensor.shape} ({tensor.dtype}) "
                         f"needs {nbytes} bytes, more than the address space ({sys.maxsize} "
                         "bytes)")


class Tensor(NeedsValue):
    """One output of an operation: ``shape`` (tuple of ints), ``dtype``, ``name``, ``op``.

    ``T[i, j]`` (or ``T[(i, j)]``, ``T[()]`` for a scalar) builds a load whose
    indices are integer expressions; it raises ``ShapeError`` for the wrong
    number of indices and ``DTypeError`` for a non-integer index.
    """

    __slots__ = ("op", "value_index", "__weakref__")

    def __init__(self, op, value_index=0):
        self.op = op
        self.value_index = value_index

    @property
    def shape(self):
        op = self.op
        shapes = op.shapes
        return op.shape if shapes is None else shapes[self.value_index]

    @property
    def dtype(self):
        return self.op.dtypes[self.value_index]

    @property
    def name(self):
        n = self.op.name
        return n if self.op.num_outputs == 1 else f"{n}.v{self.value_index}"

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        """The number of elements, exactly (a Python int: no int64 wrap-around)."""
        return math.prod(self.shape)

    def __getitem__(self, indices):
        if not isinstance(indices, tuple):
            indices = (indices,)
        return load(self, _no_negative_constants(self, indices))

    def __call__(self, *indices):
        return load(self, _no_negative_constants(self, indices))

    def __repr__(self):
        # a long definition (a gradient's) wraps: one line of 900 characters was unreadable
        return tensor_str(self, width=REPR_WIDTH)

    def __bool__(self):
        return True

    # arithmetic on scalar tensors reads them: t + 1 == t[()] + 1
    def _scalar(self):
        if self.shape != ():
            raise ShapeError(
                f"tensor {self.name} of shape {self.shape} used as a scalar; index it, "
                f"e.g. {self.name}[{', '.join('i' * 1 for _ in self.shape)}]"
            )
        return self[()]

    def __add__(self, o): return self._scalar() + o
    def __radd__(self, o): return o + self._scalar()
    def __sub__(self, o): return self._scalar() - o
    def __rsub__(self, o): return o - self._scalar()
    def __mul__(self, o): return self._scalar() * o
    def __rmul__(self, o): return o * self._scalar()
    def __truediv__(self, o): return self._scalar() / o
    def __rtruediv__(self, o): return o / self._scalar()
    def __neg__(self): return -self._scalar()


def _no_negative_constants(tensor, indices):
    """``indices`` unchanged; a constant negative index is an error (no wrapping)."""
    for pos, ix in enumerate(indices):
        v = ix.value if isinstance(ix, Const) else ix
        if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and v < 0:
            shown = ", ".join(str(x) for x in indices)
            wrapped = ""
            if len(indices) == len(tensor.shape) and tensor.shape[pos] + v >= 0:
                wrapped = (f"; numpy's {tensor.name}[{shown}] would be index "
                           f"{tensor.shape[pos] + int(v)} in dimension {pos} (extent "
                           f"{tensor.shape[pos]}): write that")
            raise OutOfBoundsError(
                f"{tensor.name}[{shown}]: index {pos} is the constant {int(v)}; negative "
                f"indices do not wrap in texpr (as in TVM, unlike numpy), they are out of "
                f"bounds{wrapped}")
    return indices


class Operation:
    """Base of the operations: ``name``, ``shape``, ``dtypes``, ``outputs``, ``input_tensors``.

    ``simplify_record`` is ``None`` except on the stages ``te.differentiate``
    returns: there it is the record of the simplification that built them,
    which ``texpr.simplify.explain`` prints (a ``texpr.simplify.SimplifyRecord``;
    the IR never looks inside it).
    """

    num_outputs = 1
    simplify_record = None
    #: per-output shapes when the outputs differ in shape (a scan's states), else None
    shapes = None

    @property
    def outputs(self):
        return self._outputs

    def output(self, i=0):
        return self._outputs[i]

    def input_tensors(self):
        return []

    def _definition(self, t, names):
        """The text of this stage's definition (:func:`texpr.printer.tensor_str`),
        ``t`` its output, ``names`` a :class:`texpr.printer._Names`."""
        raise TypeError(f"printer: unknown operation {type(self).__name__}")


class PlaceholderOp(Operation):
    """An input fed at run time."""

    def __init__(self, name, shape, dtype):
        self.name, self.shape, self.dtypes = name, shape, (dtype,)
        self._outputs = (Tensor(self, 0),)

    def _definition(self, t, names):
        return f"{names.tensor(t)} = placeholder({self.shape}, {t.dtype})"


def _collect_inputs(exprs):
    seen, out = set(), []
    for n in post_order(exprs):
        if isinstance(n, Load) and id(n.tensor) not in seen:
            seen.add(id(n.tensor))
            out.append(n.tensor)
    return out


class ComputeOp(Operation):
    """``out[axis] = body`` over the box ``0 <= axis[d] < shape[d]``.

    The spatial axes always start at 0 (``AxisError`` otherwise); reduction
    axes may run over any ``[lo, hi)``, and so may a scatter-add's domain.

    ``axis`` is the tuple of spatial IterVars, ``body`` a tuple of Exprs (one
    per output; several only for tuple reductions, all Reduces over the same
    axes). ``reduce_axis`` lists the reduction IterVars (empty when the stage
    is elementwise). ``tag`` and ``attrs`` are free-form (the operator library
    records the operator and its parameters there).
    """

    def __init__(self, name, axis, body, tag="", attrs=None):
        self.name = name
        self.axis = tuple(axis)
        for a in self.axis:
            if not isinstance(a, IterVar) or a.dom[0] != 0:
                raise AxisError(
                    f"compute {name}: spatial axis `{getattr(a, 'name', a)}` runs over "
                    f"{getattr(a, 'dom', '?')}; a compute's axes run over [0, extent) "
                    "(the element out[i] is stored at position i); shift the body instead")
        self.body = tuple(body)
        self.shape = tuple(a.extent for a in self.axis)
        self.dtypes = tuple(b.dtype for b in self.body)
        self.num_outputs = len(self.body)
        self.tag = tag
        self.attrs = dict(attrs or {})
        self._outputs = tuple(Tensor(self, i) for i in range(self.num_outputs))
        self._inputs = _collect_inputs(self.body)

    @property
    def reduce_axis(self):
        b = self.body[0]
        return b.axes if isinstance(b, Reduce) else ()

    def input_tensors(self):
        return list(self._inputs)

    def _definition(self, t, names):
        # a compute's axes run over [0, extent) (checked above): ``i<n``
        lhs = ", ".join(f"{names.var(a)}<{a.extent}" for a in self.axis)
        outs = [names.tensor(o) for o in self.outputs]
        prefix, texts = names.exprs(self.body)
        return f"{', '.join(outs)}[{lhs}] = {prefix}{' ; '.join(texts)}  # {', '.join(self.dtypes)}"


class ScatterAddOp(Operation):
    """A scatter-add stage (an update definition): ``out = init``, then for each
    point of the iteration domain ``axis`` where ``where`` holds,
    ``out[indices] += value``.

    ``axis``: tuple of IterVars (the domain, e.g. the positions of an index
    list); ``indices``: one integer Expr per output dimension (may load from
    int tensors); ``value``: an Expr over ``axis``; ``init``: a Tensor of the
    output's shape or None for zeros. Gradients of data-dependent gathers
    (``X[I[k]]``) become these, so their work is ``O(len(I))``.
    """

    def __init__(self, name, shape, dtype, axis, indices, value, where=None, init=None):
        self.name = name
        self.shape = tuple(shape)
        self.dtypes = (dtype,)
        self.axis = tuple(axis)
        self.indices = tuple(indices)
        self.value = value
        self.where = const(True) if where is None else where
        self.init = init
        if len(self.indices) != len(self.shape):
            raise ShapeError(f"scatter-add {name}: {len(self.indices)} indices for shape {self.shape}")
        self._outputs = (Tensor(self, 0),)
        self._inputs = _collect_inputs(self.indices + (self.value, self.where))
        if init is not None:
            self._inputs.insert(0, init)

    @property
    def reduce_axis(self):
        return ()

    def input_tensors(self):
        return list(self._inputs)

    def _definition(self, t, names):
        # a scatter's domain may start anywhere: always ``p:lo..hi``
        dom = ", ".join(names.domain(a) for a in self.axis)
        prefix, texts = names.exprs(list(self.indices) + [self.where, self.value])
        idx = ", ".join(texts[:len(self.indices)])
        init = names.tensor(self.init) if self.init is not None else "0"
        cond = "" if (isinstance(self.where, Const) and self.where.value is True) else \
            f" if {texts[-2]}"
        return (f"{names.tensor(t)}{self.shape} = {init}; for [{dom}]{cond}: {prefix}"
                f"{names.tensor(t)}[{idx}] += {texts[-1]}  # {t.dtype}")


def placeholder(shape, name=None, dtype="float32"):
    """An input tensor of ``shape`` (tuple of non-negative ints) and ``dtype``.

    Raises:
        ShapeError: a negative or non-integer extent.
        DTypeError: an unsupported dtype.
    """
    name = check_name(name, "placeholder", "placeholder")
    shape = _check_shape(shape, f"placeholder {name}")
    return PlaceholderOp(name, shape, dt.normalize(dtype, f"placeholder {name}")).output(0)


def reduce_axis(dom, name=None):
    """A reduction axis over ``0 <= k < dom`` or ``lo <= k < hi`` for ``dom=(lo, hi)``.

    Raises:
        ShapeError: a negative extent or non-integer bounds.
    """
    name = check_name(name, "reduce_axis", "k")
    lo, hi = axis_bounds(dom, f"reduce_axis {name}")
    return iter_var(lo, hi, name, "reduce")


def _axis_names(fcompute, n):
    try:
        params = [p for p in inspect.signature(fcompute).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    if len(params) == n and all(p.name.isidentifier() for p in params):
        return [p.name for p in params]
    return ["ax%d" % d for d in range(n)]


def _check_axes_usage(name, axis, body):
    """Every free variable is a spatial axis of this stage; reduce axes only inside their Reduce."""
    allowed = {id(a) for a in axis}
    seen = set()

    def walk(e, bound, top):
        key = (id(e), bound)
        if key in seen:
            return
        seen.add(key)
        if isinstance(e, Reduce):
            for a in e.axes:
                if not isinstance(a, IterVar) or a.kind != "reduce":
                    raise AxisError(
                        f"compute {name}: `{a!r}` used as a reduction axis is not a "
                        "reduce_axis (create it with te.reduce_axis)")
            inner = bound | frozenset(id(a) for a in e.axes)
            for child in e.args:
                walk(child, inner, top)
            return
        if isinstance(e, Var) and id(e) not in allowed and id(e) not in bound:
            if isinstance(e, IterVar) and e.kind == "reduce":
                raise AxisError(
                    f"compute {name}: reduction axis `{e.name}` is used outside a reduction "
                    f"over it in `{expr_str(top)}`; wrap it in te.sum(..., axis={e.name})")
            raise AxisError(
                f"compute {name}: variable `{e.name}` in `{expr_str(top)}` is not an axis of "
                "this compute (index variables come from the lambda's arguments)")
        for child in e.args:
            walk(child, bound, top)

    for b in body:
        walk(b, frozenset(), b)


def _same(xs, ys):
    # the same nodes (identity: ``==`` of texpr expressions builds a condition)
    return len(xs) == len(ys) and all(x is y for x, y in zip(xs, ys))


def tuple_components(red):
    """Every component of the reduction ``red`` (a Reduce), in order: ``(red,)``
    for a one-component reducer; for a tuple reducer, one Reduce per component
    of its combiner, with ``red``'s axes, sources and condition (a stage
    computes a tuple reduction whole, whichever components are read)."""
    n = len(red.combiner.result)
    if n == 1:
        return (red,)
    comb, axes, _ = red.attr
    return tuple(Reduce._rebuild((comb, axes, i), red.args) for i in range(n))


#: the attribute of a stage lifted out of another's body (a nested reduction):
#: the program asks for its values only where its consumer reads them, so
#: te.evaluate computes it only there (a reduction in a select's untaken branch
#: is never evaluated, as the compiled kernel never runs it)
NESTED_REDUCTION = "texpr.nested_reduction"


def _lift_nested_reductions(name, axis, body):
    """Move every Reduce not at the top of ``body`` into a stage of its own
    (attribute :data:`NESTED_REDUCTION`).

    The new stage's axes are this stage's axes followed by any enclosing
    reduction axes the inner reduction depends on.
    """
    counter = itertools.count()
    # nodes are interned: a shared subexpression is rewritten once (a walk of the
    # tree instead of the DAG is exponential in the depth: ``e = e * e`` n times)
    memo = {}

    def lift(e, top):
        # returns e with nested reduces replaced by loads of new stages
        key = (id(e), top)
        hit = memo.get(key)
        if hit is not None:
            return hit
        if isinstance(e, Reduce):
            args = tuple(lift_inside(a, e.axes) for a in e.args)
            node = Reduce._rebuild(e.attr, args)
            out = node if top else _as_stage(node, ())
        else:
            out = e.with_args(tuple(lift(a, False) for a in e.args)) if e.args else e
        memo[key] = out
        return out

    def lift_inside(e, enclosing_axes):
        key = (id(e), "in", tuple(id(a) for a in enclosing_axes))
        hit = memo.get(key)
        if hit is not None:
            return hit
        if isinstance(e, Reduce):
            inner = Reduce._rebuild(e.attr, tuple(lift_inside(a, e.axes + enclosing_axes)
                                                  for a in e.args))
            out = _as_stage(inner, enclosing_axes)
        else:
            out = (e.with_args(tuple(lift_inside(a, enclosing_axes) for a in e.args))
                   if e.args else e)
        memo[key] = out
        return out

    def _as_stage(red, enclosing_axes):
        fv = {id(v) for v in free_vars(red)}
        extra = [a for a in enclosing_axes if id(a) in fv]
        outer = list(axis) + extra
        new_axis = [iter_var(0, a.extent, a.name, "spatial") for a in outer]
        shifted = [na + a.dom[0] if a.dom[0] else na for na, a in zip(new_axis, outer)]
        inner_body = substitute(red, dict(zip(outer, shifted)))
        op = ComputeOp(f"{name}.red{next(counter)}", new_axis, tuple_components(inner_body),
                       attrs={NESTED_REDUCTION: True})
        idx = [a - a.dom[0] if a.dom[0] else a for a in outer]
        return op.output(inner_body.value_index)[tuple(idx)]

    return tuple(lift(b, True) for b in body)


def compute(shape, fcompute, name=None, tag="", attrs=None):
    """Define a tensor elementwise: ``out[i, j, ...] = fcompute(i, j, ...)``.

    Args:
        shape: tuple of non-negative ints (``()`` for a scalar: ``lambda: ...``).
        fcompute: called with one int64 index variable per dimension; returns an
            expression (or a Python number), or a tuple of reductions for a tuple
            reducer (then a tuple of tensors is returned).
        name: the stage's name (also used in errors and printing).
    Returns:
        Tensor (or tuple of Tensors for a tuple reduction) of ``shape``.
    Raises:
        ShapeError: bad shape. AxisError: a reduce axis used outside its reduction,
        or a foreign variable. TexprError: ``fcompute`` returns a non-expression.
        OutOfBoundsError: a constant negative index (indices do not wrap).

    >>> import texpr as te
    >>> X = te.placeholder((4, 5), name="X")
    >>> k = te.reduce_axis(5, name="k")
    >>> te.compute((4,), lambda i: te.sum(X[i, k] * X[i, k], axis=k), name="sq")
    sq[i<4] = sum(X[i, k] * X[i, k], axis=[k:0..5])  # float32
    """
    name = check_name(name, "compute", "compute")
    shape = _check_shape(shape, f"compute {name}")
    if not callable(fcompute):
        raise TexprError(f"compute {name}: fcompute must be callable, got {fcompute!r}")
    names = _axis_names(fcompute, len(shape))
    axis = tuple(iter_var(0, n, nm, "spatial") for n, nm in zip(shape, names))
    try:
        inspect.signature(fcompute).bind(*axis)
    except TypeError:
        raise ShapeError(f"compute {name}: shape {shape} has {len(shape)} dimension(s) but "
                         f"fcompute does not take {len(shape)} index argument(s)") from None
    except ValueError:  # no signature (a builtin): let the call decide
        pass
    try:
        result = fcompute(*axis)
    except TexprError as exc:  # name the tensor being built (an operator alone is vague)
        if str(exc).startswith(f"compute {name}:"):
            raise
        raise type(exc)(f"compute {name}: {exc}") from None
    multi = isinstance(result, (tuple, list))
    outs = list(result) if multi else [result]
    if not outs:
        raise TexprError(f"compute {name}: fcompute returned an empty tuple")
    body = []
    for r in outs:
        if isinstance(r, (Expr, int, float, bool, np.number, np.bool_, Tensor)):
            body.append(as_expr(r))
        else:
            raise TexprError(
                f"compute {name}: fcompute must return a texpr expression or a number, "
                f"got {type(r).__name__}: {r!r}")
    if multi and len(body) > 1:
        first = body[0]
        for b in body:
            if not (isinstance(b, Reduce) and isinstance(first, Reduce)
                    and b.combiner is first.combiner and _same(b.axes, first.axes)
                    and _same(b.args, first.args)):
                raise TexprError(
                    f"compute {name}: several outputs are only allowed for the components "
                    "of one tuple reduction")
    # a tuple reduction's components read alone or out of order (``argmax(..)[0]``):
    # the stage computes every component and returns the ones asked for
    picked = None
    if isinstance(body[0], Reduce) and len(body[0].combiner.result) > 1:
        order = [b.value_index for b in body]
        if order != list(range(len(body[0].combiner.result))):
            picked = order
            body = list(tuple_components(body[0]))
    d = depth(body)
    if d > MAX_DEPTH:
        raise TexprError(f"compute {name}: the body is {d} levels deep, more than the limit "
                         f"texpr.visitor.MAX_DEPTH = {MAX_DEPTH}; split it into stages (an "
                         "intermediate te.compute per part)")
    _check_axes_usage(name, axis, body)
    body = _lift_nested_reductions(name, axis, body)
    op = ComputeOp(name, axis, body, tag=tag, attrs=attrs)
    if picked is not None:
        outs = tuple(op.output(i) for i in picked)
        return outs if multi else outs[0]
    return op.outputs if multi else op.output(0)


def scatter_add(shape, dtype, domain, findices, fvalue, where=None, init=None, name=None):
    """A scatter-add stage: for every point ``p`` of ``domain`` (where ``where(*p)``
    holds), add ``fvalue(*p)`` at ``out[findices(*p)]``; ``out`` starts as ``init``
    or zeros.

    Args:
        shape, dtype: the output's.
        domain: the iteration domain, one entry per dimension: an int ``n``
            (``0 <= p < n``) or a pair ``(lo, hi)`` (``lo <= p < hi``; the
            index variable takes the values ``lo .. hi-1`` themselves).
        findices: ``(*p) -> index Expr or tuple`` (one per output dimension).
        fvalue: ``(*p) -> Expr``; where: ``(*p) -> bool Expr`` or None.
        init: a Tensor of ``shape`` or None (zeros).
    Returns a Tensor of ``shape``/``dtype``. Duplicated target indices accumulate
    (``np.add.at``); see docs/stages.md.
    Raises:
        ShapeError: a bad shape or domain entry (negative extent, non-int bound).
        DTypeError: ``init`` of another dtype than ``dtype``.

    >>> import numpy as np
    >>> import texpr as te
    >>> I = te.placeholder((3,), name="I", dtype="int64")
    >>> S = te.scatter_add((4,), "float32", (3,), lambda p: I[p], lambda p: 1.0, name="counts")
    >>> te.evaluate(S, {I: np.array([2, 0, 2])})
    array([1., 0., 2., 0.], dtype=float32)
    """
    name = check_name(name, "scatter_add", "scatter")
    shape = _check_shape(shape, f"scatter_add {name}")
    if isinstance(domain, (int, np.integer)):
        domain = (domain,)
    try:
        domain = tuple(domain)
    except TypeError:
        raise ShapeError(f"scatter_add {name}: domain must be a tuple of ints or (lo, hi) "
                         f"pairs, got {domain!r}") from None
    axis = tuple(_domain_axis(f"scatter_add {name}", d, n, f"p{d}")
                 for d, n in enumerate(domain))
    idx = findices(*axis)
    idx = tuple(idx) if isinstance(idx, (tuple, list)) else (idx,)
    idx = tuple(as_expr(i, like=dt.INDEX_DTYPE) for i in idx)
    value = as_expr(fvalue(*axis))
    w = None if where is None else as_expr(where(*axis))
    dtype = dt.normalize(dtype)
    if init is not None and getattr(init, "dtype", dtype) != dtype:
        # the kernels copy init into the output without a cast
        raise DTypeError(f"scatter_add {name}: init {init.name} is {init.dtype}, the "
                         f"output {dtype}; cast it first")
    return ScatterAddOp(name, shape, dtype, axis, idx, value, w, init).output(0)


def _domain_axis(what, d, entry, name):
    """One domain axis from ``n`` (``[0, n)``) or ``(lo, hi)``."""
    lo, hi = axis_bounds(entry, f"{what}: domain entry {d}")
    return iter_var(lo, hi, name, "spatial")


def axis_bounds(entry, what):
    """``(lo, hi)`` of an axis given as ``n`` (``[0, n)``) or ``(lo, hi)``, as Python ints.

    Raises:
        ShapeError: not an int or a pair of ints, a negative extent, or bounds or an
            extent outside int64 (index arithmetic is int64); ``what`` names the axis.
    """
    if isinstance(entry, (tuple, list)):
        if len(entry) != 2:
            raise ShapeError(f"{what}: expected n or (lo, hi), got {entry!r}")
        lo, hi = entry
    else:
        lo, hi = 0, entry
    for v in (lo, hi):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise ShapeError(f"{what}: bounds must be ints, got {entry!r}")
    lo, hi = int(lo), int(hi)
    if not -MAX_EXTENT - 1 <= min(lo, hi) <= max(lo, hi) <= MAX_EXTENT or hi - lo > MAX_EXTENT:
        raise ShapeError(f"{what}: the range {entry!r} leaves int64 (index arithmetic is "
                         f"int64: bounds and extent at most {MAX_EXTENT})")
    if hi < lo:
        raise ShapeError(f"{what}: negative extent in {entry!r}")
    return lo, hi


def as_tensor_list(tensors, what, allow_single=True):
    """``tensors`` (a Tensor or an iterable of Tensors) as a list of Tensors.

    Args:
        tensors: a Tensor, or an iterable of Tensors.
        what: the caller and argument, for messages (``"differentiate: inputs"``).
        allow_single: whether a lone Tensor is accepted (as a one-element list).
    Raises:
        TexprError: not iterable, an element is not a Tensor, or a lone Tensor
            where a list is required.
    """
    if isinstance(tensors, Tensor):
        if not allow_single:
            raise TexprError(f"{what}: expected a list of Tensors, got one Tensor; wrap it in [...]")
        return [tensors]
    try:
        out = list(tensors)
    except TypeError:
        raise TexprError(f"{what}: expected a Tensor or a list of Tensors, got {tensors!r}") from None
    for t in out:
        if not isinstance(t, Tensor):
            raise TexprError(f"{what}: expected Tensors, got {type(t).__name__}: {t!r}")
    return out


def row_major_strides(shape):
    """The row-major (C order) strides of ``shape``, in elements: a list of ints,
    the last 1 (``(2, 3, 4)`` -> ``[12, 4, 1]``)."""
    strides, stride = [], 1
    for n in reversed(tuple(shape)):
        strides.append(stride)
        stride *= int(n)
    strides.reverse()
    return strides


#: texpr dtype name -> numpy's (singleton) native dtype object
_NATIVE_DTYPES = {n: np.dtype(n) for n in ("float32", "float64", "int32", "int64", "bool")}


def check_input_array(tensor, value, who, convert=False):
    """Check a value given for placeholder ``tensor``: shape and dtype exactly as declared.

    With ``convert``, non-arrays (lists, scalars) are converted to the declared
    dtype first. Returns the array: in native byte order (a big-endian ``'>f4'``
    array is converted, values unchanged) and a plain ``np.ndarray``. Raises ``FeedError`` naming ``who`` (the
    caller: "evaluate", "kernel"), the tensor, and the expected shape/dtype.
    """
    if type(value) is np.ndarray and value.dtype is _NATIVE_DTYPES.get(tensor.dtype) \
            and value.shape == tensor.shape:
        return value  # the common case, checked in a few attribute reads
    if not isinstance(value, np.ndarray):
        if not convert:
            raise FeedError(f"{who}: the value for {tensor.name} must be a numpy array, got "
                            f"{type(value).__name__}")
        try:
            value = np.asarray(value, dtype=tensor.dtype)
        except (TypeError, ValueError) as exc:
            raise FeedError(f"{who}: the value fed for {tensor.name} is not an array: {exc}") from None
    if value.shape != tensor.shape:
        raise FeedError(f"{who}: placeholder {tensor.name} expects shape {tensor.shape}, "
                        f"got an array of shape {value.shape}")
    if value.dtype.name != tensor.dtype:
        raise FeedError(f"{who}: placeholder {tensor.name} expects dtype {tensor.dtype}, got "
                        f"{value.dtype.name} (convert it with .astype('{tensor.dtype}'))")
    if isinstance(value, np.ma.MaskedArray):
        raise FeedError(f"{who}: the value for {tensor.name} is a masked array; its mask "
                        "would be ignored (pass .filled(...) or .data)")
    if type(value) is not np.ndarray:
        value = np.asarray(value)  # a subclass (np.matrix, memmap) as a plain array
    if not value.dtype.isnative:
        # a non-native byte order (e.g. '>f4' on a little-endian machine) has the
        # declared dtype's name but no kernel can read it: the same values, native
        value = value.astype(value.dtype.newbyteorder("="))
    return value
