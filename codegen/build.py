"""``build``: a graph (and optionally a schedule) -> a compiled :class:`Kernel`.

A Kernel is a thin driver over its units (:mod:`codegen.units`, one per
materialised stage): ``__call__`` checks the arrays, allocates the outputs and
temporaries, and runs the units in order on the flat buffers, raising after
the first unit whose error flag is set.
"""

import threading
import time

import numpy as np

from texpr.errors import FeedError, ScheduleError, TexprError, in_stage
from texpr.tensor import (ComputeOp, PlaceholderOp, ScatterAddOp, Tensor, check_allocatable,
                          check_input_array)

from .backends.numpy_host import parking as _parking
from .options import Options, _CURRENT as _ACTIVE_OPTIONS, resolve as _resolve_options, using as _using
from . import profile as _profile
from .backends import registered as _backends  # noqa: F401 - registers the backends
from .backends.unit_errors import unit_error
from .explain import explain as _explain
from .loopnest.lower import lower
from . import strategy as _strategy
from .analysis import contraction as _contraction
from .analysis import matches as _matches
from .units import make_units
from .ir.driver import DriverPlan
from .ir.schedule import Schedule, create_schedule, default_materialized
from .rewrite.passes import rewrite
from .loopnest import dialect as _dialect
from .loopnest.source import buffer_identifiers as _buffer_identifiers

__all__ = ["build", "Kernel"]


def _simplifier():
    """``(simplify, materialized_stages)`` of :mod:`texpr.simplify` (imported on first use)."""
    from texpr import simplify

    return simplify.simplify, simplify.materialized_stages


