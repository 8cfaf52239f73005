"""Recurrences: ``te.scan`` and its stage, :class:`ScanOp` (TVM's scan semantics).

A scan computes a sequence of states over a leading *time axis*. With a state
``S`` of shape ``(T,) + R``::

    S[t] = init[t]                       for 0 <= t < L   (L = init.shape[0])
    S[t] = update[t]  (reads S[t - k])   for L <= t < T

``update`` is an ordinary compute of the state's full shape ``(T,) + R`` that
reads the *state placeholder* (a placeholder of that shape standing for ``S``)
at ``t - k`` for constants ``k >= 1``; it is only ever evaluated at
``t >= L``. The stages between the state placeholders and the updates (those
that depend on a state) are the scan's **body**: each has the leading time
axis of extent ``T`` and is computed one step at a time, reading the other
body stages at ``t`` itself. Every other tensor the body reads (an input, a
weight, a precomputed sequence) is an **external** input of the scan.
Several states updated together are one stage with one output per state.

Rules checked when the scan is built (each failure is a :class:`ScanError`
subclass naming the stage, the load and what was expected):

* shapes: ``init.shape[1:] == state.shape[1:]``, ``update.shape ==
  state.shape``, equal dtypes, one init extent ``1 <= L <= T`` for all states,
  every body stage with the leading extent ``T`` (:class:`ScanShapeError`);
* dependences: the body reads a state at ``t - k`` with a constant ``k >= 1``
  and a body stage at ``t`` (:class:`ScanDependenceError`);
* the start: a read at ``t - k`` with ``k > L`` lies under a guard that
  implies ``t >= k`` (a ``te.if_then_else`` condition or a ``where=``), since
  ``t - k`` would be negative at the first steps (:class:`ScanInitError`).

Sources: TVM's ``te.scan`` (Chen et al., "TVM: an automated end-to-end
optimizing compiler for deep learning", OSDI 2018, section 4 and the
``tvm.te.scan`` API) for the semantics.
"""

from . import dtypes as dt
from .errors import (ScanBodyInputError, ScanDependenceError, ScanError, ScanInitError,
                     ScanShapeError)
from .expr import (GE, GT, LE, LT, EQ, Add, And, Cast, Const, Load, Mul, Reduce, Select, Sub,
                   load)
from .printer import expr_str
from .tensor import ComputeOp, Operation, PlaceholderOp, Tensor, as_tensor_list, check_name, compute, \
    topo_order
from .visitor import transform

__all__ = ["ScanOp", "scan", "CHECKPOINT_CHOICES"]

#: the values of ``te.scan(..., checkpoint=)``; see :mod:`texpr.scan_adjoint`
CHECKPOINT_CHOICES = ("auto", "store", "recompute")


# ---- affine reasoning on the time axis --------------------------------------------


def affine_in(e, v):
    """``(a, b)`` with ``e == a * v + b`` (Python ints) when the int expression ``e``
    is affine in the variable ``v`` alone (constants, ``+ - *`` by constants,
    int casts); otherwise ``None``."""
    if e is v:
        return (1, 0)
    if isinstance(e, Const):
        if isinstance(e.value, bool) or not isinstance(e.value, int):
            return None
        return (0, e.value)
    if isinstance(e, Cast):
        return affine_in(e.args[0], v) if dt.is_int(e.dtype) else None
    if isinstance(e, (Add, Sub, Mul)):
        x, y = affine_in(e.args[0], v), affine_in(e.args[1], v)
        if x is None or y is None:
            return None
        if isinstance(e, Add):
            return (x[0] + y[0], x[1] + y[1])
        if isinstance(e, Sub):
            return (x[0] - y[0], x[1] - y[1])
        if x[0] and y[0]:
            return None
        return (x[0] * y[1] + y[0] * x[1], x[1] * y[1])
    return None


