"""Program assembly: a scheduled graph -> its buffers and one unit per materialised stage.

One job: decide the kernel's buffers (inputs, outputs, temporaries: flat 1-D
arrays) and cut the program into *units*, each the module text of one
materialised stage, lowered by :mod:`codegen.loopnest.stage` (statements, loop nests,
reduction modes, unrolling, blocking), with the values emitted by
:mod:`codegen.loopnest.emit` and the checks decided by :mod:`codegen.analysis.bounds`.

A unit's text (:attr:`UnitSource.module_source`) defines
``unit(b0, b1, ..., err)``: its parameters are only the buffers the stage reads
or writes, named by position of first use in the text, then ``err``
(``int64[2]``: the code of the first failed check, 1-based in the unit's own
``errors`` list, and the offending value). Every stage is lowered with the
same local identifiers (``i0_0``, ``acc0_0``, ...) and comments without user
text, so the text is a function of the stage's structure alone (shapes and
constants included, names and position in the graph excluded): the compiled
code is keyed on it (the loop-nest backend's compiler (:mod:`codegen.backends`)), so a layer repeated with the
same shapes compiles once, editing one operator recompiles only its stages,
and two graphs that share a stage share its machine code.

A stage big enough to gain from a second thread (``parallel_min_points`` points
and ``parallel_min_work`` work, fields of the active :class:`codegen.options.Options`,
read in :mod:`codegen.loopnest.stage`; or one the schedule marks parallel) is a
*chunked* unit (``Options.chunks``) where its loop nests allow it: serial text
``unit(b0, .., part, err)`` whose parallel loop runs one part of a spatial
axis, the parts run at the same time (the backend's chunked units (docs/stages.md)), so it compiles
without the backend's parallel-loop pass (about 0.5-1 s a unit). Otherwise (a scan, a
scatter, a split or second parallel axis) the unit gets ``parallel=True`` and
``prange`` loops. The stage lowering decides which from its planned nests
before it writes any text (:func:`codegen.loopnest.plan.decide_chunks`), so a
stage is lowered once; only a target's veto of parallel loops
(:meth:`codegen.loopnest.dialect.Dialect.serial_instead`) lowers it again, serially.

:attr:`Program.source` (``Kernel.source``) is the readable text of the whole
program: the units with buffers named after their tensors and each stage's
definition in a comment, then the driver as comments: the list of unit calls
that :class:`codegen.build.Kernel` runs in order, stopping at the first error
(the bridges' compiled driver runs the same list).

Re-exported for importers of this module: ``default_order``,
``lift_zero_guards``, ``ExprEmitter``, ``const_str``, ``element``
(:mod:`codegen.loopnest.emit`). The tuning knobs are no module constants: they
are the fields of :class:`codegen.options.Options` (docs/options.md).
"""

from texpr.simplify.isl_bridge import isl
from texpr.errors import TexprError, in_stage
from texpr.printer import tensor_str
from texpr.scan import ScanOp
from texpr.simplify.graph import accesses
from texpr.simplify.materialize import scan_view
from texpr.tensor import PlaceholderOp

from ..analysis.shifts import ShiftPlan
from ..ir.program import (BufferInfo, ContractionUnitSource, Program, ShiftUnitSource, UnitSource,
                          ViewInfo, alias_info)  # noqa: F401 (lower.X of old)
from .memo import TextMemo
from .scan_lower import lower_stage
from .emit import ExprEmitter, _Writer, const_str, element  # noqa: F401
from . import dialect as _dialect
from . import cse as _cse
from .source import buffer_identifiers, remove_dead_assignments, rename
from .stage import _StageLowering, default_order, lift_zero_guards
from ..options import current as _opts
from .. import strategy as _strategy

__all__ = ["lower", "Program", "BufferInfo", "UnitSource", "default_order", "ExprEmitter",
           "const_str", "element", "lift_zero_guards"]



class _UnitBuffers(dict):
    """``id(tensor) -> BufferInfo`` of one unit: a buffer of the program gets the
    unit-local name ``b<j>`` at its first use (``j`` counts the buffers used so
    far), so the parameter names follow the text, not the graph."""

    def __init__(self, program_buffers):
        super().__init__()
        self.program_buffers = program_buffers
        self.used = []  # program BufferInfos, in parameter order

    def __missing__(self, key):
        g = self.program_buffers[key]
        if isinstance(g, ViewInfo):  # the parameter is the base buffer
            b = g.alias(g.tensor, base=self[id(g.base.tensor)])
            self[key] = b
            return b
        b = BufferInfo(f"b{len(self.used)}", g.tensor, g.role)
        self.used.append(g)
        self[key] = b
        return b