class Kernel:
    """A compiled graph. ``kernel(*arrays, out=None, **named)`` takes numpy arrays
    for ``inputs`` (in order, or by placeholder name as keywords; exact shapes
    and dtypes) and returns a tuple of arrays, one per output (declared shapes
    and dtypes): fresh ones, or the caller's ``out=`` buffers (a tuple with one
    entry per output, None to allocate that one; each C-contiguous, writeable,
    of the output's shape and dtype, overlapping no input). An output listed
    twice gives two distinct arrays, and an input listed as an output is a copy.

    A Kernel pickles: the loader takes the compiled code from the cache
    (memory, then disk) or recompiles the source.

    Attributes: ``source`` (generated Python: a comment with each stage's plan,
    :mod:`codegen.strategy`, the units, then the driver's plan as comments,
    :meth:`codegen.ir.driver.DriverPlan.lines`), ``driver_plan`` (the
    :class:`codegen.ir.driver.DriverPlan` every call runs: the buffers, the unit
    calls in order, the outputs copied), ``stages`` (names of the materialised stages, in execution
    order), ``units`` (the runnable units, one per stage, see
    :mod:`codegen.units`), ``inputs``, ``outputs``, ``compile_seconds`` (wall
    seconds spent compiling or loading the units), ``units_compiled`` (units
    the backend compiled for this build, here or in a worker process),
    ``units_reused`` (units taken from the memory or disk cache, including a
    stage that occurs twice in the graph; a GEMM unit, which compiles nothing,
    counts here, as reused), ``from_disk_cache`` (no unit was
    compiled and at least one came from disk), ``from_memory_cache`` (every
    unit came from memory; a GEMM unit counts as from memory), ``paths`` (the
    generated module of each unit on disk, with canonical identifiers and no
    user names; None for a GEMM unit, which has no module, and for a unit
    compiled in memory because the cache directory could not be used),
    ``path`` (the first unit's module, or None), ``options`` (the
    :class:`codegen.options.Options` it was built with; every call runs under
    its run-time fields, :data:`codegen.options.RUN_TIME`, whatever Options
    the caller has active: assign ``kernel.options =
    kernel.options.replace(gemm_threads=2)`` or a dict of fields, ``kernel.options =
    {"gemm_threads": 2}``, to run it otherwise; anything else is a TexprError).
    ``kernel.profile(*arrays)`` times each unit (:mod:`codegen.profile`).

    Raises (on call): FeedError (wrong number/shape/dtype of arrays, an unknown,
    ambiguous or repeated name, a bad ``out=`` buffer, a masked array),
    OutOfBoundsError (a data-dependent index leaves its tensor, or a loaded
    int64 value used in index arithmetic leaves ``[-2**31, 2**31)``; the
    message names the stage, the expression and the offending value),
    TexprError (integer division by zero).
    """

    def __init__(self, program, units, inputs, outputs, seconds, options=None):
        self._program = program
        self._options = _resolve_options(options)
        self.units = list(units)
        self.inputs, self.outputs = list(inputs), list(outputs)
        # the driver, decided once: what every call (here and in the bridges'
        # compiled driver) runs, and what the end of the source shows
        self.driver_plan = _driver_plan(program, self.inputs, self.outputs)
        self.source = _with_driver(program.source, self.driver_plan)
        self.stages = list(program.stages)
        self.compile_seconds = seconds
        self.units_compiled = sum(1 for u in self.units if u.compiled)
        self.units_reused = len(self.units) - self.units_compiled
        self.from_memory_cache = bool(self.units) and all(u.from_memory_cache for u in self.units)
        self.from_disk_cache = (self.units_compiled == 0
                                and any(u.from_disk_cache for u in self.units))
        self.paths = [u.path for u in self.units]
        self.path = self.paths[0] if self.paths else None
        self._bufs = program.buffers
        plan = self.driver_plan
        # the plan in the shape the Python driver's loops read (one tuple per item)
        self._temps = tuple((t.size, t.dtype, t.output) for t in plan.temps)
        self._outs = tuple((o.slot, o.shape, o.own) for o in plan.outputs)
        # a kernel that calls a BLAS (GEMM units, a scan's np.dot) parks the BLAS's
        # workers when a call ends, so that they do not spin beside the process's
        # next work (codegen.backends.numpy_host.parking)
        self._parks = any(u.kind == "blas" or getattr(u, "calls_blas", False)
                          for u in self.units)
        self._calls_blas = any(getattr(u, "calls_blas", False) for u in self.units)
        # per thread: the temporaries of the last call, reused by the next one
        self._spare = threading.local()

    @property
    def options(self):
        """The :class:`codegen.options.Options` the kernel was built with; its
        calls run under its run-time fields."""
        return self._options

    @options.setter
    def options(self, opts):
        # an Options as it is, a dict: fields replaced in the kernel's own (not
        # in the caller's active Options); anything else is a TexprError
        if isinstance(opts, dict):
            opts = self._options.replace(**opts)
        if not isinstance(opts, Options):
            raise TexprError(f"Kernel.options must be a codegen Options or a dict of its "
                             f"fields, got {type(opts).__name__}")
        self._options = opts

    def __call__(self, *arrays, out=None, **named):
        if named:
            arrays = _bind_named(self.inputs, arrays, named)
        if len(arrays) != len(self.inputs):
            raise FeedError(f"kernel: expected {len(self.inputs)} arrays "
                            f"({', '.join(t.name for t in self.inputs)}), got {len(arrays)}\n"
                            f"{_order_hint(self.inputs, arrays)}")
        args = []
        for t, a in zip(self.inputs, arrays):
            try:
                a = check_input_array(t, a, "kernel")
            except FeedError as exc:
                raise FeedError(f"{exc}\n{_order_hint(self.inputs, arrays)}") from None
            args.append(np.ascontiguousarray(a).reshape(-1))
        outs_given = None if out is None else _check_out(self.outputs, out, args)
        return self._execute(args, outs_given)

    def run_exact(self, arrays):
        """The outputs (a tuple of fresh arrays) for ``arrays``, without the checks
        of a call, for callers that have checked them (the PyTorch bridge): one
        C-contiguous numpy array per input, of exactly its shape and dtype.
        Raises what a call raises at run time (OutOfBoundsError, ...)."""
        return self._execute([a.reshape(-1) for a in arrays], None)

    def run_into(self, inputs, outputs):
        """Compute the outputs into ``outputs`` (one array per output), for callers
        that own their buffers (the JAX bridge runs kernels on XLA's buffers).

        No checks, unlike ``kernel(*arrays, out=...)``: ``inputs`` must be
        C-contiguous numpy arrays of exactly the inputs' shapes and dtypes, and
        ``outputs`` writeable C-contiguous arrays of the outputs' shapes and
        dtypes that overlap neither an input nor each other. Raises what a call
        raises at run time (OutOfBoundsError, ...)."""
        self._execute([a.reshape(-1) for a in inputs], outputs)

    def profile(self, *arrays, repeat=1, warmup=0, print_table=True, **named):
        """Run the kernel on ``arrays`` (as ``kernel(*arrays, **named)``) ``repeat``
        times, after ``warmup`` calls that are not timed, and time each unit
        (:mod:`codegen.profile`).

        Args:
            arrays, named: the inputs, as for a call (a placeholder named
                ``repeat``, ``warmup`` or ``print_table`` goes by position).
            repeat: timed calls (an int >= 1).
            warmup: calls run first, untimed (an int >= 0).
            print_table: print the table (one row per unit, then the driver's
                own time; the rows sum to the calls' wall time).
        Returns:
            A :class:`codegen.profile.Profile`: ``rows`` (per unit: stage, what
            it computes, lowering, calls, total ms, % of the step, GFLOP/s or
            GB/s), ``wall_ms``, ``outputs`` (the last call's).
        Raises:
            What a call raises; TexprError for a bad ``repeat`` or ``warmup``.
        """
        return _profile.profile(self, arrays, named, repeat=repeat, warmup=warmup,
                                print_table=print_table)

    def explain(self, print_table=False):
        """How the kernel computes its outputs: one line per unit (a materialised
        stage, in execution order) with what it computes, its lowering (GEMM,
        batched GEMM, shift plan, loop nest parallel, chunked or serial) and, for
        a sum-reduction left a loop nest, why it is no GEMM (the matcher's or
        the cost rule's reason, :mod:`codegen.analysis.contraction`), and its plan
        (:class:`codegen.strategy.StagePlan`: the rule that decided, the lowering
        kind and why, a loop nest's order, parallel axes, unroll and lanes), then
        the inlined stages and how many multiply-adds run on BLAS and how many in
        loop nests.

        Args:
            print_table: also print the text.
        Returns:
            str.
        """
        text = _explain(self)
        if print_table:
            print(text)
        return text

    def _make_plan(self):
        """``(temps, outs)``: the driver plan as the Python driver reads it, per
        temporary ``(size, dtype, output position or None)`` and per output
        ``(slot, shape, own)`` (from :attr:`driver_plan`)."""
        return list(self._temps), list(self._outs)

    def _execute(self, args, outs_given):
        """Run the kernel's :class:`codegen.ir.driver.DriverPlan` on ``args`` (the
        inputs, flat and C-contiguous, exactly as declared). ``outs_given``: None, or per output an array or None; an
        output computed by its own stage is written straight into its array, the
        others are copied there after the run. Returns the outputs (a tuple).
        Raises the error a unit flagged."""
        rec = _profile.ACTIVE  # the profiler's hook (codegen.profile): None unless recording
        t_in = rec.enter() if rec is not None else 0.0
        temps, outs = self._temps, self._outs
        # a temporary that is no output is this thread's from call to call: fresh
        # large buffers cost the kernel's page faults on every call (conv2d_s1's
        # value and gradient: 1,700 faults per call; every stage writes its whole
        # buffer, so a reused one holds nothing stale that is read). They are taken
        # out of the thread's slot for the call (one C-level pop: atomic for a
        # signal handler) and put back after the units ran: a call re-entering this
        # kernel on this thread (a signal handler, a callback) finds the slot empty
        # and allocates its own instead of overwriting those the call it
        # interrupts still reads (after an error they are dropped)
        spare = vars(self._spare).pop("bufs", None)
        if spare is None:
            spare = {}
        for j, (size, dtype, k) in enumerate(temps):
            o = None if outs_given is None or k is None else outs_given[k]
            if o is not None:
                args.append(o.reshape(-1))
            elif k is None:
                buf = spare.get(j)
                if buf is None:
                    buf = spare[j] = np.empty(size, dtype)
                args.append(buf)
            else:
                args.append(np.empty(size, dtype))
        err = np.zeros(2, dtype=np.int64)  # [error code, the offending index]
        # the run-time knobs (GEMM threads and chunks, parking, the chunk runner)
        # are this kernel's, whatever Options the caller has active
        token = _ACTIVE_OPTIONS.set(self.options)
        try:
            if rec is None:
                for unit in self.units:
                    try:
                        unit.run(args, err)
                    except TexprError as exc:  # a unit kind's own: named as the others
                        raise in_stage(unit.stage, exc) from None
                    if err[0]:
                        _raise(unit, err)
            else:
                times = rec.run_units(self, args, err, _raise)
        finally:
            try:
                if self._parks:
                    if self._calls_blas:  # a scan's np.dot: its sizes are not known here
                        _parking.note_blas_woken()
                    _parking.park_blas_threads()
            finally:
                _ACTIVE_OPTIONS.reset(token)
        self._spare.bufs = spare  # (after an error, they are dropped)
        if outs_given is None:
            result = tuple(args[s].reshape(shape) if own else args[s].reshape(shape).copy()
                           for s, shape, own in outs)
        else:
            result = []
            for (s, shape, own), o in zip(outs, outs_given):
                a = args[s].reshape(shape)
                if o is None:
                    result.append(a if own else a.copy())
                else:
                    if not own:
                        np.copyto(o, a)
                    result.append(o)
            result = tuple(result)
        if rec is not None:
            rec.leave(self, t_in, times)
        return result

    def __reduce__(self):
        # the program (source, buffers, tensors) travels; the machine code is
        # loaded again from the cache, or recompiled (see _load_kernel)
        return (_load_kernel, (self._program, self.inputs, self.outputs, self.options))

    def __repr__(self):
        return (f"Kernel({', '.join(t.name for t in self.inputs)} -> "
                f"{', '.join(t.name for t in self.outputs)}; stages: {', '.join(self.stages)})")


