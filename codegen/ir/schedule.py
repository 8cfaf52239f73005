"""Schedules: which stages are materialised, and in what loop order each one runs.

``create_schedule(outputs)`` gives a :class:`Schedule`; ``s[tensor]`` is the
:class:`Stage` of any tensor of the graph. A stage's *leaf axes* are the loops
it will run: initially ``op.axis + op.reduce_axis`` (``op.axis`` for a
scatter-add stage), changed by ``split``/``tile``/``reorder``. Primitives (as
in TVM):

=====================  =====================================================
``compute_inline()``   substitute the stage's body into its consumers
``compute_root()``     materialise the stage in a buffer of its own
``parallel(ax)``       run loop ``ax`` with ``prange`` (spatial axes only)
``reorder(*axes)``     put these leaves, in this order, where they were
``split(ax, f)``       ``ax = outer*f + inner``; returns ``(outer, inner)``
``tile(x, y, fx, fy)`` split both and order ``xo, yo, xi, yi``
``vectorize(ax)``      a hint: ``ax`` should be the innermost loop
``blas(flag=True)``    run a contraction stage as GEMMs (True) or as its loop
                       nest (False); see :mod:`texpr.codegen.analysis.contraction`
=====================  =====================================================

Stages not touched keep ``None`` decisions, and :func:`resolve` fills them
with the default rules (module docstring of :mod:`texpr.codegen.loopnest.lower`).

Errors: :class:`texpr.errors.ScheduleError` for impossible requests (inlining a
reduction, a scatter or an output, an axis of another stage, parallelising a
reduction axis or a scatter, a non-positive split factor, ...).
"""

from texpr.simplify.graph import stage_exprs
from texpr.simplify.support import is_support_stage
from texpr.errors import ScheduleError
from texpr.expr import IterVar, Load, Reduce, iter_var
from texpr.printer import expr_str
from texpr.scan import ScanOp
from texpr.tensor import ComputeOp, Operation, PlaceholderOp, ScatterAddOp, Tensor, topo_order
from texpr.visitor import post_order, substitute, transform

__all__ = ["Schedule", "Stage", "create_schedule"]


