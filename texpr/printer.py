"""Deterministic text of expressions, stages and graphs (errors, golden tests, hashing).

``expr_str(e)`` prints infix with minimal parentheses; ``tensor_str(t)`` prints
one stage's definition (a compute's axes as ``i<n``: they run over ``[0, n)``;
reduction axes and a scatter's domain as ``k:lo..hi``, lower bound included); ``graph_str(outputs)`` every stage reachable from the
outputs, producers first. With ``canonical=True`` variables are renamed in
order of first appearance (``v0, v1, ...``; reduction axes ``r0, ...``) and
tensors ``t0, t1, ...``, so that two structurally equal graphs print the same
text whatever their names -- the basis of kernel caching.

This module knows expression nodes only (it sits below the stages, as the nodes
sit below everything that prints them): each kind of stage writes its own
definition (``Operation._definition(t, names)`` in :mod:`texpr.tensor` and
:mod:`texpr.scan`) with the helpers of :class:`_Names`, and the stage order is
:func:`texpr.topo.topo_order`'s.
"""

from . import expr as _expr
from .expr import (Add, And, Call, Cast, CmpOp, Const, Div, EQ, FloorDiv, FloorMod, GE, GT,
                   IterVar, LE, LT, Load, Max, Min, Mul, NE, Not, Or, Reduce, Select, Sub, Var)
from .topo import topo_order
from .visitor import tree_sizes

_INFIX = {Add: ("+", 4), Sub: ("-", 4), Mul: ("*", 5), Div: ("/", 5), FloorDiv: ("//", 5),
          FloorMod: ("%", 5), EQ: ("==", 3), NE: ("!=", 3), LT: ("<", 3), LE: ("<=", 3),
          GT: (">", 3), GE: (">=", 3), And: ("&&", 2), Or: ("||", 1)}
_ATOM = 9


class _Names:
    """The names a printing uses (canonical: numbered by first appearance), and the
    helpers a stage's ``_definition`` writes its text with."""

    def __init__(self, canonical):
        self.canonical = canonical
        self.vars, self.tensors = {}, {}
        self.bound = None  # id(node) -> its name in a let form (_let_form)

    def var(self, v):
        if not self.canonical:
            return v.name
        n = self.vars.get(id(v))
        if n is None:
            is_red = isinstance(v, IterVar) and v.kind == "reduce"
            prefix = "r" if is_red else "v"
            n = f"{prefix}{sum(1 for k in self.vars.values() if k[0] == prefix)}"
            self.vars[id(v)] = n
        return n

    def tensor(self, t):
        if not self.canonical:
            return t.name
        n = self.tensors.get(id(t))
        if n is None:
            n = f"t{len(self.tensors)}"
            self.tensors[id(t)] = n
        return n

    def exprs(self, roots):
        """``(prefix, texts)``: expressions printed together (:func:`_let_form`)."""
        return _let_form(list(roots), self)

    def domain(self, a):
        """A reduction or scatter axis as ``k:lo..hi``."""
        return _domain_str(a, self)

    def stage(self, t):
        """The definition of the stage computing ``t`` (:func:`_stage_str`)."""
        return _stage_str(t, self)


def _const_str(c):
    v = c.value
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v) if c.dtype == "int64" else f"{v}:{c.dtype}"
    s = repr(v)
    return s if c.dtype == "float32" else f"{s}:{c.dtype}"


#: an expression whose tree (each use of a shared subexpression counted again) has
#: more nodes than this prints its large shared subexpressions once each, as
#: ``let $0 = ...; $1 = ... in <body>``: a chain of d selects each reading the
#: level below three times is a DAG of O(d) nodes but a tree of O(3^d)
LET_TREE_NODES = 400
#: the smallest shared subexpression (tree nodes) bound to a name in the let form
LET_MIN_NODES = 8


def _let_form(roots, names):
    """``(prefix, texts)``: the text of each root; ``prefix`` is ``""``, or, when the
    roots' trees are larger than :data:`LET_TREE_NODES`, ``"let $0 = ...; ... in "``
    binding the shared subexpressions of at least :data:`LET_MIN_NODES` tree nodes
    in post-order (children first). Expressions are interned, so the form depends
    on the structure alone: equal graphs print equal text."""
    order, size, uses = tree_sizes(roots)
    if sum(size[id(r)] for r in roots) <= LET_TREE_NODES:
        return "", [_s(r, names) for r in roots]
    names.bound = {}
    try:
        lets = []
        for n in order:
            if uses.get(id(n), 0) >= 2 and size[id(n)] >= LET_MIN_NODES:
                text = _s(n, names)
                names.bound[id(n)] = f"${len(lets)}"
                lets.append(f"${len(lets)} = {text}")
        texts = [_s(r, names) for r in roots]
    finally:
        names.bound = None
    return ("let " + "; ".join(lets) + " in ") if lets else "", texts


