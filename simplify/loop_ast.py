"""Loop nests from iteration domains: isl's AST generator, seen as a small plain-Python AST.

A *statement* is a named point set (the iteration domain of one action of a
stage, e.g. "accumulate one term of the reduction") over texpr Vars, plus a
*schedule*: one quasi-affine expression of those Vars per loop dimension, which
says when each point runs (lexicographic order of the schedule tuples).
:func:`generate` hands all statements of a stage to isl's AST generator
(``AstBuild.node_from_schedule_map``) and converts the isl AST into the node
classes below, with every bound, guard and statement argument as texpr IR:

* :class:`For` -- ``for var in range(lo, hi, stride)`` (``hi`` exclusive); isl
  gives exact bounds (``min``/``max``/floor division of affine expressions) and
  turns ``%`` constraints into strides, so no per-iteration test is needed for
  them; a *degenerate* loop runs once (``var = lo``).
* :class:`If` -- a guard isl could not fold into a bound.
* :class:`Block` -- statements in sequence.
* :class:`Stmt` -- one statement instance: its name and ``args``, the value of
  each of the statement's domain Vars as an expression of the loop Vars
  (equalities in the domain are solved here: e.g. a reduction variable fixed by
  ``h = 2*oh + r`` gets no loop of its own).

This module gets islpy only through :mod:`texpr.simplify.isl_bridge`.

Reference: Grosser, Verdoolaege, Cohen, "Polyhedral AST generation is more than
scanning polyhedra", TOPLAS 2015.
"""

import re
import threading

from texpr import expr as E
from texpr.errors import TexprError
from texpr.visitor import substitute

from .isl_bridge import CTX, VarSpace, ast_cond_to_ir, ast_expr_to_ir, dim_name, isl, to_pwaff, to_set

__all__ = ["Statement", "For", "If", "Block", "Stmt", "generate", "runs_exactly", "ast_str",
           "walk"]


class Statement:
    """Input of :func:`generate`: ``name`` (an identifier), ``vars`` (the domain's
    texpr Vars, in order), ``domain`` (an ``isl.Set`` over ``VarSpace(vars)``) and
    ``schedule`` (a tuple of quasi-affine Exprs over ``vars``, one per loop
    dimension; every statement of one call has the same number)."""

    __slots__ = ("name", "vars", "domain", "schedule")

    def __init__(self, name, vars, domain, schedule):
        self.name, self.vars, self.domain = name, tuple(vars), domain
        self.schedule = tuple(E.as_expr(s) for s in schedule)


class For:
    """``for var in range(lo, hi, stride): body``; ``degenerate``: runs exactly once."""

    __slots__ = ("var", "lo", "hi", "stride", "body", "degenerate")

    def __init__(self, var, lo, hi, stride, body, degenerate=False):
        self.var, self.lo, self.hi, self.stride = var, lo, hi, stride
        self.body, self.degenerate = body, degenerate


class If:
    """``if cond: then else: orelse`` (``orelse`` may be None)."""

    __slots__ = ("cond", "then", "orelse")

    def __init__(self, cond, then, orelse=None):
        self.cond, self.then, self.orelse = cond, then, orelse


class Block:
    """A sequence of nodes."""

    __slots__ = ("body",)

    def __init__(self, body):
        self.body = list(body)


class Stmt:
    """One statement instance: ``name`` and ``args`` (an Expr per domain Var)."""

    __slots__ = ("name", "args")

    def __init__(self, name, args):
        self.name, self.args = name, tuple(args)


