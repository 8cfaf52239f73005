"""The installed package: one namespace, lazy heavy imports, no stray top-level names."""

import subprocess
import sys


def _run(code, cwd):
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_subpackages_live_under_texpr(tmp_path):
    out = _run("import texpr, texpr.simplify, texpr.codegen; "
               "print(texpr.simplify.__name__, texpr.codegen.__name__, "
               "callable(texpr.simplify.iteration_count), callable(texpr.codegen.build))", tmp_path)
    assert out == "texpr.simplify texpr.codegen True True"


def test_old_top_level_names_are_not_installed(tmp_path):
    # outside the repository checkout, only the texpr namespace is importable from us
    out = _run("import importlib.util as u; "
               "print([n for n in ('simplify', 'codegen') if u.find_spec(n) is not None])",
               tmp_path)
    assert out == "[]"


def test_import_texpr_loads_no_heavy_dependency(tmp_path):
    out = _run("import sys, texpr; "
               "print(sorted(m for m in ('numba', 'islpy', 'sympy', 'torch', 'jax') "
               "if m in sys.modules))", tmp_path)
    assert out == "[]"


def test_lazy_attribute_access(tmp_path):
    out = _run("import texpr as te; print(te.codegen.build.__module__, te.simplify.__name__)",
               tmp_path)
    assert out == "texpr.codegen.build texpr.simplify"


def _dense_tanh_code(index):
    # a dense layer, tanh, a sum of squares; X read at X[i, <index>]; prints whether
    # SymPy was imported, dL/dW's sum and numpy's value of it
    return ("import sys, numpy as np, texpr as te; from texpr import codegen; "
            "X = te.placeholder((4, 6), name='X', dtype='float64'); "
            "W = te.placeholder((3, 6), name='W', dtype='float64'); "
            "r = te.reduce_axis(6, name='r'); "
            f"Y = te.compute((4, 3), lambda i, j: te.tanh(te.sum(X[i, {index}] * W[j, r], "
            "axis=r)), name='Y'); "
            "a, b = te.reduce_axis(4, 'a'), te.reduce_axis(3, 'b'); "
            "L = te.compute((), lambda: te.sum(Y[a, b] * Y[a, b], axis=[a, b]), name='L'); "
            "g = te.differentiate(L, [W]).result; "
            "k = codegen.build([L] + list(g), [X, W]); "
            "x, w = np.arange(24.0).reshape(4, 6) * 0.01, np.arange(18.0).reshape(3, 6) * 0.01; "
            f"xs = np.stack([[x[i, [{index.replace('j', 'jj')} for r in range(6)]] "
            "for jj in range(3)] for i in range(4)]); "
            "y = np.tanh((xs * w[None]).sum(-1)); "
            "dw = np.einsum('ij,ijr->jr', 2 * y * (1 - y * y), xs); "
            "print('sympy' in sys.modules, repr(float(k(x, w)[1].sum())), repr(float(dw.sum())))")


def test_a_warm_run_never_imports_sympy(tmp_path):
    # differentiate and build of a graph whose symbolic results are cached load
    # them without the pass pipeline (SymPy is only for a miss); the first run
    # fills the cache (its index arithmetic, (r + j) % 6, needs SymPy's canonical
    # forms), the second must not import it and computes the same
    env_code = ("import os; os.environ['TEXPR_CACHE_DIR'] = %r; " % str(tmp_path / "cache")) \
        + _dense_tanh_code("(r + j) % 6")
    first = _run(env_code, tmp_path).split()
    second = _run(env_code, tmp_path).split()
    assert first[0] == "True"
    assert second[0] == "False"
    assert first[1] == second[1]
    assert abs(float(first[1]) - float(first[2])) <= 1e-12 * max(1.0, abs(float(first[2])))


def test_a_cold_build_without_index_arithmetic_never_imports_sympy(tmp_path):
    # sympy_bridge imports SymPy (0.3 s) when a function first needs it: a graph
    # whose indices are bare axes (a dense layer) differentiates, simplifies and
    # lowers without it
    env_code = ("import os; os.environ['TEXPR_CACHE_DIR'] = %r; " % str(tmp_path / "cache")) \
        + _dense_tanh_code("r")
    out = _run(env_code, tmp_path).split()
    assert out[0] == "False"
    assert abs(float(out[1]) - float(out[2])) <= 1e-12 * max(1.0, abs(float(out[2])))


def test_a_broken_sympy_raises_where_sympy_is_needed(tmp_path):
    # SymPy imported lazily: an install where it cannot be imported must fail loudly
    # where the bridge needs it, not pass as "no canonical form" / "not proved"
    # (a product of two variables: simplify.index_form's linear forms do not answer)
    code = ("import sys; sys.modules['sympy'] = None; "
            "import texpr as te; from texpr.simplify import sympy_bridge as b; "
            "i = te.reduce_axis(4, 'i'); e = (i + 2) * 3 - i; out = []\n"
            "for f, args in ((b.canonical_index, (e,)), (b.proves_equal, (e, e)), "
            "(b.constant_difference, (e * i, i))):\n"
            "    try:\n"
            "        f(*args); out.append('returned')\n"
            "    except ImportError:\n"
            "        out.append('ImportError')\n"
            "print(b.constant_difference(te.const(7), te.const(3)), *out)")
    assert _run(code, tmp_path).split() == ["4"] + ["ImportError"] * 3
