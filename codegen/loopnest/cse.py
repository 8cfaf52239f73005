"""Common subexpressions of a generated statement, computed once.

One job: :func:`hoist_common_subexpressions` rewrites a unit's text so that a
subexpression repeated within one statement's right-hand side is assigned to
a temporary just before the statement and read from it. Inlining cheap
stages into their consumers (the gates of an RNN cell into their
derivatives, ``sigmoid(z)`` used three times) writes the same subexpression
several times into one line; the compiler types and lowers every copy, and its
compile time grows with them (a GRU cell's gradient had two units of 11 KB
lines at about 6 s each).

A statement whose value is a conditional expression (``x = A if c else B``,
what a ``select`` of the graph becomes) is first turned into an ``if``
statement with one assignment per branch, so that the repeats inside each
branch can be hoisted within it; a large select inside the value is computed
first by an ``if`` statement of its own when no run-time check of the
statement comes before it. What is hoisted, so that no evaluation is
added or moved past a condition, and the run-time check that fails first is
still the one reported:
an operation of at least ``MIN_NODES`` expression nodes that occurs at
least twice in the statement, at least once where it is always evaluated:
not only inside one branch of a conditional expression (``a if c else b``) or
behind a short-circuit operator (``and``/``or``), and that holds no run-time
check (``_ck``, ``_rk``, ``_nz``). The copies inside branches then read the
temporary too (computed anyway before the statement). The statement's own
order of evaluation for everything else is unchanged.
"""

import ast
import copy

from .source import parse_module

__all__ = ["hoist_common_subexpressions", "MIN_NODES", "SPLIT_NODES"]

#: the smallest subexpression (in expression nodes) worth a temporary: a load
#: through a computed index (``b1[np.uint64(i * 4 + j)]``: 10) is, index
#: arithmetic alone (``i * 9``: 3) is not (LLVM shares that anyway)
MIN_NODES = 8
#: the smallest conditional expression turned into an if statement (smaller ones
#: stay expressions, which LLVM can turn into straight-line selects)
SPLIT_NODES = 100
_PREFIX = "cse"


class _Index:
    """Structural keys and sizes of every expression node under some roots,
    computed bottom-up once (``ast.dump`` per node would be quadratic): equal
    subtrees get the same key (an int)."""

    def __init__(self, roots):
        self.table, self.key, self.size, self.count = {}, {}, {}, {}
        for r in roots:
            self._visit(r)

    def _visit(self, node):
        parts = [type(node).__name__]
        size = 1 if isinstance(node, ast.expr) else 0
        for name, value in ast.iter_fields(node):
            if isinstance(value, ast.AST):
                parts.append((name, self._visit(value)))
                size += self.size[id(value)]
            elif isinstance(value, list):
                keys = []
                for v in value:
                    if isinstance(v, ast.AST):
                        keys.append(self._visit(v))
                        size += self.size[id(v)]
                    else:
                        keys.append(repr(v))
                parts.append((name, tuple(keys)))
            else:
                parts.append((name, repr(value)))
        k = self.table.setdefault(tuple(parts), len(self.table))
        self.key[id(node)], self.size[id(node)] = k, size
        if isinstance(node, ast.expr):
            self.count[k] = self.count.get(k, 0) + 1
        return k


def _size(node):
    """Expression nodes in ``node`` (names, constants, operations; not contexts)."""
    return sum(1 for n in ast.walk(node) if isinstance(n, ast.expr))


def _unconditional(node, out, index):
    """Collect the subexpressions of ``node`` that are always evaluated: those in
    the condition of a conditional expression, and those its two branches both
    always evaluate (equal subtrees, by ``index``'s keys: one of them runs
    whichever way the condition goes), not those of one branch only."""
    out.append(node)
    if isinstance(node, ast.IfExp):
        _unconditional(node.test, out, index)
        arms = []
        for branch in (node.body, node.orelse):
            arms.append([])
            _unconditional(branch, arms[-1], index)
        both = {index.key[id(n)] for n in arms[1]}
        out.extend(n for n in arms[0] if index.key[id(n)] in both)
    elif isinstance(node, ast.BoolOp):
        _unconditional(node.values[0], out, index)
    elif isinstance(node, ast.Lambda):
        return
    else:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                _unconditional(child, out, index)