def _schedule_map(st, loop_vars):
    """``{ name[vars] -> [loop dims] : (vars) in domain, loop_d = schedule_d(vars) }``."""
    n = len(st.vars)
    space = VarSpace(st.vars + tuple(loop_vars))
    s = space.universe()
    # the domain, lifted to the product space
    dom = st.domain.insert_dims(isl.dim_type.set, n, len(loop_vars))
    for k, lv in enumerate(loop_vars):
        dom = dom.set_dim_name(isl.dim_type.set, n + k, dim_name(lv))
    s = s.intersect(dom)
    for expr, lv in zip(st.schedule, loop_vars):
        pa = to_pwaff(expr, space)
        if pa is None:
            raise TexprError(f"loop_ast: schedule expression `{expr!r}` of statement {st.name} "
                             "is not quasi-affine")
        s = s.intersect(pa.eq_set(space.var(lv)))
    m = isl.Map.from_range(s).move_dims(isl.dim_type.in_, 0, isl.dim_type.out, 0, n)
    return m.set_tuple_name(isl.dim_type.in_, st.name)


def generate(statements, loop_vars):
    """The loop nest running ``statements`` in the order of their schedules.

    Args:
        statements: list of :class:`Statement` (distinct names).
        loop_vars: texpr Vars, one per schedule dimension; the generated loops
            use them as iterators (the caller names and types them).
    Returns:
        A :class:`Block`/:class:`For`/:class:`If`/:class:`Stmt` tree, or None
        when every domain is empty.
    Raises:
        TexprError: a non quasi-affine schedule, or an isl AST form this
        converter does not know.
    """
    loop_vars = tuple(loop_vars)
    umap = None
    for st in statements:
        if len(st.schedule) != len(loop_vars):
            raise TexprError(f"loop_ast: statement {st.name} has {len(st.schedule)} schedule "
                             f"dimensions, expected {len(loop_vars)}")
        if st.domain.is_empty():
            continue
        m = isl.UnionMap.from_map(_schedule_map(st, loop_vars))
        umap = m if umap is None else umap.union(m)
    if umap is None:
        return None
    by_name = {dim_name(v): v for v in loop_vars}
    for st in statements:
        by_name.update({dim_name(v): v for v in st.vars})
    live = [st for st in statements if not st.domain.is_empty()]
    key, names = _canonical(umap, loop_vars, by_name)
    with _MADE_LOCK:
        made = _MADE.get(key)
    if made is not None:
        tree = _renamed(made[0], {v: by_name[n] for v, n in zip(made[1], names)})
        if runs_exactly(tree, live, loop_vars) is None:
            return tree
    failures = []
    for form in ("", "residue classes, "):
        # (the residue classes only when isl got every plain form wrong)
        m = umap if not form else _residue_split(live, loop_vars)
        if m is None:
            break
        for option in GENERATORS:
            tag = f"{form}{option or 'default'}"
            try:
                tree = _convert(_ast_node(m, loop_vars, option), by_name)
            except isl.Error as exc:
                failures.append(f"{tag}: {exc}")
                continue
            wrong = runs_exactly(tree, live, loop_vars)
            if wrong is None:
                with _MADE_LOCK:
                    _MADE[key] = (_renamed(tree, {}), [by_name[n] for n in names])
                    while len(_MADE) > _MADE_KEEP:
                        del _MADE[next(iter(_MADE))]
                return tree
            failures.append(f"{tag}: {wrong}")
    raise TexprError(
        "loop_ast: isl could not generate a correct loop nest for the statements "
        f"{', '.join(st.name for st in statements)} ({'; '.join(failures)})")


#: the most pieces :func:`_residue_split` cuts one statement's domain into
MAX_RESIDUE_PIECES = 64


def _residue_split(statements, loop_vars):
    """The schedule map of ``statements`` with each domain that has integer divisions
    (``floor(e / d)``) written as the union of its residue classes (``e - r`` a
    multiple of ``d``, for each ``r < d``): the same points, in a form where each
    division is affine. isl's AST generator can drop a loop of a domain whose
    division reads an inner loop's variable (islpy 2026.2: ``{ [j, r] : 4j - r <=
    4 floor((1 + j) / 2) <= 3 + 4j - r }`` scheduled ``r`` outer ran ``j = 0``
    only: a grouped convolution's input gradient); the classes' form it generates
    correctly. None when no domain has a division, or a split would exceed
    :data:`MAX_RESIDUE_PIECES` pieces."""
    try:
        return _residue_split_map(statements, loop_vars)
    except isl.Error:  # (a division isl cannot write out: no split)
        return None


