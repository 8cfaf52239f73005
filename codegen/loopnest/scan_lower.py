"""Lowering of a scan stage: a sequential time loop around its body's loop nests.

A :class:`texpr.scan.ScanOp` with states ``S_a`` of shape ``(T,) + R_a`` and
init extent ``L`` becomes::

    _copy_n_<dtype>(S_a, init_a, L)          (flat copies)
    for t in range(L, T):                    (sequential: step t reads earlier steps)
        <each materialised body stage at step t>   (its own loop nest, parallel over
                                                    its axes when it is big)

The scan is one compiled unit (:mod:`texpr.codegen.loopnest.lower`). Each body stage is
lowered inside it by the ordinary stage lowering
(:class:`texpr.codegen.loopnest.stage._StageLowering`) as a *step stage*: the body
stage without its time axis, the step ``t`` a bounded variable (``L <= t <
T``) that is not a loop of the stage. A step stage writes into a view of one
step: an update into ``S_a[t]`` (the state's own buffer), any other body stage
into a scratch buffer of one step allocated once before the loop (the body is
read only at the current step). Loads of the state at ``t - k`` read the
state's buffer (with a bounds check: isl does not see ``t``); loads of body
stages read the step buffers. Body stages follow the simplifier's
materialisation rule within the body (the updates always have buffers).
"""

import functools

import numpy as np

from texpr.errors import TexprError
from texpr.expr import Load, Reduce, iter_var, load, select
from texpr.scan import ScanOp
from texpr.simplify import materialized_stages
from texpr.simplify.isl_bridge import VarSpace, box_set, to_set
from texpr.simplify.step_tests import fold_step_tests
from texpr.tensor import ComputeOp
from texpr.visitor import post_order, substitute, transform

from ..analysis.bounds import _BoundsChecker
from ..ir.program import BufferInfo, alias_info
from ..ir.schedule import Stage, inline_expand
from .emit import ExprEmitter
from .scan_gemm import gemm_step
from .stage import _StageLowering, lift_zero_guards
from ..options import current as _opts

__all__ = ["lower_scan"]


@functools.lru_cache(maxsize=None)
def _step_classes():
    """The stage lowering and its expression emitter, told which loads are proven in
    bounds (built on first use: :mod:`texpr.codegen.loopnest.stage` imports this module)."""
    class _StepEmitter(ExprEmitter):
        safe = frozenset()

        @property
        def checks(self):
            return self._checks

        @checks.setter
        def checks(self, ids):
            self._checks = {i for i in ids if i not in self.safe}

    class _StepLowering(_StageLowering):
        safe = frozenset()

        def _emitter(self):
            em = _StepEmitter(self.names, self.buffers, self.op.name, self.errors)
            em.safe = self.safe
            return em

    return _StepLowering


class _ScanBuffers(dict):
    """The buffers the scan's step stages see: the scan's own (its outputs, inputs,
    step scratch buffers, added here) over those of the unit (``outer``, which
    registers a buffer of the program as a parameter of the unit at first use)."""

    def __init__(self, outer):
        super().__init__()
        self.outer = outer

    def __missing__(self, key):
        return self.outer[key]


class _Row:
    """Step ``t`` of a state stored through a view (:class:`codegen.loopnest.lower.ViewInfo`):
    the step stage's index ``i..`` is the state's ``(t, i..)``."""

    def __init__(self, state, tensor, tname):
        self.name, self.tensor, self.role = state.name, tensor, state.role
        self.shape = tuple(tensor.shape) if tensor.shape else (1,)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.dtype = tensor.dtype
        self.state, self.tname = state, tname

    def physical(self, idx):
        return self.state.physical([self.tname] + list(idx))


class _SubWriter:
    """The unit's source writer for a step stage: the same lines, its canonical
    comments tagged with the step stage's prefix (they must be distinct in a unit)."""

    def __init__(self, w, tag):
        self.w, self.tag = w, tag

    def __call__(self, depth, text):
        self.w(depth, text)

    def comment(self, depth, canonical, readable):
        self.w.comment(depth, f"{canonical} {self.tag}", readable)

    @property
    def lines(self):
        """The unit's lines (a lowering may take back what it just wrote)."""
        return self.w.lines


def _step_ops(op):
    """``[(body op, step op)]`` and the step variable: each body stage without its
    time axis, the step a variable over ``[L, T)``, state loads re-pointed at the
    scan's outputs and body loads at the step stages."""
    T, L = op.time_extent, op.init_extent
    tv = iter_var(L, T, "t", "spatial")
    state_out = {id(s): o for s, o in zip(op.state_placeholder, op.outputs)}
    step_of = {}

    def remap(node):
        if not isinstance(node, Load):
            return None
        t = node.tensor
        out = state_out.get(id(t))
        if out is not None:
            return load(out, node.args)
        step = step_of.get(id(t))
        if step is not None:
            return load(step, node.args[1:])
        return None

    pairs = []
    for b in op.body_ops:
        axis = tuple(iter_var(0, n, a.name, "spatial") for n, a in zip(b.shape[1:], b.axis[1:]))
        mapping = dict(zip(b.axis, (tv,) + axis))
        body = tuple(fold_step_tests(transform(substitute(e, mapping), remap), tv, L, T)
                     for e in b.body)
        new = ComputeOp(b.name, axis, body, b.tag, b.attrs)
        for old, o in zip(b.outputs, new.outputs):
            step_of[id(old)] = o
        pairs.append((b, new))
    return pairs, tv


