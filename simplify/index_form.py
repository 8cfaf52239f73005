"""Linear forms of integer index expressions over atoms, without SymPy.

One job: answer, for the two questions :mod:`texpr.simplify.sympy_bridge` is
asked during a build, whether SymPy is needed at all (importing it costs 0.3 s,
a third of a small graph's cold build on a quiet 2-core machine; maxpool2's and
depthwise's only SymPy calls had answers known without it).

:func:`linear_form` writes an integer index tree as ``const + sum(coef * atom)``
where an atom is a variable, ``v // c`` or ``v % c`` (``v`` a variable, ``c >= 2`` a
constant), or -- for :func:`known_difference` only -- a ``min``/``max`` of
affine functions of variables no two of which differ by a constant (SymPy
cannot order them, and keeps such a ``Min`` unevaluated). On
these atoms this is the form ``sympy.expand`` gives: it distributes constant
factors and collects terms, and it rewrites none of these atoms (SymPy
evaluates ``floor(v/c)`` and ``Mod(v, c)`` of an integer symbol to
themselves). Anything else (a product of two variables, a division of a sum,
a cast, a float) has no form here, and the caller asks SymPy.

* :func:`expanded_size_bound`: a lower bound on the size of the tree that
  :func:`texpr.simplify.sympy_bridge.canonical_index` returns, which renders
  each term of the expansion (``c * atom`` as a product, a coefficient of 1 or
  -1 as the atom itself) joined by one node per term after the first (equal
  constants are one node: nodes are interned).
  :mod:`texpr.simplify.cleanup` keeps SymPy's form only when it is strictly
  smaller than the best form so far, so a bound at least that size means
  SymPy's answer would be dropped and it is not asked.
* :func:`known_difference`: ``a - b`` as an int when the forms' atoms cancel;
  "not constant" when they do not (what SymPy's expansion answers too); None
  when there is no form.

tests/test_index_form.py checks both against SymPy on generated trees.
"""

from texpr import expr as E

__all__ = ["linear_form", "expanded_size_bound", "known_difference", "NOT_CONSTANT"]

_INT = ("int32", "int64")

#: :func:`known_difference`'s answer when the difference is not a constant
NOT_CONSTANT = object()


def _int_const(x):
    return isinstance(x, E.Const) and isinstance(x.value, int) \
        and not isinstance(x.value, bool)


def _atom_of(x, minmax):
    """The key of an atom node (``("v", uid)``, ``("d" or "m", uid, divisor)``, or
    a min/max's), or None."""
    if isinstance(x, E.Var):
        return ("v", x.attr[1])
    if isinstance(x, (E.FloorDiv, E.FloorMod)) and isinstance(x.a, E.Var) \
            and x.a.dtype in _INT and _int_const(x.b) and x.b.value >= 2:
        return ("d" if isinstance(x, E.FloorDiv) else "m", x.a.attr[1], x.b.value)
    if minmax and isinstance(x, (E.Min, E.Max)):
        kind = type(x)
        args, stack = [], [x]
        while stack:  # SymPy flattens Min(Min(a, b), c) into Min(a, b, c)
            y = stack.pop()
            if isinstance(y, kind):
                stack.extend((y.a, y.b))
            else:
                args.append(y)
        forms = []
        for y in args:  # affine in variables: SymPy cannot order two of them
            f = _form(y, False)
            if f is None or any(k[0] != "v" for k in f[0]):
                return None
            forms.append(f)
        keys = {_key(f) for f in forms}
        for i, f in enumerate(forms):
            for g in forms[i + 1:]:
                if not _difference(f, g)[0]:
                    return None  # a constant apart: SymPy's Min may pick one
        return ("n" if kind is E.Min else "x", frozenset(keys))
    return None


def _key(form):
    coefs, const = form
    return frozenset(coefs.items()), const


def _difference(f, g):
    coefs = dict(f[0])
    for k, c in g[0].items():
        coefs[k] = coefs.get(k, 0) - c
    return {k: c for k, c in coefs.items() if c}, f[1] - g[1]


def linear_form(e, minmax=False):
    """``({atom key: coef}, const)`` of the integer index tree ``e`` (coefficients
    non-zero), or None when it has no form over the atoms (module docstring;
    ``minmax``: ``min``/``max`` atoms allowed) or is too deep to walk here.
    ``e``: a texpr Expr of any dtype (only int32/int64 trees have a form).
    Never raises."""
    try:
        return _form(e, minmax)
    except RecursionError:  # (attack helper-30) the callers' None: "ask SymPy"
        return None


def _form(x, minmax):
    if x.dtype not in _INT:
        return None
    if _int_const(x):
        return {}, x.value
    key = _atom_of(x, minmax)
    if key is not None:
        return {key: 1}, 0
    if isinstance(x, (E.Add, E.Sub)):
        a, b = _form(x.a, minmax), _form(x.b, minmax)
        if a is None or b is None:
            return None
        if isinstance(x, E.Add):
            b = ({k: -c for k, c in b[0].items()}, -b[1])
        return _difference(a, b)
    if isinstance(x, E.Mul):
        for c, o in ((x.a, x.b), (x.b, x.a)):
            if _int_const(c):
                f = _form(o, minmax)
                if f is None:
                    return None
                if c.value == 0:
                    return {}, 0
                return {k: v * c.value for k, v in f[0].items()}, f[1] * c.value
    return None


def expanded_size_bound(e):
    """A lower bound on the node count (distinct nodes: they are interned, as
    :func:`texpr.visitor.post_order` counts them) of SymPy's canonical form of
    ``e`` (:func:`texpr.simplify.sympy_bridge.canonical_index`), or None when
    ``e`` has no linear form (ask SymPy). The form renders each term
    ``c * atom`` as a product when ``|c| >= 2`` and joins the terms by one node
    per term after the first; its leaves are the atoms' variables and the
    constants ``|c|``, the divisors and ``|const|``, each counted once. Never
    raises."""
    f = linear_form(e)
    if f is None:
        return None
    coefs, const = f
    if not coefs:
        return 1
    variables, constants = set(), set()
    nodes = 0
    for key, c in coefs.items():
        variables.add(key[1])
        if key[0] != "v":
            nodes += 1  # the // or % node
            constants.add(key[2])
        if abs(c) != 1:
            nodes += 1  # the product
            constants.add(abs(c))
    terms = len(coefs)
    if const:
        constants.add(abs(const))
        terms += 1
    return len(variables) + len(constants) + nodes + terms - 1


def known_difference(a, b):
    """``a - b`` for two integer index trees: an int when their linear forms
    (``min``/``max`` atoms allowed) differ by a constant, :data:`NOT_CONSTANT`
    when they differ in an atom's coefficient, None when either has no form.
    Never raises."""
    fa, fb = linear_form(a, minmax=True), linear_form(b, minmax=True)
    if fa is None or fb is None:
        return None
    coefs, const = _difference(fa, fb)
    return NOT_CONSTANT if coefs else const
