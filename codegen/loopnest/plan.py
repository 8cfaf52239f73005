"""Loop-nest planning: a stage's loop nests as data, and how its unit runs them.

One job: hold what :class:`codegen.loopnest.stage._StageLowering` decides before
it writes a line, and decide from it how the unit runs (``"chunked"``,
``"prange"`` or ``"serial"``). The stage lowering first *plans* every loop nest
of its stage -- the loop order, the parallel axes, unrolling, lanes and
register blocking are chosen, the statements built and split on residues, and
isl's loop tree generated (:func:`texpr.simplify.loop_ast.generate`) -- as a
list of :class:`Nest` records; :func:`decide_chunks` then reads the statements'
schedules and the trees and says whether the unit is a *chunked* unit (its
parallel loops run one part of a spatial axis each, the backend's chunked units,
docs/stages.md) or uses parallel loops; only then are the nests written, once.

A chunked unit needs (all read from the plan, none from the text):

* one parallel dimension per nest whose schedule value is, in every statement,
  the same spatial axis of the op or its tile ``axis // d`` (:func:`chunk_form`):
  instances at different values of it write different output elements, so
  the parts are independent in every statement, not only within one loop;
* every statement inside such a loop, writing the element of the axis value
  the loop runs (:func:`runs_its_part`): isl may run two rows in one pass of a
  stride-2 loop, which would write a row of another part;
* no statement outside every parallel loop (each part would run it);
* a buffer-mode reduction fills its output rows per part: its parallel axis is
  the op's leading axis (:attr:`StageChunks.fill_axis`).

:class:`LoopPlan` is the frozen summary the stage's
:class:`codegen.strategy.StagePlan` records (:func:`codegen.strategy.with_loops`).
"""

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

from texpr import expr as E
from texpr.simplify import loop_ast as LA

__all__ = ["Nest", "LoopPlan", "StageChunks", "decide_chunks", "chunk_form", "runs_its_part",
           "runs_parallel"]


@dataclass
class Nest:
    """One planned loop nest of a stage (written by
    :meth:`codegen.loopnest.stage._StageLowering._write_nest`).

    Fields: ``depth`` (indentation), ``statements`` (the isl statements, after
    residue splits), ``loop_vars`` (one per schedule dimension), ``tree`` (the
    loop tree, or None: no point to run), ``stmt_code`` (statement kind ->
    function writing it), ``par_chunked`` (the schedule dimensions that run in
    parallel in a chunked unit), ``rest_small`` (None, or a function saying
    whether the nest is a rest too small for parallel loops,
    ``options.rest_parallel_fraction``: counted only if the unit uses parallel
    loops, see :attr:`par_prange`), ``jam_dim`` and ``lanes`` (the
    register-blocked or unrolled lane dimension, or None).
    """

    depth: int
    statements: list
    loop_vars: list
    tree: object
    stmt_code: dict
    par_chunked: set
    rest_small: Optional[Callable] = None
    jam_dim: Optional[int] = None
    lanes: Optional[tuple] = None
    _prange: Optional[set] = None

    @property
    def par_prange(self):
        """The schedule dimensions that run as parallel loops when the unit is not
        chunked: those of :attr:`par_chunked`, unless the nest is a small rest
        (a chunked unit's parts run every nest, each its own part)."""
        if self._prange is None:
            small = self.par_chunked and self.rest_small is not None and self.rest_small()
            self._prange = set() if small else self.par_chunked
        return self._prange


@dataclass
class StageChunks:
    """What :func:`decide_chunks` reads besides the nests: ``op`` (the stage's
    operation), ``ok`` (its lowering supports chunks: not a scatter-add),
    ``fill_axis`` (a buffer-mode reduction's output is filled per part along
    this axis, or None), ``broken`` (a reason found while planning that no
    chunk can take the stage: a buffer-mode fill along another axis)."""

    op: object
    ok: bool = False
    fill_axis: object = None
    broken: bool = False