def _driver_plan(program, inputs, outputs):
    """The :class:`DriverPlan` of ``program`` run on ``inputs`` for ``outputs``,
    its buffers named as in the program's source."""
    names = _buffer_identifiers([b.tensor.name for b in program.buffers])
    return DriverPlan.from_program(program, inputs, outputs, names)


_DRIVER_MARK = "# ---- the driver"


def _with_driver(source, plan):
    """``source`` (a Program's) with its closing driver section the text of
    ``plan`` (:meth:`DriverPlan.lines`): what the source shows is what runs."""
    at = source.find("\n" + _DRIVER_MARK)
    head = source if at < 0 else source[:at + 1]
    return head + "\n".join(plan.lines()) + "\n"


def _raise(unit, err):
    """Raise the error of the failed check ``err[0]`` of ``unit``."""
    raise unit_error(unit, int(err[0]), int(err[1]))



def _order_hint(inputs, arrays):
    """The lines a FeedError of a call adds: the inputs in order with their shapes
    and dtypes, what each argument is, and, when the arguments fit the inputs in
    another order, that order (positional arrays in the wrong order were a shape
    error with no hint, issue 52)."""

    def spec(a):
        return (tuple(a.shape), a.dtype.name) if isinstance(a, np.ndarray) else None

    def text(a):
        sp = spec(a)
        return type(a).__name__ if sp is None else f"{sp[0]} {sp[1]}"

    want = [(tuple(t.shape), t.dtype) for t in inputs]
    lines = ["the kernel takes its arrays in this order: "
             + ", ".join(f"{t.name} {t.shape} {t.dtype}" for t in inputs),
             "it was given: " + ", ".join(text(a) for a in arrays)]
    got = [spec(a) for a in arrays]
    fits = [[k for k, w in enumerate(want) if g == w] for g in got]
    # one input for each argument, every input once: another order of the same arrays
    order, used = [], set()
    for f in fits:
        free = [k for k in f if k not in used]
        if not free:
            break
        order.append(free[0])
        used.add(free[0])
    if len(order) == len(inputs) and order != list(range(len(inputs))):
        names = [inputs[k].name for k in order]
        lines.append(f"the arguments fit the inputs in the order {', '.join(names)}: pass "
                     f"them as ({', '.join(inputs[k].name for k in range(len(inputs)))}), "
                     f"or by name (kernel({', '.join(n + '=...' for n in names)}))")
    return "\n".join(lines)


