"""The profiler: where a kernel's time goes, one row per unit.

One job: time the units of :class:`codegen.build.Kernel` calls and present the
times as a table, like ``torch.profiler``'s ``key_averages()``.

Two ways in:

* ``kernel.profile(*arrays, repeat=1, **named)`` runs the kernel ``repeat``
  times on the arrays (after ``warmup`` untimed calls), prints the table
  (``print_table=True``) and returns a :class:`Profile`: its ``rows``, the
  measured ``wall_ms`` of the calls, and the ``outputs`` of the last call
  (those of a plain call).
* ``TEXPR_PROFILE=1`` in the environment (read when ``texpr.codegen`` is
  imported) records every kernel call of the process; at exit the table of
  each kernel that ran is printed to stderr. :func:`report`
  (``texpr.codegen.profile_report()``) returns (and prints) it earlier;
  :func:`enable` and :func:`disable` switch recording on and off in a running
  process. A recorded kernel is kept alive until the process ends. The bridges
  (``texpr.torch``, ``texpr.jax``) run a kernel from compiled code when they
  can (the bridges' compiled driver (:mod:`codegen.backends`), no Python between the units, so nothing to
  time there): while recording is on when a bridge first calls a kernel, it
  gets the Python driver instead, and its calls are recorded.

Rows. One per unit (a materialised stage), in execution order:

* ``stage`` and ``computes``: what the stage is, from the tensors: ``forward
  of <operator>`` (the stage's tag: te.nn's operators tag their stages),
  ``gradient of W through dense`` (an adjoint contribution ``d_W__dense``,
  from the ``out``/``inp`` attributes :mod:`texpr.jacobian` gives it; the
  simplifier keeps them), ``gradient of X`` (an adjoint sum), ``operand of
  S, packed for its GEMM`` (a stage :mod:`codegen.rewrite.operands`,
  :mod:`codegen.rewrite.tap_split` or :mod:`codegen.rewrite.windows` made for stage ``S``,
  whose own row says what it is), ... (:func:`computes`). A scatter-add
  stage has no attributes: a gradient scatter (the adjoint of a gather,
  ``d_X__Y``, ``d_X__Y_g0``) is recognised by its name, the naming
  convention of ``docs/conventions.md``.
* ``lowering``: ``GEMM (MxK @ KxN)``, ``batched GEMM Bx(...)``, ``n GEMMs``
  (:mod:`codegen.analysis.contraction`), ``shift (n moves)`` (:mod:`codegen.analysis.shifts`),
  ``loop nest, chunked parallel`` (the backend's chunked units (docs/stages.md)), ``loop nest,
  parallel`` (``prange``), ``loop nest, serial``; a scan's unit is a ``scan
  loop nest``.
* ``calls``, ``total_ms``, ``percent`` (of the step: the wall time of the
  calls), ``ms_per_call``.
* Throughput: a *contraction* (a GEMM unit, or a sum whose iteration domain
  has more points than the unit's buffers have elements) gets ``gflops``:
  ``2 * macs / time``, with ``macs`` the points of the stage's iteration
  domain, reduction axes included, counted exactly by
  :func:`texpr.simplify.stage_count` (the useful multiply-adds: not the
  padding a GEMM may multiply). Every other unit gets ``gbps``: ``bytes /
  time``, ``bytes`` the sizes of the buffers the unit reads or writes, each
  counted once (the least traffic the stage can have).

Two more rows make the rows add up to the step: ``(driver)``, the kernel's
own Python around and between the units (the temporaries, the error flag,
the outputs: from the driver's entry to its return, less the units), and,
for ``kernel.profile``, ``(call checks)``: the checks of ``kernel(...)``'s
arguments before the driver runs (the whole call's wall time less the
driver's). So the rows sum to ``wall_ms``, the wall time of the calls.

Cost. A kernel call reads one module attribute (:data:`ACTIVE`) and
tests it; nothing is timed unless a profile is recording. While recording,
each unit costs two clock reads. A call that raises is not recorded.
"""

import atexit
import os
import re
import sys
import threading
import time
import weakref
from typing import NamedTuple, Optional

import numpy as np

from texpr.errors import TexprError
from texpr.expr import Reduce
from texpr.scan import ScanOp
from texpr.simplify import stage_count
from texpr.simplify.isl_bridge import isl
from texpr.tensor import ComputeOp, ScatterAddOp, topo_order

