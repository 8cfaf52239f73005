"""Loop-nest emission: a stage's planned nests -> source lines.

One job: the part of :class:`codegen.loopnest.stage._StageLowering` (a mixin,
:class:`_NestWriter`) that turns statements into loop nests and writes them:
:meth:`_NestWriter._plan_nest` plans one nest (residue splits, isl's loop tree,
its int64 arithmetic checked) as a :class:`codegen.loopnest.plan.Nest`;
:meth:`_NestWriter._write_nest` writes a planned nest once the unit's execution
is decided (chunked loops, parallel loops or serial ones), with a float sum's
innermost loop unrolled into partial sums or written once with ``_radd``, and
register-blocked or unrolled lanes.
"""

import functools
import math
import re

from texpr.simplify.isl_bridge import VarSpace, to_set
from texpr.simplify import loop_ast as LA
from texpr import expr as E
from texpr.errors import TexprError
from texpr.printer import expr_str

from ..options import current as _opts
from ..analysis.bounds import _BoundsChecker
from .emit import const_str
from . import dialect as _dialect
from .order import _free, _points
from .plan import Nest

#: a statement that branches, and the run-time checks (calls that may set the
#: error flag), which keep a sum's loop unrolled by copies
_BRANCH = re.compile(r"\s*(if|elif|else|while|for)\b")


@functools.lru_cache(maxsize=None)
def _check_call(names):
    """A regex finding a call of one of the check helpers ``names``."""
    return re.compile(r"\b(" + "|".join(names) + r")\(")


def _lane(name, lane):
    return name if lane is None else f"{name}_l{lane}"


def _tree(parts):
    """The sum of the partial sums ``parts`` (a power of two of them) as a fixed
    pairwise tree: ``((p0 + p1) + (p2 + p3)) + ...``."""
    while len(parts) > 1:
        parts = [f"({parts[i]} + {parts[i + 1]})" for i in range(0, len(parts), 2)]
    return parts[0]