def _residue_split_map(statements, loop_vars):
    umap, any_div = None, False
    for st in statements:
        pieces = []
        for bset in st.domain.compute_divs().get_basic_sets():
            ls = bset.get_local_space()
            parts = [bset]
            for k in range(bset.dim(isl.dim_type.div)):
                div = ls.get_div(k)
                den = div.get_denominator_val()
                num = div.scale_val(den)  # the division's integer numerator e
                d = int(den.to_python())
                if d <= 1:
                    continue
                any_div = True
                parts = [p.intersect(num.add_constant_val(isl.Val.int_from_si(CTX, -r))
                                     .mod_val(den).zero_basic_set())
                         for p in parts for r in range(d)]
                if len(parts) > MAX_RESIDUE_PIECES:
                    return None
            pieces += [p for p in parts if not p.is_empty()]
        dom = None
        for p in pieces:
            dom = isl.Set.from_basic_set(p) if dom is None else dom.union(isl.Set.from_basic_set(p))
        if dom is None:
            continue
        m = isl.UnionMap.from_map(_schedule_map(Statement(st.name, st.vars, dom, st.schedule),
                                                loop_vars))
        umap = m if umap is None else umap.union(m)
    return umap if any_div else None


#: the loop nests :func:`generate` made in this process, oldest first: {canonical text
#: of the schedule map (:func:`_canonical`): (the loop nest, its Vars in the canonical
#: order)}; at most ``_MADE_KEEP``
_MADE = {}
_MADE_KEEP = 1024
_MADE_LOCK = threading.Lock()
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _canonical(umap, loop_vars, by_name):
    """``(key, names)``: the text of the schedule map ``umap`` with the dimension
    names of texpr Vars (``by_name``) replaced by their position in ``names``
    (the loop dimensions first, then the others in order of appearance), and their
    dtypes. Stages of repeated layers give equal keys (their Vars differ only in
    their unique ids); isl's AST generator works on positions, so their loop nests
    are one nest with the Vars renamed."""
    names = [dim_name(v) for v in loop_vars]
    pos = {n: k for k, n in enumerate(names)}

    def sub(m):
        n = m.group(0)
        if n not in by_name:
            return n
        k = pos.get(n)
        if k is None:
            k = pos[n] = len(names)
            names.append(n)
        return f"@{k}"
    text = _IDENT.sub(sub, str(umap))
    return (text, tuple(by_name[n].dtype for n in names)), names


def _renamed(node, mapping):
    """A copy of loop AST ``node`` with the Vars of ``mapping`` ({Var: Var})
    replaced (a new tree: the caller may change its nodes)."""
    if node is None:
        return None
    if isinstance(node, Block):
        return Block([_renamed(c, mapping) for c in node.body])
    if isinstance(node, For):
        var = next((v for k, v in mapping.items() if k is node.var), node.var)
        return For(var, substitute(node.lo, mapping),
                   substitute(node.hi, mapping), node.stride, _renamed(node.body, mapping),
                   node.degenerate)
    if isinstance(node, If):
        return If(substitute(node.cond, mapping), _renamed(node.then, mapping),
                  _renamed(node.orelse, mapping))
    return Stmt(node.name, [substitute(a, mapping) for a in node.args])


#: isl's AST generators tried in turn (None: the default, separating one; then
#: the *atomic* option: one loop per statement and level, guards where the
#: pieces differ). The first whose loop nest :func:`runs_exactly` the statements
#: is used. Some unions of pieces with existentially quantified divisions make
#: the default fail inside ``isl_map_simplify`` ("total dimensionality changed
#: unexpectedly", isl 0.26/0.27), and islpy 2026.2.2's default generator once
#: returned a loop nest without the points of a reduction variable's second
#: value (``k = 1`` of ``{[j0, j1, k] : 0 <= k <= 1 and (j0 + k) % 3 + j0 >= 2
#: and ...}``: a gradient silently missing terms, tests/test_codegen_loop_ast.py);
#: the atomic one got both right.
GENERATORS = (None, "atomic", "separate")


