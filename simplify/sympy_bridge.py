"""The bridge between texpr IR and SymPy -- the only module that imports sympy.

Used for the scalar algebra of integer index expressions: canonical forms
(``0 - r + (h + r) // 3`` -> ``(h + r) // 3 - r``) and proving simple facts
(:func:`proves_equal`). Only integer arithmetic with ``+ - *``, ``//`` and ``%``
by positive constants, ``min`` and ``max`` crosses the bridge; anything else
(loads, floats, selects) returns None and stays as it is.

Symbols are integers named like ISL dimensions (:func:`texpr.simplify.isl_bridge.dim_name`).
"""

import math

from texpr import expr as E

from .index_form import NOT_CONSTANT, known_difference
from .isl_bridge import dim_name

__all__ = ["to_sympy", "from_sympy", "canonical_index", "proves_equal", "constant_difference"]


class _Sympy:
    """The ``sympy`` module, imported when a function here first needs it: the
    import takes 0.3 s (a third of a small graph's cold build on a quiet 2-core
    machine), and many graphs have no index arithmetic that crosses the bridge."""

    def __getattr__(self, name):
        import sympy as module
        globals()["sympy"] = module
        return getattr(module, name)


sympy = _Sympy()


def _require_sympy():
    # import SymPy now, outside the callers' handlers: they take SymPy's errors as
    # "no form" or "unknown", and a broken install must raise instead
    return sympy.Integer

_INT = ("int32", "int64")


def _pos_int(e):
    return isinstance(e, E.Const) and isinstance(e.value, int) and not isinstance(e.value, bool) \
        and e.value > 0


def to_sympy(e, symbols):
    """``e`` as a SymPy expression, or None when it is not integer index arithmetic.

    ``symbols`` (a dict) collects ``name -> (sympy.Symbol, Var)`` for the way back.
    """
    memo = {}

    def go(x):
        if id(x) in memo:
            return memo[id(x)]
        r = _go(x)
        memo[id(x)] = r
        return r

    def _go(x):
        if x.dtype not in _INT:
            return None
        if isinstance(x, E.Const):
            return sympy.Integer(x.value)
        if isinstance(x, E.Var):
            name = dim_name(x)
            hit = symbols.get(name)
            if hit is None:
                hit = (sympy.Symbol(name, integer=True), x)
                symbols[name] = hit
            return hit[0]
        if isinstance(x, (E.Add, E.Sub, E.Mul, E.Min, E.Max)):
            a, b = go(x.a), go(x.b)
            if a is None or b is None:
                return None
            if isinstance(x, E.Add):
                return a + b
            if isinstance(x, E.Sub):
                return a - b
            if isinstance(x, E.Mul):
                return a * b
            return (sympy.Min if isinstance(x, E.Min) else sympy.Max)(a, b)
        if isinstance(x, (E.FloorDiv, E.FloorMod)) and _pos_int(x.b):
            a = go(x.a)
            if a is None:
                return None
            c = sympy.Integer(x.b.value)
            return sympy.floor(a / c) if isinstance(x, E.FloorDiv) else sympy.Mod(a, c)
        return None

    return go(e)


def from_sympy(s, symbols):
    """A SymPy expression (as made by :func:`to_sympy`) back to texpr IR (int64);
    None when it holds something the IR cannot say exactly."""
    by_name = {n: v for n, (_s, v) in symbols.items()}

    def go(x):
        if x.is_Integer:
            return E.const(int(x))
        if x.is_Symbol:
            v = by_name.get(x.name)
            return v
        if isinstance(x, sympy.Add):
            out = None
            neg = []
            for t in x.as_ordered_terms():
                coeff, rest = t.as_coeff_Mul()
                if coeff < 0:
                    neg.append(-t)
                    continue
                g = go(t)
                if g is None:
                    return None
                out = g if out is None else E.add(out, g)
            for t in neg:
                g = go(t)
                if g is None:
                    return None
                out = E.sub(E.const(0) if out is None else out, g)
            return out
        if isinstance(x, sympy.Mul):
            coeff, rest = x.as_coeff_Mul()
            if not coeff.is_Integer:
                return None
            g = go(rest)
            if g is None:
                return None
            return g if coeff == 1 else E.mul(E.const(int(coeff)), g)
        if isinstance(x, sympy.floor):
            num, den = _integer_fraction(x.args[0])
            if num is None:
                return None
            g = go(num)
            return None if g is None else E.floordiv(g, E.const(den))
        if isinstance(x, sympy.Mod):
            a, m = x.args
            if not m.is_Integer or m <= 0:
                return None
            g = go(a)
            return None if g is None else E.floormod(g, E.const(int(m)))
        if isinstance(x, (sympy.Min, sympy.Max)):
            args = [go(a) for a in x.args]
            if any(a is None for a in args):
                return None
            f = E.minimum if isinstance(x, sympy.Min) else E.maximum
            out = args[0]
            for a in args[1:]:
                out = f(out, a)
            return out
        return None

    return go(s)


def _integer_fraction(arg):
    """``arg == num / den`` with ``num`` having integer coefficients."""
    arg = sympy.expand(arg)
    dens = [sympy.fraction(sympy.Rational(c))[1] if c.is_Rational else None
            for c in (t.as_coeff_Mul()[0] for t in sympy.Add.make_args(arg))]
    if any(d is None for d in dens):
        return None, None
    den = 1
    for d in dens:
        den = den * int(d) // math.gcd(den, int(d))
    return sympy.expand(arg * den), den


def canonical_index(e):
    """A canonical (expanded, collected) form of an integer index expression, or
    ``e`` itself when it does not cross the bridge or would not get smaller."""
    _require_sympy()
    symbols = {}
    try:
        s = to_sympy(e, symbols)
        if s is None:
            return e
        out = from_sympy(sympy.expand(s), symbols)
    except Exception:  # noqa: BLE001 - sympy raises many kinds; the form is optional
        return e
    return out if out is not None else e


def proves_equal(a, b):
    """Whether SymPy proves the integer expressions ``a`` and ``b`` equal everywhere."""
    _require_sympy()
    symbols = {}
    try:
        sa, sb = to_sympy(a, symbols), to_sympy(b, symbols)
        if sa is None or sb is None:
            return False
        return bool(sympy.simplify(sa - sb) == 0)
    except Exception:  # noqa: BLE001 - not proved
        return False


def constant_difference(a, b):
    """``a - b`` as a Python int when SymPy's expansion of the integer
    expressions ``a`` and ``b`` makes it a constant (``2*c + 2`` minus ``2*c``:
    2), else None (not index arithmetic, or not provably constant this cheaply:
    no ``simplify``, so a ``None`` is never an error, only "unknown"). Linear
    forms answer without SymPy where they can
    (:func:`texpr.simplify.index_form.known_difference`: the same answer, and
    "unknown" for ``min``/``max`` terms that do not cancel)."""
    known = known_difference(a, b)  # (no SymPy needed: see _Sympy)
    if known is not None:
        return None if known is NOT_CONSTANT else known
    _require_sympy()
    symbols = {}
    try:
        sa, sb = to_sympy(a, symbols), to_sympy(b, symbols)
        if sa is None or sb is None:
            return None
        d = sympy.expand(sa - sb)
        return int(d) if d.is_Integer else None
    except Exception:  # noqa: BLE001 - unknown
        return None