def _bind_named(inputs, arrays, named):
    """Positional ``arrays`` then ``named`` (placeholder name -> array), in input order."""
    names = [t.name for t in inputs]
    if len(arrays) > len(inputs):
        raise FeedError(f"kernel: expected {len(inputs)} arrays ({', '.join(names)}), "
                        f"got {len(arrays)} positional")
    bound = list(arrays) + [None] * (len(inputs) - len(arrays))
    given = [True] * len(arrays) + [False] * (len(inputs) - len(arrays))
    for key, value in named.items():
        where = [i for i, n in enumerate(names) if n == key]
        if not where:
            raise FeedError(f"kernel: no input placeholder is named {key!r} "
                            f"(inputs: {', '.join(names)})")
        if len(where) > 1:
            raise FeedError(f"kernel: several input placeholders are named {key!r}; "
                            "pass them by position")
        i = where[0]
        if given[i]:
            raise FeedError(f"kernel: input {key} is given both by position and by name")
        bound[i], given[i] = value, True
    missing = [n for n, g in zip(names, given) if not g]
    if missing:
        raise FeedError(f"kernel: no array given for input(s) {', '.join(missing)}")
    return bound


def _check_out(outputs, out, args):
    """The ``out=`` buffers, one per output (None: allocate), checked against the
    outputs' shapes and dtypes, C-contiguous, writeable, not overlapping an input
    or each other (the kernel reads inputs while it writes outputs)."""
    if isinstance(out, np.ndarray):
        out = (out,)
    try:
        out = tuple(out)
    except TypeError:
        raise FeedError(f"kernel: out= takes a tuple of arrays (one per output), "
                        f"got {type(out).__name__}") from None
    if len(out) != len(outputs):
        raise FeedError(f"kernel: out= has {len(out)} entries for {len(outputs)} outputs "
                        f"({', '.join(t.name for t in outputs)}); use None to allocate one")
    seen = []
    for k, (t, o) in enumerate(zip(outputs, out)):
        who = f"out[{k}] (the buffer of output {k}, {t.name})"
        if o is None:
            continue
        if not isinstance(o, np.ndarray):
            raise FeedError(f"kernel: {who} must be a numpy array, got "
                            f"{type(o).__name__}")
        if o.shape != tuple(t.shape):
            raise FeedError(f"kernel: {who} has shape {o.shape}, "
                            f"expected {tuple(t.shape)}")
        if o.dtype.name != t.dtype:
            raise FeedError(f"kernel: {who} has dtype {o.dtype.name}, "
                            f"expected {t.dtype}")
        if o.dtype != np.dtype(t.dtype):
            # '>f4' is named float32 too: the kernel writes native-order bytes
            raise FeedError(f"kernel: {who} has byte order {o.dtype.str!r}, expected the "
                            f"machine's ({np.dtype(t.dtype).str!r})")
        if not o.flags.c_contiguous:
            raise FeedError(f"kernel: {who} is not C-contiguous "
                            "(pass np.ascontiguousarray storage)")
        if not o.flags.writeable:
            raise FeedError(f"kernel: {who} is read-only")
        for other in list(args) + seen:
            if o.size and np.may_share_memory(o, other):
                raise FeedError(f"kernel: {who} overlaps an input or "
                                "another out= buffer")
        seen.append(o)
    return out