__all__ = ["Row", "Profile", "Report", "profile", "report", "enable", "disable", "enabled",
           "computes", "lowering", "unit_info", "ACTIVE"]

#: the recorder of the calls being profiled, or None (the kernel's driver reads it)
ACTIVE = None

_clock = time.perf_counter


class Row(NamedTuple):
    """One row of a profile: a unit, or the driver's own time (``stage``
    ``(driver)`` or ``(call checks)``; no throughput). See the module docstring."""

    stage: str
    computes: str
    lowering: str
    calls: int
    total_ms: float
    percent: float
    ms_per_call: float
    macs: Optional[int] = None
    bytes: Optional[int] = None
    gflops: Optional[float] = None
    gbps: Optional[float] = None

    @property
    def throughput(self):
        """``"12.3 GFLOP/s"``, ``"4.5 GB/s"`` or ``""``."""
        if self.gflops is not None:
            return f"{self.gflops:.1f} GFLOP/s"
        if self.gbps is not None:
            return f"{self.gbps:.2f} GB/s"
        return ""


class Profile:
    """The profile of one kernel: ``kernel`` (``"Kernel(inputs -> outputs)"``), ``calls``,
    ``wall_ms`` (the measured wall time of the calls: the step, times
    ``calls``), ``rows`` (a list of :class:`Row`, the units in execution order,
    then the driver; their ``total_ms`` sum to ``wall_ms``) and ``outputs``
    (``kernel.profile``: the last call's outputs; None in a :class:`Report`).
    ``str()`` is the table."""

    def __init__(self, kernel, calls, wall_ms, rows, outputs=None):
        self.kernel, self.calls, self.wall_ms = kernel, calls, wall_ms
        self.rows, self.outputs = list(rows), outputs

    def table(self, sort_by=None):
        """The table (a str), rows in execution order, or by ``sort_by``
        (``"total_ms"``: the longest first; the driver rows stay last)."""
        rows = self.rows
        if sort_by is not None:
            units = [r for r in rows if not r.stage.startswith("(")]
            rows = (sorted(units, key=lambda r: -getattr(r, sort_by))
                    + [r for r in rows if r.stage.startswith("(")])
        head = ("stage", "computes", "lowering", "calls", "total ms", "%", "ms/call",
                "throughput")
        body = [(r.stage, r.computes, r.lowering, str(r.calls), f"{r.total_ms:.3f}",
                 f"{r.percent:.1f}", f"{r.ms_per_call:.3f}", r.throughput) for r in rows]
        step = self.wall_ms / self.calls if self.calls else 0.0
        body.append(("total", "", "", str(self.calls), f"{self.wall_ms:.3f}", "100.0",
                     f"{step:.3f}", ""))
        widths = [max(len(line[c]) for line in [head] + body) for c in range(len(head))]
        right = {3, 4, 5, 6, 7}

        def fmt(line):
            return "  ".join(s.rjust(w) if c in right else s.ljust(w)
                             for c, (s, w) in enumerate(zip(line, widths))).rstrip()
        rule = "-" * len(fmt(head))
        title = (f"{self.kernel}: {self.calls} call{'s' if self.calls != 1 else ''}, "
                 f"{step:.3f} ms per call")
        return "\n".join([title, rule, fmt(head), rule] + [fmt(b) for b in body[:-1]]
                         + [rule, fmt(body[-1])])

    def __str__(self):
        return self.table()

    def __repr__(self):
        return (f"Profile({self.kernel}, {self.calls} calls, {self.wall_ms:.3f} ms, "
                f"{len(self.rows)} rows)")


class Report:
    """What ``TEXPR_PROFILE=1`` (:func:`report`) gathered: ``profiles``, one
    :class:`Profile` per kernel that ran, in order of first call. ``str()``
    is their tables."""

    def __init__(self, profiles):
        self.profiles = list(profiles)

    def __str__(self):
        if not self.profiles:
            return "texpr profile: no kernel call was recorded"
        return "\n\n".join(p.table() for p in self.profiles)

    def __repr__(self):
        return f"Report({len(self.profiles)} kernels)"


# ---- recording ------------------------------------------------------------------------


