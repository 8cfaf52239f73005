"""The bridge between texpr IR and islpy -- the only module that imports islpy.

Index expressions that are *quasi-affine* (sums of integer multiples of
variables and constants, ``//`` and ``%`` by positive constants, ``min``/``max``,
``abs`` (as ``max(e, -e)``) and ``select`` of such) become ``isl.PwAff``; conditions over them become
``isl.Set`` s. ``//`` and ``%`` by a constant are ISL integer divisions
(existentially quantified variables), so ISL reasons about modular arithmetic
exactly. Anything else (a load of an int tensor -- a data-dependent index --,
a float, a product of two variables) is not quasi-affine: the conversions
return ``None`` for it, or keep it aside as a *residual* condition that the
caller must keep as a guard.

Back from ISL: :func:`pwaff_to_expr` and :func:`set_to_expr` go through ISL's
AST expression builder, and :func:`ast_expr_to_ir` turns any ``isl.AstExpr``
into texpr IR (codegen uses it for loop bounds and guards).

Dimension names are ``<var name>_<uid>``, unique per variable.

The package installed is ``islpy-barvinok`` (the same ``islpy`` module built with
barvinok), so ``Set.card()`` counts points exactly without enumerating them.

Reference: S. Verdoolaege, "isl: An Integer Set Library for the Polyhedral
Model", ICMS 2010; the AST generator: Grosser, Verdoolaege, Cohen,
"Polyhedral AST generation is more than scanning polyhedra", TOPLAS 2015.
"""

import re

import islpy as isl

from texpr import expr as E
from texpr.errors import TexprError

CTX = isl.DEFAULT_CONTEXT

__all__ = ["isl", "CTX", "VarSpace", "dim_name", "to_pwaff", "to_set", "box_set",
           "pwaff_to_expr", "set_to_expr", "ast_expr_to_ir", "is_quasi_affine"]


def dim_name(v):
    """The unique ISL dimension name of a texpr Var: its name's ASCII letters,
    digits and underscores (ISL rejects names that look like numbers: a
    leading digit gets a ``v`` in front), then its unique id."""
    base = re.sub(r"[^A-Za-z0-9_]", "_", v.attr[0])
    if not base or base[0].isdigit():
        base = "v" + base
    return f"{base}_{v.attr[1]}"


class VarSpace:
    """An ordered list of texpr Vars seen as the set dimensions of an ISL space.

    ``params`` are Vars treated as symbolic constants (ISL parameters).
    """

    def __init__(self, vars, params=()):
        self.vars = tuple(vars)
        self.params = tuple(params)
        self.names = [dim_name(v) for v in self.vars]
        self.param_names = [dim_name(v) for v in self.params]
        self.by_name = {n: v for n, v in zip(self.names + self.param_names,
                                             self.vars + self.params)}
        sp = isl.Space.create_from_names(CTX, set=self.names, params=self.param_names)
        self.space = sp
        self.local_space = isl.LocalSpace.from_space(sp)
        self.pos = {id(v): ("set", d) for d, v in enumerate(self.vars)}
        self.pos.update({id(v): ("param", d) for d, v in enumerate(self.params)})

    def universe(self):
        return isl.Set.universe(self.space)

    def empty(self):
        return isl.Set.empty(self.space)

    def const(self, value):
        return isl.PwAff.from_aff(
            isl.Aff.val_on_domain(self.local_space, isl.Val.int_from_si(CTX, int(value))))

    def var(self, v):
        kind, d = self.pos[id(v)]
        t = isl.dim_type.set if kind == "set" else isl.dim_type.param
        return isl.PwAff.from_aff(isl.Aff.var_on_domain(self.local_space, t, d))


def box_set(space):
    """The box ``lo <= v < hi`` of every IterVar of ``space`` (plain Vars unbounded)."""
    s = space.universe()
    for v in space.vars:
        if isinstance(v, E.IterVar):
            lo, hi = v.dom
            pv = space.var(v)
            s = s.intersect(pv.ge_set(space.const(lo))).intersect(pv.lt_set(space.const(hi)))
    return s


def _positive_const(e):
    return isinstance(e, E.Const) and isinstance(e.value, int) and e.value > 0


