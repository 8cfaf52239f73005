"""The module paths codegen had before its pipeline layout (``texpr.codegen.stage``,
``texpr.codegen.gemm``, ...), kept importable for one release.

``import texpr.codegen.stage`` and ``from texpr.codegen import stage`` give the
module at its new place (:data:`MOVED`): the same module object, so setting one
of its attributes is seen by the code that reads it. New code imports the new
paths; docs/pipeline.md shows the layout.
"""

import importlib
import importlib.abc
import importlib.util
import os
import sys

__all__ = ["MOVED", "BACKEND_MODULES", "install"]

#: old name under texpr.codegen -> new module path under texpr.codegen
MOVED = {
    "affine": "analysis.affine", "bounds": "analysis.bounds",
    "contraction": "analysis.contraction", "shifts": "analysis.shifts",
    "schedule": "ir.schedule",
    "memo": "loopnest.memo", "lower": "loopnest.lower", "stage": "loopnest.stage",
    "emit": "loopnest.emit", "cse": "loopnest.cse", "source": "loopnest.source",
    "scan_lower": "loopnest.scan_lower", "scan_gemm": "loopnest.scan_gemm",
    "operands": "rewrite.operands", "tap_split": "rewrite.tap_split",
    "windows": "rewrite.windows", "split_reductions": "rewrite.split_reductions",
}

#: old names under texpr.codegen of modules that moved into a backend's folder
#: (``codegen/backends/NAME/``): :data:`MOVED` gets each at the folder that holds
#: the module file (found on disk, without importing the backend)
BACKEND_MODULES = ("vectorize", "compile", "runtime", "native_call", "chunks", "unit_files",
                   "forksafe", "gemm", "parking")


def _backend_paths():
    """``{old name: "backends.NAME.module"}`` for :data:`BACKEND_MODULES`."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "backends")
    found = {}
    for folder in sorted(os.listdir(root)):
        for leaf in BACKEND_MODULES:
            if leaf not in found and os.path.isfile(os.path.join(root, folder, leaf + ".py")):
                found[leaf] = f"backends.{folder}.{leaf}"
    return found


MOVED.update(_backend_paths())


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``<package>.<old>`` and loads it as the module at its new path."""

    def __init__(self, package):
        self.package = package

    def find_spec(self, fullname, path=None, target=None):
        head, _, leaf = fullname.rpartition(".")
        if head != self.package or leaf not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        leaf = spec.name.rpartition(".")[2]
        return importlib.import_module(f"{self.package}.{MOVED[leaf]}")

    def exec_module(self, module):
        """Nothing to run: the module at the new path is loaded already."""


def install(package):
    """Make the old paths under ``package`` (``"texpr.codegen"``) importable."""
    if not any(isinstance(f, _Alias) and f.package == package for f in sys.meta_path):
        sys.meta_path.append(_Alias(package))


def attribute(package, name):
    """The module at the new place of ``package.name``, for the package's
    ``__getattr__`` (``codegen.stage``); AttributeError when ``name`` never moved."""
    if name not in MOVED:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return importlib.import_module(f"{package}.{MOVED[name]}")