@dataclass(frozen=True)
class ChunkDecision:
    """The answer of :func:`decide_chunks`: ``chunked`` (the unit runs parts of
    ``axis``), ``align`` (parts start at multiples of it: the tiles of a
    register-blocked nest), ``divs`` (``id(loop var) -> d``: the chunked loop
    runs the values ``axis // d``)."""

    chunked: bool
    axis: object = None
    align: int = 1
    divs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class LoopPlan:
    """The loop decisions of one loop-nest stage, made before its text is
    written: ``order`` (leaf axes, outermost first), ``parallel`` (the axes run
    in parallel), ``lanes`` (``(axis name, count)`` of an unrolled reduction
    loop, or None), ``jam`` (``(axis name, count)``: the points of a spatial axis
    a scalar-mode sum blocks in registers, or None), ``partial_sums`` (the
    partial sums a float sum's innermost loop is unrolled into where it runs
    long enough, or None; whether it is instead written once with ``_radd`` is
    settled as it is written: the target reads the loop's text), ``execution`` (``"chunked"``, ``"prange"`` or
    ``"serial"``), ``chunk_axis`` and ``chunk_align`` (a chunked unit's axis
    and the multiple its parts start at)."""

    order: Optional[tuple] = None
    parallel: Optional[tuple] = None
    lanes: Optional[tuple] = None
    jam: Optional[tuple] = None
    partial_sums: Optional[int] = None
    execution: str = "serial"
    chunk_axis: object = None
    chunk_align: int = 1


def chunk_form(x):
    """``(axis, d)`` when the schedule value ``x`` is a spatial axis (``d = 1``) or
    its tile ``axis // d`` (a positive constant ``d``); ``(None, 1)`` otherwise."""
    if isinstance(x, E.IterVar):
        return x, 1
    if (isinstance(x, E.FloorDiv) and isinstance(x.a, E.IterVar) and isinstance(x.b, E.Const)
            and isinstance(x.b.value, int) and x.b.value > 0):
        return x.a, x.b.value
    return None, 1


def runs_its_part(node, var, d, axis, stmt_vars):
    """Whether the statement node ``node`` inside the chunked loop over ``var``
    (running the values ``axis // d``) writes the element of the value the loop
    runs: the axis's argument is the loop variable itself (``d * var`` plus a
    lane or a constant below ``d`` for a tile). isl may run two rows in one pass
    of a stride-2 loop (``U(c); U(c + 1)``,
    :func:`texpr.simplify.loop_ast.runs_exactly`): the part that owns ``c`` would
    then write row ``c + 1`` of another part, and a pass at ``c = -1`` would run
    in no part (an attack's find: dW rows of a gradient zeroed at a part
    boundary)."""
    svars = stmt_vars[node.name]
    pos = next((p for p, sv in enumerate(svars) if sv is axis), None)
    if pos is None:
        return False
    arg = node.args[pos]
    if d == 1:
        return arg is var
    if not isinstance(arg, E.Add):
        return False
    for tile, lane in ((arg.a, arg.b), (arg.b, arg.a)):
        if (isinstance(tile, E.Mul) and any(x is var for x in (tile.a, tile.b))
                and any(isinstance(x, E.Const) and x.value == d for x in (tile.a, tile.b))
                and (isinstance(lane, E.Const) and 0 <= lane.value < d
                     or isinstance(lane, E.Var) and lane is not var)):
            return True
    return False