def _p(e, names):
    """(text, precedence) of ``e``."""
    bound = names.bound
    if bound is not None and id(e) in bound:
        return bound[id(e)], _ATOM
    if isinstance(e, Const):
        return _const_str(e), _ATOM
    if isinstance(e, Var):
        return names.var(e), _ATOM
    cls = type(e)
    if cls in _INFIX:
        op, prec = _INFIX[cls]
        a, pa = _p(e.args[0], names)
        b, pb = _p(e.args[1], names)
        if pa < prec or (pa == prec and isinstance(e.args[0], CmpOp)):
            a = f"({a})"
        if pb <= prec:
            b = f"({b})"
        return f"{a} {op} {b}", prec
    if isinstance(e, (Min, Max)):
        return f"{cls.__name__.lower()}({_s(e.args[0], names)}, {_s(e.args[1], names)})", _ATOM
    if isinstance(e, Not):
        a, pa = _p(e.args[0], names)
        return f"!({a})" if pa < _ATOM else f"!{a}", 8
    if isinstance(e, Select):
        return "select(" + ", ".join(_s(a, names) for a in e.args) + ")", _ATOM
    if isinstance(e, Cast):
        return f"{e.attr}({_s(e.args[0], names)})", _ATOM
    if isinstance(e, Call):
        return f"{e.name}(" + ", ".join(_s(a, names) for a in e.args) + ")", _ATOM
    if isinstance(e, Load):
        return f"{names.tensor(e.tensor)}[" + ", ".join(_s(a, names) for a in e.args) + "]", _ATOM
    if isinstance(e, Reduce):
        axes = ", ".join(_domain_str(a, names) for a in e.axes)
        src = ", ".join(_s(s, names) for s in e.source)
        text = f"{e.combiner.name}({src}, axis=[{axes}]"
        if not (isinstance(e.where, Const) and e.where.value is True):
            text += f", where={_s(e.where, names)}"
        text += ")"
        if e.combiner.kind == "custom":
            body = "; ".join(_s(r, names) for r in e.combiner.result)
            text = f"{text}{{{body}}}"
        if len(e.source) > 1:
            text += f".{e.value_index}"
        return text, _ATOM
    raise TypeError(f"printer: unknown node {type(e).__name__}")


def _domain_str(a, names):
    """An axis with its whole domain: ``k:lo..hi`` for ``lo <= k < hi``."""
    return f"{names.var(a)}:{a.dom[0]}..{a.dom[1]}"


def _s(e, names):
    return _p(e, names)[0]


def expr_str(e, canonical=False, _names=None):
    """The text of one expression (a large one with shared subexpressions in the
    let form, see :data:`LET_TREE_NODES`)."""
    prefix, (text,) = _let_form([e], _names or _Names(canonical))
    return prefix + text


def _stage_str(t, names):
    """The definition of the stage computing ``t``, as its operation writes it."""
    definition = getattr(t.op, "_definition", None)
    if definition is None:
        raise TypeError(f"printer: unknown operation {type(t.op).__name__}")
    return definition(t, names)


#: the width ``repr(tensor)`` (and ``print``) wraps a stage's definition to
REPR_WIDTH = 100
_OPENERS, _CLOSERS = "([{", ")]}"
#: the infix operators a long operand chain breaks before, loosest first
_BREAK_OPS = (" || ", " && ", " == ", " != ", " <= ", " >= ", " < ", " > ", " + ", " - ",
              " * ", " / ", " // ", " % ")


def _top_level(text):
    """Per character of ``text``, whether it is outside every bracket."""
    depth, out = 0, []
    for ch in text:
        if ch in _CLOSERS:
            depth -= 1
        out.append(depth == 0)
        if ch in _OPENERS:
            depth += 1
    return out


def _split_top(text, sep):
    """``text`` cut at the occurrences of ``sep`` outside brackets."""
    top, parts, start, i = _top_level(text), [], 0, 0
    while True:
        i = text.find(sep, i)
        if i < 0:
            break
        if top[i] and all(top[i:i + len(sep)]):
            parts.append(text[start:i])
            start = i + len(sep)
            i = start
        else:
            i += 1
    parts.append(text[start:])
    return parts


