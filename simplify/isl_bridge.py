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

import math
import re
from collections import namedtuple

import islpy as isl
import numpy as np

from texpr import expr as E
from texpr.errors import DTypeError, TexprError

CTX = isl.DEFAULT_CONTEXT

__all__ = ["isl", "CTX", "VarSpace", "dim_name", "to_pwaff", "to_set", "box_set",
           "pwaff_to_expr", "set_to_expr", "ast_expr_to_ir", "ast_cond_to_ir", "is_quasi_affine"]


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
    pa = pa.coalesce()
    expr = ast_expr_to_ir(_ast_build_on(space, context).expr_from_pw_aff(pa), space.by_name)
    # translation validation (as for loop nests, loop_ast.runs_exactly): the
    # expression must equal the PwAff wherever it is defined and known
    where = pa.domain() if context is None else pa.domain().intersect(context)
    back = to_pwaff(expr, space)
    if back is None or not where.is_subset(back.eq_set(pa)):
        if context is not None:
            return pwaff_to_expr(pa, space)
        raise TexprError(f"isl_bridge: isl's expression for {pa} is not equal to it")
    return expr


def _ast_build_on(space, context):
    """An AstBuild whose schedule space is ``space`` (known facts: ``context``)."""
    return isl.AstBuild.from_context(context if context is not None else space.universe())


def set_to_expr(s, space, context=None):
    """An ``isl.Set`` over ``space`` as a texpr boolean expression (simplified
    under ``context`` when given)."""
    s = whole = s.coalesce()
    if s.is_empty():
        return E.const(False)
    if context is not None:
        s = s.gist(context)
    if s.plain_is_universe():
        return E.const(True)
    expr = _ast_build_on(space, context).expr_from_set(s)
    out = ast_cond_to_ir(expr, space.by_name)  # ISL says 1 for "always"
    # translation validation: the condition must hold exactly on the set (where
    # the context holds); else without the context, else an error
    back, resid = to_set(out, space)
    known = space.universe() if context is None else context
    if resid is not None or not back.intersect(known).is_equal(whole.intersect(known)):
        if context is not None:
            return set_to_expr(whole, space)
        raise TexprError(f"isl_bridge: isl's condition for {whole} is not equal to it")
    return out


_AST_BIN = {
    isl.ast_expr_op_type.add: E.add, isl.ast_expr_op_type.sub: E.sub,
    isl.ast_expr_op_type.mul: E.mul, isl.ast_expr_op_type.fdiv_q: E.floordiv,
    isl.ast_expr_op_type.pdiv_q: E.floordiv, isl.ast_expr_op_type.pdiv_r: E.floormod,
    isl.ast_expr_op_type.zdiv_r: E.floormod, isl.ast_expr_op_type.div: lambda a, b: _c_div(a, b),
    isl.ast_expr_op_type.eq: lambda a, b: a == b, isl.ast_expr_op_type.le: lambda a, b: a <= b,
    isl.ast_expr_op_type.lt: lambda a, b: a < b, isl.ast_expr_op_type.ge: lambda a, b: a >= b,
    isl.ast_expr_op_type.gt: lambda a, b: a > b,
    isl.ast_expr_op_type.and_: E.logical_and, isl.ast_expr_op_type.and_then: E.logical_and,
    isl.ast_expr_op_type.or_: E.logical_or, isl.ast_expr_op_type.or_else: E.logical_or,
}


def _c_div(a, b):
    """ISL's ``div`` (its C printer's ``/``): an "exact" division, which ISL's AST
    generator also places where the numerator is not a multiple (a loop bound
    of a residue class that is empty at that point, ``-c0 / 2`` at ``c0 = 3``),
    relying on C's division, which truncates toward zero: floor division there
    gave a loop that ran outside the domain (fuzz seed 7000031103: a read past
    a buffer). So C's truncation, for a positive constant divisor (ISL's only
    kind; another raises TexprError)."""
    if isinstance(b, E.Const) and isinstance(b.value, int) and b.value > 0:
        return E.select(a < 0, E.const(0) - E.floordiv(E.const(0) - a, b), E.floordiv(a, b))
    raise TexprError(f"isl_bridge: an ISL exact division by {b!r}, not a positive "
                     "constant")


_AST_LOGICAL = (isl.ast_expr_op_type.and_, isl.ast_expr_op_type.and_then,
                isl.ast_expr_op_type.or_, isl.ast_expr_op_type.or_else)