class _Replace(ast.NodeTransformer):
    """Every subtree whose key (in ``index``) is ``key`` becomes the name ``name``."""

    def __init__(self, index, key, name):
        self.index, self.key, self.name = index, key, name

    def generic_visit(self, node):
        if isinstance(node, ast.expr) and self.index.key.get(id(node)) == self.key:
            return ast.copy_location(ast.Name(self.name, ast.Load()), node)
        return super().generic_visit(node)


_HOISTABLE = (ast.BinOp, ast.UnaryOp, ast.Call, ast.Subscript, ast.Compare, ast.IfExp)


def _candidate(values, index):
    """The key and a node of the largest subexpression to hoist from the
    expressions ``values`` (evaluated in this order, each always), or None."""
    best = None
    # a subexpression holding a run-time check stays where it is: computed first,
    # its check would run before the statement's earlier checks
    checked = set()
    for value in values:
        _mark_checked(value, checked)
    for value in values:
        always = []
        _unconditional(value, always, index)
        for n in always:
            if n is value or not isinstance(n, _HOISTABLE) or id(n) in checked:
                continue
            k = index.key[id(n)]
            if index.count.get(k, 0) < 2:
                continue
            size = index.size[id(n)]
            if size >= MIN_NODES and (best is None or size > best[0]):
                best = (size, k, n)
    return None if best is None else best[1:]


def _mark_checked(node, checked):
    """Add to ``checked`` the ids of ``node``'s subtrees that hold a run-time check;
    whether ``node`` does."""
    has = _is_check(node)
    for c in ast.iter_child_nodes(node):
        has = _mark_checked(c, checked) or has
    if has:
        checked.add(id(node))
    return has


def _rewrite(stmt, counter):
    """``(hoisted assignment statements, the statement)`` with the repeated
    subexpressions of its value computed once, largest first (a temporary's own
    definition may read an earlier one)."""
    seq = [stmt]
    while True:
        index = _Index([st.value for st in seq])
        found = _candidate([st.value for st in seq], index)
        if found is None:
            return seq[:-1], seq[-1]
        key, node = found
        name = f"{_PREFIX}{next(counter)}"
        first = next(i for i, st in enumerate(seq)
                     if any(index.key.get(id(n)) == key for n in ast.walk(st.value)))
        definition = ast.fix_missing_locations(ast.copy_location(
            ast.Assign([ast.Name(name, ast.Store())], node,
                       lineno=stmt.lineno), stmt))
        for st in seq[first:]:  # (``node`` leaves the tree: it is the definition now)
            st.value = _Replace(index, key, name).visit(st.value)
        seq.insert(first, definition)


def _transform(stmt, counter):
    """``(statements, changed)``: ``stmt`` whose value is a conditional expression
    becomes an ``if`` statement with one assignment per branch (the same
    evaluation: the condition, then the taken branch, then the store), so that
    the repeats inside a branch are hoisted within it; then each assignment's
    repeated subexpressions are hoisted (:func:`_rewrite`)."""
    v = stmt.value
    if isinstance(v, ast.IfExp) and _size(v) >= SPLIT_NODES:
        # what the condition computes and a branch reuses (a chain of selects:
        # each level's value is compared, then used) is computed once, first
        # (the value itself is never hoisted: it stays the conditional expression)
        first, stmt = _rewrite(stmt, counter)
        v = stmt.value
        arms = []
        for branch in (v.body, v.orelse):
            leaf = copy.copy(stmt)
            leaf.value = branch
            arms.append(_transform(leaf, counter)[0])
        node = ast.copy_location(ast.If(v.test, arms[0], arms[1]), stmt)
        return first + [node], True
    # the repeats that the whole value always evaluates first (the conditions of a
    # sum of selects share their subexpressions: a chain of selects in one body
    # repeats each level's value in every term's condition), then a large select
    # inside the value (e.g. a sum of selects, one per term of a Jacobian) is
    # computed by an if statement of its own
    out, stmt = _rewrite(stmt, counter)
    v = stmt.value
    for sel in _large_selects(v):
        name = f"{_PREFIX}{next(counter)}"
        tmp = ast.copy_location(ast.Assign([ast.Name(name, ast.Store())], sel,
                                           lineno=stmt.lineno), stmt)
        out += _transform(tmp, counter)[0]
        stmt.value = _ReplaceNode(sel, name).visit(stmt.value)
    hoisted, new = _rewrite(stmt, counter)
    return out + hoisted + [new], bool(out or hoisted)