class Stage:
    """The schedule of one operation (see the module docstring for the primitives).

    Attributes: ``op`` (the Operation), ``leaf_axes`` (list of IterVars, the
    loops outermost first), ``inline`` (None: default rule, True, False),
    ``parallel_axes``, ``vectorize_axes`` (lists of leaf IterVars), ``ordered``
    (True once the user has fixed the loop order by split/reorder/tile).
    """

    def __init__(self, op):
        self.op = op
        self.inline = None
        self.leaf_axes = list(getattr(op, "axis", ())) + list(getattr(op, "reduce_axis", ()))
        self.relations = {}  # leaf -> (parent, factor, "outer"|"inner")
        self.parallel_axes = []
        self.parallel_set = False
        self.vectorize_axes = []
        self.ordered = False
        self.attached = True
        self.blas_flag = None  # None: the cost rule decides (codegen.analysis.contraction)

    # -- helpers ------------------------------------------------------------
    @property
    def name(self):
        return self.op.name

    def _is_reduction(self):
        return isinstance(self.op, ComputeOp) and bool(self.op.reduce_axis)

    def _check_leaf(self, axis, what):
        if not isinstance(axis, IterVar):
            raise ScheduleError(f"stage {self.name}: {what} expects an axis (stage.op.axis[i] "
                                f"or stage.op.reduce_axis[i] or a split result), got {axis!r}")
        if not any(axis is a for a in self.leaf_axes):
            if any(axis is p for p, _, _ in self.relations.values()):
                raise ScheduleError(f"stage {self.name}: {what}: axis `{axis.name}` was split; "
                                    "use the axes split() returned")
            raise ScheduleError(f"stage {self.name}: {what}: axis `{axis.name}` is not an axis "
                                f"of this stage (its loops: "
                                f"{', '.join(a.name for a in self.leaf_axes)})")

    # -- primitives ---------------------------------------------------------
    def compute_inline(self):
        """Substitute this (elementwise) stage into its consumers.

        Raises ScheduleError for a reduction, a scatter, a placeholder, a tuple
        output, or an output of the schedule."""
        op = self.op
        if isinstance(op, PlaceholderOp):
            raise ScheduleError(f"stage {self.name}: a placeholder cannot be inlined")
        if isinstance(op, ScatterAddOp):
            raise ScheduleError(f"stage {self.name}: a scatter-add stage cannot be inlined")
        if isinstance(op, ScanOp):
            raise ScheduleError(f"stage {self.name}: a scan stage cannot be inlined")
        if self._is_reduction():
            raise ScheduleError(f"stage {self.name}: cannot inline a reduction "
                                f"(`{expr_str(op.body[0])}`); it is always materialised")
        if self._schedule is not None and any(t.op is op for t in self._schedule.outputs):
            raise ScheduleError(f"stage {self.name}: an output of the schedule cannot be inlined")
        self.inline = True
        return self

    def compute_root(self):
        """Materialise this stage in a buffer of its own (computed once)."""
        if isinstance(self.op, PlaceholderOp):
            raise ScheduleError(f"stage {self.name}: a placeholder is an input, not computed")
        self.inline = False
        return self

    def parallel(self, axis):
        """Run the loop over ``axis`` (a spatial leaf axis) in parallel (the dialect's parallel range).

        A scatter-add stage cannot, except a support stage
        (:func:`texpr.simplify.is_support_stage`), whose points write distinct elements."""
        self._check_leaf(axis, "parallel")
        if isinstance(self.op, ScatterAddOp) and not is_support_stage(self.op):
            raise ScheduleError(f"stage {self.name}: a scatter-add stage accumulates into shared "
                                "locations and cannot run in parallel")
        if axis.kind == "reduce":
            raise ScheduleError(f"stage {self.name}: reduction axis `{axis.name}` cannot be "
                                "parallel (its iterations accumulate into the same element)")
        if not any(axis is a for a in self.parallel_axes):
            self.parallel_axes.append(axis)
        self.parallel_set = True
        return self

    def blas(self, flag=True):
        """Run this stage as GEMMs on numpy's BLAS (``flag`` True) or as its loop
        nest (False), overriding the cost rule of :mod:`texpr.codegen.analysis.contraction`
        (by default a contraction runs on BLAS when its GEMMs are large enough,
        and a stage the user split, reordered, parallelised or vectorised keeps its
        loops). ``blas(True)`` on a stage that is not a contraction raises
        ScheduleError at build time, naming what did not match."""
        if not isinstance(flag, bool):
            raise ScheduleError(f"stage {self.name}: blas() takes True or False, got {flag!r}")
        if isinstance(self.op, PlaceholderOp):
            raise ScheduleError(f"stage {self.name}: a placeholder is an input, not computed")
        self.blas_flag = flag
        return self

    def vectorize(self, axis):
        """Hint that ``axis`` should be the innermost loop (moved there at lowering)."""
        self._check_leaf(axis, "vectorize")
        self.vectorize_axes.append(axis)
        return self

    def split(self, axis, factor):
        """Split leaf ``axis`` into ``(outer, inner)`` with ``axis = outer*factor + inner``."""
        self._check_leaf(axis, "split")
        if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
            raise ScheduleError(f"stage {self.name}: split factor must be a positive int, "
                                f"got {factor!r}")
        lo, hi = axis.dom
        # outer = axis // factor, inner = axis % factor (axis_value): over [lo, hi)
        # outer runs over [lo // factor, (hi - 1) // factor + 1)
        o_lo = lo // factor
        o_hi = (hi - 1) // factor + 1 if hi > lo else o_lo
        outer = iter_var(o_lo, o_hi, f"{axis.name}.outer", axis.kind)
        inner = iter_var(0, factor, f"{axis.name}.inner", axis.kind)
        k = next(i for i, a in enumerate(self.leaf_axes) if a is axis)
        self.leaf_axes[k:k + 1] = [outer, inner]
        self.relations[outer] = (axis, factor, "outer")
        self.relations[inner] = (axis, factor, "inner")
        if any(axis is a for a in self.parallel_axes):
            self.parallel_axes = [outer if a is axis else a for a in self.parallel_axes]
        self.ordered = True
        return outer, inner

    def reorder(self, *axes):
        """Place the given leaf axes, in the given order, in the positions they occupy."""
        if len(axes) == 1 and isinstance(axes[0], (list, tuple)):
            axes = tuple(axes[0])
        for a in axes:
            self._check_leaf(a, "reorder")
        if len({id(a) for a in axes}) != len(axes):
            raise ScheduleError(f"stage {self.name}: reorder lists an axis twice")
        ids = {id(a) for a in axes}
        slots = [k for k, a in enumerate(self.leaf_axes) if id(a) in ids]
        for k, a in zip(slots, axes):
            self.leaf_axes[k] = a
        self.ordered = True
        return self

    def tile(self, x, y, x_factor, y_factor):
        """Split ``x`` and ``y`` and order ``x.outer, y.outer, x.inner, y.inner``."""
        xo, xi = self.split(x, x_factor)
        yo, yi = self.split(y, y_factor)
        self.reorder(xo, yo, xi, yi)
        return xo, yo, xi, yi

    # -- lowering helpers ----------------------------------------------------
    def axis_value(self, leaf, orig_map=None):
        """The value of leaf ``leaf`` as a quasi-affine expression of the stage's
        original axes (mapped through ``orig_map`` when given)."""
        rel = self.relations.get(leaf)
        if rel is None:
            return orig_map.get(leaf, leaf) if orig_map else leaf
        parent, factor, which = rel
        pv = self.axis_value(parent, orig_map)
        return pv // factor if which == "outer" else pv % factor

    def __repr__(self):
        return (f"Stage({self.name}, inline={self.inline}, loops=["
                f"{', '.join(a.name for a in self.leaf_axes)}])")