def _ceil_div(a, b):
    return -((-a) // b)


def lower_bound(cond, v):
    """The largest ``c`` such that ``cond`` implies ``v >= c``, read from the
    conjuncts of ``cond`` that compare affine functions of ``v`` alone; ``None``
    when none does."""
    if isinstance(cond, And):
        bounds = [b for b in (lower_bound(c, v) for c in cond.args) if b is not None]
        return max(bounds) if bounds else None
    if not isinstance(cond, (GE, GT, LE, LT, EQ)):
        return None
    x, y = affine_in(cond.args[0], v), affine_in(cond.args[1], v)
    if x is None or y is None:
        return None
    a, b = x[0] - y[0], x[1] - y[1]  # lhs - rhs = a v + b
    if isinstance(cond, (LE, LT)):  # rhs - lhs >= 0 (> 0)
        a, b = -a, -b
    if isinstance(cond, (GT, LT)):  # a v + b >= 1
        b -= 1
    if a > 0:  # a v + b >= 0  <=>  v >= ceil(-b / a)
        return _ceil_div(-b, a)
    if isinstance(cond, EQ) and a < 0:
        return _ceil_div(b, -a)
    return None


# ---- the stage ----------------------------------------------------------------------


def _body_ops(name, updates, states):
    """The stages between the state placeholders and the updates, producers first,
    and the external tensors they read."""
    state_ids = {id(s) for s in states}
    update_ops = {id(u.op) for u in updates}
    ops = topo_order(list(updates))
    dep = set()
    for op in ops:
        if id(op) in update_ops or any(id(t) in state_ids or id(t.op) in dep
                                       for t in op.input_tensors()):
            dep.add(id(op))
    body = [op for op in ops if id(op) in dep and not isinstance(op, PlaceholderOp)]
    for op in body:
        if not isinstance(op, ComputeOp):
            raise ScanError(f"scan {name}: the body stage {op.name} is a "
                            f"{type(op).__name__}; a scan's body holds compute stages only "
                            "(te.compute)")
    body_ids = {id(o) for op in body for o in op.outputs}
    externals, seen = [], set()
    for op in body:
        for t in op.input_tensors():
            if id(t) in body_ids or id(t) in state_ids or id(t) in seen:
                continue
            seen.add(id(t))
            externals.append(t)
    return tuple(body), tuple(externals)


def _distinct(updates):
    """``updates`` with each repeat of a tensor (the same update for two states, as the
    simplifier's merging of identical stages makes, or a user writes) replaced by a
    copy stage of its own, ``{name}_state{k}``: every state reads its own update
    (the evaluator and the lowering take the update of a state by the tensor)."""
    seen, out = set(), []
    for k, u in enumerate(updates):
        if id(u) in seen and isinstance(u, Tensor) and isinstance(u.op, ComputeOp):
            u = compute(tuple(u.shape), lambda *i, u=u: u[i], name=f"{u.name}_state{k}")
        seen.add(id(u))
        out.append(u)
    return tuple(out)


class ScanOp(Operation):
    """A scan stage: one output per state, each of the state's shape ``(T,) + R``.

    Attributes:
        init, update, state_placeholder: tuples of Tensors, one per state.
        body_ops: the body's compute stages (producers first); the updates' stages
            are among them. Each has the leading time axis (extent ``T``).
        externals: the tensors the body reads that are neither body stages nor
            states (computed before the scan, read as they are).
        time_extent: ``T``; init_extent: ``L`` (the steps the init gives).
        shapes, dtypes: per output. ``shape`` is the first output's shape.

    Build it with :func:`scan`, which documents the semantics; the constructor
    checks every rule of the module docstring.
    """

    def __init__(self, name, init, update, state_placeholder, tag="", attrs=None):
        self.name = name
        self.init, self.update = tuple(init), _distinct(tuple(update))
        self.state_placeholder = tuple(state_placeholder)
        self.tag, self.attrs = tag, dict(attrs or {})
        mode = self.attrs.get("checkpoint", "auto")
        if mode not in CHECKPOINT_CHOICES:
            raise ScanError(f"scan {name}: checkpoint={mode!r}; expected one of "
                            f"{', '.join(repr(c) for c in CHECKPOINT_CHOICES)}")
        n = len(self.state_placeholder)
        if not n or len(self.init) != n or len(self.update) != n:
            raise ScanShapeError(
                f"scan {name}: {len(self.init)} init(s), {len(self.update)} update(s) and "
                f"{n} state placeholder(s); give one of each per state")
        self._check_states()
        self.body_ops, self.externals = _body_ops(name, self.update, self.state_placeholder)
        self._check_body()
        self.shapes = tuple(tuple(s.shape) for s in self.state_placeholder)
        self.shape = self.shapes[0]
        self.dtypes = tuple(s.dtype for s in self.state_placeholder)
        self.num_outputs = n
        self._outputs = tuple(Tensor(self, i) for i in range(n))
        inputs, seen = [], set()
        for t in self.init + self.externals:
            if id(t) not in seen:
                seen.add(id(t))
                inputs.append(t)
        self._inputs = inputs

    #: set by the simplifier once the body went through it (a pass-local fact)
    body_simplified = False

    @property
    def checkpoint(self):
        """How the adjoint gets the body's per-step adjoints (``"auto"``, ``"store"``
        or ``"recompute"``; :mod:`texpr.scan_adjoint` gives the rule)."""
        return self.attrs.get("checkpoint", "auto")

    def input_tensors(self):
        return list(self._inputs)

    def _definition(self, t, names):
        # the outputs, then the body stages indented below (they run step by step)
        outs = ", ".join(f"{names.tensor(o)}{o.shape}" for o in self.outputs)
        parts = ", ".join(f"{names.tensor(s)} := {names.tensor(o)} from {names.tensor(i)}"
                          for s, o, i in zip(self.state_placeholder, self.outputs, self.init))
        ups = ", ".join(names.tensor(u) for u in self.update)
        lines = [f"{outs} = scan({parts}; steps {self.init_extent}..{self.time_extent}: "
                 f"{ups})  # {', '.join(self.dtypes)}"]
        lines += ["  | " + names.stage(b.output(0)) for b in self.body_ops]
        return "\n".join(lines)

    @property
    def body_tensors(self):
        """Every output of every body stage."""
        return [o for op in self.body_ops for o in op.outputs]

    def _check_states(self):
        name = self.name
        seen = set()
        L = None
        for a, (s, i, u) in enumerate(zip(self.state_placeholder, self.init, self.update)):
            if not isinstance(s.op, PlaceholderOp):
                raise ScanError(f"scan {name}: state_placeholder {s.name} is not a placeholder; "
                                "make one with te.placeholder(state_shape)")
            if id(s) in seen:
                raise ScanError(f"scan {name}: the state placeholder {s.name} is given twice")
            seen.add(id(s))
            if not s.shape:
                raise ScanShapeError(f"scan {name}: the state placeholder {s.name} is a scalar; "
                                     "a state has a leading time axis (shape (T, ...))")
            if not isinstance(u.op, ComputeOp):
                raise ScanError(f"scan {name}: update {u.name} is not a compute stage "
                                f"({type(u.op).__name__}); define it with te.compute")
            if tuple(u.shape) != tuple(s.shape):
                raise ScanShapeError(
                    f"scan {name}: update {u.name} has shape {u.shape}; expected the shape of "
                    f"its state placeholder {s.name}, {s.shape} (the update covers every step)")
            if len(i.shape) != len(s.shape) or tuple(i.shape[1:]) != tuple(s.shape[1:]):
                raise ScanShapeError(
                    f"scan {name}: init {i.name} has shape {i.shape}; expected (L,) + "
                    f"{tuple(s.shape[1:])}, the state {s.name}'s shape {s.shape} without its "
                    "time extent (L is the number of steps the init gives)")
            for t, what in ((i, "init"), (u, "update")):
                if t.dtype != s.dtype:
                    raise ScanShapeError(
                        f"scan {name}: {what} {t.name} has dtype {t.dtype}; its state "
                        f"placeholder {s.name} has {s.dtype}")
            if L is None:
                L = i.shape[0]
            elif i.shape[0] != L:
                raise ScanShapeError(
                    f"scan {name}: the inits give {L} and {i.shape[0]} steps ({i.name}); every "
                    "state of one scan starts with the same number of steps")
            if s.shape[0] != self.state_placeholder[0].shape[0]:
                raise ScanShapeError(
                    f"scan {name}: states {self.state_placeholder[0].name} and {s.name} have "
                    f"{self.state_placeholder[0].shape[0]} and {s.shape[0]} steps; the states "
                    "of one scan share the time axis")
        T = self.state_placeholder[0].shape[0]
        if not 1 <= L <= T:
            raise ScanShapeError(
                f"scan {name}: the init gives {L} steps of {T}; it must give at least one and "
                "at most T")
        self.time_extent, self.init_extent = T, L

    def _check_body(self):
        T, L = self.time_extent, self.init_extent
        states = {id(s): s for s in self.state_placeholder}
        body_ids = {id(o) for op in self.body_ops for o in op.outputs}
        for op in self.body_ops:
            if not op.shape or op.shape[0] != T:
                raise ScanShapeError(
                    f"scan {self.name}: the body stage {op.name} has shape {op.shape}; a stage "
                    f"that depends on the state runs step by step and needs the leading time "
                    f"axis of extent {T}")
            t = op.axis[0]
            for b in op.body:
                _check_reads(self.name, op, b, t, L, states, body_ids)

    def rebuilt(self, tmap):
        """This scan with the loads of its inits and externals re-pointed by ``tmap``
        (``{id(old Tensor): new Tensor}``), the body stages rebuilt where their loads
        change; ``self`` when nothing changes."""
        if not any(id(t) in tmap and tmap[id(t)] is not t for t in self._inputs):
            return self
        local = dict(tmap)
        for op in self.body_ops:
            body = tuple(_remap(b, local) for b in op.body)
            if all(x is y for x, y in zip(body, op.body)):
                continue
            new = ComputeOp(op.name, op.axis, body, op.tag, op.attrs)
            for old, o in zip(op.outputs, new.outputs):
                local[id(old)] = o
        init = tuple(tmap.get(id(t), t) for t in self.init)
        update = tuple(local.get(id(u), u) for u in self.update)
        new = ScanOp(self.name, init, update, self.state_placeholder, self.tag, self.attrs)
        new.body_simplified = self.body_simplified
        return new


def _remap(e, tmap):
    def fn(node):
        if isinstance(node, Load):
            new = tmap.get(id(node.tensor))
            if new is not None and new is not node.tensor:
                return load(new, node.args)
        return None

    return transform(e, fn)


def _check_reads(name, op, root, t, L, states, body_ids):
    """Check every load of a state or body stage in ``root`` (see the module docstring);
    ``lb`` is what the path to a node proves about ``t`` (at least ``L``)."""
    seen = set()

    def visit(e, lb):
        key = (id(e), lb)
        if key in seen:
            return
        seen.add(key)
        if isinstance(e, Select):
            c = lower_bound(e.args[0], t)
            visit(e.args[0], lb)
            visit(e.args[1], lb if c is None else max(lb, c))
            visit(e.args[2], lb)
            return
        if isinstance(e, And):
            c = lower_bound(e.args[0], t)
            visit(e.args[0], lb)
            visit(e.args[1], lb if c is None else max(lb, c))
            return
        if isinstance(e, Reduce):
            c = lower_bound(e.where, t)
            inner = lb if c is None else max(lb, c)
            for s in e.source:
                visit(s, inner)
            visit(e.where, lb)
            return
        if isinstance(e, Load):
            tensor = e.tensor
            if id(tensor) in states:
                form = affine_in(e.args[0], t)
                where = f"scan {name}: the body stage {op.name} reads `{expr_str(e)}`"
                if form is None or form[0] != 1:
                    raise ScanDependenceError(
                        f"{where}; the time index of a state must be `{t.name} - k` for a "
                        f"constant k >= 1 ({t.name} is the step)")
                k = -form[1]
                if k < 1:
                    raise ScanDependenceError(
                        f"{where}, the state at step {t.name}"
                        f"{' + ' + str(-k) if k < 0 else ''}: a step reads only earlier steps "
                        f"(`{tensor.name}[{t.name} - k, ...]` with k >= 1)")
                if k > lb:
                    raise ScanInitError(
                        f"{where}: at the first step {t.name} = {L} that is step {L - k} < 0. "
                        f"The init gives {L} step(s); give {k} (init.shape[0] = {k}) or guard "
                        f"the read with te.if_then_else({t.name} >= {k}, ..., ...)")
            elif id(tensor) in body_ids:
                form = affine_in(e.args[0], t)
                if form != (1, 0):
                    raise ScanDependenceError(
                        f"scan {name}: the body stage {op.name} reads `{expr_str(e)}`; body "
                        f"stages (which depend on the state) are read at the same step "
                        f"`{tensor.name}[{t.name}, ...]`, earlier steps through the state")
        for c in e.args:
            visit(c, lb)

    visit(root, L)


def scan(init, update, state_placeholder, inputs=None, name="scan", tag="", attrs=None,
         checkpoint="auto"):
    """A recurrence over a leading time axis, as TVM's ``te.scan``.

    With one state of shape ``(T,) + R``::

        out[t] = init[t]       for 0 <= t < L      (L = init.shape[0])
        out[t] = update[t]     for L <= t < T      (step by step, in order)

    where ``update`` reads ``state_placeholder[t - k, ...]`` (``k >= 1``), which
    stands for ``out`` itself: step ``t`` sees the steps computed before it.

    Args:
        init: Tensor of shape ``(L,) + R`` (``1 <= L <= T``): the first ``L``
            steps. Or a list, one per state (all with the same ``L``).
        update: Tensor of shape ``(T,) + R`` (the state's shape), a compute over
            the time axis ``t`` that reads the state placeholder at ``t - k`` with
            a constant ``k >= 1`` (``k > L`` only under a guard ``t >= k``), and
            other stages of the body at ``t``. Or a list, one per state. The
            stages between the state placeholders and the updates form the body;
            everything else the body reads is an input computed before the scan.
        state_placeholder: a placeholder of shape ``(T,) + R`` (its dtype is the
            state's), or a list, one per state.
        inputs: optional Tensor or list: the tensors the body reads besides the
            state (documentation, as in TVM; each is checked not to depend on a
            state).
        name: the stage's name; tag, attrs: free-form, as for ``te.compute``.
        checkpoint: what the gradient does with the step adjoints of the body's
            stages that read the scan's inputs (an RK4 body's stages, a cell's
            gates): ``"store"`` them as extra outputs of the reverse scan, computed
            once per reverse step; ``"recompute"`` them for all steps after the
            reverse scan, from its stored states; ``"auto"`` (the default) stores
            each one that is more than its update's adjoint. See
            :mod:`texpr.scan_adjoint` (and docs/pipeline.md, "Scans") for the rule.
    Returns:
        A Tensor of shape ``(T,) + R`` (the whole sequence of states) for a
        single state; a list of Tensors, one per state, for lists.
    Raises:
        ScanShapeError: shapes or dtypes of init, update and state disagree, or a
            body stage lacks the leading time axis of extent ``T``.
        ScanDependenceError: the body reads a state at ``t`` or later, at a time
            index that is not ``t - k``, or a body stage at a step other than ``t``.
        ScanInitError: a read at ``t - k`` can fall before step 0 (``k > L``
            without a guard ``t >= k``).
        ScanError: a state placeholder that is not a placeholder, an ``inputs``
            entry that depends on a state, a scatter-add in the body, a
            ``checkpoint`` other than ``"auto"``, ``"store"`` or ``"recompute"``.

    Gradients: ``te.differentiate`` through a scan builds a scan in reverse
    time over the stored states (:mod:`texpr.scan_adjoint`).

    >>> import numpy as np
    >>> import texpr as te
    >>> X = te.placeholder((5, 2), name="X")
    >>> S = te.placeholder((5, 2), name="S")
    >>> init = te.compute((1, 2), lambda _, i: X[0, i], name="init")
    >>> upd = te.compute((5, 2), lambda t, i: S[t - 1, i] + X[t, i], name="upd")
    >>> csum = te.scan(init, upd, S, name="csum")
    >>> x = np.arange(10, dtype="float32").reshape(5, 2)
    >>> te.evaluate(csum, {X: x})[:, 0]
    array([ 0.,  2.,  6., 12., 20.], dtype=float32)
    """
    name = check_name(name, "scan", "scan")
    single = isinstance(state_placeholder, Tensor)
    states = as_tensor_list(state_placeholder, f"scan {name}: state_placeholder")
    inits = as_tensor_list(init, f"scan {name}: init")
    updates = as_tensor_list(update, f"scan {name}: update")
    attrs = dict(attrs or {})
    if checkpoint != "auto":
        attrs["checkpoint"] = checkpoint
    op = ScanOp(name, inits, updates, states, tag, attrs)
    if inputs is not None:
        body_ids = {id(t) for t in op.body_tensors}
        state_ids = {id(s) for s in states}
        for t in as_tensor_list(inputs, f"scan {name}: inputs"):
            if id(t) in body_ids or id(t) in state_ids:
                raise ScanError(f"scan {name}: inputs lists {t.name}, which depends on the "
                                "state; inputs are the tensors the body reads besides it")
    return op.output(0) if single else list(op.outputs)


def check_not_in_a_body(inputs, ops, what):
    """Raise :class:`ScanBodyInputError` if a tensor of ``inputs`` is a body stage or
    a state placeholder of a scan among ``ops`` (a graph's operations): such a
    tensor has no value outside its scan, and a derivative w.r.t. it would be
    zero however the output depends on the scan (``what``: the caller, for the
    message)."""
    owner = {}
    for op in ops:
        if isinstance(op, ScanOp):
            for t in [b.output(i) for b in op.body_ops for i in range(b.num_outputs)] + list(
                    op.state_placeholder):
                owner.setdefault(id(t), op)
    for t in inputs:
        op = owner.get(id(t))
        if op is not None:
            raise ScanBodyInputError(
                f"{what}: input {t.name} is part of scan {op.name}'s body (a body stage, its "
                "update or its state placeholder); it has no value outside the scan. Differentiate w.r.t. the scan's "
                f"output {op.output(0).name} or a tensor its body reads (an input of the scan)")
