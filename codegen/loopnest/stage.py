"""Stage lowering: one materialised stage -> its statements and loop nests (isl) -> source lines.

One job: the loops of one stage (its unit's body, see :mod:`codegen.loopnest.lower`),
in three steps (:meth:`_StageLowering.run`): *plan* -- the loop order, parallel
axes, register blocking, partial sums and lanes are chosen
(:mod:`codegen.loopnest.order`), and every loop nest's statements and isl loop
tree are built (reductions: :mod:`codegen.loopnest.reduce`; nests:
:mod:`codegen.loopnest.tree`) as :class:`codegen.loopnest.plan.Nest` records;
*decide* -- whether the unit runs in chunks, with parallel loops or serially,
from the statements' schedules and the trees
(:func:`codegen.loopnest.plan.decide_chunks`), giving the stage's
:class:`codegen.loopnest.plan.LoopPlan`; *write* -- each nest once, as the plan
says (values: :mod:`codegen.loopnest.emit`, :mod:`codegen.loopnest.branches`).
A materialised stage becomes:

1. its body with the inlined stages substituted (:func:`schedule.inline_expand`);
2. its statements, each a point set over the stage's axes:
   * elementwise: ``S[s]`` over the spatial box, ``out[s] = body``;
   * reduction, loops ordered spatial-then-reduce (*scalar mode*): ``I[s]``
     (``acc = identity``), ``U[s, r]`` over the box intersected with the affine
     part of ``where`` (``acc = combine(acc, source)``), ``F[s]`` (``out[s] = acc``),
     scheduled ``[s, 0, 0..]``, ``[s, 1, r]``, ``[s, 2, 0..]``: the accumulator is a
     local scalar;
   * reduction with a reduction loop outside a spatial one (*buffer mode*): the
     output is filled with the identity, then ``U[s, r]``: ``out[s] = combine(out[s], ..)``;
   * scatter-add: the output is initialised (zeros or a copy of ``init``), then
     ``U[p]`` over its domain (intersected with the affine part of ``where``):
     ``out[indices] += value``; a support stage (identity indices: the simplifier's
     elementwise stage restricted to its support) is ``out[p] = value`` with its
     outermost loop parallel like an elementwise stage;
3. the schedule of each statement is the value of every leaf loop of the stage
   (splits are ``floor(v/f)`` and ``v mod f``), so isl's AST generator
   (:func:`texpr.simplify.loop_ast.generate`) gives the loops with exact bounds and
   strides, and solves equalities away;
4. the residual (data-dependent) part of ``where`` stays as an ``if``; loads
   whose indices isl cannot prove in bounds get a run-time check that sets an
   error flag (a ``raise`` would stop the compiler from parallelising the loop); loads
   proven out of bounds are reported at build time (:class:`OutOfBoundsError`).

Default schedule of a stage the user did not order: loops in definition order,
except for reductions, where the axis giving the most accesses that are unit
stride or invariant in it goes innermost (the output's store counts as
invariant in a reduction loop; before that, an axis along which the
reduction's data-dependent ``where`` does not vary, so that the condition is
tested once per innermost loop: ``options.condition_invariant``): a reduction axis (scalar mode) or a spatial axis (buffer mode, with
the reduction loops moved outside the spatial loops whose output tile is small
so that the innermost loop has independent iterations and vectorises without
reassociating floating-point sums). The outermost spatial loop runs in parallel
(``prange``; never a loop that accumulates into shared locations), unless the
stage visits fewer than ``options.parallel_min_points`` points.

Code shape (all exact: no reassociation the user did not ask for beyond a
sum's order of terms, which the evaluator does not fix either):

* buffers are passed flat; an element is ``buf[np.uint64(row-major offset)]``
  with the static extents as constants (no negative-index wrap-around code,
  unit strides visible to LLVM);
* the innermost loop of a floating-point sum (scalar mode) that LLVM's loop
  vectoriser takes (unit-stride loads, no branch, no run-time check) is written
  once, its accumulator updated by ``_radd``, an add LLVM may reassociate: the
  vectoriser keeps the partial sums in vector registers; any other is unrolled
  into ``options.unroll`` partial sums, kept per output element across the outer
  reduction loops (``options.partials_per_output``) and added to the accumulator
  in a fixed tree after them;
* register blocking: in scalar mode, ``options.jam`` consecutive points of the innermost
  spatial axis share the reduction loops (when the domain does not depend on
  that axis and some load is shared), each with its own accumulator;
* in buffer mode a short innermost reduction loop (``<= options.max_lanes``) is unrolled
  inside the spatial loops where all its values are in the domain, so each
  output element is loaded and stored once for all of them; a long one with
  constant bounds is unrolled by groups of ``options.split_lanes`` values the same way
  (dense's dX and dW: 1.6-2.3 ms -> 1.0 ms; layernorm 0.7 -> 0.34 ms); where a
  ``where`` bounds it, the groups wholly inside the domain are unrolled and the
  cut ones run as plain loops (cumsum 6.5 -> 4.4 ms); the longest such
  reduction goes innermost when the loads along the innermost spatial axis
  are contiguous (conv2d: 16 input channels, not 3 kernel columns: 8.5 -> 8.0 ms;
  dilated 16 -> 12 ms);
* register blocking may take a spatial axis other than the innermost (moved
  innermost) where the innermost reduction loop is too short to unroll: a
  strided conv's dW blocks its input channels (8.4 -> 4.7 ms);
* a ``where`` condition ``e % m`` (or ``e // m``) that keeps several but not all
  residue classes of ``e`` (e.g. ``(h + 1) % 3 <= 1``: stride 3, two taps) splits
  the domain into one piece per class, each a strided loop, instead of a test in
  every iteration.
"""