def _compile_kernel(program, inputs, outputs, options=None):
    t0 = time.perf_counter()
    units = make_units(program)
    return Kernel(program, units, inputs, outputs, time.perf_counter() - t0, options)


def _load_kernel(program, inputs, outputs, options=None):
    return _compile_kernel(program, inputs, outputs, options)


def build(outputs, inputs, schedule=None, *, parallel=True, blas=True, options=None):
    """Compile the graph computing ``outputs`` from ``inputs`` into a :class:`Kernel`.

    Args:
        outputs: a Tensor or a list of Tensors (returned in this order).
        inputs: the list of placeholder Tensors the kernel takes, in order
            (every placeholder the outputs read must be listed).
        schedule: a :class:`Schedule` from ``create_schedule(outputs)``; None
            for the default schedule (then :func:`texpr.simplify.simplify` runs
            first: it is idempotent on simplified graphs).
        parallel: allow parallel loop nests (False: every loop nest is
            sequential; GEMMs still run on the BLAS, cut into parts on the
            worker threads).
        blas: allow the library lowerings: GEMMs on the BLAS, shift plans, and
            the rewrites that prepare them (False: every stage is a loop nest).
        options: the tuning knobs, a :class:`codegen.options.Options` (used as it
            is) or a dict of its fields (replaced in the active Options); None:
            the active Options (:func:`codegen.options.current`, the defaults
            unless ``with codegen.options(...)`` set others). The whole build
            runs under them and the kernel keeps them (``Kernel.options``).
    Returns:
        A :class:`Kernel` (compiled; compilation is cached in memory and on disk,
        see the loop-nest backend's compiler (:mod:`codegen.backends`)).
    Raises:
        TexprError: a non-Tensor output, a non-placeholder input, a placeholder
        missing from ``inputs``; ScheduleError: a schedule of another graph or
        an impossible request; OutOfBoundsError: a load provably outside its
        tensor; codegen.CompileError: the backend's compiler rejected the generated code;
        TexprError: index arithmetic that cannot be proven to stay in int64
        (the message names the stage and the subexpression); an ``options``
        field that does not exist or has a value of the wrong type or out of range.
    """
    opts = _resolve_options(options)
    with _using(opts):
        return _build(outputs, inputs, schedule, parallel, blas, opts)