def _body_materialized(op):
    """Ids of the body stages that get a buffer (the simplifier's rule over the
    body graph, the updates always)."""

    body_ids = {id(b) for b in op.body_ops}
    mat = {id(b) for b in materialized_stages(list(op.update)) if id(b) in body_ids}
    mat.update(id(u.op) for u in op.update)
    return mat


def _proven_loads(step, tv, inlined):
    """Ids of the loads of the step stage ``step`` that isl proves in bounds once it
    knows the step ``L <= t < T`` (the stage lowering alone does not: ``t`` is not
    one of its loops, and it would check them at run time)."""

    body = [inline_expand(b, inlined) for b in step.body]
    red = body[0] if isinstance(body[0], Reduce) else None
    axes = list(step.axis) + (list(red.axes) if red is not None else [])
    space = VarSpace(axes + [tv])
    box = box_set(space)
    ck = _BoundsChecker(step.name, space, box)
    exprs = list(body)
    if red is None:
        for b in body:
            ck.walk(b, box, False)
    else:
        for r in (red, lift_zero_guards(red, VarSpace(axes))):
            exprs.append(r)
            ck.walk(r.where, box, False)
            wset, resid = to_set(r.where, space)
            for src in r.source:
                ck.walk(src, box.intersect(wset), resid is not None)
    loads = {id(n) for n in post_order(exprs) if isinstance(n, Load)}
    return loads - ck.need


def _pointwise(op, pairs, mat, inlined):
    """For a one-state scan whose body is one elementwise stage reading the state only
    at its own point (``S[t - k, i...]``; cumsum, cumprod, their adjoints, moving
    averages): that stage over ``(u, i...)`` with the step ``t = u + L``, to be run
    with the time loop innermost (each point's history is independent: the loops
    interchange), else None."""

    if len(op.outputs) != 1 or len(mat) != 1:
        return None
    (b, step), = [(b, s) for b, s in pairs if id(b) in mat]
    if step.num_outputs != 1:
        return None
    body = inline_expand(step.body[0], inlined)
    if isinstance(body, Reduce):
        return None
    out = op.outputs[0]
    for n in post_order(body):
        if isinstance(n, Load) and n.tensor is out:
            if len(n.args) != len(step.axis) + 1 or any(
                    x is not a for x, a in zip(n.args[1:], step.axis)):
                return None
    return body, None, step.axis


def lower_stage(sl, depth):
    """Write the loop nests of ``sl``'s stage (a :class:`_StageLowering`): a scan's
    steps here, any other stage by the stage lowering itself."""
    if isinstance(sl.op, ScanOp):
        sl.header(depth)
        return lower_scan(sl, depth)
    return sl.run(depth)