#: the texts :func:`_tidy` has finished in this process: ``{(text, passes, settings):
#: finished text}``, at most 32 M characters of them (keys and values)
_TIDIED = TextMemo(1 << 25)


def _tidy(src):
    """``src`` (a unit's module text) without its dead assignments
    (:func:`source.remove_dead_assignments`) and, when ``Options.cse``, with its
    common subexpressions hoisted (:func:`cse.hoist_common_subexpressions`).

    Both passes are functions of the text and of the CSE settings alone, so the
    result is remembered per ``(text, settings)``: the stages of repeated layers
    lower to the same text (buffers numbered by first use, shapes written in), and
    their passes run once per process instead of once per layer (GPT-8L's training
    step: 306 units lowered, 34 distinct texts). The returned text is the
    one the passes make, character for character (the key holds the two pass
    functions too: one replaced, as a test may, is a new key)."""
    dead, hoist = remove_dead_assignments, _cse.hoist_common_subexpressions
    opts = _opts()
    key = (src, dead, hoist, opts.cse, opts.cse_min_nodes, opts.cse_split_nodes)
    done = _TIDIED.get(key)
    if done is None:
        done = dead(src, "unit")
        if opts.cse:
            done = hoist(done, "unit")
        _TIDIED.put(key, done, len(src) + len(done))
    return done


def _lower_stage(op, stage, buffers, inlined, parallel, chunking):
    """``(lowering, unit buffers, writer)``: ``op`` lowered, once: its parallel
    loops run in chunks when ``chunking`` and its planned nests allow it
    (:func:`codegen.loopnest.plan.decide_chunks`), else as parallel loops."""
    ub = _UnitBuffers(buffers)
    w = _Writer()
    sl = _StageLowering(0, op, stage, ub, inlined, [], parallel, w)
    sl.chunking = chunking
    try:
        lower_stage(sl, 1)
    except isl.Error as exc:
        raise TexprError(f"stage {op.name}: isl failed while lowering it ({exc}); "
                         "please report the program") from None
    except TexprError as exc:  # (texpr.simplify.loop_ast's refusals name no stage)
        raise in_stage(op.name, exc) from None
    return sl, ub, w


def _lower_unit(op, stage, buffers, order, idents, inlined, parallel, chose=None):
    """The :class:`UnitSource` of the materialised ``op`` (see the module
    docstring). ``chose``: None, or a list that gets ``(lowering, execution)``:
    the :class:`_StageLowering` that wrote the unit and how it runs
    (``"chunked"``, ``"prange"`` or ``"serial"``), for the stage's plan."""
    sl, ub, w = _lower_stage(op, stage, buffers, inlined, parallel, parallel and _opts().chunks)
    target = _dialect.current()
    if target.serial_instead(sl):  # the target miscompiles it in parallel
        sl, ub, w = _lower_stage(op, stage, buffers, inlined, False, False)
    chunks = align = 0
    if sl.chunking and sl.chunk_axis is not None:  # (decided before the text was written)
        chunks, align = sl.chunk_axis.extent, sl.chunk_align
    errors = sl.errors
    w(1, "return 0")
    params = [f"b{j}" for j in range(len(ub.used))] + (["part"] if chunks else []) + ["err"]
    deco = target.decorator(sl.uses_prange)
    body = f"{deco}\ndef unit({', '.join(params)}):\n" + "\n".join(w.lines) + "\n"
    src = target.prelude() + "\n\n" + body
    src = _tidy(src)
    pos = {id(b): j for j, b in enumerate(order)}
    args = [pos[id(b)] for b in ub.used]
    # the readable text: the function only, buffers named after their tensors
    fn_text = src[src.index(deco):]
    mapping = {f"b{j}": idents[a] for j, a in enumerate(args)}
    readable = rename(fn_text, mapping)
    readable = "".join(
        ln[:len(ln) - len(ln.lstrip())] + w.comments[ln.strip()] + "\n"
        if ln.strip() in w.comments else ln for ln in readable.splitlines(keepends=True))
    specs = [(b.dtype, 1) for b in ub.used] + [("int64", 1)] * (2 if chunks else 1)
    unit = UnitSource(op.name, tensor_str(op.output(0)), src, args, specs, errors,
                      sl.uses_prange, readable, chunks, align, kind=target.unit_kind)
    if chose is not None:
        if sl.loop_plan is not None:
            execution = sl.loop_plan.execution
        else:  # (a scan: its steps' nests are planned by their own lowerings)
            execution = "prange" if sl.uses_prange else "serial"
        chose.append((sl, execution))
    return unit


