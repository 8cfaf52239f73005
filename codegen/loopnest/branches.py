"""Large values of a statement written as statements of their own, in their order of evaluation.

One job: :func:`bind_branches`, which the stage lowering
(:class:`codegen.loopnest.stage._StageLowering`) calls for each value of a
statement after :meth:`codegen.loopnest.emit.ExprEmitter.bind_shared`: a select
or ``and``/``or`` whose branches compute something worth a name becomes an
``if`` block, nodes with a run-time check and shared nodes get variables on
their path, and a value too deep for the parser is written in parts.
"""

from texpr import expr as E
from texpr.visitor import tree_sizes

from ..options import current as _opts

__all__ = ["bind_branches"]


def bind_branches(sl, em, depth, e):
    """After :meth:`codegen.loopnest.stage._StageLowering._bind_shared`, a value ``e`` still larger than
    ``options.let_tree_nodes`` as a tree is computed before its statement as statements
    in its own order of evaluation: a select whose branches compute something
    worth a name becomes ``if c: v = a`` / ``else: v = b`` (an ``and``/``or``
    likewise), and within each block every node with a run-time check and
    every shared node (of at least ``options.let_min_nodes`` tree nodes) gets a
    variable at its first evaluation on that path; a branch's variables are
    forgotten after it. ``e`` is emitted by name from then on.

    That is a chain of selects behind a guarded load (a gather at a data
    index, its load checked, read only where the index is in range):
    :meth:`ExprEmitter.bind_shared` binds only what the statement always
    evaluates, so the chain and its derivative stayed trees of O(3^d) text (a
    fuzzed gradient scatter, seed 7007400007: 430 KB of source, the compiler out of
    memory at 23 GB). Checks run in the value's order (each in a statement of
    its own, in order), so the one that fails first stays the one reported.
    A value whose text would nest deeper than ``options.text_max_height`` parentheses is
    written the same way, a node at that height bound (a derivative's sum of
    216 terms, each in a branch of its own: fuzz seed 7007500472).
    Returns the ids to unbind after the statement."""
    order, size, uses = tree_sizes([e])
    # too deep to parse is written in parts whatever its size (an attack: a select
    # over a 2,000-node tree and a chain of 45 checked gathers was a SyntaxError)
    if em.unbound_height([e]) <= _opts().text_max_height and (
            em.unbound_tree_nodes([e]) <= _opts().let_tree_nodes
            or len(order) > _opts().let_max_dag_nodes):
        return []
    bound = []
    _Branches(sl, em, size, uses).block(e, depth, bound)
    return bound


