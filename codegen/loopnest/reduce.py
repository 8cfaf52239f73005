"""Reduction stages of the loop-nest lowering: scalar mode and buffer mode.

One job: the part of :class:`codegen.loopnest.stage._StageLowering` (a mixin,
:class:`_Reductions`) that plans a reduction stage's nests -- scalar mode (the
spatial loops outermost, accumulators in registers, the innermost sum loop
unrolled, points register-blocked) and buffer mode (a reduction loop outside a
spatial one, the outputs filled and updated in place, short reduction loops
unrolled as lanes, long ones by groups) -- and writes the combine of one
point (built-in and user reducers, a data-dependent ``where`` as a select or
an ``if``). The rules are in :mod:`codegen.loopnest.stage`'s docstring.
"""

import math

from texpr.simplify.isl_bridge import isl, to_set
from texpr.simplify import loop_ast as LA
from texpr import dtypes as dt
from texpr import expr as E
from texpr.visitor import post_order

from ..options import current as _opts
from ..analysis.bounds import _BoundsChecker
from .emit import ExprEmitter, const_str, fill_value
from .order import _jam_axis, _loads, _mentions, _nodes, _partial_groups
from .tree import _lane, _tree


class _Reductions:
    """Reduction stages of :class:`codegen.loopnest.stage._StageLowering` (a
    mixin: it reads the lowering's state and calls its pieces)."""

    def _run_scalar_reduction(self, depth, w, spatial, red, order, par, outs, sp_space, sp_box,
                              full, space, dom, comb, ncomp, acc, n_sp, combine):
        """A reduction whose spatial loops are outermost: per output point, accumulators
        initialised, updated over the reduction loops (unrolled, jammed) and stored."""
        sp_order, rd_order = order[:n_sp], order[n_sp:]
        from texpr.visitor import post_order
        small = len(post_order(red.source[0])) <= _opts().unroll_max_nodes
        sum_ok = comb.kind == "sum" and ncomp == 1 and dt.is_float(comb.dtypes[0]) and small
        u_n = _opts().unroll if comb.dtypes[0] == "float32" else _opts().unroll // 2
        # a float32 sum accumulates in float64, rounded once when it is stored
        acc_dt = ("float64" if _opts().sum_float64 and comb.kind == "sum" and ncomp == 1
                  and comb.dtypes[0] == "float32" else None)
        # a small stage runs in microseconds either way: unrolled and blocked
        # copies would only cost compile time (the main job's 64-term loss sum
        # with its checked gather: 1.8 s of compilation unrolled)
        sum_ok = sum_ok and self._box_points(full) >= _opts().unroll_min_points
        if sum_ok and rd_order and rd_order[-1].extent >= 2 * u_n:
            # (per output: the partial sums are set by the init statement and
            # added by the final one, so they run on across the outer reduction
            # loops; else the innermost loop's writer sets and adds them)
            self.unroll = (combine, acc[0], acc_dt or comb.dtypes[0], u_n,
                           rd_order[-1].extent, _opts().partials_per_output)
        jam = None
        if sum_ok and not self.stage.ordered and rd_order:
            # moving another spatial axis innermost pays where the reduction
            # loop is short (strided conv dW: 8.4 -> 4.7 ms), not where it is
            # unrolled (conv dW stride 1: 7.8 -> 14.5 ms)
            move = _opts().jam_move and not self.stage.vectorize_axes and self.unroll is None
            jam = _jam_axis(sp_order, red, par if move else sp_order[:-1])
            if jam is not None:
                self.chosen_jam = (jam.name, _opts().jam)
            if jam is not None and jam is not sp_order[-1]:
                sp_order = [a for a in sp_order if a is not jam] + [jam]
                self.chosen_order = sp_order + rd_order
            if jam is not None and self.unroll is not None:
                u_j = _opts().jam_unroll
                u_j = u_j if comb.dtypes[0] == "float32" else max(1, u_j // 2)
                if u_j < self.unroll[3]:
                    self.unroll = self.unroll[:3] + (u_j,) + self.unroll[4:]

        def parts(lane):
            # the partial sums of an unrolled sum kept per output element (their
            # count read when written: register blocking lowers it)
            if self.unroll is None or not self.unroll[5]:
                return []
            return [f"{_lane(acc[0], lane)}_p{u}" for u in range(self.unroll[3])]

        def init(d, lane=None):
            for a, c in zip(acc, comb.identity):
                w(d, f"{_lane(a, lane)} = {const_str(c.value, acc_dt or c.dtype)}")
            for p in parts(lane):
                w(d, f"{p} = {const_str(0, self.unroll[2])}")

        def fin(d, lane=None):
            ps = parts(lane)
            if ps and _lane(acc[0], lane) in self.partials_used:
                self.partials_used.discard(_lane(acc[0], lane))
                w(d, f"{_lane(acc[0], lane)} += {_tree(ps)}")
            elif ps:
                # no loop of this nest was unrolled (written with _radd, or too
                # short): the partial sums init wrote are taken back
                inits = {f"{p} = {const_str(0, self.unroll[2])}" for p in ps}
                for i in range(len(w.lines) - 1, -1, -1):
                    if w.lines[i].strip() in inits:
                        inits.discard(w.lines[i].strip())
                        del w.lines[i]
                        if not inits:
                            break
            for o, a in zip(outs, acc):
                v = _lane(a, lane)
                w(d, f"{self._store(o)} = {f'np.float32({v})' if acc_dt else v}")

        stmts = {"I": init, "U": lambda d, lane=None: combine(d, [_lane(acc[0], lane)]
                                                              + acc[1:]), "F": fin}
        pos = {id(a): p for p, a in enumerate(sp_order)}
        pos.update({id(a): n_sp + 1 + p for p, a in enumerate(rd_order)})
        par_dims = {pos[id(a)] for a in par}
        zeros_r = [0] * len(rd_order)
        rest_sp, rest_dom = sp_box, dom
        if jam is not None:
            # register blocking: options.jam consecutive points of the innermost spatial
            # axis share the reduction loops (one accumulator each), over the
            # full tiles; the last partial tile runs unblocked below
            n_full = jam.extent // _opts().jam * _opts().jam
            in_sp = to_set(jam < n_full, sp_space)[0]
            in_full = to_set(jam < n_full, space)[0]

            def sv(a):
                return jam // _opts().jam if a is jam else self._val(a)

            lane = [jam % _opts().jam]
            sts = [LA.Statement(f"I{self.k}", spatial, sp_box.intersect(in_sp),
                                [sv(a) for a in sp_order] + [0] + zeros_r + lane),
                   LA.Statement(f"U{self.k}", full, dom.intersect(in_full),
                                [sv(a) for a in sp_order] + [1]
                                + [self._val(a) for a in rd_order] + lane),
                   LA.Statement(f"F{self.k}", spatial, sp_box.intersect(in_sp),
                                [sv(a) for a in sp_order] + [2] + zeros_r + lane)]
            self.jam_dim = len(order) + 1
            self._plan_nest(depth, sts, len(order) + 2, stmts, par_dims)
            self.jam_dim = None
            rest_sp = sp_box.intersect(in_sp.complement())
            rest_dom = dom.intersect(in_full.complement())
        sched_i = [self._val(a) for a in sp_order] + [0] + zeros_r
        sched_u = [self._val(a) for a in sp_order] + [1] + [self._val(a) for a in rd_order]
        sched_f = [self._val(a) for a in sp_order] + [2] + zeros_r
        sts = [LA.Statement(f"I{self.k}", spatial, rest_sp, sched_i),
               LA.Statement(f"U{self.k}", full, rest_dom, sched_u),
               LA.Statement(f"F{self.k}", spatial, rest_sp, sched_f)]
        return self._plan_nest(depth, sts, len(order) + 1, stmts, par_dims)

    def _run_buffer_reduction(self, depth, op, w, red, order, par, outs, full, space, box, resid,
                              dom, sensitive, comb, ncomp, combine):
        """A reduction with a reduction loop outside a spatial one: the outputs are
        filled with the identity and updated in place (lanes, split groups)."""
        # (a view's layout is another tensor's: no rows of its own to slice)
        sliced = bool(par and par[0] is op.axis[0] and not any(hasattr(o, "perm") for o in outs))
        if self.chunking and par:
            if sliced:
                self._chunks.fill_axis = op.axis[0]  # every nest must chunk the rows filled
            else:
                self._chunks.broken = True  # a chunk could not fill its own part only
        row = math.prod(op.shape[1:])

        def fill():
            for o, c in zip(outs, comb.identity):
                # chunked: each chunk fills its own rows (the leading axis is the chunks')
                target = (f"{o.name}[part[0] * {row}:part[1] * {row}]"
                          if sliced and self.chunking else o.name)
                w(depth, f"_fill_{o.dtype}({target}, {fill_value(c.value, o.dtype)})")

        self.items.append(fill)
        targets = [self._store(o) for o in outs]
        stmts = {"U": lambda d, lane=None: combine(d, targets)}
        rest = dom
        temps = [f"t{self.k}_{c}" for c in range(ncomp)]
        # inside an unrolled lane loop the update goes to the element's scalar copy;
        # a statement isl placed outside one (a residue split, a loop of one
        # value substituted away) updates the element itself
        lane_stmts = {
            "U": lambda d, lane=None: combine(d, targets if lane is None else temps),
            "load": lambda d: [w(d, f"{t} = {g}") for t, g in zip(temps, targets)],
            "store": lambda d: [w(d, f"{g} = {t}") for t, g in zip(temps, targets)]}
        lane_axis = split_axis = None
        if not self.stage.ordered and order[-1].kind == "spatial" and not sensitive:
            # (the unrolled groups and the rest run one after the other: not for
            # a reducer whose result depends on the order of the points)
            rd = [a for a in order if a.kind == "reduce"]
            used = rd and any(_mentions(ld, rd[-1]) for ld in _loads(red.source))
            # (a loop of one value is no loop: isl substitutes it away)
            if used and 2 <= rd[-1].extent <= _opts().max_lanes and rd[-1].dom[0] == 0:
                lane_axis = rd[-1]
            elif used and rd[-1].extent >= _opts().split_lanes and rd[-1].dom[0] == 0 \
                    and self._box_points(full) >= _opts().unroll_min_points \
                    and (resid is None or not _mentions(red.where, rd[-1])) \
                    and sum(len(_nodes(x)) for x in red.source) <= _opts().unroll_max_nodes:
                split_axis = rd[-1]
        if split_axis is not None:
            # a long innermost reduction loop whose bounds are constant: its groups
            # of options.split_lanes consecutive values are unrolled inside the spatial
            # loops (the output element is loaded and stored once per group; the
            # terms are added in the same order), the last partial group runs below
            r, f = split_axis, _opts().split_lanes
            n_full = r.extent // f * f
            main = dom.intersect(to_set(r < n_full, space)[0])
            if _mentions(red.where, r):
                # a group is unrolled where all its values are in the domain (e.g.
                # cumsum's k <= j: the groups wholly below j)
                main = main.subtract(_partial_groups(red.where, full, r, f, box))
            rest = dom.subtract(main)
            sched = [r // f if a is r else self._val(a) for a in order] + [r % f]
            pos = {id(a): p for p, a in enumerate(order)}
            self.lanes = (len(order), f)
            self.chosen_lanes = (r.name, f)
            self._plan_nest(depth, [LA.Statement(f"U{self.k}", full, main, sched)],
                            len(order) + 1, lane_stmts, {pos[id(a)] for a in par})
            self.lanes = None
        if lane_axis is not None:
            # the short innermost reduction loop moves inside the spatial loops and
            # is unrolled (each output element is loaded and stored once for all its
            # lanes) where every lane is in the domain; the rest runs as it is
            k_ax = next(i for i, a in enumerate(full) if a is lane_axis)
            bad = box.subtract(dom).project_out(isl.dim_type.set, k_ax, 1)
            bad = bad.insert_dims(isl.dim_type.set, k_ax, 1).intersect(box)
            main = dom.subtract(bad)
            rest = dom.intersect(bad)
            lane_order = [a for a in order if a is not lane_axis] + [lane_axis]
            pos = {id(a): p for p, a in enumerate(lane_order)}
            self.lanes = (len(order) - 1, lane_axis.extent)
            self.chosen_lanes = (lane_axis.name, lane_axis.extent)
            self._plan_nest(depth, [LA.Statement(f"U{self.k}", full, main,
                                                 [self._val(a) for a in lane_order])],
                            len(order), lane_stmts, {pos[id(a)] for a in par})
            self.lanes = None
        pos = {id(a): p for p, a in enumerate(order)}
        return self._plan_nest(depth, [LA.Statement(f"U{self.k}", full, rest,
                                                    [self._val(a) for a in order])],
                               len(order), stmts, {pos[id(a)] for a in par})

    # -- pieces --------------------------------------------------------------
    def _combine_lines(self, comb, red, em, resid):
        """A function ``(depth, targets, reassoc=False)`` writing ``targets =
        combine(targets, source)`` (a sum's add as ``_radd`` where ``reassoc``)."""
        w = self.w
        d0 = comb.dtypes[0]

        def emit(depth, targets, reassoc=False):
            bound = []
            if resid is not None and self._select_combine(comb, red, em, resid):
                self._combine_selected(em, depth, targets, comb, red, resid, reassoc)
                return
            if resid is not None:
                depth, bound = self._guard(em, depth, resid, list(red.source))
            bound += self._bind_shared(em, depth, red.source)
            for src in red.source:
                bound += self._bind_branches(em, depth, src)
            if comb.kind == "sum" and reassoc:
                w(depth, f"{targets[0]} = _radd({targets[0]}, {em.cast(red.source[0], d0)})")
            elif comb.kind in ("sum", "prod"):
                op = "+=" if comb.kind == "sum" else "*="
                w(depth, f"{targets[0]} {op} {em.cast(red.source[0], d0)}")
            elif comb.kind in ("max", "min"):
                fn = f"_f{comb.kind}_{d0}" if dt.is_float(d0) else comb.kind
                w(depth, f"{targets[0]} = {fn}({targets[0]}, {em.cast(red.source[0], d0)})")
            else:
                ys = [f"y{self.k}_{c}" for c in range(len(comb.rhs))]
                for y, s, v in zip(ys, red.source, comb.rhs):
                    w(depth, f"{y} = {em.cast(s, v.dtype)}")
                names = dict(self.names)
                names.update({id(v): t for v, t in zip(comb.lhs, targets)})
                names.update({id(v): y for v, y in zip(comb.rhs, ys)})
                cem = ExprEmitter(names, self.buffers, self.op.name, self.errors)
                # the combine's operands are any values of their dtypes: its integer
                # + - * // that may leave the dtype are checked, as te.evaluate does
                cem.arith_checks = _BoundsChecker(self.op.name, None, None).value_arith(
                    comb.result)
                # a deep combiner is written in parts (the text height bound)
                cbound = self._bind_shared(cem, depth, comb.result)
                # the condition every component selects on (an argmax's tie rule):
                # written once, where the first component would evaluate it first
                first = comb.result[0]
                if (len(comb.result) > 1 and isinstance(first, E.Select)
                        and id(first.cond) not in cem.bound
                        and all(isinstance(r, E.Select) and r.cond is first.cond
                                for r in comb.result)):
                    flag = f"sel{self.k}_{self._fresh()}"
                    w(depth, f"{flag} = {cem(first.cond)}")
                    cem.bound[id(first.cond)] = flag
                    cbound.append(id(first.cond))
                news = [f"n{self.k}_{c}" for c in range(len(comb.result))]
                for n, r, v in zip(news, comb.result, comb.lhs):
                    w(depth, f"{n} = {cem.cast(r, v.dtype)}")
                cem.unbind(cbound)
                for t, n in zip(targets, news):
                    w(depth, f"{t} = {n}")
            em.unbind(bound)
        return emit

    def _select_combine(self, comb, red, em, resid):
        """Whether the data-dependent ``where`` ``resid`` of ``red`` is written as a
        select of the combined value (``acc += v if c else 0``) rather than an
        ``if`` around the combine: a built-in combiner, one small source and
        condition (no statement of their own), and a source that runs no
        run-time check (a bounds check, a checked integer operation: evaluated
        where ``c`` fails, it would report what the program never reads) and
        reads nothing but floats. Then the source's loads are not behind a
        branch: LLVM turns the select into a blend and vectorises the
        accumulators (a relu-masked per-channel sum of 2 M floats: 10.9 ->
        1.6 ms), where a load behind the ``if`` kept every element a branch.
        The combined values are the same: a sum adds ``+0.0`` where ``c`` fails
        (its accumulator, from ``+0.0``, is never ``-0.0``), a product
        multiplies by 1, a max or min keeps its accumulator."""
        if not _opts().select_where or comb.kind not in ("sum", "prod", "max", "min") \
                or len(red.source) != 1:
            return False
        if em.tree_nodes([resid] + list(red.source)) > _opts().let_tree_nodes:
            return False
        for n in post_order(red.source[0]):
            if em._has_own_check(n) or (isinstance(n, E.Load) and not dt.is_float(n.dtype)):
                return False
        return True

    def _combine_selected(self, em, depth, targets, comb, red, resid, reassoc):
        """The combine of :meth:`_select_combine`: the value, then the select."""
        w = self.w
        d0 = comb.dtypes[0]
        v = f"v{self.k}_{self._fresh()}"
        w(depth, f"{v} = {em.cast(red.source[0], d0)}")
        cond = em(resid)
        t = targets[0]
        if comb.kind in ("sum", "prod"):
            unit = const_str(0 if comb.kind == "sum" else 1, d0)
            term = f"({v} if {cond} else {unit})"
            if comb.kind == "sum" and reassoc:
                w(depth, f"{t} = _radd({t}, {term})")
            else:
                w(depth, f"{t} {'+=' if comb.kind == 'sum' else '*='} {term}")
        else:
            fn = f"_f{comb.kind}_{d0}" if dt.is_float(d0) else comb.kind
            w(depth, f"{t} = {fn}({t}, {v}) if {cond} else {t}")

    def _guard(self, em, depth, cond, later):
        """Write ``if cond:`` before a statement whose values are ``later``; returns the
        depth inside it and the ids :meth:`ExprEmitter.bind_shared` bound. A large
        condition (a where holding a chain of selects, lifted from a gradient) is
        a sequence of conjuncts, each computed into a flag only where the ones
        before it held (``and``'s short circuit, without nesting a block per
        conjunct), after binding the shared subexpressions it computes first."""
        w = self.w
        if em.tree_nodes([cond] + later) <= _opts().let_tree_nodes:
            w(depth, f"if {em(cond)}:")
            return depth + 1, []
        parts, stack = [], [cond]
        while stack:  # the conjuncts, in order
            c = stack.pop()
            if isinstance(c, E.And):
                stack += [c.b, c.a]
            else:
                parts.append(c)
        flag = f"ok{self.k}_{self._fresh()}"
        bound = []
        for j, c in enumerate(parts):
            d = depth
            if j:
                w(depth, f"if {flag}:")
                d += 1
            new = self._bind_shared(em, d, [c], later=parts[j + 1:] + later)
            new += self._bind_branches(em, d, c)
            self.split_guard |= bool(new) and j + 1 < len(parts)
            bound += new
            w(d, f"{flag} = {em(c)}")
        w(depth, f"if {flag}:")
        return depth + 1, bound