def wrap_text(text, width=REPR_WIDTH, indent=0):
    """``text`` (an expression as :func:`expr_str` prints it) on lines of at most
    about ``width`` characters, for people: a long operand chain breaks before its
    loosest operator, a long call, load or list puts each argument on a line of
    its own, indented by 4; the let form's bindings each take a line. Text that
    fits is returned as it is; a single atom longer than ``width`` stays whole.
    The canonical text (cache keys, :func:`graph_str` with ``canonical``) never
    wraps."""
    if indent + len(text) <= width:
        return text
    pad = " " * indent
    if text.startswith("let ") and " in " in text:
        head, body = text[4:], None
        parts = _split_top(head, " in ")
        if len(parts) >= 2:
            lets, body = " in ".join(parts[:-1]), parts[-1]
            binds = _split_top(lets, "; ")
            lines = ["let"] + [pad + "    " + wrap_text(b, width, indent + 4)
                               + (";" if k < len(binds) - 1 else "")
                               for k, b in enumerate(binds)]
            return "\n".join(lines + [pad + "in " + wrap_text(body, width, indent + 3)])
    for op in _BREAK_OPS:
        terms = _split_top(text, op)
        if len(terms) > 1:
            sym = op.strip() + " "
            lines = [wrap_text(terms[0], width, indent)]
            lines += [pad + sym + wrap_text(t, width, indent + len(sym)) for t in terms[1:]]
            return "\n".join(lines)
    # one term: ``head(args)suffix`` (a call, a load, a reduction, a parenthesised group)
    top = _top_level(text)
    opener = next((i for i, ch in enumerate(text) if ch in _OPENERS and top[i]), None)
    if opener is None:
        return text
    depth, close = 0, None
    for i in range(opener, len(text)):
        if text[i] in _OPENERS:
            depth += 1
        elif text[i] in _CLOSERS:
            depth -= 1
            if depth == 0:
                close = i
                break
    if close is None:
        return text
    items = _split_top(text[opener + 1:close], ", ")
    if len(items) == 1 and text[opener] == "(" and opener == 0:
        items = [text[1:close]]  # a parenthesised group: its content on its own lines
    inner = [pad + "    " + wrap_text(it, width, indent + 4) + ("," if k < len(items) - 1 else "")
             for k, it in enumerate(items)]
    rest = text[close + 1:]
    tail = pad + text[close] + (wrap_text(rest, width, indent + 1) if rest else "")
    return "\n".join([text[:opener + 1]] + inner + [tail])


def tensor_str(t, canonical=False, width=None):
    """One stage's definition (also ``repr(t)``): the output's axes with their
    extents, the body, and the dtype; a scatter-add prints its loop. ``width``
    (an int; ``repr`` and ``print`` use :data:`REPR_WIDTH`): a definition longer
    than that is wrapped for people (:func:`wrap_text`); None keeps one line.

    >>> import texpr as te
    >>> X = te.placeholder((4, 3), name="X")
    >>> W = te.placeholder((5, 3), name="W")
    >>> k = te.reduce_axis(3, "k")
    >>> Y = te.compute((4, 5), lambda i, j: te.sum(X[i, k] * W[j, k], axis=k), name="Y")
    >>> print(te.tensor_str(Y))
    Y[i<4, j<5] = sum(X[i, k] * W[j, k], axis=[k:0..3])  # float32
    >>> print(te.tensor_str(Y, canonical=True))
    t0[v0<4, v1<5] = sum(t1[v0, r0] * t2[v1, r0], axis=[r0:0..3])  # float32
    >>> j = te.reduce_axis(5, "j")
    >>> G = te.compute((4, 3), lambda i, k: te.sum(te.if_then_else(
    ...     te.all(i >= 1, i <= 2), W[j, k] * te.exp(X[i, k] - X[i - 1, k]), 0.0), axis=j),
    ...     name="G")
    >>> print(te.tensor_str(G, width=60))
    G[i<4, k<3] = sum(
        select(
            i >= 1 && i <= 2,
            W[j, k] * exp(X[i, k] - X[i - 1, k]),
            0.0
        ),
        axis=[j:0..5]
    )  # float32
    """
    text = _stage_str(t, _Names(canonical))
    if width is None or len(text) <= width or "\n" in text:
        return text
    lhs, sep, rest = text.partition(" = ")
    body, hashmark, dtypes = rest.rpartition("  # ")
    if not sep or not hashmark:
        return text
    return f"{lhs} = {wrap_text(body, width, 0).lstrip()}  # {dtypes}"


def graph_str(outputs, canonical=False):
    """Every stage reachable from ``outputs``, producers first, one per line
    (with ``canonical``, a last line names the outputs).

    >>> import texpr as te
    >>> X = te.placeholder((3,), name="X")
    >>> Y = te.compute((3,), lambda i: te.exp(X[i]), name="Y")
    >>> print(te.graph_str([Y]))
    X = placeholder((3,), float32)
    Y[i<3] = exp(X[i])  # float32
    """
    if hasattr(outputs, "op"):  # one Tensor
        outputs = [outputs]
    names = _Names(canonical)
    lines = []
    for op in topo_order(outputs):
        lines.append(_stage_str(op.output(0), names))
    if canonical:
        lines.append("outputs: " + ", ".join(names.tensor(t) for t in outputs))
    return "\n".join(lines)


# repr(e) of every expression node is its text
_expr.install_printer(expr_str)