class _NestWriter:
    """The loop nests of :class:`codegen.loopnest.stage._StageLowering` (a mixin:
    it reads the lowering's ``k``, ``op``, ``stage``, ``names``, ``w``,
    ``residues``, ``unroll``, ``jam_dim``, ``lanes``, ``chunking`` and the
    chunk decision)."""

    def _split_residues(self, cand, statements, ndims, par_dims):
        """Split the statements on the residue classes of a ``(e % m)`` of the
        ``where`` that keeps more than one and fewer than ``m`` classes (e.g.
        ``(h + 1) % 3 <= 1``): each class gets loops of its own, in which isl turns
        the condition into a stride instead of a test in every iteration. The
        classes run one after the other, at the loop level where ``e``'s last
        variable is scheduled. Returns ``(statements, ndims, par_dims)``."""
        e, m = cand
        evars = [v for v in _free(e)]
        owner = next((st for st in statements if all(any(v is x for x in st.vars)
                                                     for v in evars)), None)
        if owner is None:
            return statements, ndims, par_dims
        # the schedule position where all of e's variables are fixed
        t = None
        for idx in range(len(owner.schedule)):
            seen = [x for sch in owner.schedule[:idx + 1] for x in _free(sch)]
            if all(any(v is x for x in seen) for v in evars):
                t = idx
                break
        if t is None:
            return statements, ndims, par_dims
        out = []
        for st in statements:
            if not all(any(v is x for x in st.vars) for v in evars):
                out.append(LA.Statement(st.name, st.vars, st.domain,
                                        st.schedule[:t] + (0,) + st.schedule[t:]))
                continue
            space = VarSpace(st.vars)
            classes = []
            for r in range(m):
                piece = st.domain.intersect(to_set(E.floormod(e, m) == r, space)[0])
                if not piece.is_empty():
                    classes.append((r, piece))
            if len(classes) in (0, 1, m):
                return statements, ndims, par_dims
            # the class's schedule position is its residue r, the same for every
            # statement: a reduction's update pieces (fewer classes than its init
            # and final ones) run between the init and final of their class
            # (numbering the non-empty classes put an update with another
            # class's init: fuzz seed 7000802849, a silently wrong gradient)
            for r, piece in classes:
                out.append(LA.Statement(f"{st.name}r{r}", st.vars, piece,
                                        st.schedule[:t] + (r,) + st.schedule[t:]))
        return out, ndims + 1, {d + (d >= t) for d in par_dims}, t

    @staticmethod
    def _box_points(axes):
        """Points of the iteration box (an upper bound of the domain's: exact, cheap)."""
        return math.prod(a.extent for a in axes)

    def _plan_nest(self, depth, statements, ndims, stmt_code, par_dims):
        """Plan one loop nest (a :class:`codegen.loopnest.plan.Nest` appended to
        :attr:`items`): the statements split on residues, the loop tree generated
        and its arithmetic checked; :meth:`_write_nest` writes it."""
        rest_small = None
        if par_dims and not self.stage.parallel_set and self.stage_points:
            # parallel loops: a small rest nest runs serially (counted only for a
            # unit with parallel loops: a chunked unit's parts run every nest)
            domains = [st.domain for st in statements if st.name.startswith("U")]
            limit = _opts().rest_parallel_fraction * self.stage_points

            def rest_small():
                return sum(_points(d) for d in domains) < limit
        jam_dim, lanes = self.jam_dim, self.lanes
        for cand in self.residues:
            split = self._split_residues(cand, statements, ndims, par_dims)
            if len(split) != 4:
                continue
            statements, ndims, par_dims, t = split
            if jam_dim is not None:
                jam_dim += jam_dim >= t
            if lanes is not None:
                lanes = (lanes[0] + (lanes[0] >= t), lanes[1])
        loop_vars = [E.var(f"c{self.k}_{d}") for d in range(ndims)]
        for v in loop_vars:
            self.names[id(v)] = v.name
        tree = LA.generate(statements, loop_vars)
        if tree is not None:
            self._check_loop_arithmetic(tree, statements, loop_vars)
        self.items.append(Nest(depth, statements, loop_vars, tree, stmt_code, par_dims,
                               rest_small, jam_dim, lanes))

    def _write_nest(self, nest):
        """Write the planned ``nest``: its parallel loops chunked when the unit is
        chunked (:meth:`_decide`), else parallel loops."""
        saved = self.jam_dim, self.lanes
        self.jam_dim, self.lanes = nest.jam_dim, nest.lanes
        try:
            if nest.tree is None:
                self.w(nest.depth, "pass")
                return
            par = nest.par_chunked if self.chunking else nest.par_prange
            par_vars = {id(nest.loop_vars[d]) for d in par}
            stmt_vars = {st.name: st.vars for st in nest.statements}
            self._emit_tree(nest.tree, nest.depth, par_vars, stmt_vars, nest.stmt_code)
        finally:
            self.jam_dim, self.lanes = saved

    def _check_loop_arithmetic(self, tree, statements, loop_vars):
        """The loop bounds, guards and statement arguments isl generated stay in
        int64 (intervals: each loop variable ranges over the values of its
        schedule dimension); else a TexprError as for the stage's own indices."""
        ck = _BoundsChecker(self.op.name, None, None)
        for d, lv in enumerate(loop_vars):
            lo = hi = None
            for st in statements:
                x = st.schedule[d]
                r = ck.index(x if isinstance(x, E.Expr) else E.const(int(x)), None)
                lo = r[0] if lo is None else min(lo, r[0])
                hi = r[1] if hi is None else max(hi, r[1])
            if lo is not None:
                ck.var_ranges[id(lv)] = (lo, hi)
        for node in LA.walk(tree):
            if isinstance(node, LA.For):
                ck.index(node.lo, None)
                ck.index(node.hi, None)
            elif isinstance(node, LA.If):
                ck.condition(node.cond, None)
            elif isinstance(node, LA.Stmt):
                for a in node.args:
                    ck.index(a, None)

    def _emit_tree(self, node, depth, par_vars, stmt_vars, stmt_code):
        w = self.w
        em = self._emitter()
        if isinstance(node, LA.Block):
            for c in node.body:
                self._emit_tree(c, depth, par_vars, stmt_vars, stmt_code)
        elif isinstance(node, LA.For) and self._is_lane_loop(node):
            lanes = range(_opts().jam if self.lanes is None else self.lanes[1])
            if self.lanes is not None:
                # buffer mode: the output element is read once into a scalar, takes
                # every lane in order, and is written back once
                self.names[id(node.var)] = "0"
                self._emit_stmt(node.body, depth, stmt_vars, {"U": stmt_code["load"]})
            for lane in lanes:
                self.names[id(node.var)] = str(lane)
                self._emit_stmt(node.body, depth, stmt_vars, stmt_code, lane)
            if self.lanes is not None:
                stmt_code["store"](depth)
            self.names[id(node.var)] = node.var.name
        elif isinstance(node, LA.For):
            v = self.names[id(node.var)]
            lo, hi = em(node.lo), em(node.hi)
            if self.chunking and id(node.var) in par_vars:
                # a chunk: the values of the loop whose axis value is in
                # part[0] <= a < part[1] (the loop runs a // d; parts start at
                # multiples of d)
                d = self._chunk_div.get(id(node.var), 1)
                p0, p1 = ("part[0]", "part[1]") if d == 1 else \
                    (f"(part[0] // {d})", f"((part[1] + {d - 1}) // {d})")
                if node.degenerate:
                    w(depth, f"{v} = {lo}")
                    w(depth, f"if {p0} <= {v} < {p1}:")
                elif node.stride == 1:
                    w(depth, f"for {v} in range(max({lo}, {p0}), min({hi}, {p1})):")
                else:
                    s = node.stride
                    w(depth, f"for {v} in range({lo} + (max({p0}, {lo}) - ({lo}) + {s - 1})"
                             f" // {s} * {s}, min({hi}, {p1}), {s}):")
                self._emit_tree(node.body, depth + 1, par_vars, stmt_vars, stmt_code)
                return
            if node.degenerate:
                w(depth, f"{v} = {lo}")
                self._emit_tree(node.body, depth, par_vars, stmt_vars, stmt_code)
                return
            if id(node.var) in par_vars:
                self.uses_prange = True
                if node.stride == 1:
                    w(depth, f"for {v} in {_dialect.current().parallel_range}({lo}, {hi}):")
                else:
                    s = node.stride
                    prange = _dialect.current().parallel_range
                    w(depth, f"for {v}_t in {prange}(({hi} - {lo} + {s - 1}) // {s}):")
                    w(depth + 1, f"{v} = {lo} + {v}_t * {s}")
            elif self._writes_sum(node):
                self._emit_unrolled_sum(node, v, lo, hi, depth, stmt_vars)
                return
            else:
                step = f", {node.stride}" if node.stride != 1 else ""
                w(depth, f"for {v} in range({lo}, {hi}{step}):")
            self._emit_tree(node.body, depth + 1, par_vars, stmt_vars, stmt_code)
        elif isinstance(node, LA.If):
            w(depth, f"if {em(node.cond)}:")
            self._emit_tree(node.then, depth + 1, par_vars, stmt_vars, stmt_code)
            if node.orelse is not None:
                w(depth, "else:")
                self._emit_tree(node.orelse, depth + 1, par_vars, stmt_vars, stmt_code)
        else:
            self._emit_stmt(node, depth, stmt_vars, stmt_code)

    def _writes_sum(self, node):
        """Whether the (not parallel) loop ``node`` is a float sum's innermost loop,
        written by :meth:`_emit_unrolled_sum` (unrolled, or once with ``_radd``)."""
        return (self.unroll is not None and node.stride == 1 and self._long(node) and (
            (isinstance(node.body, LA.Stmt) and node.body.name.startswith("U"))
            or (isinstance(node.body, LA.For) and self._is_lane_loop(node.body)
                and isinstance(node.body.body, LA.Stmt)
                and node.body.body.name.startswith("U"))))

    def _long(self, node):
        """Whether the loop ``node`` may run ``2 * u_n`` times or more (its trip count
        ``hi - lo`` is not a smaller constant): unrolling a loop that always runs
        fewer times than it has copies (upsample2's dX: 2 of a 28-value axis per
        output) only adds code for the compiler to compile."""
        from texpr.simplify.sympy_bridge import constant_difference  # (SymPy: a build's
        # lowering only, never a warm run's, which loads the lowered program)
        trips = constant_difference(node.hi, node.lo)
        return trips is None or trips >= 2 * self.unroll[3]

    def _is_lane_loop(self, node):
        if self.lanes is not None:
            dim, n = self.lanes
            return (node.var.name == f"c{self.k}_{dim}" and isinstance(node.lo, E.Const)
                    and node.lo.value == 0 and isinstance(node.hi, E.Const)
                    and node.hi.value == n and node.stride == 1)
        if self.jam_dim is None or node.var.name != f"c{self.k}_{self.jam_dim}":
            return False
        if not (isinstance(node.lo, E.Const) and node.lo.value == 0
                and isinstance(node.hi, E.Const) and node.hi.value == _opts().jam
                and node.stride == 1):
            raise TexprError(f"stage {self.op.name}: internal: a register-blocked loop with "
                             f"bounds {expr_str(node.lo)}..{expr_str(node.hi)}")
        return True

    def _emit_stmt(self, node, depth, stmt_vars, stmt_code, lane=None):
        if not isinstance(node, LA.Stmt):
            raise TexprError(f"stage {self.op.name}: internal: a register-blocked loop "
                             "around more than one statement")
        em = self._emitter()
        kind = node.name[0]
        for v, a in zip(stmt_vars[node.name], node.args):
            self.w(depth, f"{self.names[id(v)]} = {em(a)}")
        if lane is None:
            stmt_code[kind](depth)
        else:
            stmt_code[kind](depth, lane)

    def _sum_lanes(self, node, stmt_vars):
        """The pieces both ways of writing a sum's innermost loop ``node`` share:
        ``(lanes, body)``, where ``lanes`` are the register-blocked lanes (``[None]``
        without blocking) and ``body(d, ln, target, reassoc=False)`` writes lane
        ``ln``'s statement at depth ``d``, its combine into ``target`` (with
        ``_radd`` where ``reassoc``). Call ``body.done()`` after the last lane."""
        combine = self.unroll[0]
        lane_loop = node.body if isinstance(node.body, LA.For) else None
        stmt = lane_loop.body if lane_loop is not None else node.body
        em = self._emitter()

        def body(d, ln, target, reassoc=False):
            if lane_loop is not None:
                self.names[id(lane_loop.var)] = str(ln)
            for var, a in zip(stmt_vars[stmt.name], stmt.args):
                self.w(d, f"{self.names[id(var)]} = {em(a)}")
            combine(d, [target], reassoc=reassoc)

        def done():
            if lane_loop is not None:
                self.names[id(lane_loop.var)] = lane_loop.var.name

        body.done = done
        return (list(range(_opts().jam)) if lane_loop is not None else [None]), body

    def _emit_unrolled_sum(self, node, v, lo, hi, depth, stmt_vars):
        """The innermost loop of a sum, with ``u_n`` independent partial sums per
        accumulator (the dependency chain of one accumulator no longer bounds the
        speed, and the copies vectorise without the compiler reassociating
        anything), then the remainder, then the partial sums added to the
        accumulator in a fixed tree. With register blocking, each lane of the
        blocked spatial axis has its own accumulator and partial sums."""
        if _opts().reassociate and self._emit_reassociated_sum(node, v, lo, hi, depth, stmt_vars):
            return
        w = self.w
        _combine, acc, dtype, u_n, _extent, per_output = self.unroll
        lanes, body = self._sum_lanes(node, stmt_vars)
        self.chosen_sum = f"unroll {u_n}"  # (the stage's plan records it)
        w(depth, f"{v}_lo = {lo}")
        w(depth, f"{v}_hi = {hi}")
        w(depth, f"{v}_m = {v}_lo + max({v}_hi - {v}_lo, 0) // {u_n} * {u_n}")
        parts = {ln: [f"{_lane(acc, ln)}_p{u}" for u in range(u_n)] for ln in lanes}
        if per_output:
            self.partials_used.update(_lane(acc, ln) for ln in lanes)
        else:  # (per output, the init statement set them)
            for ln in lanes:
                for p in parts[ln]:
                    w(depth, f"{p} = {const_str(0, dtype)}")
        w(depth, f"for {v} in range({v}_lo, {v}_m, {u_n}):")
        saved = self.names[id(node.var)]
        for u in range(u_n):
            lane_var = f"{v}_u{u}"
            w(depth + 1, f"{lane_var} = {v} + {u}")
            self.names[id(node.var)] = lane_var
            for ln in lanes:
                body(depth + 1, ln, parts[ln][u])
        self.names[id(node.var)] = saved
        w(depth, f"for {v} in range({v}_m, {v}_hi):")
        for ln in lanes:
            body(depth + 1, ln, _lane(acc, ln))
        if not per_output:  # (else the output's final statement adds them)
            for ln in lanes:
                w(depth, f"{_lane(acc, ln)} += {_tree(parts[ln])}")
        body.done()

    def _emit_reassociated_sum(self, node, v, lo, hi, depth, stmt_vars):
        """The innermost loop of a float sum written once, each accumulator (one per
        lane of a register-blocked axis) updated by ``_radd`` (an add LLVM may
        reassociate, the backend's ``_radd``): LLVM's loop
        vectoriser keeps the partial sums in vector registers, so the copies of
        :meth:`_emit_unrolled_sum` are not needed. Written, and True, only where
        the vectoriser will take the loop and gain: at least
        ``options.reassociate_min_trips`` trips (the constant trip count, else the
        reduction axis's extent), every subscript moves by -1, 0 or +1
        per iteration (:meth:`codegen.loopnest.dialect.Dialect.unit_stride_loop`, the rule that
        turns the vectoriser on for the unit) and the body has no branch and no
        run-time check (a call that may set the error flag,
        :attr:`codegen.loopnest.dialect.Dialect.check_names`). Otherwise nothing is written and
        the caller unrolls. Measured (benchmarks/bench_variants.py, 2026-12-04,
        ``reassociate=False`` against the default in one process): layernorm's
        value and gradient 0.23 -> 0.10 ms, the other suite cases within noise."""
        from texpr.simplify.sympy_bridge import constant_difference
        trips = constant_difference(node.hi, node.lo)
        acc, extent = self.unroll[1], self.unroll[4]
        if (trips if trips is not None else extent) < _opts().reassociate_min_trips:
            return False
        w = self.w
        lanes, body = self._sum_lanes(node, stmt_vars)
        start = len(w.lines)
        w(depth, f"for {v} in range({lo}, {hi}):")
        for ln in lanes:
            body(depth + 1, ln, _lane(acc, ln), reassoc=True)
        body.done()
        written = w.lines[start:]
        text = "\n".join(line[4 * depth:] for line in written)
        checks = _check_call(_dialect.current().check_names)
        if (any(_BRANCH.match(line) for line in written[1:]) or checks.search(text)
                or not _dialect.current().unit_stride_loop(text)):
            del w.lines[start:]
            return False
        self.chosen_sum = "reassociated"  # (the stage's plan records it)
        return True
