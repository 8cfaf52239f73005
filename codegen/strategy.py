"""The strategy: how each stage of a build is lowered, decided once, as data.

One job: give every stage of a resolved schedule a :class:`StagePlan` --
materialised or inlined, and a materialised stage's lowering kind: ``"gemm"``
(a :class:`codegen.analysis.contraction.ContractionPlan` run on BLAS),
``"shift"`` (a :class:`codegen.analysis.shifts.ShiftPlan`), ``"loopnest"``,
``"scan"`` or ``"scatter"`` (a loop nest of a scan or scatter-add stage) --
with the reason when a contraction stays a loop nest. The lowering
(:func:`codegen.loopnest.lower.lower`) reads the plan and does not decide
again; ``kernel.explain()`` and ``Kernel.source`` print one line per stage.

**Rules.** :data:`RULES` is an ordered list of small functions ``rule(op, ctx)
-> StagePlan or None`` (``ctx``: a :class:`StrategyContext`); the first that
returns a plan decides the stage (as TVM dlight's ``ScheduleRule`` list).
The default list, in order:

1. :func:`schedule_says_no_blas` -- ``schedule[t].blas(False)``: a loop nest;
2. :func:`no_blas_build` -- ``build(blas=False)`` keeps every stage a loop nest;
3. :func:`schedule_sets_loops` -- a stage whose loops the schedule sets (split,
   reorder, parallel, vectorize) keeps them, unless it says ``blas(True)``;
4. :func:`shift_plan` -- a window or tap-sum stage of the rewrites runs as a
   shift plan (:mod:`codegen.analysis.shifts`);
5. :func:`gemm` -- a contraction the matcher takes and the cost rule lets pay
   runs on BLAS; otherwise (a sum-reduction) a loop nest, with the matcher's or
   the cost rule's reason; ``blas(True)`` on a stage that does not match is a
   ScheduleError;
6. :func:`loop_nest` -- everything else.

A rule of one's own goes in front (``RULES.insert(0, rule)``); the list takes
part in the symbolic cache's key (:func:`rules_fingerprint`), so a changed list
lowers anew. docs/extending.md shows one.

**Loop decisions.** A loop-nest stage's loops are planned before any of its
text is written (:meth:`codegen.loopnest.stage._StageLowering.run`): the loop
order, the parallel axes, register blocking, lanes and the sum loop's partial
sums (:mod:`codegen.loopnest.order`), then every nest's statements and isl loop
tree (:class:`codegen.loopnest.plan.Nest`), then how the unit runs them --
chunked, ``prange`` or serial (:func:`codegen.loopnest.plan.decide_chunks`,
from the statements' schedules and the trees) -- as a
:class:`codegen.loopnest.plan.LoopPlan`; the nests are then written once, and
:func:`with_loops` records the plan in the stage's StagePlan, so that it is
printed with the rest. Two things are still settled while writing: whether a
float sum's innermost loop is written once with ``_radd`` (the dialect reads
the loop's text: unit strides, no branch, no check) or unrolled, and a
backend's veto of parallel loops (:meth:`codegen.loopnest.dialect.Dialect.serial_instead`,
the default backend's, on a ``where`` written as flag blocks), which lowers the stage again,
serially.
"""

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Callable, Optional

from texpr.errors import ScheduleError, TexprError
from texpr.scan import ScanOp
from texpr.tensor import ScatterAddOp

from .analysis import contraction, matches
from .analysis import shifts

__all__ = ["StagePlan", "StrategyContext", "RULES", "plan_stage", "inline_plan", "from_payload",
           "with_loops", "rules_fingerprint", "schedule_says_no_blas", "no_blas_build",
           "schedule_sets_loops", "shift_plan", "gemm", "loop_nest"]