def lower_scan(sl, depth):
    """Emit the scan stage of the stage lowering ``sl`` (a
    :class:`texpr.codegen.loopnest.stage._StageLowering` whose ``op`` is a ScanOp) at ``depth``:
    the whole scan is one compiled unit (its step stages are loop nests inside it)."""

    op, w, k = sl.op, sl.w, sl.k
    T, L = op.time_extent, op.init_extent
    for a, (out, init) in enumerate(zip(op.outputs, op.init)):
        n = int(np.prod(init.shape, dtype=np.int64))
        if not n:
            continue
        if id(init.op) in sl.inlined or hasattr(sl.buffers[id(out)], "physical"):
            _lower_init_in_place(sl, depth, a, out, init)
        else:
            ob, ib = sl.buffers[id(out)], sl.buffers[id(init)]
            if ob.dtype != ib.dtype:
                raise TexprError(f"scan {op.name}: state {a} is {ob.dtype}, its init {ib.dtype}")
            w(depth, f"_copy_n_{ob.dtype}({ob.name}, {ib.name}, np.int64({n}))")
    if T == L or any(d == 0 for out in op.outputs for d in out.shape[1:]):
        return
    _StepLowering = _step_classes()
    pairs, tv = _step_ops(op)
    mat = _body_materialized(op)
    inlined = set(sl.inlined) | {id(s) for b, s in pairs if id(b) not in mat}
    buffers = _ScanBuffers(sl.buffers)
    point = _pointwise(op, pairs, mat, inlined)
    if point is not None:
        return _lower_pointwise(sl, depth, point, tv, buffers)
    tname = f"t{k}"
    views = []  # (name, state buffer, row size): the update's view of step t
    for j, (b, s) in enumerate(pairs):
        if id(b) not in mat:
            continue
        for c, (bo, so) in enumerate(zip(b.outputs, s.outputs)):
            a = next((a for a, u in enumerate(op.update) if u is bo), None)
            name = f"scan{k}_{j}_{c}"
            info = BufferInfo(name, so, "temp")
            buffers[id(so)] = info
            if a is not None:
                state = sl.buffers[id(op.outputs[a])]
                if hasattr(state, "physical"):  # the step's row, through the state's view
                    buffers[id(so)] = _Row(state, so, tname)
                else:
                    views.append((name, state.name, info.size))
            else:
                w(depth, f"{name} = np.empty({info.size}, dtype=np.{info.dtype})")
    w(depth, f"for {tname} in range({L}, {T}):")
    for name, state, size in views:
        w(depth + 1, f"{name} = {state}[{tname} * {size}:({tname} + 1) * {size}]")
    for j, (b, s) in enumerate(pairs):
        if id(b) not in mat:
            continue
        sub = _StepLowering(f"{k}s{j}", s, Stage(s), buffers, inlined, sl.errors,
                            sl.parallel_on, _SubWriter(w, f"{k}s{j}"))
        sub.safe = _proven_loads(s, tv, inlined)
        sub.names[id(tv)] = tname
        gemm = gemm_step(s, buffers, inlined, tv, tname, L, T)
        if gemm is None:
            sub.run(depth + 1)
        else:  # a matrix product per step: BLAS, the loop nest for non-finite operands
            test, call = gemm
            w(depth + 1, f"if {test}:")
            w(depth + 2, call)
            w(depth + 1, "else:")
            sub.run(depth + 2)
        sl.uses_prange |= sub.uses_prange
        sl.split_guard |= sub.split_guard


def _lower_init_in_place(sl, depth, a, out, init):
    """The init of state ``a`` as a loop nest that writes the state's first steps
    (``out[:L]``, in the state's layout) directly: the inlined elementwise init's
    body (no buffer of its own, no copy), or a copy of the init's buffer into a
    state that lives in another tensor's buffer (:class:`codegen.loopnest.lower.ViewInfo`)."""

    src = init.op
    axes = tuple(iter_var(0, n, f"i{d}", "spatial") for d, n in enumerate(init.shape))
    if id(src) in sl.inlined:
        body = substitute(src.body[0], dict(zip(src.axis, axes)))
    else:
        body = load(init, axes)
    nest = ComputeOp(f"{sl.op.name}_init{a}", axes, (body,), tag="scan_init")
    buffers = _ScanBuffers(sl.buffers)
    state = sl.buffers[id(out)]
    buffers[id(nest.output(0))] = alias_info(state, nest.output(0))
    sub = _StageLowering(f"{sl.k}i{a}", nest, Stage(nest), buffers, sl.inlined, sl.errors,
                         sl.parallel_on, _SubWriter(sl.w, f"{sl.k}i{a}"))
    sub.run(depth)
    sl.uses_prange |= sub.uses_prange


def _lower_pointwise(sl, depth, point, tv, buffers):
    """The interchanged loop nest of :func:`_pointwise`: ``for i...: for t: S[t, i] =
    t >= L ? body : S[t, i]`` (the outermost ``i`` loop parallel when the scan is
    big), written into the state's own buffer (no view: a parallel loop must see
    that it reads what it writes)."""


    op, k = sl.op, sl.k
    body, _u, step_axes = point
    T, L = op.time_extent, op.init_extent
    out = op.outputs[0]
    t = iter_var(0, T, "t", "spatial")
    rest = tuple(iter_var(0, n, f"i{d}", "spatial") for d, n in enumerate(out.shape[1:]))
    body = substitute(body, {tv: t, **dict(zip(step_axes, rest))})
    body = select(t >= L, body, out[(t,) + rest])
    nest = ComputeOp(f"{op.name}_steps", (t,) + rest, (body,), tag="scan_pointwise")
    state = sl.buffers[id(out)]
    buffers[id(nest.output(0))] = alias_info(state, nest.output(0))
    st = Stage(nest)
    if rest:
        st.reorder(*(rest + (t,)))
        if out.size >= _opts().parallel_min_points and sl.parallel_on:
            st.parallel(rest[0])
    # a state of no axes but time: its one loop is the recurrence, never parallel
    # (the default rules made it a prange loop once it had 65,536 steps: a prefix
    # sum of 200,000 values was off by 90, found by the fuzzer's parallel mode)
    sub = _StageLowering(f"{k}p", nest, st, buffers, sl.inlined, sl.errors,
                         sl.parallel_on and bool(rest), _SubWriter(sl.w, f"{k}p"))
    sub.run(depth)
    sl.uses_prange |= sub.uses_prange
