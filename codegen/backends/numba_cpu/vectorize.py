"""Whether LLVM's loop vectoriser pays for a unit: decided from the unit's text.

numba runs LLVM's loop vectoriser on every function it compiles. On the loop
nests texpr generates it pays where an innermost loop walks memory at unit
stride (elementwise stages, depthwise convolutions: about 35% faster), and
costs seconds of compile time for nothing where none does: avg_pool2d's forward
(stride-2 loads in its innermost loop) took 13.8 s to compile with it and 2.4
s without, and ran 0.66 ms either way.

:func:`loop_vectorize_pays` reads the generated source (a pure function of
the text, so the unit's cache key, the hash of its text, also fixes the
choice): for every innermost ``for`` loop it evaluates each subscript's index
at three consecutive values of the loop variable, with the enclosing loops'
variables fixed, following the loop body's integer assignments in order
(``i0_3 = c0_4``). The vectoriser runs when some innermost loop has only
indices that move by -1, 0 or +1 per iteration, at least one of them by one.

:func:`invariant_comparison_loop` finds the loop nests on which the vectoriser
must not run at all: a loop holding an inner loop that compares (a max, min or
argmax reduction, a select) and does not depend on it, or has more than
:data:`MAX_UNROLLED_COMPARISONS` points with constant bounds, few enough for
LLVM to unroll them fully (LLVM may find uniform what the text says depends on
the loop). LLVM's loop
vectoriser (the LLVM of llvmlite 0.46) fully unrolls the inner loop, finds its
chain of selects uniform in the outer loop, and walks it in
``vputils::isSingleScalar`` without memoising: each select reads the previous
one two or three times, so the walk takes 2^n-3^n steps for n unrolled points
(fuzz seed 7004500389: an argmin over 5 x 5 points inside a loop over its
broadcast output axis; 17 s at 3 x 5 points, more than 20 minutes at 5 x 5,
under a second with the vectoriser off).
"""

import ast

from ...loopnest.source import parse_module

__all__ = ["loop_vectorize_pays", "invariant_comparison_loop", "unit_stride_loop"]

_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
           ast.Mult: lambda a, b: a * b, ast.FloorDiv: lambda a, b: a // b,
           ast.Mod: lambda a, b: a % b}
#: calls an index may go through that keep its integer value
_IDENTITY_CALLS = {"uint64", "int64", "intp", "int"}


class _Unknown(Exception):
    pass


def _free_value(name):
    # a fixed, name-dependent value for a variable bound outside the loop
    return 3 + sum(map(ord, name)) % 11


def _eval(node, env):
    if isinstance(node, ast.Constant) and isinstance(node.value, int) \
            and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name):
        v = env.get(node.id)
        if v is _Unknown:
            raise _Unknown
        return _free_value(node.id) if v is None else v
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        a, b = _eval(node.left, env), _eval(node.right, env)
        if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and b == 0:
            raise _Unknown
        return _BINOPS[type(node.op)](a, b)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand, env)
    if isinstance(node, ast.Call) and not node.keywords:
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
        args = [_eval(a, env) for a in node.args]
        if name in _IDENTITY_CALLS and len(args) == 1:
            return args[0]
        if name in ("min", "max") and args:
            return (min if name == "min" else max)(args)
    raise _Unknown


def _strides(loop):
    """The strides (per iteration of ``loop``) of the subscripts in its body, None
    for one that is not affine in the loop variable or cannot be evaluated."""
    var = loop.target.id if isinstance(loop.target, ast.Name) else None
    if var is None:
        return [None]
    envs = [{var: k} for k in range(3)]
    out = []

    def visit_subscripts(node):
        for sub in ast.walk(node):
            if isinstance(sub, ast.Subscript):
                try:
                    vals = [_eval(sub.slice, e) for e in envs]
                except (_Unknown, RecursionError):
                    out.append(None)
                    continue
                d = vals[1] - vals[0]
                out.append(d if vals[2] - vals[1] == d else None)

    for stmt in loop.body:
        visit_subscripts(stmt)
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                and isinstance(stmt.targets[0], ast.Name):
            name = stmt.targets[0].id
            for e in envs:
                try:
                    e[name] = _eval(stmt.value, e)
                except (_Unknown, RecursionError):
                    e[name] = _Unknown
        elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
            for e in envs:
                e[stmt.target.id] = _Unknown
    return out


def _unit_functions(tree):
    # the units' own functions (``def unit``, a scan's step, the driver), not the
    # helpers' (``_fill``, ``_ck``: underscored)
    return [f for f in ast.walk(tree)
            if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")]


def _innermost_loops(tree):
    for node in (n for f in _unit_functions(tree) for n in ast.walk(f)):
        if isinstance(node, ast.For) and not any(
                isinstance(n, (ast.For, ast.While)) for s in node.body for n in ast.walk(s)):
            yield node


def loop_vectorize_pays(source):
    """Whether ``source`` (a generated unit's module text) has an innermost loop
    whose subscripts all move by -1, 0 or +1 per iteration, one of them by one
    (see the module docstring). A text that does not parse gives True (numba's
    default)."""
    try:
        tree = parse_module(source)
    except (SyntaxError, ValueError, RecursionError):
        return True
    return any(_walks_unit_stride(loop) for loop in _innermost_loops(tree))


def _walks_unit_stride(loop):
    # every subscript of the loop moves by -1, 0 or +1 per iteration, one by one
    strides = _strides(loop)
    return bool(strides) and all(s in (-1, 0, 1) for s in strides) \
        and any(s in (-1, 1) for s in strides)


def unit_stride_loop(text):
    """Whether ``text``, one ``for`` loop (a generated loop and its body, dedented),
    holds no inner loop and walks memory as :func:`loop_vectorize_pays` asks of a
    unit's loops: every subscript moves by -1, 0 or +1 per iteration, one of them
    by one. False for a text that does not parse."""
    try:
        tree = parse_module(text)
    except (SyntaxError, ValueError, RecursionError):
        return False
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.For):
        return False
    loop = tree.body[0]
    if any(isinstance(n, (ast.For, ast.While)) for s in loop.body for n in ast.walk(s)):
        return False
    return _walks_unit_stride(loop)