def to_pwaff(e, space):
    """``e`` as an ``isl.PwAff`` over ``space``, or None if it is not quasi-affine."""
    memo = {}

    def conv(x):
        if id(x) in memo:
            return memo[id(x)]
        out = _conv(x)
        memo[id(x)] = out
        return out

    def _conv(x):
        if isinstance(x, E.Const):
            return space.const(x.value) if isinstance(x.value, int) and not isinstance(x.value, bool) else None
        if isinstance(x, E.Var):
            return space.var(x) if id(x) in space.pos else None
        if x.dtype not in ("int32", "int64"):
            return None
        if isinstance(x, (E.Add, E.Sub, E.Min, E.Max)):
            a, b = conv(x.a), conv(x.b)
            if a is None or b is None:
                return None
            return {E.Add: a.add, E.Sub: a.sub, E.Min: a.min, E.Max: a.max}[type(x)](b)
        if isinstance(x, E.Mul):
            for c, o in ((x.a, x.b), (x.b, x.a)):
                if isinstance(c, E.Const):
                    po = conv(o)
                    return None if po is None else po.scale_val(isl.Val.int_from_si(CTX, c.value))
            return None
        if isinstance(x, E.FloorDiv) and _positive_const(x.b):
            a = conv(x.a)
            return None if a is None else a.div(space.const(x.b.value)).floor()
        if isinstance(x, E.FloorMod) and _positive_const(x.b):
            a = conv(x.a)
            return None if a is None else a.mod_val(isl.Val.int_from_si(CTX, x.b.value))
        if isinstance(x, E.Select):
            c, resid = to_set(x.cond, space)
            if resid is not None:
                return None
            a, b = conv(x.true_value), conv(x.false_value)
            if a is None or b is None:
                return None
            return a.intersect_domain(c).union_add(b.intersect_domain(c.complement()))
        if isinstance(x, E.Cast) and x.value.dtype in ("int32", "int64"):
            return conv(x.value)
        if isinstance(x, E.Call) and x.name == "abs":
            a = conv(x.args[0])  # |a| = max(a, -a): two affine pieces
            return None if a is None else a.max(a.neg())
        return None

    return conv(e)


def is_quasi_affine(e, space):
    """Whether ``e`` (an integer expression) converts to a PwAff over ``space``."""
    return to_pwaff(e, space) is not None


_CMP_SET = {E.EQ: "eq_set", E.NE: "ne_set", E.LT: "lt_set", E.LE: "le_set",
            E.GT: "gt_set", E.GE: "ge_set"}


def to_set(cond, space):
    """Split a boolean ``cond`` into ``(isl.Set, residual)``.

    The set holds the quasi-affine part; ``residual`` is an Expr for the part
    ISL cannot see (data-dependent or float conditions), or None. The original
    condition equals ``set AND residual``: only conjunctions are split, and a
    non-affine disjunction/negation stays whole in the residual.
    """
    if isinstance(cond, E.Const):
        return (space.universe() if cond.value else space.empty()), None
    if isinstance(cond, E.And):
        sa, ra = to_set(cond.a, space)
        sb, rb = to_set(cond.b, space)
        resid = ra if rb is None else (rb if ra is None else E.logical_and(ra, rb))
        return sa.intersect(sb), resid
    if isinstance(cond, E.Or):
        sa, ra = to_set(cond.a, space)
        sb, rb = to_set(cond.b, space)
        if ra is None and rb is None:
            return sa.union(sb), None
        return space.universe(), cond
    if isinstance(cond, E.Not):
        sa, ra = to_set(cond.a, space)
        if ra is None:
            return sa.complement(), None
        return space.universe(), cond
    if type(cond) in _CMP_SET and cond.a.dtype in ("int32", "int64") \
            and cond.b.dtype in ("int32", "int64"):
        a, b = to_pwaff(cond.a, space), to_pwaff(cond.b, space)
        if a is not None and b is not None:
            return getattr(a, _CMP_SET[type(cond)])(b), None
    return space.universe(), cond


# ---- back from ISL -------------------------------------------------------------

def pwaff_to_expr(pa, space, context=None):
    """An ``isl.PwAff`` over ``space`` as a texpr int64 expression.

    ``context`` (an isl.Set on the same space) may say what is known, to
    simplify the pieces' conditions.
    """
    expr = _ast_build_on(space, context).expr_from_pw_aff(pa.coalesce())
    return ast_expr_to_ir(expr, space.by_name)