class _Branches:
    """The state of one :func:`bind_branches`: ``checked`` (id -> whether
    emitting the node runs a check not bound yet), ``heights`` (id -> how deep the
    node's text nests now; a bound node: 0), the names' ``prefix`` and ``count``."""

    def __init__(self, sl, em, size, uses):
        self.sl, self.em, self.size, self.uses = sl, em, size, uses
        self.vc = em.value_checks
        self.checked = {}
        self.heights = {}
        self.prefix = f"s{sl.k}_{sl._fresh()}_"
        self.count = 0

    def height(self, n):
        hit = self.heights.get(id(n))
        if hit is None:
            em = self.em
            hit = 0 if id(n) in em.bound else em.text_weight(n) + max(
                map(self.height, n.args), default=0)
            self.heights[id(n)] = hit
        return hit

    def has_check(self, n):
        hit = self.checked.get(id(n))
        if hit is None:
            em = self.em
            hit = id(n) not in em.bound and (
                em._has_own_check(n) or any(self.has_check(c) for c in n.args))
            self.checked[id(n)] = hit
        return hit

    def worth(self, n):
        """Whether the node would write a statement of its own."""
        return (id(n) not in self.em.bound and id(n) not in self.vc
                and (self.has_check(n) or self.size[id(n)] > _opts().inline_nodes))

    def first_in(self, arm, hoisted):
        """The nodes worth a statement that ``arm`` evaluates before any check
        outside ``hoisted`` (ids), in its order of evaluation."""
        em, vc = self.em, self.vc
        out, pending = [], [False]

        def walk(n):
            if pending[0] or id(n) in em.bound:
                return
            if id(n) in vc:
                pending[0] = True
                return
            if not self.worth(n):
                return
            if id(n) in hoisted:  # computed before the if: its checks come first
                out.append(n)
                return
            if isinstance(n, E.Select):
                walk(n.cond)
                late = self.has_check(n.true_value) or self.has_check(n.false_value)
            elif isinstance(n, (E.And, E.Or)):
                walk(n.a)
                late = self.has_check(n.b)
            else:
                for c in n.args:
                    walk(c)
                late = em._has_own_check(n) or any(id(c) in vc for c in n.args)
            if not pending[0]:
                out.append(n)
            pending[0] = pending[0] or late

        walk(arm)
        return out

    def in_both_arms(self, n):
        """What both branches of the select ``n`` compute first (before any other
        check of theirs): computed once before its ``if``, checks in order."""
        hoisted = set()
        while True:  # grows: a hoisted node's checks no longer hold later ones back
            b = {id(x) for x in self.first_in(n.false_value, hoisted)}
            both = [x for x in self.first_in(n.true_value, hoisted) if id(x) in b]
            if {id(x) for x in both} == hoisted:
                return both
            hoisted = {id(x) for x in both}

    def name(self):
        name = f"{self.prefix}{self.count}"
        self.count += 1
        return name

    def bind(self, n, d, text, scope):
        name = self.name()
        self.sl.w(d, f"{name} = {text}")
        self.em.bound[id(n)] = name
        self.heights[id(n)] = 0
        scope.append(id(n))

    def forget(self, inner):
        """A branch's names are gone: unbind them and recount."""
        self.em.unbind(inner)
        self.checked.clear()
        self.heights.clear()

    def block(self, n, d, scope):
        """The statements of ``n`` at depth ``d``."""
        if not self.worth(n):
            return
        if isinstance(n, E.Select) and (self.worth(n.true_value) or self.worth(n.false_value)):
            return self.select_block(n, d, scope)
        if isinstance(n, (E.And, E.Or)) and self.worth(n.b):
            return self.logic_block(n, d, scope)
        if isinstance(n, E.Select):
            kids = (n.cond,)  # branches inline: nothing in them worth a statement
        elif isinstance(n, (E.And, E.Or)):
            kids = (n.a,)
        else:
            kids = n.args
        for c in kids:
            self.block(c, d, scope)
        em = self.em
        if (em._has_own_check(n) or any(id(c) in self.vc for c in n.args)
                or (self.uses.get(id(n), 0) >= 2 and self.size[id(n)] >= _opts().let_min_nodes)
                or self.height(n) >= _opts().text_max_height):
            self.bind(n, d, em(n), scope)

    def select_block(self, n, d, scope):
        """A select whose branches compute something worth a statement: ``if``."""
        em, w = self.em, self.sl.w
        self.block(n.cond, d, scope)
        for c in self.in_both_arms(n):  # before the if, once (not 2^depth times)
            self.block(c, d, scope)
        name = self.name()
        w(d, f"if {em(n.cond)}:")
        for k, arm in enumerate((n.true_value, n.false_value)):
            if k:
                w(d, "else:")
            inner = []
            self.block(arm, d + 1, inner)
            w(d + 1, f"{name} = {em.cast(arm, n.dtype)}")
            self.forget(inner)
        em.bound[id(n)] = name
        scope.append(id(n))

    def logic_block(self, n, d, scope):
        """An ``and``/``or`` whose right operand is worth a statement: ``if``."""
        em, w = self.em, self.sl.w
        self.block(n.a, d, scope)
        name = self.name()
        w(d, f"{name} = {em(n.a)}")
        w(d, f"if {name}:" if isinstance(n, E.And) else f"if not {name}:")
        inner = []
        self.block(n.b, d + 1, inner)
        w(d + 1, f"{name} = {em(n.b)}")
        self.forget(inner)
        em.bound[id(n)] = name
        scope.append(id(n))
