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