class _Record:
    """The accumulated times of one kernel: per unit seconds, calls, and the
    seconds of the driver's calls (from its entry to its return)."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.unit_seconds = [0.0] * len(kernel.units)
        self.calls = 0
        self.seconds = 0.0

    def copy(self):
        c = _Record(self.kernel)
        c.unit_seconds, c.calls, c.seconds = list(self.unit_seconds), self.calls, self.seconds
        return c


class _Recorder:
    """Records the calls of ``only`` (a Kernel), or of every kernel (None).
    Calls of other kernels go to ``parent`` (the recorder this one replaced),
    or run untimed. The kernel's driver calls :meth:`enter`, :meth:`run_units`
    and :meth:`leave` (codegen.build.Kernel._execute)."""

    def __init__(self, only=None, parent=None):
        self.only, self.parent = only, parent
        self.records = {}  # id(kernel) -> _Record, in order of first call
        self._lock = threading.Lock()

    def enter(self):
        return _clock()

    def run_units(self, kernel, args, err, fail):
        """Run ``kernel``'s units as its driver does (``fail(unit, err)`` raises a
        unit's error), timing each when this recorder takes the kernel. Returns
        the seconds per unit, or None (not recorded here)."""
        if self.only is not None and kernel is not self.only:
            if self.parent is not None:
                return self.parent.run_units(kernel, args, err, fail)
            for unit in kernel.units:
                unit.run(args, err)
                if err[0]:
                    fail(unit, err)
            return None
        times = []
        for unit in kernel.units:
            t0 = _clock()
            unit.run(args, err)
            times.append(_clock() - t0)
            if err[0]:
                fail(unit, err)
        return times

    def leave(self, kernel, t_in, times):
        """Add one call of ``kernel`` (entered at ``t_in``; ``times``: what
        :meth:`run_units` returned)."""
        seconds = _clock() - t_in
        if self.only is not None and kernel is not self.only:
            if self.parent is not None:
                self.parent.leave(kernel, t_in, times)
            return
        if times is None:
            return
        with self._lock:
            rec = self.records.get(id(kernel))
            if rec is None:
                rec = self.records[id(kernel)] = _Record(kernel)
            rec.unit_seconds = [a + b for a, b in zip(rec.unit_seconds, times)]
            rec.calls += 1
            rec.seconds += seconds
        if self.parent is not None:
            # a kernel.profile in a recording process: its calls count there too
            self.parent.leave(kernel, t_in, times)


def enable():
    """Record every kernel call from now on (what ``TEXPR_PROFILE=1`` does at
    import). Already recording: nothing changes."""
    global ACTIVE
    if ACTIVE is None:
        ACTIVE = _Recorder()


def disable():
    """Stop recording (the calls recorded so far are dropped)."""
    global ACTIVE
    ACTIVE = None


def enabled():
    """Whether kernel calls are being recorded."""
    return ACTIVE is not None


def report(print_table=True, file=None, reset=False):
    """The profiles of the kernels called since recording began
    (``TEXPR_PROFILE=1`` or :func:`enable`).

    Args:
        print_table: print the tables (to ``file``, default stdout).
        file: where to print.
        reset: start counting again afterwards.
    Returns:
        A :class:`Report` (no profiles when nothing is recording).
    """
    rec = ACTIVE
    profiles = []
    if rec is not None:
        with rec._lock:
            records = [r.copy() for r in rec.records.values()]
            if reset:
                rec.records = {}
        profiles = [_profile_of(r) for r in records if r.calls]
    out = Report(profiles)
    if print_table:
        print(out, file=file if file is not None else sys.stdout)
    return out


def _report_at_exit():
    if ACTIVE is not None and ACTIVE.records:
        report(file=sys.stderr)


def profile(kernel, arrays, named, repeat=1, warmup=0, print_table=True):
    """``kernel.profile(*arrays, repeat=, warmup=, print_table=, **named)``: see
    :meth:`codegen.build.Kernel.profile`."""
    for what, v, least in (("repeat", repeat, 1), ("warmup", warmup, 0)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < least:
            raise TexprError(f"kernel.profile: {what} must be an int >= {least}, got {v!r}")
    for _ in range(int(warmup)):
        kernel(*arrays, **named)
    global ACTIVE
    rec = _Recorder(only=kernel, parent=ACTIVE)
    outer = 0.0
    ACTIVE = rec
    try:
        for _ in range(int(repeat)):
            t0 = _clock()
            outputs = kernel(*arrays, **named)
            outer += _clock() - t0
    finally:
        ACTIVE = rec.parent
    result = _profile_of(rec.records[id(kernel)], outer, outputs)
    if print_table:
        print(result)
    return result


# ---- the rows -------------------------------------------------------------------------


class _UnitInfo(NamedTuple):
    stage: str
    computes: str
    lowering: str
    macs: Optional[int]   # the multiply-adds of a contraction, else None
    bytes: int


#: kernel -> its units' _UnitInfo (computed once: counting uses isl)
_INFO = weakref.WeakKeyDictionary()


def _profile_of(rec, outer=None, outputs=None):
    """The :class:`Profile` of ``rec`` (a _Record); ``outer``: the seconds of the
    whole ``kernel(...)`` calls (their checks included), if measured."""
    kernel, calls = rec.kernel, rec.calls
    info = _INFO.get(kernel)
    if info is None:
        info = _INFO[kernel] = unit_info(kernel)
    wall = outer if outer is not None else rec.seconds
    ms = 1e3

    def pct(s):
        return 100.0 * s / wall if wall > 0 else 0.0

    rows = []
    for u, s in zip(info, rec.unit_seconds):
        gflops = gbps = None
        if s > 0:
            if u.macs is not None:
                gflops = 2.0 * u.macs * calls / s / 1e9
            else:
                gbps = u.bytes * calls / s / 1e9
        rows.append(Row(u.stage, u.computes, u.lowering, calls, s * ms, pct(s), s * ms / calls,
                        u.macs, u.bytes, gflops, gbps))
    driver = rec.seconds - sum(rec.unit_seconds)
    rows.append(Row("(driver)", "allocation, outputs, Python between units", "Python",
                    calls, driver * ms, pct(driver), driver * ms / calls))
    if outer is not None:
        checks = outer - rec.seconds
        rows.append(Row("(call checks)", "kernel(...)'s checks of its arrays", "Python", calls,
                        checks * ms, pct(checks), checks * ms / calls))
    name = (f"Kernel({', '.join(t.name for t in kernel.inputs)} -> "
            f"{', '.join(t.name for t in kernel.outputs)})")
    return Profile(name, calls, wall * ms, rows, outputs)


def unit_info(kernel):
    """Per unit of ``kernel``: ``(stage, computes, lowering, macs, bytes)`` (see
    the module docstring)."""
    program = kernel._program
    ops = list(getattr(program, "ops", ()))
    if len(ops) != len(kernel.units):  # (a program without its ops: names only)
        ops = [None] * len(kernel.units)
    names = {op.name for op in topo_order(list(kernel.outputs))}
    bufs = program.buffers
    out = []
    for unit, op in zip(kernel.units, ops):
        nbytes = sum(bufs[a].size * np.dtype(bufs[a].dtype).itemsize for a in unit.args)
        elements = sum(bufs[a].size for a in unit.args)
        what = computes(op, names) if op is not None else ""
        out.append(_UnitInfo(unit.stage, what, lowering(unit, op), _macs(unit, op, elements),
                             nbytes))
    return out


def _macs(unit, op, elements):
    """The multiply-adds of a contraction unit (its domain's points), else None."""
    if op is None or not isinstance(op, ComputeOp) or not isinstance(op.body[0], Reduce):
        if unit.kind == "blas":
            return unit.plan.points
        return None
    if op.body[0].combiner.kind != "sum":
        return None
    try:
        n = int(stage_count(op))
    except (TexprError, isl.Error):
        return unit.plan.points if unit.kind == "blas" else None
    if unit.kind == "blas" or n > elements:
        return n
    return None


def lowering(unit, op=None):
    """How ``unit`` runs, in a few words (see the module docstring)."""
    if unit.kind == "blas":
        dims = [p.gemm_dims() for p in unit.plan.pieces]
        if len(dims) == 1:
            b, m, n, k = dims[0]
            shape = f"({m}x{k} @ {k}x{n})"
            return f"batched GEMM {b}x{shape}" if b > 1 else f"GEMM {shape}"
        batched = any(b > 1 for b, _, _, _ in dims)
        return f"{len(dims)} {'batched ' if batched else ''}GEMMs"
    if unit.kind == "shift":
        return f"shift ({len(unit.plan.moves)} moves)"
    if getattr(unit, "loop_nest", False):
        nest = "scan loop nest" if isinstance(op, ScanOp) else "loop nest"
        if getattr(unit, "chunks", 0):
            return f"{nest}, chunked parallel"
        return f"{nest}, {'parallel' if getattr(unit, 'parallel', False) else 'serial'}"
    return unit.kind


#: tags of stages made for another stage (``attrs["of"]``): what they are to it
_MADE_FOR = {
    "packed_operand": "operand of {of}, packed for its GEMM",
    "tap_split": "taps of {of}, one GEMM",
    "window": "window of {of}",
    "split_reduction": "partial reductions of {of}, split across cores",
    "argmax": "argmax of {of}, for its gradient",
    "reduction_rest": "partial reductions of {of}, for its gradient",
    "prefix_scan": "prefix scan of {of}",
    "prefix_adjoint": "reverse scan of the gradient of {of}",
    "scan_adjoint": "gradient scan of {of}",
    "scan_unrolled": "unrolled step of scan {of}",
    "scan_step": "step of scan {of}",
    "scan_update_head": "gradient of the steps of scan {of}",
    "scan_adjoint_sequence": "gradient sequence of scan {of}",
    "tangent": "tangent of {of}",
    "scan_tangent": "tangent of scan {of}",
}

_OWN = {
    "identity_head": "identity head (the gradient's seed)",
    "zeros": "zeros",
    "adjoint_sum": "gradient (sum of contributions)",
    "adjoint_contribution": "gradient contribution",
    "split_sum": "term of a split sum",
    "tangent": "tangent",
}

_SUFFIX = re.compile(r"(_dense|_g\d+|_init)$")


def _adjoint_name(name, known):
    """``(inp, out)`` of an adjoint named ``d_<inp>__<out>`` (optionally ending in
    ``_dense``, ``_g<k>``, ``_init``: the pieces of a scatter's adjoint,
    :mod:`texpr.jacobian`), or None. Of several ways to read the name, the one
    with the most of ``inp`` and ``out`` among the graph's tensor names
    (``known``) wins; then a suffix is taken for a piece's."""
    if not name.startswith("d_"):
        return None
    found = []
    for base in (_SUFFIX.sub("", name)[2:], name[2:]):
        found += [(base[:m.start()], base[m.end():]) for m in re.finditer("__", base)
                  if m.start() > 0 and m.end() < len(base)]
    if not found:
        return None
    return max(found, key=lambda s: (s[0] in known) + (s[1] in known))


def computes(op, names=()):
    """What the stage ``op`` computes, in a few words: ``forward of dense``,
    ``gradient of W through dense``, ``operand of S, packed for its GEMM``, ...
    (see the module docstring). ``names``: the names of the graph's tensors
    (a dict or set), to split an adjoint's name ``d_<inp>__<out>`` where
    ``inp`` is one of them."""
    tag = getattr(op, "tag", "") or ""
    attrs = getattr(op, "attrs", None) or {}
    of = attrs.get("of")
    if tag == "adjoint_contribution" and "inp" in attrs and "out" in attrs:
        return f"gradient of {attrs['inp']} through {attrs['out']}"
    if tag == "adjoint_sum" and of is not None:
        return f"gradient of {of}"
    if tag in _MADE_FOR and of is not None:
        return _MADE_FOR[tag].format(of=of)
    if tag in ("adjoint_contribution", "adjoint_sum") or isinstance(op, ScatterAddOp):
        named = _adjoint_name(op.name, names)
        if named is not None:
            return f"gradient of {named[0]} through {named[1]}"
        return _OWN.get(tag, "scatter-add")
    if tag == "split_sum":
        m = re.fullmatch(r"(.+)_t\d+", op.name)
        return f"term of {m.group(1)}" if m else _OWN[tag]
    if tag in _OWN:
        return _OWN[tag]
    if isinstance(op, ScanOp):
        return f"forward of {tag}" if tag else "forward scan"
    return f"forward of {tag}" if tag else "forward"


if os.environ.get("TEXPR_PROFILE", "") not in ("", "0"):
    enable()
atexit.register(_report_at_exit)