import numpy as np

from texpr.simplify.isl_bridge import VarSpace, box_set, isl, to_pwaff, to_set
from texpr.simplify import loop_ast as LA
from texpr import dtypes as dt
from texpr import expr as E
from texpr.errors import TexprError
from texpr.printer import expr_str, tensor_str
from texpr.visitor import post_order
from texpr.tensor import ScatterAddOp

from ..options import current as _opts
from ..analysis.affine import affine_offsets
from ..analysis.bounds import _BoundsChecker
from .emit import ExprEmitter, element, fill_value, helper_int
from ..ir.schedule import inline_expand
from .plan import LoopPlan, Nest, StageChunks, decide_chunks, runs_parallel
from .order import (_data_condition_axes, _jam_axis, _order_sensitive, _points,  # noqa: F401
                    _residue_candidates, _worth_parallel, default_order, lift_zero_guards,
                    _free)
from .reduce import _Reductions
from .tree import _NestWriter
from .branches import bind_branches

__all__ = ["default_order", "lift_zero_guards"]

# The knobs read here are fields of the active codegen Options (``_opts()``, read
# when the stage is lowered; docs/options.md). Why their defaults are what they are:
# options.rest_parallel_fraction (default 0.125): a second loop nest of a stage (the rest of
#   an unrolled or blocked nest: borders, partial groups) with fewer than this fraction of
#   the stage's points runs sequentially: the compiler compiles every parallel loop nest as
#   a function of its own (depthwise conv's border nests: about 1 s of compile time each,
#   for about 5% of the stage's run time)
# options.inline_nodes (default 16): a subexpression of at most this many tree nodes and no
#   run-time check stays inline in a large value's statements
#   (:meth:`_StageLowering._bind_branches`)
# options.short_contiguous (default True): when no loop of at least 4 trips walks memory
#   contiguously, a shorter one that does may go innermost: the main job's 3x3 convolution
#   of 4x4 images (batch 64) had its batch axis innermost, at a stride of a whole image: its
#   forward ran 1.52 -> 0.55 ms, its weight gradient 1.33 -> 0.78 ms, its input gradient
#   0.70 -> 1.33 ms (the training step 6.06 -> 5.53 ms); avgpool3s2's dX 6.95 -> 1.78 ms,
#   upsample2's dX 0.23 -> 0.07 ms, avgpool3s2's forward 0.56 -> 0.82 ms, the other suite
#   cases unchanged (bench_variants, one run)
# options.condition_invariant (default True): the innermost loop is, first, one along which
#   the reduction's data-dependent ``where`` does not vary (tested once per loop, not per
#   trip: see :func:`_data_condition_axes`), and a short contiguous loop may also go
#   innermost when every long one strides far or varies the condition (the scores' credit
#   for invariant loads had kept the main job's conv2 from options.short_contiguous: its batch axis
#   was innermost again). The main job's serial kernel, one run: conv2 0.98 -> 0.27 ms,
#   conv1's weight gradient 1.27 -> 0.19, the whole kernel 3.64 -> 1.86 ms. False: the
#   scores and options.short_contiguous alone
# options.speculate_selects (default True): a float select of an elementwise stage whose
#   arms are small, call nothing, run no check and read in bounds over the whole stage is
#   written ``_sel(c, a, b)``: both arms computed, then one LLVM select
#   (:func:`speculative_selects`). False: always ``a if c else b``, a branch
# options.speculate_max_nodes (default 16): the most nodes the two arms of a speculated
#   select have together
# options.sum_float64 (default True): a float32 sum of a loop nest (scalar mode: its
#   accumulators in registers) adds in float64 and rounds once when it stores: BatchNorm's
#   statistics and their gradients over 65,536 terms were 10x less accurate than PyTorch's
#   cascaded float32 sums (a small ResNet's gradients within 1.6e-5 of float64, PyTorch's
#   1.5e-6). The vectorised loop then holds half as many lanes per register. False: float32
#   accumulators
# options.select_where (default True): a reduction's data-dependent ``where`` over a value
#   that runs no check is a select of the combined value, not an ``if`` around it
#   (:meth:`_StageLowering._select_combine`: the loads leave the branch and the accumulators
#   vectorise). False: always the ``if``
# options.buffer_tile (default 4096): output tile (elements) below the reduction loops in
#   buffer mode
# options.parallel_min_points (default 1 << 16): stages visiting fewer points run
#   sequentially by default (waking the worker threads costs more than the loop)
# options.parallel_points (default 1 << 19): ... and, below ``options.parallel_points`` points,
#   whose *work* (its points times the expression nodes of its body; a reduction's summand
#   and condition) is below ``options.parallel_min_work``. Waking the second thread costs about 0.1
#   ms here (a parallel loop and a chunked unit's launch alike, OpenMP waiting passively:
#   the loop-nest backend's compiler), so a stage of few cheap points runs faster serially.
#   Calibrated on the suite's stages (2 cores, bench_variants, docs/stages.md): upsample2's
#   and pixel_shuffle2's copies and selects (0.4 M points, work 3-9 M) and layernorm's
#   stages (0.13 M points) lose in parallel; max_pool2d's forward max and argmax (0.8 M
#   points, work 7-14 M), avg_pool2d's and the depthwise convolution's stages (1.7-6.9 M
#   points) gain
# options.parallel_min_work (default 16_000_000): 
# options.chunks (default True): a parallel stage is a *chunked* serial unit whose parts of
#   its outermost spatial axis run at the same time (the backend's chunked units
#   (docs/stages.md)), where its loop nests allow it, instead of prange loops (the backend's
#   parallel-loop pass: about 0.5-1 s of compile time per unit)
# options.unroll_min_points (default 1 << 15): reductions whose iteration box has fewer
#   points are neither unrolled nor register-blocked
# options.unroll (default 8): partial sums in the innermost loop of a sum reduction (a power
#   of two)
# options.jam (default 4): points of the innermost spatial axis blocked together in a sum
#   (register blocking)
# options.jam_unroll (default 4): partial sums per blocked point of a register-blocked sum
#   (options.jam points x this many accumulators; options.unroll's 8 there made flatten_dense's dense unit
#   32 accumulators and 7.7 s of compile time)
# options.jam_move (default True): the blocked axis may be a spatial axis other than the
#   innermost (moved innermost)
# options.max_lanes (default 4): a reduction loop this short, innermost among the reductions
#   in buffer mode, is unrolled inside the spatial loops
# options.split_lanes (default 16): a longer innermost reduction loop in buffer mode
#   (constant bounds) is unrolled by groups of this many values inside the spatial loops
# options.max_residue_splits (default 2): at most this many residue splits of one stage's
#   domain (each doubles its code, about)
# options.reassociate (default True): the innermost loop of a float sum that LLVM's loop
#   vectoriser takes is written once with ``_radd`` accumulators instead of ``options.unroll``
#   copies (:meth:`_StageLowering._emit_reassociated_sum`)
# options.reassociate_min_trips (default 128): ... where its loop runs at least this many
#   times: the vectorised loop takes vector width x interleave (8 x 4 float32 lanes with
#   AVX2) terms a trip, and a shorter loop runs mostly in its scalar remainder, one
#   dependency chain. Depthwise conv's dW (a 28-value innermost loop): 0.72 ms unrolled,
#   1.57 ms written once (bench_variants, 2026-12-04)
# options.unroll_max_nodes (default 64): larger summands are not unrolled (compile time
#   grows with the copies)
# options.cse (default True): repeated subexpressions of a statement are computed once, and
#   large selects inside it by if statements of their own (:mod:`codegen.loopnest.cse`)
# options.invariant_free (default True): in the default order's scores, a load invariant in
#   a loop counts as much as a unit-stride one, and the output's store is invariant in a
#   reduction loop (layernorm's variance: ``mean[i]`` and the store no longer pull ``i``
#   innermost, which read X at stride 512 and unrolled 16 lanes; value and gradient compile
#   time 3.8 -> 3.0 s); first, though, the innermost loop walks the fewest tensors at a far
#   stride (:func:`_far_strided`). False: the earlier scores alone
# options.affine_offsets (default True): loads whose row-major offset isl proves affine over
#   the iteration box are addressed by that offset, not by their ``//`` and ``%`` indices
#   (:mod:`codegen.analysis.affine`)


