"""Generic traversal and rewriting of expressions (every pass builds on these).

Because nodes are interned, memoising on node identity visits each distinct
subexpression once, however often it is shared.
"""

from .expr import Expr, IterVar, Load, Reduce, Var


def post_order(root):
    """Every distinct node of ``root`` (an Expr or an iterable of Exprs), children first."""
    roots = [root] if isinstance(root, Expr) else list(root)
    seen, order = set(), []
    stack = [(r, False) for r in reversed(roots)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for child in reversed(node.args):
            if id(child) not in seen:
                stack.append((child, False))
    return order


def transform(root, fn):
    """Rewrite bottom-up: ``fn(node_with_new_children)`` returns a replacement or None.

    Works on one Expr or a tuple/list of Exprs (returned as a tuple).
    """
    memo = {}
    for node in post_order(root):
        new = node.with_args(tuple(memo[id(c)] for c in node.args)) if node.args else node
        out = fn(new)
        memo[id(node)] = new if out is None else out
    if isinstance(root, Expr):
        return memo[id(root)]
    return tuple(memo[id(r)] for r in root)


def substitute(root, mapping):
    """Replace variables (or any node) by expressions: ``mapping`` is {node: Expr}.

    Reduction axes that are mapped to other IterVars are renamed inside the
    ``Reduce`` nodes' ``attr`` too.
    """
    if not mapping:
        return root
    by_id = {id(k): v for k, v in mapping.items()}

    def fn(node):
        hit = by_id.get(id(node))
        if hit is not None:
            return hit
        if isinstance(node, Reduce) and any(id(a) in by_id for a in node.axes):
            axes = tuple(by_id.get(id(a), a) for a in node.axes)
            if all(isinstance(a, IterVar) for a in axes):
                return Reduce._rebuild((node.combiner, axes, node.value_index), node.args)
        return None

    # map leaves first: transform only calls fn on rebuilt nodes, leaves included
    return transform(root, fn)


def free_vars(root):
    """The Vars (including IterVars) ``root`` mentions, reduction axes of its Reduces excluded."""
    out, bound = [], set()
    nodes = post_order(root)
    for n in nodes:
        if isinstance(n, Reduce):
            bound.update(id(a) for a in n.axes)
    seen = set()
    for n in nodes:
        if isinstance(n, Var) and id(n) not in bound and id(n) not in seen:
            seen.add(id(n))
            out.append(n)
    return out


def loads(root, tensor=None):
    """All distinct Load nodes in ``root`` (of ``tensor`` only, when given)."""
    return [n for n in post_order(root)
            if isinstance(n, Load) and (tensor is None or n.tensor is tensor)]


def contains(root, pred):
    """Whether any node of ``root`` satisfies ``pred``."""
    return any(pred(n) for n in post_order(root))


#: the deepest expression a compute body may be (nodes on the longest root-to-leaf
#: path). Deeper bodies are rejected where they are built: the recursive walks of
#: the evaluator, the derivative rules, the printer and SymPy, and the parentheses
#: of the generated source (Python's parser allows 200 levels) all stay within
#: bounds below it, for the body and its gradient. Split a deeper expression into
#: stages (each its own te.compute).
MAX_DEPTH = 64


def depth(root):
    """Nodes on the longest root-to-leaf path of ``root`` (an Expr or several),
    computed without recursion; 0 for no expressions."""
    d = {}
    for n in post_order(root):
        d[id(n)] = 1 + max((d[id(c)] for c in n.args), default=0)
    roots = [root] if isinstance(root, Expr) else list(root)
    return max((d[id(r)] for r in roots), default=0)


def tree_sizes(roots):
    """``(order, size, uses)`` of the DAG under ``roots`` (an iterable of Exprs):
    ``order`` its distinct nodes, children first (:func:`post_order`); ``size``
    id -> nodes of the node's subtree written as a tree (each use of a shared
    node counted again); ``uses`` id -> number of parent edges (how often the
    DAG reads the node). A chain of selects each reading the level below
    several times has O(d) nodes and trees of O(3^d): the printer's let form and
    codegen's shared bindings decide by these counts."""
    order = post_order(list(roots))
    size, uses = {}, {}
    for n in order:
        size[id(n)] = 1 + sum(size[id(c)] for c in n.args)
        for c in n.args:
            uses[id(c)] = uses.get(id(c), 0) + 1
    return order, size, uses