def _build(outputs, inputs, schedule, parallel, blas, opts):
    """:func:`build` under its Options: the arguments checked."""
    single = isinstance(outputs, Tensor)
    outs = [outputs] if single else list(outputs)
    if isinstance(inputs, Tensor):
        inputs = [inputs]
    inputs = list(inputs)
    for t in outs:
        if not isinstance(t, Tensor):
            raise TexprError(f"build: outputs must be Tensors, got {type(t).__name__}: {t!r}")
    for t in inputs:
        if not isinstance(t, Tensor) or not isinstance(t.op, PlaceholderOp):
            raise TexprError(f"build: inputs must be placeholder Tensors, got {t!r}")
    if len({id(t) for t in inputs}) != len(inputs):
        names = [t.name for t in inputs]
        raise TexprError(f"build: a placeholder is listed twice in inputs {names}; "
                         "each input takes one array")
    with _matches.build_scope():  # one contraction.match per stage for the whole build
        return _build_checked(outs, inputs, schedule, parallel, blas, opts)


def _build_checked(outs, inputs, schedule, parallel, blas, opts):
    """:func:`build` after its arguments are checked."""
    simp, rule = _simplifier()
    if schedule is None:
        outs = list(simp(outs))
        outs, found = rewrite(outs, gemms=blas, parallel=parallel)  # (codegen.rewrite.passes)
        schedule = create_schedule(outs)
        for op in found.materialize:  # a GEMM reads it: computed once, not inlined at every tap
            schedule[op].compute_root()
        for op in found.windows:  # a shift plan copies its source: a buffer, not inlined into it
            for t in op.input_tensors():
                if isinstance(t.op, ComputeOp) and t.op in schedule.ops:
                    schedule[t].compute_root()
        for op in found.parts:  # the slices in parallel, each a contiguous run of the reduction
            st = schedule[op]
            st.reorder(*st.leaf_axes)
            st.parallel(op.axis[0])
    else:
        if not isinstance(schedule, Schedule):
            raise ScheduleError(f"build: schedule must come from create_schedule, got {schedule!r}")
        if len(schedule.outputs) != len(outs) or any(
                a is not b for a, b in zip(schedule.outputs, outs)):
            raise ScheduleError("build: the schedule was created for other outputs ("
                                f"{', '.join(t.name for t in schedule.outputs)}); create it with "
                                "create_schedule(outputs)")
    mat, inl = default_materialized(schedule, rule)
    for op in schedule.ops:
        if isinstance(op, ScatterAddOp) and op.init is not None and id(op.init.op) in inl:
            if schedule[op.init].inline:
                raise ScheduleError(f"stage {op.init.op.name}: it initialises scatter-add "
                                    f"{op.name} and cannot be inlined")
            inl.discard(id(op.init.op))
            mat.add(id(op.init.op))
    for op in schedule.ops:  # exact sizes: a buffer beyond the address space is an error
        if id(op) in mat or op in [t.op for t in outs]:
            for t in op.outputs:
                check_allocatable(t, "build")
    program = _lowered(schedule, inputs, mat, inl, parallel, blas, opts)
    return _housekeeping(_compile_kernel(program, inputs, outs, opts))