def speculative_selects(name, exprs, space, box, em):
    """ids of the float selects of ``exprs`` (an elementwise stage's body over ``box``)
    written ``_sel(c, a, b)``: both arms computed, then chosen by one LLVM select.
    A select in the generated text is a branch; on a data-dependent condition (a
    relu's mask, ``select(x > 0, dy, 0)``) half its branches are mispredicted, and
    LLVM cannot make it a blend itself, for it may not load an array element the
    branch does not reach. Speculated: arms of at most
    ``options.speculate_max_nodes`` nodes together, with no call, no division, no
    integer load and no run-time check (:attr:`ExprEmitter.checks` and the
    others), whose loads isl proves in bounds over the whole stage, not only
    where the condition holds (a padding select, ``select(h >= 1, X[h - 1],
    0)``, keeps its branch), and whose nested selects are speculated too. The
    value is the branch's: an arm not taken is computed and dropped (a NaN or
    an infinity in it never reaches the result)."""
    out = set()
    if not _opts().speculate_selects:
        return out
    for n in post_order(list(exprs)):
        if not isinstance(n, E.Select) or not dt.is_float(n.dtype):
            continue
        arms = [n.true_value, n.false_value]
        nodes = post_order(arms)
        if len(nodes) > _opts().speculate_max_nodes:
            continue
        if any(isinstance(x, (E.Call, E.Div, E.Reduce))
               or (isinstance(x, E.Select) and id(x) not in out)
               or (isinstance(x, E.Load) and not dt.is_float(x.dtype))
               or em._has_own_check(x) for x in nodes):
            continue
        ck = _BoundsChecker(name, space, box)
        try:
            for a in arms:
                ck.walk(a, box, False)
        except (TexprError, isl.Error):
            continue
        if ck.need or ck.values or ck.arith:
            continue
        out.add(id(n))
    return out