def _ast_node(umap, loop_vars, option=None):
    """isl's AST of a schedule map with the AST-generation ``option`` (None,
    "atomic", "separate") on every loop dimension; raises isl.Error."""
    ids = isl.IdList.alloc(CTX, len(loop_vars))
    for lv in loop_vars:
        ids = ids.add(isl.Id(dim_name(lv)))
    context = isl.Set.universe(isl.Space.params_alloc(CTX, 0))
    build = isl.AstBuild.from_context(context).set_iterators(ids)
    if option is not None:
        dims = ", ".join(f"c{k}" for k in range(len(loop_vars)))
        build = build.set_options(isl.UnionMap(f"{{ [{dims}] -> {option}[x] }}", context=CTX))
    return build.node_from_schedule_map(umap)


def runs_exactly(tree, statements, loop_vars):
    """Translation validation of a generated loop nest (Pnueli, Siegel,
    Singerman, "Translation validation", TACAS 1998: check each output of the
    translator, not the translator).

    Args:
        tree: a loop AST (:class:`Block`/:class:`For`/:class:`If`/:class:`Stmt`).
        statements: the :class:`Statement` s it should run (non-empty domains).
        loop_vars: the Vars of the loop dimensions, as given to :func:`generate`.
    Returns:
        None when ``tree`` runs every point of every statement's domain exactly
        once and nothing else; else a sentence saying what is wrong. Each
        :class:`Stmt` node's instances are the isl set of the loop points its
        enclosing bounds and guards admit, mapped through its arguments; each
        instance must come from one loop point, the instances of one statement
        must be disjoint across nodes, and their union its domain. The order is
        isl's to keep: it may run an instance at another iterator value than its
        schedule's (two residue classes in one stride-2 loop, ``U0(c, 2);
        U2(c + 1, 1)``), still in schedule order.
    """
    by_stmt = {st.name: st for st in statements}
    found = {st.name: [] for st in statements}
    problems = []

    def visit(node, conds, bound=()):
        if node is None or problems:
            return
        if isinstance(node, Block):
            for c in node.body:
                visit(c, conds, bound)
        elif isinstance(node, For):
            v = node.var
            if node.degenerate:
                here = [E.as_expr(v) == node.lo]
            else:
                here = [E.as_expr(v) >= node.lo, E.as_expr(v) < node.hi]
                if node.stride != 1:
                    here.append(E.floormod(E.as_expr(v) - node.lo, node.stride) == 0)
            visit(node.body, conds + here, bound + (id(v),))
        elif isinstance(node, If):
            visit(node.then, conds + [node.cond], bound)
            visit(node.orelse, conds + [E.logical_not(node.cond)], bound)
        elif isinstance(node, Stmt):
            st = by_stmt.get(node.name)
            if st is None or len(node.args) != len(st.vars):
                problems.append(f"an instance of an unknown statement {node.name}")
                return
            space = VarSpace(tuple(loop_vars) + st.vars)
            rel = space.universe()
            parts = conds + [E.as_expr(v) == a for v, a in zip(st.vars, node.args)]
            for c in parts:
                s, resid = to_set(c, space)
                if resid is not None:
                    problems.append(f"a condition isl's output should not have: {c!r}")
                    return
                rel = rel.intersect(s)
            # each instance at one point of the loops around it (dimensions
            # without a loop here are free in rel: left out)
            n_loop = len(loop_vars)
            loops = rel
            for d in reversed(range(n_loop)):
                if id(loop_vars[d]) not in bound:
                    loops = loops.project_out(isl.dim_type.set, d, 1)
            n_b = loops.dim(isl.dim_type.set) - len(st.vars)
            once = isl.Map.from_range(loops).move_dims(isl.dim_type.in_, 0, isl.dim_type.out,
                                                       n_b, len(st.vars))
            if not once.is_single_valued():
                problems.append(f"{node.name} runs some points twice")
                return
            found[node.name].append(rel.project_out(isl.dim_type.set, 0, n_loop))

    visit(tree, [])
    if problems:
        return problems[0]
    for st in statements:
        got = VarSpace(st.vars).empty()
        for piece in found[st.name]:
            if not got.intersect(piece).is_empty():
                return f"{st.name} runs some points twice"
            got = got.union(piece)
        if not got.is_equal(st.domain):
            missing = "misses points" if not st.domain.is_subset(got) else "runs extra points"
            return f"{st.name} {missing} of its domain"
    return None


