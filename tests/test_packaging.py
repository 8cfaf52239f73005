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


def test_a_warm_run_never_imports_sympy(tmp_path):
    # differentiate and build of a graph whose symbolic results are cached load
    # them without the pass pipeline (SymPy is only for a miss); the first run
    # fills the cache, the second must not import it and computes the same
    code = ("import sys, numpy as np, texpr as te; from texpr import codegen; "
            "X = te.placeholder((4, 6), name='X', dtype='float64'); "
            "W = te.placeholder((3, 6), name='W', dtype='float64'); "
            "r = te.reduce_axis(6, name='r'); "
            "Y = te.compute((4, 3), lambda i, j: te.tanh(te.sum(X[i, r] * W[j, r], axis=r)), "
            "name='Y'); "
            "a, b = te.reduce_axis(4, 'a'), te.reduce_axis(3, 'b'); "
            "L = te.compute((), lambda: te.sum(Y[a, b] * Y[a, b], axis=[a, b]), name='L'); "
            "g = te.differentiate(L, [W]).result; "
            "k = codegen.build([L] + list(g), [X, W]); "
            "x, w = np.ones((4, 6)) * 0.1, np.arange(18.0).reshape(3, 6) * 0.01; "
            "print('sympy' in sys.modules, repr(float(k(x, w)[1].sum())))")
    env_code = ("import os; os.environ['TEXPR_CACHE_DIR'] = %r; " % str(tmp_path / "cache")) + code
    first = _run(env_code, tmp_path)
    second = _run(env_code, tmp_path)
    assert first.split()[0] == "True"
    assert second.split()[0] == "False"
    assert first.split()[1] == second.split()[1]