# ---- hooks of the on-disk caches (texpr.symcache, texpr.cache) ----------------------


def _lowered(schedule, inputs, mat, inl, parallel, blas, opts):
    """``lower(schedule, inputs, mat, inl, parallel)`` through the symbolic cache
    (:mod:`texpr.symcache`, kind ``"lower"``): the key is the scheduled graph,
    every stage's decisions, the materialised and inlined stages, the inputs,
    ``parallel``, ``blas``, the active target dialect and the fingerprint of the
    lowering fields of ``opts`` (the :class:`Options` the lowering reads: a
    program lowered under other knobs is never loaded); a hit binds the
    Program's buffers to these tensors."""
    from texpr import symcache

    def extra(c):
        stages = [{k: v for k, v in vars(schedule.stages[id(op)]).items()
                   if k not in ("op", "_schedule")} for op in schedule.ops]
        return ["inputs", list(inputs), "outputs", list(schedule.outputs), "stages", stages,
                "materialized", sorted(c.position(op) for op in schedule.ops if id(op) in mat),
                "inlined", sorted(c.position(op) for op in schedule.ops if id(op) in inl),
                "parallel", bool(parallel), "blas", bool(blas),
                "dialect", [_dialect.current().name, type(_dialect.current()).__qualname__],
                "options", opts.fingerprint(lowering_only=True),
                "rules", _strategy.rules_fingerprint()]

    # the key holds texpr's source: whatever lower() returns, an entry of this key
    # was written by this very lower() (a foreign or damaged entry fails its checksum)
    def run():
        memo, inlined = {}, frozenset(inl)

        def choose(op, key):  # the strategy: the first rule that applies (codegen.strategy)
            ctx = _strategy.StrategyContext(schedule, inlined, parallel, key, blas)
            return _strategy.plan_stage(op, ctx, memo)

        program = lower(schedule, inputs, mat, inl, parallel=parallel, strategy=choose)
        # per sum-reduction stage left a loop nest, why (Kernel.explain reads it)
        program.loop_reasons = {
            plan.stage: plan.reason for plan, op in zip(program.plans, program.ops)
            if plan.is_loop_nest and plan.reason and _contraction.float_sum(op) is not None}
        return program

    return symcache.memo("lower", list(schedule.outputs) + list(inputs), extra, run)


def _housekeeping(kernel):
    """``kernel``, its modules marked as used (the cache's least-recently-used
    order); when one was just written, the cache is kept under its size bound
    (:mod:`texpr.cache`)."""
    paths = [p for p in getattr(kernel, "paths", [kernel.path]) if p]
    if paths and not kernel.from_memory_cache:
        from texpr import cache

        for p in paths:
            cache.touch(p)
        if not kernel.from_disk_cache:
            cache.enforce_size_bound(keep=paths)
    return kernel