def _ast_build_on(space, context):
    """An AstBuild whose schedule space is ``space`` (known facts: ``context``)."""
    return isl.AstBuild.from_context(context if context is not None else space.universe())


def set_to_expr(s, space, context=None):
    """An ``isl.Set`` over ``space`` as a texpr boolean expression (simplified
    under ``context`` when given)."""
    s = s.coalesce()
    if s.is_empty():
        return E.const(False)
    if context is not None:
        s = s.gist(context)
    if s.plain_is_universe():
        return E.const(True)
    expr = _ast_build_on(space, context).expr_from_set(s)
    out = ast_expr_to_ir(expr, space.by_name)
    if isinstance(out, E.Const) and out.dtype != "bool":  # ISL says 1 for "always"
        out = E.const(bool(out.value))
    return out


_AST_BIN = {
    isl.ast_expr_op_type.add: E.add, isl.ast_expr_op_type.sub: E.sub,
    isl.ast_expr_op_type.mul: E.mul, isl.ast_expr_op_type.fdiv_q: E.floordiv,
    isl.ast_expr_op_type.pdiv_q: E.floordiv, isl.ast_expr_op_type.pdiv_r: E.floormod,
    isl.ast_expr_op_type.zdiv_r: E.floormod, isl.ast_expr_op_type.div: E.floordiv,
    isl.ast_expr_op_type.eq: lambda a, b: a == b, isl.ast_expr_op_type.le: lambda a, b: a <= b,
    isl.ast_expr_op_type.lt: lambda a, b: a < b, isl.ast_expr_op_type.ge: lambda a, b: a >= b,
    isl.ast_expr_op_type.gt: lambda a, b: a > b,
    isl.ast_expr_op_type.and_: E.logical_and, isl.ast_expr_op_type.and_then: E.logical_and,
    isl.ast_expr_op_type.or_: E.logical_or, isl.ast_expr_op_type.or_else: E.logical_or,
}


def ast_expr_to_ir(ae, by_name):
    """Convert an ``isl.AstExpr`` to texpr IR; identifiers are looked up in
    ``by_name`` (dimension name -> Var, see :func:`dim_name`).

    Note: ``zdiv_r`` (remainder with C semantics) is only produced by ISL in
    tests against zero, where it agrees with floor modulo.
    """
    t = ae.get_type()
    if t == isl.ast_expr_type.int:
        return E.const(ae.get_val().to_python())
    if t == isl.ast_expr_type.id:
        name = ae.get_id().get_name()
        try:
            return by_name[name]
        except KeyError:
            raise TexprError(f"isl_bridge: unknown identifier {name!r} in an ISL expression") from None
    op = ae.get_op_type()
    args = [ast_expr_to_ir(ae.get_op_arg(k), by_name) for k in range(ae.get_op_n_arg())]
    if op in _AST_BIN:
        out = args[0]
        for b in args[1:]:
            out = _AST_BIN[op](out, b)
        return out
    if op == isl.ast_expr_op_type.minus:
        return E.sub(E.const(0), args[0])
    if op == isl.ast_expr_op_type.min:
        out = args[0]
        for b in args[1:]:
            out = E.minimum(out, b)
        return out
    if op == isl.ast_expr_op_type.max:
        out = args[0]
        for b in args[1:]:
            out = E.maximum(out, b)
        return out
    if op in (isl.ast_expr_op_type.select, isl.ast_expr_op_type.cond):
        return E.select(args[0], args[1], args[2])
    raise TexprError(f"isl_bridge: unsupported ISL AST operation {op}")


# ---- domain primitives used by the passes (kept here: no other module imports islpy) ----

__all__ += ["card", "bounds_set", "solve_last_dims", "dim_bounds", "is_injective",
            "DomainError"]


class DomainError(TexprError):
    """ISL could not handle an iteration domain (raised instead of an islpy error)."""