def _truth(e):
    """A condition from an ISL AST expression: C's truth value of an integer where
    ISL writes one (``4 * c0 + c1 <= 5 || 1``: ``1`` is true; fuzz seed
    7002200745, where the loop nest's ``if`` failed to build)."""
    if e.dtype == "bool":
        return e
    if isinstance(e, E.Const):
        return E.const(bool(e.value), "bool")
    return e != 0


def ast_cond_to_ir(ae, by_name):
    """Convert an ``isl.AstExpr`` in a condition's place (an ``if``, a guard) to a
    boolean texpr expression (an integer is C's truth value: non-zero is true).
    Identifiers are looked up in ``by_name`` as for :func:`ast_expr_to_ir`;
    raises TexprError as it does (an unknown identifier or operation)."""
    return _truth(ast_expr_to_ir(ae, by_name))


def ast_expr_to_ir(ae, by_name):
    """Convert an ``isl.AstExpr`` to texpr IR; identifiers are looked up in
    ``by_name`` (dimension name -> Var, see :func:`dim_name`). The operands of
    ``&&``, ``||`` and a select's condition are conditions (an integer there is
    C's truth value, see :func:`ast_cond_to_ir`).

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
    if op in _AST_LOGICAL:
        args = [_truth(a) for a in args]
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
        return E.select(_truth(args[0]), args[1], args[2])
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
    except (isl.Error, DTypeError):  # DTypeError: a constant of ISL's form leaves int64
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


# ---- bounded point counting (for heuristics) -----------------------------------------
#
# barvinok's ``card`` does not depend on the number of points, but its cost grows
# quickly with the integer divisions of a set (``e % m`` and ``e // m`` conditions:
# each an existential variable), their moduli, its dimension and its disjuncts:
# on the box 30x300x300, ``((17*i + 23*j)//29 + (31*j + 37*k)//41) % 43 < 20 and
# (7*i + 11*j + 13*k) % 47 < 21`` took more than 5 minutes; with
# ``((3*j + 2*k)//5 + (j + k)//7) % 11 == 0 and (i + 2*j + 3*k) % 13 == 4`` the set
# took 0.35 s but its projection along ``j`` more than 100 s (a projection's
# divisions become unknown existentials). ISL's operation budget
# (``Context.set_max_operations``) is no guard: barvinok's own work is not counted
# (10^4 operations sufficed for a 1.3 s count) and a count stopped part way (at
# 100 or 1000 operations) crashed the process with a segmentation fault.
# So the heuristics (loop order, parallel rules, BLAS cost) count through
# :func:`card_within` / :func:`projected_cards_within`: barvinok only for sets
# that :func:`count_cost` calls cheap, else enumeration of the bounding box with
# numpy (exact, at most :data:`ENUM_MAX_WORK`), else the box's points (an upper
# bound). Exact counts (iteration counts, the simplifier's cost model) still use
# :func:`card`.

__all__ += ["CARD_MAX_COST", "ENUM_MAX_WORK", "ENUM_MAX_POINTS", "Count", "count_cost",
            "bounding_box", "card_within", "projected_cards_within"]

#: :func:`count_cost` up to which :func:`card_within` asks barvinok (see there)
CARD_MAX_COST = 64
#: the cost of one integer division whose expression ISL does not know (an
#: existential variable, as left by a projection)
UNKNOWN_DIV_COST = 64
#: enumeration budget of :func:`card_within`, in elementary numpy operations
#: (see :func:`_enum_plan`; at most 2.3 ns each on 256 random sets: 0.3 s)
ENUM_MAX_WORK = 1 << 27
#: the most points enumerated (a boolean each: 16 MiB)
ENUM_MAX_POINTS = 1 << 24
#: points enumerated at once (int64 temporaries of 8 bytes each), unless one slice
#: across the longest axis has more, up to
_ENUM_CHUNK = 1 << 18
_ENUM_CHUNK_MAX = 1 << 22

#: A point count: ``value`` (an int), ``exact`` (False: ``value`` is an upper bound,
#: the points of the set's bounding box) and ``method`` ("barvinok", "enumerate",
#: "box").
Count = namedtuple("Count", "value exact method")


def _check_countable(s):
    if s.dim(isl.dim_type.param):
        raise DomainError(f"cannot count the points of {s}: it has parameters")


def _aff_tree(aff):
    """An ``isl.Aff`` as a hashable tree ``(den, set_coefs, div_terms, const)``: its
    value is ``(set_coefs . x + sum(c * floor(sub)) + const) / den`` over the
    ``(c, sub)`` of ``div_terms`` (integers; ``sub`` a tree of the same form)."""
    den = aff.get_denominator_val()
    sc = tuple(aff.get_coefficient_val(isl.dim_type.in_, x).mul(den).to_python()
               for x in range(aff.dim(isl.dim_type.in_)))
    dt = []
    for y in range(aff.dim(isl.dim_type.div)):
        c = aff.get_coefficient_val(isl.dim_type.div, y).mul(den).to_python()
        if c:
            dt.append((c, _aff_tree(aff.get_div(y))))
    return (den.to_python(), sc, tuple(dt), aff.get_constant_val().mul(den).to_python())


def _divs(bset):
    """The integer divisions of a basic set, in order: each the tree
    (:func:`_aff_tree`) of the expression it is the floor of, or None when ISL does
    not know it (an existential variable)."""
    ls = bset.get_local_space()
    out = []
    for d in range(bset.dim(isl.dim_type.div)):
        try:
            aff = ls.get_div(d)
        except isl.Error:
            out.append(None)
            continue
        out.append(_aff_tree(aff))
    return out


def count_cost(s):
    """An a-priori estimate of how hard barvinok finds counting the points of ``s``.

    Per basic set: the product of its integer divisions' denominators (the
    moduli of ``%`` and ``//``; an unknown division -- an existential variable,
    as a projection leaves -- counts :data:`UNKNOWN_DIV_COST`), doubled for every
    dimension plus division past 4; the sum over the basic sets, times their
    number (disjoint pieces cost more than their sum). It reads the set's
    representation only: no counting, no integer programming. On 330 random sets
    of 2 to 5 dimensions (boxes of 3 to 300 per axis, conditions with ``%``,
    ``//``, ``or``, ``not``), every set of cost <= 64 counted in at most 0.03 s,
    those of cost <= 128 in 0.23 s; the slowest over the limit ran for minutes.

    Args:
        s: an ``isl.Set``.

    Returns:
        An int >= 0 (0 for a set with no basic sets).
    """
    bsets = s.get_basic_sets()
    total = 0
    for b in bsets:
        c = 1
        divs = _divs(b)
        for dv in divs:
            c *= UNKNOWN_DIV_COST if dv is None else max(dv[0], 1)
        total += c << max(0, b.dim(isl.dim_type.set) + len(divs) - 4)
    return total * len(bsets)


def bounding_box(s):
    """Integer bounds ``[(lo, hi), ...]`` (``lo <= x < hi``) of every set dimension of
    ``s``, from the set without its integer divisions (a superset: the bounds may
    be loose where only ``%``/``//`` conditions bound a dimension, never too tight).

    Args:
        s: a parameter-free ``isl.Set``.

    Returns:
        A list of ``(lo, hi)`` int pairs, or None when the relaxed set is empty.

    Raises:
        DomainError: ``s`` has parameters or a dimension is unbounded.
    """
    _check_countable(s)
    r = s.remove_divs()
    if r.is_empty():
        return None
    out = []
    for d in range(r.dim(isl.dim_type.set)):
        lo, hi = r.dim_min_val(d), r.dim_max_val(d)
        if not (lo.is_int() and hi.is_int()):
            raise DomainError(f"cannot count the points of {s}: dimension {d} is unbounded")
        out.append((lo.to_python(), hi.to_python() + 1))
    return out


def _enum_plan(s, box, max_work):
    """The basic sets of ``s`` as ``(divs, constraints)`` for :func:`_enumerate`
    (the divisions' trees, :func:`_aff_tree`; the constraints as ``(is_equality,
    row)``, a row the integer coefficients of the set dimensions, of the
    divisions and the constant), or None when a division is unknown, the work is
    over ``max_work``, the box has more than :data:`ENUM_MAX_POINTS` points (or a
    slice across its longest axis more than ``_ENUM_CHUNK_MAX``) or an
    intermediate could overflow int64.

    The work counts, for every division and constraint, its terms times the
    points of the sub-box of the dimensions it reads (numpy broadcasts: a bound
    on one axis costs that axis's extent), for the and of the constraints the
    points of the dimensions read so far, and per basic set the box's points
    (the union of the pieces)."""
    extents = [hi - lo for lo, hi in box]
    points = math.prod(extents)
    mag = [max(abs(lo), abs(hi)) for lo, hi in box]
    seen = {}  # tree -> (magnitude of its floor, set dimensions read)
    work = 0

    def size(dims):
        return math.prod(extents[d] for d in dims)

    def visit(tree):
        nonlocal work
        if tree in seen:
            return seen[tree]
        den, sc, dt, c = tree
        m, dims = abs(c), {x for x, a in enumerate(sc) if a}
        m += sum(abs(a) * mag[x] for x, a in enumerate(sc))
        for a, sub in dt:
            sm, sd = visit(sub)
            m += abs(a) * sm
            dims |= sd
        if m >= 1 << 62:
            raise OverflowError
        work += (1 + sum(1 for a in sc if a) + len(dt)) * size(dims)
        seen[tree] = (m // den + 1, dims)
        return seen[tree]

    plan = []
    try:
        for b in s.get_basic_sets():
            nset, ndiv = b.dim(isl.dim_type.set), b.dim(isl.dim_type.div)
            divs = _divs(b)
            if any(dv is None for dv in divs):
                return None
            info = [visit(dv) for dv in divs]
            rows, row_dims = [], []
            for c in b.get_constraints():
                row = [c.get_coefficient_val(isl.dim_type.set, x).to_python() for x in range(nset)]
                row += [c.get_coefficient_val(isl.dim_type.div, x).to_python() for x in range(ndiv)]
                row.append(c.get_constant_val().to_python())
                vmag = mag[:nset] + [im for im, _d in info]
                vdims = [{x} for x in range(nset)] + [idims for _m, idims in info]
                if abs(row[-1]) + sum(abs(a) * x for a, x in zip(row, vmag)) >= 1 << 62:
                    return None
                dims = set().union(*[vdims[x] for x, a in enumerate(row[:-1]) if a])
                work += (1 + sum(1 for a in row[:-1] if a)) * size(dims)
                rows.append((c.is_equality(), row))
                row_dims.append(dims)
            # the rows are and-ed from the smallest sub-box up; each costs the
            # points of the dimensions read so far
            order = sorted(range(len(rows)), key=lambda r: size(row_dims[r]))
            acc = set()
            for r in order:
                acc |= row_dims[r]
                work += size(acc)
            work += points
            plan.append((divs, [rows[r] for r in order]))
    except OverflowError:
        return None
    rest = points // max(max(extents), 1)  # the points of one slice of a chunk
    if work > max_work or points > ENUM_MAX_POINTS or rest > _ENUM_CHUNK_MAX:
        return None
    return plan


def _affine_value(row, coords):
    out = row[-1]
    for a, x in zip(row[:-1], coords):
        if a:
            out = out + a * x
    return out


def _floor_value(tree, coords, memo):
    """``floor`` of a division's tree (:func:`_aff_tree`) on the grid ``coords``."""
    got = memo.get(tree)
    if got is None:
        den, sc, dt, c = tree
        num = _affine_value(sc + (c,), coords)
        for a, sub in dt:
            num = num + a * _floor_value(sub, coords, memo)
        got = memo[tree] = np.floor_divide(num, den)
    return got


def _enumerate(plan, box):
    """The points of the box that satisfy ``plan`` (from :func:`_enum_plan`), as a
    boolean array of the box's shape (axis ``d``: ``box[d][0] + index``)."""
    shape = tuple(hi - lo for lo, hi in box)
    n = len(shape)
    mask = np.zeros(shape, dtype=bool)
    if not all(shape):
        return mask
    c = max(range(n), key=lambda d: shape[d])  # chunks along the longest axis
    step = max(1, _ENUM_CHUNK // max(math.prod(shape) // shape[c], 1))
    for start in range(0, shape[c], step):
        stop = min(shape[c], start + step)
        coords = []
        for d, (lo, hi) in enumerate(box):
            a, b = (lo + start, lo + stop) if d == c else (lo, hi)
            coords.append(np.arange(a, b, dtype=np.int64).reshape(
                [-1 if e == d else 1 for e in range(n)]))
        chunk = mask[(slice(None),) * c + (slice(start, stop),)]
        memo = {}
        for divs, rows in plan:
            vals = coords + [_floor_value(dv, coords, memo) for dv in divs]
            inside = True  # broadcast: grows to the dimensions the rows read
            for eq, row in rows:
                v = _affine_value(row, vals)
                inside = inside & ((v == 0) if eq else (v >= 0))
            chunk |= inside
    return mask


def _box_count(box):
    return 0 if box is None else math.prod(hi - lo for lo, hi in box)


def _mask_within(s, max_work):
    """``(mask, box)``: the points of ``s`` enumerated over its bounding box, or
    ``(None, box)`` when that is over budget (``box`` None: ``s`` is empty)."""
    box = bounding_box(s)
    if box is None:
        return np.zeros((0,) * s.dim(isl.dim_type.set), dtype=bool), None
    if not box:  # no set dimensions: one point or none
        return np.array(not s.is_empty()), box
    plan = _enum_plan(s, box, max_work)
    return (None if plan is None else _enumerate(plan, box)), box


def card_within(s, max_cost=None, max_work=None):
    """The number of integer points of ``s``, at a bounded cost (for heuristics).

    barvinok counts (exactly) when :func:`count_cost` of ``s`` is at most
    ``max_cost``; else the set's bounding box (:func:`bounding_box`) is enumerated
    with numpy (exactly) when every integer division is known, the box has at
    most :data:`ENUM_MAX_POINTS` points and the work (the points of the
    sub-boxes each constraint reads, times its terms) is at most ``max_work``;
    else the count is the bounding box's points, an upper bound. Whatever the
    set, the cost is bounded but for barvinok's, which :func:`count_cost` only
    estimates.

    Args:
        s: a bounded, parameter-free ``isl.Set``.
        max_cost: the barvinok budget (default :data:`CARD_MAX_COST`, read at the
            call); 0 never asks barvinok unless the set has no basic sets.
        max_work: the enumeration budget (default :data:`ENUM_MAX_WORK`); 0 never
            enumerates.

    Returns:
        A :class:`Count` ``(value, exact, method)``.

    Raises:
        DomainError: ``s`` is unbounded or has parameters.
    """
    max_cost = CARD_MAX_COST if max_cost is None else max_cost
    max_work = ENUM_MAX_WORK if max_work is None else max_work
    _check_countable(s)
    if count_cost(s) <= max_cost:
        return Count(card(s), True, "barvinok")
    mask, box = _mask_within(s, max_work)
    if mask is not None:
        return Count(int(np.count_nonzero(mask)), True, "enumerate")
    return Count(_box_count(box), False, "box")


def projected_cards_within(s, max_cost=None, max_work=None):
    """The points of ``s`` and of each of its projections along one set dimension,
    at a bounded cost (for heuristics: a loop's average trip count is the points
    of the domain over the points of its projection without that loop).

    barvinok counts when ``s`` and every projection cost at most ``max_cost``
    (:func:`count_cost`; a projection's divisions are often unknown existentials,
    which barvinok finds hardest); else one enumeration of the bounding box
    gives them all (exactly; budget as in :func:`card_within`); else every
    count is that of the bounding box (of ``s``; without dimension ``k`` for the
    projection along ``k``), an upper bound.

    Args:
        s: a bounded, parameter-free ``isl.Set``.
        max_cost, max_work: the budgets of :func:`card_within`.

    Returns:
        ``(total, projections)``: a :class:`Count` and a list of them, one per set
        dimension ``k`` (the points of ``s`` with dimension ``k`` projected out).

    Raises:
        DomainError: ``s`` is unbounded or has parameters.
    """
    max_cost = CARD_MAX_COST if max_cost is None else max_cost
    max_work = ENUM_MAX_WORK if max_work is None else max_work
    _check_countable(s)
    n = s.dim(isl.dim_type.set)
    projs = [s.project_out(isl.dim_type.set, k, 1) for k in range(n)]
    if all(count_cost(x) <= max_cost for x in [s] + projs):
        return (Count(card(s), True, "barvinok"),
                [Count(card(p), True, "barvinok") for p in projs])
    mask, box = _mask_within(s, max_work)
    if box is None:
        return Count(0, True, "box"), [Count(0, True, "box") for _ in projs]
    if mask is not None:
        return (Count(int(np.count_nonzero(mask)), True, "enumerate"),
                [Count(int(np.count_nonzero(mask.any(axis=k))), True, "enumerate")
                 for k in range(n)])
    total = _box_count(box)
    return (Count(total, False, "box"),
            [Count(_box_count(box[:k] + box[k + 1:]), False, "box") for k in range(n)])