#: the run-time checks of generated code (codegen.analysis.bounds, codegen.loopnest.emit): calls
#: that flag an error; the first one to fail is the one reported
_CHECKS = frozenset({"_ck", "_rk", "_nz", "_fail", "_iadd", "_isub", "_imul",
                     "_ifloordiv"})


def _is_check(node):
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in _CHECKS)


def _has_check(node):
    return any(_is_check(n) for n in ast.walk(node))


def _large_selects(value):
    """The conditional expressions of at least ``SPLIT_NODES`` nodes that ``value``
    always evaluates (not inside another one's branch, nor behind ``and``/``or``),
    left to right, that may run first: up to the first run-time check of the
    statement outside them (evaluation order), so that the check that fails
    first is still the one reported."""
    found = []
    blocked = [False]

    def visit(n):
        if isinstance(n, ast.IfExp):
            if not blocked[0] and n is not value and _size(n) >= SPLIT_NODES:
                found.append(n)
            elif _has_check(n):
                blocked[0] = True
            return
        if isinstance(n, ast.BoolOp):
            visit(n.values[0])
            if any(_has_check(v) for v in n.values[1:]):
                blocked[0] = True
            return
        for c in ast.iter_child_nodes(n):  # Python's order of evaluation
            if isinstance(c, ast.expr):
                visit(c)
        if _is_check(n):
            blocked[0] = True
    visit(value)
    return found


class _ReplaceNode(ast.NodeTransformer):
    def __init__(self, node, name):
        self.node, self.name = node, name

    def generic_visit(self, node):
        if node is self.node:
            return ast.copy_location(ast.Name(self.name, ast.Load()), node)
        return super().generic_visit(node)


def hoist_common_subexpressions(source, func):
    """``source`` (a module text) with the statements of function ``func``
    rewritten as the module docstring says. Returns ``source`` unchanged when
    nothing repeats (or ``func`` is absent). Only single-line assignment
    statements (``x = e``, ``x op= e``, ``a[i] = e``) are rewritten; the
    other lines keep their text."""
    tree = parse_module(source)
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == func), None)
    if fn is None:
        return source
    if any(isinstance(n, ast.Name) and n.id.startswith(_PREFIX) for n in ast.walk(fn)):
        return source  # never rename over identifiers we did not make
    lines = source.splitlines()
    counter = iter(range(1 << 30))
    edits = {}
    stmts = [st for st in ast.walk(fn) if isinstance(st, (ast.Assign, ast.AugAssign))]
    for st in stmts:
        if st.lineno != st.end_lineno:
            continue
        if _size(st.value) < 2 * MIN_NODES:
            continue
        new, changed = _transform(st, counter)
        if not changed:
            continue
        line = lines[st.lineno - 1]
        indent = line[:len(line) - len(line.lstrip())]
        text = "\n".join(ast.unparse(ast.fix_missing_locations(n)) for n in new)
        edits[st.lineno - 1] = [indent + ln for ln in text.splitlines()]
    if not edits:
        return source
    out = []
    for k, line in enumerate(lines):
        out.extend(edits.get(k, [line]))
    return "\n".join(out) + ("\n" if source.endswith("\n") else "")
