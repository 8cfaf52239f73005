"""simplify.index_form against SymPy: its answers are the ones SymPy would give.

The cleanup pass skips SymPy when ``expanded_size_bound`` says SymPy's form
cannot be smaller than the best form so far, and ``constant_difference``
answers from linear forms. Both must agree with SymPy on every tree: here on
generated index trees (variables, constants, + - *, // and % by constants,
min/max), SymPy computed directly through the bridge's own translation.
"""

import random

import pytest

from texpr import expr as E
from texpr.simplify import index_form
from texpr.simplify import sympy_bridge as sb
from texpr.simplify.cleanup import algebraic_cleanup
from texpr.visitor import post_order

sympy = pytest.importorskip("sympy")

VARS = [E.var(n, "int64") for n in ("i", "j", "k")]


def _tree(rng, depth, minmax):
    if depth == 0 or rng.random() < 0.25:
        if rng.random() < 0.6:
            return rng.choice(VARS)
        return E.const(rng.choice([-3, -2, -1, 0, 1, 2, 3, 7]), "int64")
    kind = rng.choice(["add", "sub", "mulc", "mulc", "mul", "div", "mod"]
                      + (["min", "max"] if minmax else []))
    a = _tree(rng, depth - 1, minmax)
    if kind in ("mulc", "div", "mod"):
        c = E.const(rng.choice([-2, 0, 1, 2, 3, 4]) if kind == "mulc" else rng.choice([1, 2, 3, 4]),
                    "int64")
        if kind == "mulc":
            return E.mul(c, a) if rng.random() < 0.5 else E.mul(a, c)
        return (E.floordiv if kind == "div" else E.floormod)(a, c)
    b = _tree(rng, depth - 1, minmax)
    return {"add": E.add, "sub": E.sub, "mul": E.mul, "min": E.minimum,
            "max": E.maximum}[kind](a, b)


def _sympy_form(e):
    symbols = {}
    s = sb.to_sympy(e, symbols)
    return None if s is None else sb.from_sympy(sympy.expand(s), symbols)


def _sympy_difference(a, b):
    symbols = {}
    sa, sb_ = sb.to_sympy(a, symbols), sb.to_sympy(b, symbols)
    d = sympy.expand(sa - sb_)
    return int(d) if d.is_Integer else None


def test_the_size_bound_is_never_above_sympys_form():
    rng = random.Random(20261205)
    bounded = 0
    for _ in range(3000):
        e = _tree(rng, rng.randint(1, 4), minmax=False)
        bound = index_form.expanded_size_bound(e)
        if bound is None:
            continue
        bounded += 1
        f = _sympy_form(e)
        if f is not None:
            assert len(post_order(f)) >= bound, (e, f, bound)
    assert bounded > 1000


@pytest.mark.parametrize("minmax", [False, True])
def test_known_differences_are_sympys(minmax):
    rng = random.Random(7 + minmax)
    constant = not_constant = 0
    for _ in range(3000):
        a = _tree(rng, rng.randint(0, 3), minmax)
        # b: a plus a constant, rewritten (commuted, or distributed), or unrelated
        r = rng.random()
        if r < 0.4:
            b = E.add(E.const(rng.randint(-5, 5), "int64"), a)
        elif r < 0.6:
            b = E.sub(E.mul(E.const(2, "int64"), a), a)
        else:
            b = _tree(rng, rng.randint(0, 3), minmax)
        known = index_form.known_difference(a, b)
        if known is None:
            continue
        want = _sympy_difference(a, b)
        if known is index_form.NOT_CONSTANT:
            not_constant += 1
            assert want is None, (a, b, want)
        else:
            constant += 1
            assert known == want, (a, b, known, want)
    assert constant > 300 and not_constant > 300


def test_cleanup_keeps_the_same_forms_without_sympy():
    """The pass's result with the bound is the result of asking SymPy every time."""
    rng = random.Random(11)
    trees = [_tree(rng, rng.randint(1, 4), minmax=False) for _ in range(800)]
    from texpr.simplify import cleanup
    from texpr.simplify.isl_bridge import canonical_quasi_affine
    from texpr.visitor import free_vars
    for e in trees:
        got = cleanup._clean_expr(e, {})
        out, size = e, len(post_order(e))
        for form in (canonical_quasi_affine(e, free_vars(e)), sb.canonical_index(e)):
            if form is not None and form is not out and len(post_order(form)) < size:
                out, size = form, len(post_order(form))
        assert got is out, (e, got, out)


def test_a_maxpool_build_does_not_import_sympy(tmp_path, monkeypatch):
    """The forms maxpool2 and depthwise need are all known without SymPy."""
    import subprocess
    import sys
    code = """
import sys
import texpr as te
from texpr import codegen
X = te.placeholder((2, 4, 8, 8), "X")
W = te.placeholder((4, 1, 3, 3), "W")
Y = te.nn.max_pool2d(X, 2, 2)
Z = te.nn.conv2d(X, W, padding=1, groups=4)
HY = te.placeholder(Y.shape, "HY")
HZ = te.placeholder(Z.shape, "HZ")
(dX,) = te.differentiate(Y, [X], head=HY).result
dX2, dW = te.differentiate(Z, [X, W], head=HZ).result
codegen.build([Y, Z, dX, dX2, dW], [X, W, HY, HZ])
print("sympy" in sys.modules)
"""
    monkeypatch.setenv("TEXPR_CACHE_DIR", str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_a_deep_tree_is_unknown_not_an_error():
    # attack helper-30: the linear forms recurse; a tree deeper than Python's
    # recursion limit gives "no form" (SymPy's path then answers None), not an error
    i = E.var("i", "int64")
    e = i
    for t in range(3000):
        e = E.add(e, E.const(1 + t % 3, "int64"))
    assert index_form.linear_form(e) is None and index_form.expanded_size_bound(e) is None
    assert sb.constant_difference(e, i) in (None, sum(1 + t % 3 for t in range(3000)))