def _convert(node, by_name):
    t = node.get_type()
    if t == isl.ast_node_type.block:
        ch = node.block_get_children()
        return Block([_convert(ch.get_at(k), by_name) for k in range(ch.n_ast_node())])
    if t == isl.ast_node_type.for_:
        it = node.for_get_iterator()
        var = by_name[it.get_id().get_name()]
        lo = ast_expr_to_ir(node.for_get_init(), by_name)
        body = _convert(node.for_get_body(), by_name)
        if node.for_is_degenerate():
            return For(var, lo, E.add(lo, 1), 1, body, degenerate=True)
        cond = node.for_get_cond()
        op = cond.get_op_type()
        lhs = cond.get_op_arg(0)
        if (lhs.get_type() != isl.ast_expr_type.id
                or lhs.get_id().get_name() != it.get_id().get_name()
                or op not in (isl.ast_expr_op_type.le, isl.ast_expr_op_type.lt)):
            raise TexprError(f"loop_ast: unexpected loop condition {cond.to_C_str()}")
        bound = ast_expr_to_ir(cond.get_op_arg(1), by_name)
        hi = E.add(bound, 1) if op == isl.ast_expr_op_type.le else bound
        stride = node.for_get_inc().get_val().to_python()
        return For(var, lo, hi, int(stride), body)
    if t == isl.ast_node_type.if_:
        cond = ast_cond_to_ir(node.if_get_cond(), by_name)
        then = _convert(node.if_get_then_node(), by_name)
        orelse = _convert(node.if_get_else_node(), by_name) if node.if_has_else_node() else None
        return If(cond, then, orelse)
    if t == isl.ast_node_type.user:
        e = node.user_get_expr()
        name = e.get_op_arg(0).get_id().get_name()
        args = [ast_expr_to_ir(e.get_op_arg(k), by_name) for k in range(1, e.get_op_n_arg())]
        return Stmt(name, args)
    if t == isl.ast_node_type.mark:
        return _convert(node.mark_get_node(), by_name)
    raise TexprError(f"loop_ast: unsupported isl AST node {t}")


def walk(node):
    """Every node of a loop AST, parents first."""
    if node is None:
        return
    yield node
    if isinstance(node, Block):
        for c in node.body:
            yield from walk(c)
    elif isinstance(node, For):
        yield from walk(node.body)
    elif isinstance(node, If):
        yield from walk(node.then)
        yield from walk(node.orelse)


def ast_str(node, indent=0):
    """A readable text of a loop AST (debugging and golden tests)."""
    from texpr.printer import expr_str

    pad = "  " * indent
    if node is None:
        return pad + "pass"
    if isinstance(node, Block):
        return "\n".join(ast_str(c, indent) for c in node.body)
    if isinstance(node, For):
        if node.degenerate:
            head = f"{pad}{node.var.name} = {expr_str(node.lo)}"
            return head + "\n" + ast_str(node.body, indent)
        step = f", {node.stride}" if node.stride != 1 else ""
        head = f"{pad}for {node.var.name} in range({expr_str(node.lo)}, {expr_str(node.hi)}{step}):"
        return head + "\n" + ast_str(node.body, indent + 1)
    if isinstance(node, If):
        out = f"{pad}if {expr_str(node.cond)}:\n" + ast_str(node.then, indent + 1)
        if node.orelse is not None:
            out += f"\n{pad}else:\n" + ast_str(node.orelse, indent + 1)
        return out
    return f"{pad}{node.name}(" + ", ".join(expr_str(a) for a in node.args) + ")"