@dataclass(frozen=True)
class StagePlan:
    """How one stage is lowered.

    Fields: ``stage`` (its name); ``materialize`` (False: inlined into its
    readers, no unit); ``kind`` (``"gemm"``, ``"shift"``, ``"loopnest"``,
    ``"scan"``, ``"scatter"``, or ``"inline"``); ``payload`` (the
    ContractionPlan or ShiftPlan, else None); ``reason`` (why this kind: for a
    contraction left a loop nest, why it is no GEMM); ``rule`` (the name of the
    rule that decided); and the loop decisions of a loop nest, None until it is
    lowered (its :class:`codegen.loopnest.plan.LoopPlan`, made before its text is
    written, :func:`with_loops`): ``loop_order`` (axis names, outermost first), ``parallel_axes``,
    ``unroll`` (how the innermost loop of a float sum was written: ``"unroll N"``,
    N partial sums, or ``"reassociated"``, once with adds the compiler may
    reassociate; None: neither), ``lanes`` (``(axis name, count)``: the
    reduction loop written as that many unrolled lanes), ``execution``
    (``"chunked"``, ``"prange"`` or ``"serial"``).
    """

    stage: str
    materialize: bool
    kind: str
    payload: object = None
    reason: Optional[str] = None
    rule: Optional[str] = None
    loop_order: Optional[tuple] = None
    parallel_axes: Optional[tuple] = None
    unroll: Optional[str] = None
    lanes: Optional[tuple] = None
    execution: Optional[str] = None

    @property
    def is_loop_nest(self):
        """Whether the stage is a unit of the loop-nest backend (not a GEMM or a
        shift plan, not inlined)."""
        return self.kind in ("loopnest", "scan", "scatter")

    def line(self):
        """One line: the kind, then why, then the loop decisions."""
        if self.kind == "gemm":
            d = self.payload.describe()
            text = f"gemm: {d[len('BLAS: '):] if d.startswith('BLAS: ') else d}"
        elif self.kind == "shift":
            d = self.payload.describe()
            text = d if d.startswith("shift plan") else f"shift plan: {d}"
        else:
            text = self.kind.replace("loopnest", "loop nest")
            if self.execution:
                text += f" ({self.execution})"
            loops = []
            if self.loop_order:
                loops.append("order " + ", ".join(self.loop_order))
            if self.parallel_axes:
                loops.append("parallel " + ", ".join(self.parallel_axes))
            if self.unroll:
                loops.append(f"sum loop {self.unroll}")
            if self.lanes:
                loops.append(f"lanes {self.lanes[1]} over {self.lanes[0]}")
            if loops:
                text += ": " + "; ".join(loops)
        if self.reason:
            text += f" -- {self.reason}"
        return text


@dataclass
class StrategyContext:
    """What the rules read besides the stage: ``schedule`` (the resolved
    :class:`codegen.ir.schedule.Schedule`), ``inlined`` (ids of the inlined
    ops), ``parallel`` and ``blas`` (the build's flags), ``key`` (``tensor ->
    buffer key`` for a plan's payload, or None: the tensor's name)."""

    schedule: object
    inlined: frozenset
    parallel: bool
    key: Optional[Callable] = None
    blas: bool = True


def _loop_kind(op):
    if isinstance(op, ScanOp):
        return "scan"
    if isinstance(op, ScatterAddOp):
        return "scatter"
    return "loopnest"


def _loops(op, reason, rule):
    return StagePlan(op.name, True, _loop_kind(op), None, reason, rule)


def schedule_says_no_blas(op, ctx):
    """``blas(False)``: a loop nest."""
    if ctx.schedule[op].blas_flag is False:
        return _loops(op, "the schedule says blas(False)", "schedule_says_no_blas")
    return None


def no_blas_build(op, ctx):
    """``build(blas=False)`` (and no ``blas(True)``): a loop nest."""
    if ctx.schedule[op].blas_flag is None and not ctx.blas:
        return _loops(op, "the build says blas=False: every stage is a loop nest",
                      "no_blas_build")
    return None


def schedule_sets_loops(op, ctx):
    """Loops set by the schedule (and no ``blas(True)``): a loop nest."""
    st = ctx.schedule[op]
    if st.blas_flag is None and (st.ordered or st.parallel_set or st.vectorize_axes):
        return _loops(op, "the schedule sets its loops (split, reorder, parallel or vectorize)",
                      "schedule_sets_loops")
    return None


def shift_plan(op, ctx):
    """A window or tap-sum stage with a shift plan."""
    plan = shifts.plan_of(op, ctx.key or (lambda t: t.name))
    if plan is None:
        return None
    return StagePlan(op.name, True, "shift", plan, "a window or tap-sum stage of the rewrites",
                     "shift_plan")


def gemm(op, ctx):
    """A contraction: GEMMs when they pay, else (a float sum) a loop nest and why."""
    if contraction.float_sum(op) is None and not ctx.schedule[op].blas_flag:
        return None  # (the matcher refuses all but float sums: no need to ask)
    why = []
    plan = matches.match(op, ctx.inlined, key=ctx.key, why=why)
    flag = ctx.schedule[op].blas_flag
    if plan is None:
        if flag:
            raise ScheduleError(f"stage {op.name}: blas(True), but it is not a contraction "
                                f"the GEMM path runs ({why[0] if why else 'no match'}; "
                                "see texpr.codegen.analysis.contraction)")
        return _loops(op, f"not a GEMM: {why[0] if why else 'no match'}", "gemm")
    if flag is None and not contraction.cost_ok(plan):
        return _loops(op, "BLAS does not pay: "
                      f"{contraction.cost_refusal(plan) or 'the cost rule'}", "gemm")
    why = "the schedule says blas(True)" if flag else "a contraction, and BLAS pays"
    return StagePlan(op.name, True, "gemm", plan, why, "gemm")


def loop_nest(op, ctx):
    """The last rule: a loop nest."""
    kind = _loop_kind(op)
    why = {"scan": "a scan: its steps in order", "scatter": "a scatter-add"}.get(
        kind, "no GEMM or shift plan applies")
    return _loops(op, why, "loop_nest")


#: the rules, in order: the first that returns a plan decides the stage
RULES = [schedule_says_no_blas, no_blas_build, schedule_sets_loops, shift_plan, gemm, loop_nest]