def card(s):
    """The exact number of integer points of a bounded, parameter-free ``isl.Set``.

    Uses barvinok's symbolic counting (``isl_set_card``), so the cost does not
    depend on the number of points (Verdoolaege et al., "Counting integer points
    in parametric polytopes using Barvinok's rational functions", Algorithmica 2007).

    Raises:
        DomainError: the set is unbounded or has parameters.
    """
    try:
        pieces = s.card().get_pieces()
    except isl.Error as exc:
        raise DomainError(f"cannot count the points of {s}: {exc}") from None
    total = 0
    for _dom, qp in pieces:
        v = qp.get_constant_val()
        if not v.is_int():
            raise DomainError(f"the point count of {s} is not a constant: {qp}")
        total += v.to_python()
    return int(total)


def bounds_set(space, bounds):
    """The box ``lo <= v < hi`` for ``bounds`` = {id(var): (lo, hi)} over ``space``."""
    s = space.universe()
    for v in space.vars:
        b = bounds.get(id(v))
        if b is None:
            continue
        pv = space.var(v)
        s = s.intersect(pv.ge_set(space.const(b[0]))).intersect(pv.lt_set(space.const(b[1])))
    return s


def _aff_score(pa):
    pieces = pa.get_pieces()
    divs = sum(aff.dim(isl.dim_type.div) for _s, aff in pieces)
    return (len(pieces), divs)


def solve_last_dims(s, pos):
    """Whether set dimension ``pos`` of ``s`` is a function of the other dimensions.

    Returns ``(pw_aff, projected, score)`` -- the dimension as an ``isl.PwAff`` of the
    others (over the space without ``pos``), the set with ``pos`` projected out,
    and a cost score (pieces, integer divisions) -- or None when the dimension is
    not single-valued. (ISL: ``Map.is_single_valued`` and ``PwMultiAff.from_map``.)
    """
    n = s.dim(isl.dim_type.set)
    m = isl.Map.from_range(s)
    m = m.move_dims(isl.dim_type.in_, 0, isl.dim_type.out, 0, pos)
    m = m.move_dims(isl.dim_type.in_, pos, isl.dim_type.out, 1, n - pos - 1)
    if not m.is_single_valued():
        return None
    pa = isl.PwMultiAff.from_map(m).get_pw_aff(0)
    return pa, m.domain(), _aff_score(pa)


def dim_bounds(s, pos):
    """``(lo, hi)`` with ``lo <= x < hi`` the tight bounds of set dimension ``pos``."""
    lo = s.dim_min_val(pos)
    hi = s.dim_max_val(pos)
    return lo.to_python(), hi.to_python() + 1


def single_piece_aff(pa):
    """The affine expression of a one-piece PwAff, extended to its whole space."""
    pieces = pa.get_pieces()
    if len(pieces) != 1:
        return None
    return isl.PwAff.from_aff(pieces[0][1])


def is_injective(domain, index_pwaffs):
    """Whether the map ``x -> (f_1(x), ..., f_n(x))`` (PwAffs over ``domain``'s space)
    is injective on ``domain`` (a stage read there reads each point at most once)."""
    if not index_pwaffs:
        return card(domain) <= 1
    m = isl.Map.from_pw_aff(index_pwaffs[0])
    for f in index_pwaffs[1:]:
        m = m.flat_range_product(isl.Map.from_pw_aff(f))
    return m.intersect_domain(domain).is_injective()




__all__ += ["canonical_quasi_affine"]


def canonical_quasi_affine(e, vars):
    """ISL's own form of a quasi-affine integer expression over ``vars`` (Vars;
    IterVars are known to lie in their boxes), or None when ``e`` is not
    quasi-affine. Re-deriving the integer divisions lets ISL simplify nested
    ones: ``j1 + 2*j3 + 2*(j1//2) - 4*((j1 + 2*(j1//2))//4)`` -> ``j1 % 2 + 2*j3``."""
    try:
        space = VarSpace(vars)
        pa = to_pwaff(e, space)
        if pa is None:
            return None
        ctx = box_set(space)
        return pwaff_to_expr(pa.gist(ctx), space, context=ctx)
    except isl.Error:
        return None


__all__ += ["project_onto_first", "is_subset"]


def project_onto_first(s, n):
    """The projection of ``s`` onto its first ``n`` set dimensions (the others are
    existentially quantified: "there is a point of ``s`` above")."""
    total = s.dim(isl.dim_type.set)
    return s.project_out(isl.dim_type.set, n, total - n)


def is_subset(a, b):
    """Whether the set ``a`` is contained in ``b`` (same space)."""
    return a.is_subset(b)