def _blas_unit(op, plan):
    """The unit of a stage run as GEMMs (or as strided moves, a
    :class:`codegen.analysis.shifts.ShiftPlan`): its definition and its plan as comments."""
    w = _Writer()
    w.comment(0, "---- stage (BLAS)", f"---- stage {op.name}: {tensor_str(op.output(0))}")
    w.comment(0, "BLAS", plan.describe())
    readable = "\n".join(w.comments[ln.strip()] for ln in w.lines) + "\n"
    cls = ShiftUnitSource if isinstance(plan, ShiftPlan) else ContractionUnitSource
    return cls(op.name, tensor_str(op.output(0)), plan, readable)


def _scan_views(schedule, mat_ops):
    """``{id(stage): (scan op, perm)}``: the materialised stages that only re-index
    a materialised scan's state (:func:`texpr.simplify.materialize.scan_view`);
    the scan writes their buffers directly and they get no unit."""
    if not any(isinstance(op, ScanOp) for op in mat_ops):
        return {}
    accs = accesses(schedule.outputs)
    output_ids = {id(t) for t in schedule.outputs}
    mat_ids = {id(op) for op in mat_ops}
    views = {}
    for op in mat_ops:
        v = scan_view(op, accs, output_ids)
        if v is not None and id(v[0]) in mat_ids:
            views[id(op)] = v
    return views


def lower(schedule, inputs, materialized, inlined, parallel=True, contraction=None,
          strategy=None):
    """Lower a resolved schedule to a :class:`Program` (one unit per materialised stage).

    ``materialized``/``inlined``: sets of op ids (from
    :func:`schedule.default_materialized`); ``inputs``: the placeholder Tensors
    in argument order; ``parallel``: allow ``prange`` loops; ``contraction``:
    None, or a function ``(op, key) -> ContractionPlan or None`` choosing the
    stages that run as GEMMs (:mod:`codegen.analysis.contraction`; ``key`` maps a tensor
    to its buffer's position): such a stage is a unit of kind ``"blas"``
    (:class:`codegen.analysis.contraction.ContractionUnitSource`) instead of a loop nest;
    ``strategy``: None, or a function ``(op, key) -> StagePlan``
    (:mod:`codegen.strategy`) that decides every materialised stage (it takes
    the place of ``contraction``). The lowering follows the plan and does not
    decide again.

    Raises TexprError (a placeholder read but not listed in ``inputs``; index
    arithmetic not provably exact in int64; an isl failure),
    OutOfBoundsError (a load provably outside its tensor).
    """
    buffers, order, mat_ops = _buffers(schedule, inputs, materialized)
    idents = buffer_identifiers([b.tensor.name for b in order])
    position = {id(b.tensor): k for k, b in enumerate(order)}
    units, plans = [], []
    for op in mat_ops:
        key = lambda t: position[id(t)]  # noqa: E731
        if strategy is not None:
            plan = strategy(op, key)
        else:
            plan = _strategy.from_payload(op, None if contraction is None else contraction(op, key))
        if plan.kind in ("gemm", "shift"):
            units.append(_blas_unit(op, plan.payload))
        else:
            chose = []
            units.append(_lower_unit(op, schedule[op], buffers, order, idents, inlined,
                                     parallel, chose))
            plan = _strategy.with_loops(plan, *chose[0])
        plans.append(plan)
    inline_plans = [_strategy.inline_plan(op) for op in schedule.ops if id(op) in inlined
                    and not isinstance(op, PlaceholderOp)]
    source = _program_source(order, idents, units, plans + inline_plans)
    return Program(source, order, units, [op.name for op in mat_ops],
                   any(u.parallel for u in units), mat_ops, plans, inline_plans)