class _Chunking:
    """The state of :func:`decide_chunks` while it reads the nests in order."""

    def __init__(self, info):
        self.op = info.op
        self.ok = info.ok
        self.broken = info.broken
        self.axis = info.fill_axis  # every nest must chunk the rows a fill wrote
        self.align = 1
        self.divs = {}
        self.outside = False  # a statement outside every chunked loop

    def nest_dims(self, statements, par_dims, loop_var):
        """Chunks need one parallel dimension whose schedule value is, in every
        statement, the same spatial axis of the op (the one every other nest of
        the unit chunks too): instances at different values of it then write
        different output elements, so the chunks of its range are independent
        of each other in every statement, not only within one loop (a parallel
        range synchronises between two parallel loops; chunks do not)."""
        if not self.ok or len(par_dims) != 1:
            self.broken = True
            return
        (d,) = par_dims
        forms = {chunk_form(st.schedule[d]) for st in statements}
        if len(forms) != 1:
            self.broken = True
            return
        ((axis, div),) = forms
        if not (axis is not None and axis.kind == "spatial"
                and any(axis is a for a in self.op.axis)
                and (self.axis is None or self.axis is axis)):
            self.broken = True
            return
        self.axis = axis
        # a register-blocked nest runs its tiles (axis // options.jam): parts start at a
        # multiple of every tile size, so a tile is in one part
        self.align = math.lcm(self.align, div)
        self.divs[id(loop_var)] = div

    def statements(self, node, par_vars, stmt_vars, chunks, lowering):
        """Read the statements of the tree ``node`` as the stage lowering writes
        them (``chunks``: the chunked loops around, ``[(var, d)]``)."""
        if isinstance(node, LA.Block):
            for c in node.body:
                self.statements(c, par_vars, stmt_vars, chunks, lowering)
        elif isinstance(node, LA.For) and lowering._is_lane_loop(node):
            if isinstance(node.body, LA.Stmt):  # (else the writer reports it)
                self.statement(node.body, stmt_vars, chunks)
        elif isinstance(node, LA.For):
            if id(node.var) in par_vars:
                inner = chunks + [(node.var, self.divs.get(id(node.var), 1))]
                self.statements(node.body, par_vars, stmt_vars, inner, lowering)
            elif node.degenerate or not lowering._writes_sum(node):
                self.statements(node.body, par_vars, stmt_vars, chunks, lowering)
            # (a sum's unrolled loop: the accumulator's statements were read)
        elif isinstance(node, LA.If):
            self.statements(node.then, par_vars, stmt_vars, chunks, lowering)
            if node.orelse is not None:
                self.statements(node.orelse, par_vars, stmt_vars, chunks, lowering)
        elif isinstance(node, LA.Stmt):
            self.statement(node, stmt_vars, chunks)

    def statement(self, node, stmt_vars, chunks):
        if not chunks:
            self.outside = True
        elif not runs_its_part(node, *chunks[-1], self.axis, stmt_vars):
            self.broken = True


def decide_chunks(info, nests, lowering):
    """Whether the stage whose planned nests are ``nests`` (:class:`Nest`, in
    order) runs as a chunked unit (see the module docstring).

    Args:
        info: a :class:`StageChunks`.
        nests: the stage's nests, in the order they are written.
        lowering: the stage lowering (its ``_is_lane_loop`` and ``_writes_sum``
            say how a loop of a nest is written; its ``jam_dim`` and ``lanes``
            are set to each nest's while it is read).
    Returns:
        A :class:`ChunkDecision`: chunked, or not (no loop runs in parallel, or
        the unit needs parallel loops).
    """
    c = _Chunking(info)
    saved = lowering.jam_dim, lowering.lanes
    try:
        for n in nests:
            if n.tree is None:
                continue
            if n.par_chunked:
                first = n.loop_vars[next(iter(n.par_chunked))]
                c.nest_dims(n.statements, n.par_chunked, first)
            lowering.jam_dim, lowering.lanes = n.jam_dim, n.lanes
            c.statements(n.tree, {id(n.loop_vars[d]) for d in n.par_chunked},
                         {st.name: st.vars for st in n.statements}, [], lowering)
    finally:
        lowering.jam_dim, lowering.lanes = saved
    if c.broken or c.axis is None or c.outside:
        return ChunkDecision(False)
    return ChunkDecision(True, c.axis, c.align, c.divs)


def runs_parallel(nest):
    """Whether the planned ``nest``, written with parallel loops, has one: a loop
    of a parallel dimension that isl did not reduce to one value."""
    if nest.tree is None or not nest.par_prange:
        return False
    par = {id(nest.loop_vars[d]) for d in nest.par_prange}
    return any(isinstance(x, LA.For) and id(x.var) in par and not x.degenerate
               for x in LA.walk(nest.tree))