def _names(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _outer_loops(node):
    # the ``for`` loops in ``node`` with no ``for`` loop between them and ``node``
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.For):
            yield child
        else:
            yield from _outer_loops(child)


#: the most points of an inner comparing loop nest with constant bounds that the
#: loop vectoriser may see unrolled inside another loop whatever the text says
#: of its dependence (LLVM may prove uniform what reads the loop variable, as
#: ``j >= 0``): the walk is bounded by about 3^12 steps (0.6 s; 3 x 5 points
#: took 17 s). max_pool2d's windows (2 x 2, 3 x 3) stay below it
MAX_UNROLLED_COMPARISONS = 12
#: the most points of a loop nest LLVM unrolls fully here (its threshold is on
#: the unrolled size: 25 points of a guarded argmin were unrolled); a larger
#: nest with constant bounds keeps the vectoriser
MAX_FULLY_UNROLLED_POINTS = 128


def _trip(loop):
    # the constant trip count of ``for v in range(a, b)`` (or ``range(b)``), else None
    it = loop.iter
    if not (isinstance(it, ast.Call) and getattr(it.func, "id", None) == "range"
            and 1 <= len(it.args) <= 2 and not it.keywords):
        return None
    if any(isinstance(n, ast.Name) for a in it.args for n in ast.walk(a)):
        return None
    try:
        bounds = [_eval(a, {}) for a in it.args]
    except (_Unknown, RecursionError):
        return None
    return max(0, bounds[-1] - (bounds[0] if len(bounds) == 2 else 0))


def _unrolled_points(loop):
    """How many times the innermost bodies of the nest ``loop`` run, when every
    loop in it has constant bounds (else None)."""
    n = _trip(loop)
    if n is None:
        return None
    inner = [_unrolled_points(c) for s in loop.body
             for c in ([s] if isinstance(s, ast.For) else _outer_loops(s))]
    if None in inner:
        return None
    return n * (sum(inner) if inner else 1)


def _carries_a_value(loop):
    """Whether a name assigned in ``loop``'s body is read, in text order, before
    its first assignment there (a scalar carried from one iteration to the
    next: a reduction's accumulator, one chain of comparisons through the whole
    nest) -- not a value reloaded from a buffer at each iteration."""
    first_store = {}
    reads = []
    for n in (n for stmt in loop.body for n in ast.walk(stmt)):
        if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
            reads.append((n.target.id, (n.lineno, n.col_offset)))
        if isinstance(n, ast.Name):
            pos = (n.lineno, n.col_offset)
            if isinstance(n.ctx, ast.Store):
                first_store[n.id] = min(first_store.get(n.id, pos), pos)
            else:
                reads.append((n.id, pos))
    return any(name in first_store and pos < first_store[name] for name, pos in reads)


def _compares(node):
    return any(isinstance(n, (ast.Compare, ast.IfExp)) for n in ast.walk(node))


def _independent_inner_loop(loop):
    """Whether a ``for`` loop nested directly in ``loop``'s body (no loop between
    them) compares and either reads neither ``loop``'s variable nor a name
    assigned (in ``loop``'s body, before it) from one that does, or such loops
    carry a value through their iterations (one chain of comparisons) with
    constant bounds, each at most :data:`MAX_FULLY_UNROLLED_POINTS` points and
    together more than :data:`MAX_UNROLLED_COMPARISONS`."""
    tainted = _names(loop.target)
    chain = 0  # points of the carrying nests in the body: one chain through them all
    for stmt in loop.body:
        inners = [stmt] if isinstance(stmt, ast.For) else _outer_loops(stmt)
        for inner in inners:
            if not _compares(inner):
                continue
            if not (_names(inner) & tainted):
                return True
            points = _unrolled_points(inner) if _carries_a_value(inner) else None
            if points is not None and points <= MAX_FULLY_UNROLLED_POINTS:
                # sibling nests (a where= of two pieces: range(0, 12), then
                # range(24, 36)) carry the same accumulator: their points add up
                chain += points
                if chain > MAX_UNROLLED_COMPARISONS:
                    return True
        for n in ast.walk(stmt):
            if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and \
                    _names(n.value) & tainted:
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                for t in targets:
                    tainted |= _names(t)
    return False


def invariant_comparison_loop(source):
    """Whether ``source`` (a generated unit's module text) has a loop with an
    inner loop that compares and does not depend on it, or that compares at
    more than :data:`MAX_UNROLLED_COMPARISONS` points with constant bounds (see
    the module docstring): LLVM's loop vectoriser could then take exponential
    time, and must be off for the whole unit. A text that does not parse gives
    False."""
    try:
        tree = parse_module(source)
    except (SyntaxError, ValueError, RecursionError):
        return False
    return any(isinstance(node, ast.For) and _independent_inner_loop(node)
               for f in _unit_functions(tree) for node in ast.walk(f))