def _buffers(schedule, inputs, materialized):
    """``(buffers, order, stages)``: the program's buffers (``id(tensor) ->
    BufferInfo`` or ViewInfo), the BufferInfos in argument order (inputs,
    outputs, temporaries), and the materialised ops that get a unit (a stage a
    scan writes through a view gets none).

    Raises:
        TexprError: a placeholder the outputs read that ``inputs`` does not list.
    """
    buffers = {}
    order = []
    for k, t in enumerate(inputs):
        b = BufferInfo(f"in{k}", t, "input")
        buffers[id(t)] = b
        order.append(b)
    for k, t in enumerate(schedule.outputs):
        if id(t) in buffers:
            continue
        b = BufferInfo(f"out{k}", t, "output")
        buffers[id(t)] = b
        order.append(b)
    ntmp = 0
    mat_ops = [op for op in schedule.ops if id(op) in materialized]
    for op in schedule.ops:
        if isinstance(op, PlaceholderOp) and id(op.output(0)) not in buffers:
            raise TexprError(f"build: placeholder {op.name} (shape {op.shape}) is read by the "
                             "outputs but not listed in inputs")
    views = _scan_views(schedule, mat_ops)
    for op in mat_ops:  # the stage a scan writes through a view gets its buffer first
        if id(op) in views:
            t = op.output(0)
            if id(t) not in buffers:
                buffers[id(t)] = BufferInfo(f"tmp{ntmp}", t, "temp")
                ntmp += 1
                order.append(buffers[id(t)])
            scan, perm = views[id(op)]
            buffers[id(scan.output(0))] = ViewInfo(buffers[id(t)], scan.output(0), perm)
    mat_ops = [op for op in mat_ops if id(op) not in views]
    for op in mat_ops:
        for t in op.outputs:
            if id(t) not in buffers:
                b = BufferInfo(f"tmp{ntmp}", t, "temp")
                ntmp += 1
                buffers[id(t)] = b
                order.append(b)
    return buffers, order, mat_ops


def _program_source(order, idents, units, plans):
    """:attr:`Program.source`: the prelude, the buffers and the stages' plans as
    comments, each unit's text, then the driver as comments."""
    head = _Writer()
    for k, (b, ident) in enumerate(zip(order, idents)):
        head.comment(0, f"argument {k}",
                     f"{ident}: {b.role} {b.tensor.name}, shape {tuple(b.tensor.shape)}, "
                     f"{b.dtype}")
    head.comment(0, "argument err", "err: the error flag ([code, value]; code 0, or the "
                 "first failed check of the unit that stopped)")
    head.comment(0, "strategy", "strategy (codegen.strategy), one line per stage:")
    for k, p in enumerate(plans):
        head.comment(0, f"plan {k}", f"  {p.stage}: {p.line()}")
    parts = [_dialect.current().prelude().rstrip("\n"),
             "\n".join(head.comments[ln] for ln in head.lines)]
    calls = ["# ---- the driver: what codegen.build.Kernel runs (and the bridges' compiled",
             "# driver, the same list): each unit in order on the buffers above, each",
             "# compiled as a module of its own; the first unit whose error flag is set stops",
             "# the run and raises"]
    for k, u in enumerate(units):
        args = ", ".join([idents[a] for a in u.args])
        if u.kind == "blas":
            parts.append(u.source.rstrip("\n"))
            calls.append(f"# unit{k}: {u.stage}: GEMMs on numpy's BLAS over {args} (its comment)")
            continue
        if u.kind == "shift":
            parts.append(u.source.rstrip("\n"))
            calls.append(f"# unit{k}: {u.stage}: a shift plan (strided copies and adds) over "
                         f"{args} (its comment)")
            continue
        parts.append(u.source.replace("\ndef unit(", f"\ndef unit{k}(", 1).rstrip("\n"))
        if u.chunks:
            calls.append(f"# unit{k}({args}, part, err) for the parts [lo, hi) of "
                         f"0..{u.chunks}, one per thread at the same time")
        else:
            calls.append(f"# unit{k}({args}, err)")
    parts.append("\n".join(calls))
    return "\n\n\n".join(parts) + "\n"