class Schedule:
    """The stages of every operation reachable from ``outputs`` (see :func:`create_schedule`)."""

    def __init__(self, outputs):
        if isinstance(outputs, Tensor):
            outputs = [outputs]
        self.outputs = list(outputs)
        for t in self.outputs:
            if not isinstance(t, Tensor):
                raise ScheduleError(f"create_schedule: outputs must be Tensors, got {t!r}")
        self.ops = topo_order(self.outputs)
        self.stages = {}
        self._detached = {}
        for op in self.ops:
            st = Stage(op)
            st._schedule = self
            self.stages[id(op)] = st

    def __getitem__(self, tensor):
        """The Stage of ``tensor``. A Tensor the outputs do not compute (e.g. an
        adjoint the simplifier inlined into its consumer) gets a *detached* stage
        (``stage.attached`` is False) whose decisions have no effect.

        Raises ScheduleError when ``tensor`` is not a Tensor."""
        if isinstance(tensor, Operation):
            op = tensor
        elif isinstance(tensor, Tensor):
            op = tensor.op
        else:
            raise ScheduleError(f"schedule: s[...] takes a Tensor, got {tensor!r}")
        st = self.stages.get(id(op))
        if st is None:
            st = self._detached.get(id(op))
            if st is None:
                st = Stage(op)
                st._schedule = self
                st.attached = False
                self._detached[id(op)] = (st)
        return st

    def __repr__(self):
        return "Schedule(\n  " + "\n  ".join(repr(self.stages[id(op)]) for op in self.ops) + ")"


def create_schedule(outputs):
    """A schedule of the graph computing ``outputs`` (a Tensor or list of Tensors).

    Every stage starts with default decisions; see :class:`Stage` for the
    primitives. Raises ScheduleError when an output is not a Tensor.
    """
    return Schedule(outputs)


# ---- default rules -----------------------------------------------------------------

def inline_expand(e, inlined):
    """``e`` with every load of an inlined stage (``inlined``: set of op ids)
    replaced by the stage's body at the load's indices, recursively."""
    if not inlined:
        return e
    memo = {}

    def fn(node):
        if isinstance(node, Load) and id(node.tensor.op) in inlined:
            op = node.tensor.op
            key = id(node)
            if key not in memo:
                body = substitute(op.body[node.tensor.value_index], dict(zip(op.axis, node.args)))
                memo[key] = inline_expand(body, inlined)
            return memo[key]
        return None

    return transform(e, fn)


def default_materialized(schedule, rule=None):
    """Ids of the ops to materialise: user decisions first, then ``rule`` (the
    simplifier's, when given: a function ``(outputs) -> set of ops``), else: every
    reduction, scatter, output and elementwise stage read at more than one
    distinct index tuple (after inlining the others)."""
    outputs = {id(t.op) for t in schedule.outputs}
    simp = None
    if rule is not None:
        try:
            simp = {id(op) for op in rule(schedule.outputs)}
        except Exception:  # noqa: BLE001 - a failing external rule falls back to ours
            simp = None
    mat, inlined = set(), set()
    # a scan reads its externals whole, step by step: they have buffers (its inits
    # too, unless the simplifier's rule computes a cheap one into the scan's state)
    scan_inputs = {id(t.op) for op in schedule.ops if isinstance(op, ScanOp)
                   for t in op.externals}
    scan_inits = set() if simp is not None else \
        {id(t.op) for op in schedule.ops if isinstance(op, ScanOp) for t in op.init}
    for op in reversed(schedule.ops):
        if isinstance(op, PlaceholderOp):
            continue
        st = schedule[op]
        if st.inline and id(op) in scan_inputs:
            raise ScheduleError(f"stage {op.name}: a scan reads it whole at every step; it "
                                "cannot be inlined (compute_inline)")
        if st.inline is not None:
            (inlined if st.inline else mat).add(id(op))
            continue
        if id(op) in outputs or isinstance(op, (ScatterAddOp, ScanOp)) \
                or st._is_reduction() or op.num_outputs > 1 or id(op) in scan_inputs \
                or id(op) in scan_inits:
            mat.add(id(op))
            continue
        if simp is not None:
            (mat if id(op) in simp else inlined).add(id(op))
            continue
        # distinct index tuples this op is read at, in the materialised consumers
        seen = set()
        for cons in schedule.ops:
            if id(cons) not in mat:
                continue
            for e in stage_exprs(cons):
                for n in post_order(inline_expand(e, inlined)):
                    if isinstance(n, Load) and n.tensor.op is op:
                        seen.add(tuple(id(a) for a in n.args))
                    if isinstance(n, Reduce):
                        pass
        (mat if len(seen) > 1 else inlined).add(id(op))
    return mat, inlined
