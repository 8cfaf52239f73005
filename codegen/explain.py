"""``kernel.explain()``: how a compiled kernel computes its outputs, as text.

One job: describe, without running it, each unit of a :class:`codegen.build.Kernel`
(one per materialised stage, in execution order): what it computes and how it
is lowered (the profiler's columns, :func:`codegen.profile.unit_info`), and for
a contraction (a sum whose domain has more points than its buffers have
elements: the profiler's multiply-adds) that stayed a loop nest, why no GEMM
runs it (the reason the
build's chooser recorded: the matcher's, :func:`codegen.analysis.contraction.match`, or
the cost rule's, :func:`codegen.analysis.contraction.cost_refusal`, or the schedule's).
Under each unit, its plan (:class:`codegen.strategy.StagePlan`): the lowering
kind, the rule that chose it and why, and the loop nest's order, parallel axes,
unroll and lanes; then the inlined stages.
The last lines add up the multiply-adds that run on BLAS and in loop nests.
"""

from .profile import unit_info

__all__ = ["explain"]


def explain(kernel):
    """The text of ``kernel.explain()`` (see the module docstring)."""
    info = unit_info(kernel)
    reasons = getattr(kernel._program, "loop_reasons", None) or {}
    # the plans of the program's units, by unit (a scan's view stage has none)
    program_plans = getattr(kernel._program, "plans", None) or []
    plans = {id(u): p for u, p in zip(kernel.units, program_plans)}
    width = max([len(u.stage) for u in info] + [5])
    lines = [f"{kernel!r}", f"{'stage':{width}s}  lowering / computes"]
    blas = loops = 0
    for unit, u in zip(kernel.units, info):
        lines.append(f"{u.stage:{width}s}  {u.lowering}: {u.computes}")
        if u.macs is not None:
            if unit.kind == "blas":
                blas += u.macs
            else:
                loops += u.macs
        why = reasons.get(u.stage) if getattr(unit, "loop_nest", False) and u.macs is not None else None
        if why:
            lines.append(f"{'':{width}s}    stays a loop nest ({u.macs:,} multiply-adds; {why})")
        plan = plans.get(id(unit))
        if plan is not None:
            lines.append(f"{'':{width}s}    plan ({plan.rule}): {plan.line()}")
    inline = getattr(kernel._program, "inline_plans", None) or []
    if inline:
        lines.append("inlined: " + ", ".join(p.stage for p in inline))
    lines.append(f"multiply-adds: {blas:,} on BLAS, {loops:,} in loop nests")
    return "\n".join(lines)