def plan_stage(op, ctx, memo=None):
    """The :class:`StagePlan` of the materialised stage ``op``: the first of
    :data:`RULES` that applies.

    Args:
        op: the stage's operation.
        ctx: a :class:`StrategyContext`.
        memo: a dict (``id(op) -> (op, plan)``) the plan is remembered in, or None.
    Returns:
        A StagePlan.
    Raises:
        ScheduleError: ``blas(True)`` on a stage the GEMM path cannot run; what
        a rule raises.
    """
    if memo is not None:
        held = memo.get(id(op))
        if held is not None and held[0] is op:
            return held[1]
    plan = None
    for rule in list(RULES):
        name = getattr(rule, "__name__", repr(rule))
        try:
            plan = rule(op, ctx)
        except TexprError:
            raise
        except Exception as exc:  # a rule of one's own: named, not a raw traceback
            raise ScheduleError(f"stage {op.name}: the lowering rule {name} raised "
                                f"{type(exc).__name__}: {exc}") from exc
        if plan is not None:
            _check_plan(op, plan, name)
            if plan.rule is None:  # (the rule's name, printed with the plan)
                plan = dataclasses.replace(plan, rule=name)
            break
    if plan is None:  # (a list without loop_nest at its end)
        plan = loop_nest(op, ctx)
    if memo is not None:
        memo[id(op)] = (op, plan)
    return plan


_PAYLOADS = {"gemm": contraction.ContractionPlan, "shift": shifts.ShiftPlan}


def _check_plan(op, plan, name):
    """ScheduleError unless ``plan``, the answer of the rule ``name`` for the
    materialised ``op``, is a StagePlan of that stage the lowering can follow."""
    where = f"stage {op.name}: the lowering rule {name}"
    if not isinstance(plan, StagePlan):
        raise ScheduleError(f"{where} returned {type(plan).__name__} {plan!r}; "
                            "a rule returns a strategy.StagePlan or None")
    if plan.stage != op.name:
        raise ScheduleError(f"{where} returned the plan of stage {plan.stage!r}")
    kinds = ("gemm", "shift", _loop_kind(op))
    if not plan.materialize or plan.kind not in kinds:
        raise ScheduleError(f"{where} returned kind {plan.kind!r} (materialize="
                            f"{plan.materialize}); a materialised stage's kind is one of "
                            f"{', '.join(map(repr, kinds))}")
    want = _PAYLOADS.get(plan.kind)
    if want is not None and not isinstance(plan.payload, want):
        raise ScheduleError(f"{where} returned kind {plan.kind!r} without its payload "
                            f"(a {want.__name__}), got {type(plan.payload).__name__}")


def from_payload(op, payload):
    """The StagePlan of the materialised ``op`` from a GEMM or shift plan, or None
    for a loop nest (what a ``contraction=`` chooser of
    :func:`codegen.loopnest.lower.lower` answers)."""
    if payload is None:
        return loop_nest(op, None)
    kind = "shift" if isinstance(payload, shifts.ShiftPlan) else "gemm"
    return StagePlan(op.name, True, kind, payload, None, "contraction=")


def inline_plan(op):
    """The :class:`StagePlan` of a stage inlined into its readers."""
    return StagePlan(op.name, False, "inline", None, "inlined into the stages that read it")


def with_loops(plan, lowering, execution):
    """``plan`` with the loop decisions of the loop-nest lowering ``lowering`` (a
    :class:`codegen.loopnest.stage._StageLowering` that ran: its
    :class:`codegen.loopnest.plan.LoopPlan`, made before it wrote the unit, and
    how it wrote the innermost loop of a sum) and ``execution``
    (``"chunked"``, ``"prange"`` or ``"serial"``)."""
    names = {}
    for a in list(getattr(lowering.op, "axis", ())) + list(getattr(lowering.op, "reduce_axis",
                                                                   ())):
        names[id(a)] = a.name
    loops = getattr(lowering, "loop_plan", None)
    if loops is not None:
        order, par, lanes = loops.order, loops.parallel, loops.lanes
    else:  # (a scan: its steps' loops are their own stages')
        order = getattr(lowering, "chosen_order", None)
        par = getattr(lowering, "chosen_parallel", None)
        lanes = getattr(lowering, "chosen_lanes", None)
    unroll = getattr(lowering, "chosen_sum", None)
    return dataclasses.replace(
        plan,
        loop_order=None if order is None else tuple(names.get(id(a), a.name) for a in order),
        parallel_axes=tuple(a.name for a in par) if par and execution != "serial" else None,
        unroll=unroll, lanes=lanes, execution=execution)


def rules_fingerprint():
    """A text naming the rules of :data:`RULES` and their code, for cache keys."""
    h = hashlib.sha256()
    for rule in RULES:
        code = getattr(rule, "__code__", None)
        h.update(f"{getattr(rule, '__module__', '')}.{getattr(rule, '__qualname__', rule)!r}"
                 .encode())
        if code is not None:
            h.update(code.co_code)
            h.update(repr(code.co_consts).encode())
    return h.hexdigest()