class _StageLowering(_Reductions, _NestWriter):
    """Lowers one materialised stage to source lines written by ``w``
    (:class:`codegen.loopnest.emit._Writer`) at ``depth``: ``run`` plans the
    stage's nests (:attr:`items`), decides how the unit runs them
    (:attr:`loop_plan`, a :class:`codegen.loopnest.plan.LoopPlan`; ``chunking``
    set by the unit asks for chunks, and after ``run`` says whether they were
    taken) and writes them; ``uses_prange`` tells whether a loop runs in
    parallel, ``errors`` (shared list) receives the messages of its run-time
    checks (code = position + 1).

    ``k`` prefixes the local identifiers (``i{k}_0``, ``acc{k}_0``, ...): the
    program lowers every stage as a unit of its own with ``k = 0``, so the text
    depends on the stage's structure alone. ``buffers`` maps ``id(tensor)`` to
    the :class:`codegen.loopnest.lower.BufferInfo` whose ``name`` the text uses.

    Dispatch: :meth:`_plan` picks the lowering by the op's kind (scatter-add,
    reduction, elementwise); a new op kind adds a branch there (or a method
    like :meth:`_scatter`) that plans its nests with :meth:`_plan_nest`.
    """

    def __init__(self, k, op, stage, buffers, inlined, errors, parallel_on, w):
        self.k, self.op, self.stage, self.buffers = k, op, stage, buffers
        self._temps = 0  # numbers the temporaries of statements (_fresh)
        self.inlined, self.errors, self.parallel_on, self.w = inlined, errors, parallel_on, w
        self.names = {}
        self.uses_prange = False
        # a where= written as a chain of flag blocks binding values one block reads
        # from another (_guard): the backend's parallel-loop pass miscompiles such a body
        self.split_guard = False
        # chunked lowering (the backend's chunked units): the parallel loop over ``chunk_axis``
        # runs the part ``part[0] <= value < part[1]`` of its range only
        self.chunking = False  # asked for by the unit; after planning: the unit is chunked
        self.chunk_axis = None  # the one spatial axis every chunked loop runs over
        self.chunk_align = 1  # parts start at multiples of this (tiles of the axis)
        self._chunk_div = {}  # id(loop var) -> d: the loop runs the values axis // d
        self._chunks = StageChunks(op)  # what plan.decide_chunks reads besides the nests
        # the planned stage, in the order it is written: plan.Nest records and
        # functions writing lines (a buffer-mode reduction's fill)
        self.items = []
        self.loop_plan = None  # the plan.LoopPlan, once planned
        # (combine, accumulator, dtype, partial sums, the innermost reduction axis's
        # extent, whether the partial sums are per output element) of a float sum
        # whose innermost loop is unrolled or written with _radd
        self.unroll = None
        # the accumulators (lanes) whose partial sums an unrolled loop updated since
        # their output's init statement (its final statement adds them, or else
        # takes back the init's lines)
        self.partials_used = set()
        self.jam_dim = None
        self.lanes = None  # (loop dimension, count) of an unrolled reduction loop
        # what the lowering chose, for the stage's plan (codegen.strategy.with_loops):
        # the loop order (IterVars), the parallel axes, (axis name, count) of lanes
        self.chosen_order = self.chosen_parallel = self.chosen_lanes = None
        self.chosen_sum = None  # how the innermost sum loop was written: "unroll N", ...
        self.chosen_jam = None  # (axis name, count) of register blocking
        self.residues = []  # [(e, m)]: split the domains on the residues of e % m
        self.stage_points = None  # points of a reduction stage's domain

    def header(self, depth):
        """The stage's comment line (its definition, in the readable source only)."""
        self.w.comment(depth, "---- stage",
                       f"---- stage {self.op.name}: {tensor_str(self.op.output(0))}")

    def run(self, depth):
        """Write the stage's loop nests (a scan is lowered by
        :func:`codegen.loopnest.scan_lower.lower_stage`, which calls this for the rest):
        every nest planned first (:meth:`_plan`), then how the unit runs them
        decided (:meth:`_decide`), then each written once."""
        self.header(depth)
        self._plan(depth)
        self._decide()
        for item in self.items:
            if isinstance(item, Nest):
                self._write_nest(item)
            else:
                item()

    def _decide(self):
        """Chunked or not (:func:`codegen.loopnest.plan.decide_chunks`), from the
        planned nests; then the stage's :class:`LoopPlan`."""
        if self.chunking:
            nests = [n for n in self.items if isinstance(n, Nest)]
            d = decide_chunks(self._chunks, nests, self)
            self.chunking = d.chunked
            if d.chunked:
                self.chunk_axis, self.chunk_align, self._chunk_div = d.axis, d.align, d.divs
        par = self.chosen_parallel
        if self.chunking:
            execution = "chunked"
        elif any(runs_parallel(n) for n in self.items if isinstance(n, Nest)):
            execution = "prange"
        else:
            execution = "serial"
        self.loop_plan = LoopPlan(
            None if self.chosen_order is None else tuple(self.chosen_order),
            None if par is None else tuple(par), self.chosen_lanes, self.chosen_jam,
            None if self.unroll is None else self.unroll[3], execution,
            self.chunk_axis if self.chunking else None, self.chunk_align if self.chunking else 1)

    def _plan(self, depth):
        """Plan the stage's loop nests into :attr:`items` (nothing written but a
        scatter-add's initialisation, which every way of running it shares)."""
        op = self.op
        w = self.w
        if isinstance(op, ScatterAddOp):
            return self._scatter(depth)
        spatial = list(op.axis)
        body = [inline_expand(b, self.inlined) for b in op.body]
        red = body[0] if isinstance(body[0], E.Reduce) else None
        self._chunks.ok = True
        reduce_ = list(op.reduce_axis)
        for d, a in enumerate(spatial):
            self.names[id(a)] = f"i{self.k}_{d}"
        for d, a in enumerate(reduce_):
            self.names[id(a)] = f"r{self.k}_{d}"
        order, par = self._order(body, spatial, reduce_)
        self.chosen_order, self.chosen_parallel = order, par  # (the stage's plan records them)
        outs = [self.buffers[id(t)] for t in op.outputs]
        sp_space = VarSpace(spatial)
        sp_box = box_set(sp_space)
        if red is None:
            return self._run_pointwise(depth, op, w, spatial, body, order, par, outs, sp_space,
                                       sp_box)
        # reduction
        full = spatial + reduce_
        space = VarSpace(full)
        box = box_set(space)
        red = lift_zero_guards(red, space)
        wset, resid = to_set(red.where, space)
        dom = box.intersect(wset)
        self.residues = _residue_candidates(red.where, space, dom)
        sensitive = _order_sensitive(red)
        if sensitive:
            # a residue split runs the classes one after the other: only over the
            # spatial axes, which keeps each element's points in row-major order
            self.residues = [(e, m) for e, m in self.residues
                             if all(v.kind == "spatial" for v in _free(e)
                                    if isinstance(v, E.IterVar))]
        # counting a domain's points can cost (barvinok on modulus conditions;
        # _points bounds it): only where the parallel rules need it
        self.stage_points = _points(dom) if par else None
        if not self.stage.parallel_set and par and not _worth_parallel(
                self.stage_points, list(red.source) + [red.where]):
            par = self.chosen_parallel = []
        em = self._emitter()
        ck = _BoundsChecker(op.name, space, box)
        ck.walk(red.where, box, False)
        for s in red.source:
            ck.walk(s, dom, resid is not None)
        em.checks, em.value_checks, em.arith_checks = ck.need, ck.values, ck.arith
        if _opts().affine_offsets:
            em.flat = affine_offsets([red.where] + list(red.source), full, space, box, ck.need)
        comb = red.combiner
        ncomp = len(comb.identity)
        acc = [f"acc{self.k}_{c}" for c in range(ncomp)]
        n_sp = sum(1 for a in order if a.kind == "spatial")
        scalar_mode = all(a.kind == "spatial" for a in order[:n_sp])
        combine = self._combine_lines(comb, red, em, resid)
        if scalar_mode:
            return self._run_scalar_reduction(depth, w, spatial, red, order, par, outs, sp_space,
                                              sp_box, full, space, dom, comb, ncomp, acc, n_sp,
                                              combine)
        return self._run_buffer_reduction(depth, op, w, red, order, par, outs, full, space, box,
                                          resid, dom, sensitive, comb, ncomp, combine)

    def _run_pointwise(self, depth, op, w, spatial, body, order, par, outs, sp_space, sp_box):
        """An elementwise stage's loop nest (every output written at each point)."""
        if not self.stage.parallel_set and not _worth_parallel(int(np.prod(op.shape)), body):
            par = self.chosen_parallel = []
        em = self._emitter()
        ck = _BoundsChecker(op.name, sp_space, sp_box)
        for b in body:
            ck.walk(b, sp_box, False)
        em.checks, em.value_checks, em.arith_checks = ck.need, ck.values, ck.arith
        em.speculative = speculative_selects(op.name, body, sp_space, sp_box, em)
        if _opts().affine_offsets:
            em.flat = affine_offsets(body, spatial, sp_space, sp_box, ck.need)

        def write_all(d):
            # every output of the stage: a tuple reduction whose domain the
            # simplifier collapsed (one point, equalities solved) is an
            # elementwise stage with several outputs (BUGS.md C14)
            bound = self._bind_shared(em, d, body)
            for o, b in zip(outs, body):
                bound += self._bind_branches(em, d, b)
                w(d, f"{self._store(o)} = {em.cast(b, o.dtype)}")
            em.unbind(bound)

        stmts = {"S": write_all}
        st = [LA.Statement(f"S{self.k}", spatial, sp_box, [self._val(a) for a in order])]
        loop_pos = {id(a): p for p, a in enumerate(order)}
        return self._plan_nest(depth, st, len(order), stmts,
                               {loop_pos[id(a)] for a in par})

    def _emitter(self):
        return ExprEmitter(self.names, self.buffers, self.op.name, self.errors)

    def _val(self, leaf):
        return self.stage.axis_value(leaf)

    def _store(self, buf):
        if not self.op.axis:
            return f"{buf.name}[0]"
        return element(buf, [self.names[id(a)] for a in self.op.axis])

    def _order(self, body, spatial, reduce_):
        st = self.stage
        if st.ordered:
            order = list(st.leaf_axes)
        else:
            order = default_order(self.op, body, spatial, reduce_)
            if body and _order_sensitive(body[0]):
                # a tuple reducer keeps the first of tied points in row-major order
                # of its reduction axes (its combine need not be symmetric): the
                # reduction loops keep their declared order, nested where the
                # default order put them
                declared = iter(reduce_)
                order = [next(declared) if a.kind == "reduce" else a for a in order]
        for v in st.vectorize_axes:
            if any(v is a for a in order) and order[-1] is not v:
                order = [a for a in order if a is not v] + [v]
        par = []
        if self.parallel_on:
            if st.parallel_set:
                par = [a for a in st.parallel_axes if any(a is b for b in order)]
            else:
                for a in order:
                    if a.kind == "spatial":
                        par = [a]
                        break
                    break  # a reduction loop outermost: nothing to parallelise safely
        return order, par

    def _bind_branches(self, em, depth, e):
        """:func:`codegen.loopnest.branches.bind_branches` for a statement written at
        ``depth``; returns the ids to unbind after it."""
        return bind_branches(self, em, depth, e)

    def _bind_shared(self, em, depth, exprs, checked_before=False, later=()):
        """:meth:`ExprEmitter.bind_shared` for a statement written at ``depth`` (names
        ``let<k>_<n>_<j>``: unique in the unit, the same in every build)."""
        inner = []
        names = em.bind_shared(exprs, lambda text: self.w(depth, text),
                               f"let{self.k}_{self._fresh()}_", checked_before, later,
                               expand=lambda n: inner.extend(self._bind_branches(em, depth, n)))
        return names + inner

    def _fresh(self):
        """A number for the temporaries of one statement, new in the stage (the text
        stays the same in every build: statements are written in a fixed order)."""
        self._temps += 1
        return self._temps

    def _scatter(self, depth):
        """A scatter-add stage: the output initialised (zeros or a copy of ``init``),
        then ``out[indices] += value`` over the domain. A *support stage*
        (:func:`texpr.simplify.is_support_stage`: identity indices, each element written
        at most once) is an elementwise stage over its support: ``out[axes] =
        value``, no index checks, and its outermost loop may run in parallel."""
        from texpr.simplify.support import is_support_stage
        op, w = self.op, self.w
        support = is_support_stage(op)
        out = self.buffers[id(op.output(0))]
        if op.init is not None:
            src = self.buffers[id(op.init)]
            if src.dtype != out.dtype:
                raise TexprError(f"scatter-add {op.name}: its init is {src.dtype}, its "
                                 f"output {out.dtype}")
            w(depth, f"_copy_{out.dtype}({out.name}, {src.name})")
        else:
            w(depth, f"_fill_{out.dtype}({out.name}, {fill_value(0, out.dtype)})")
        axes = list(op.axis)
        for d, a in enumerate(axes):
            self.names[id(a)] = f"p{self.k}_{d}"
        space = VarSpace(axes)
        box = box_set(space)
        wset, resid = to_set(op.where, space)
        dom = box.intersect(wset)
        self.residues = _residue_candidates(op.where, space, dom)
        em = self._emitter()
        ck = _BoundsChecker(op.name, space, box)
        ck.walk(op.where, box, False)
        for e in ([] if support else list(op.indices)) + [op.value]:
            ck.walk(e, dom, resid is not None)
        for e in op.indices:
            ck.index(e, dom)
        em.checks, em.value_checks, em.arith_checks = ck.need, ck.values, ck.arith
        order = list(self.stage.leaf_axes) if self.stage.ordered else axes
        par_dims = set()
        if support and self.parallel_on:
            st = self.stage
            if st.parallel_set:
                par = [a for a in st.parallel_axes if any(a is b for b in order)]
            else:
                par = order[:1] if _points(dom) >= _opts().parallel_min_points else []
            par_dims = {k for k, a in enumerate(order) if any(a is b for b in par)}

        def upd(d):
            guard = []
            if resid is not None:
                d, guard = self._guard(em, d, resid, list(op.indices) + [op.value])
            upd_body(d)
            em.unbind(guard)

        def upd_body(d):
            if support or not op.indices:
                bound = self._bind_shared(em, d, [op.value])
                bound += self._bind_branches(em, d, op.value)
                target = self._store(out) if support else element(out, [])
                w(d, f"{target} {'=' if support else '+='} {em.cast(op.value, out.dtype)}")
                em.unbind(bound)
                return
            safe_index = []
            for k, n in enumerate(op.shape):
                pa = to_pwaff(op.indices[k], space)
                safe = False
                if pa is not None:
                    bad = pa.lt_set(space.const(0)).union(pa.ge_set(space.const(n))).intersect(dom)
                    safe = bad.is_empty()
                safe_index.append(safe)
            idx = [em(i) for i in op.indices]
            tgt = []
            for k, (s, n) in enumerate(zip(idx, op.shape)):
                if safe_index[k]:
                    tgt.append(s)
                else:
                    self.errors.append(
                        f"stage {op.name}: scatter-add index {k} `{expr_str(op.indices[k])}` "
                        f"leaves the shape {op.shape}")
                    tgt.append(f"_ck({helper_int(s)}, np.int64({n}), err, "
                               f"np.int64({len(self.errors)}))")
            bound = []
            if em.tree_nodes([op.value]) > _opts().let_tree_nodes:
                # a large value shares its subexpressions (ExprEmitter.bind_shared):
                # the target's indices and their checks first, as Python evaluates
                # ``out[target] += value``, then the value's bindings
                tag = self._fresh()
                for k in range(len(tgt)):
                    w(d, f"ix{self.k}_{tag}_{k} = {tgt[k]}")
                    tgt[k] = f"ix{self.k}_{tag}_{k}"
                bound = self._bind_shared(em, d, [op.value])
                bound += self._bind_branches(em, d, op.value)
            w(d, f"{element(out, tgt)} += {em.cast(op.value, out.dtype)}")
            em.unbind(bound)

        st = [LA.Statement(f"U{self.k}", axes, dom, [self.stage.axis_value(a) for a in order])]
        self._plan_nest(depth, st, len(order), {"U": upd}, par_dims)

