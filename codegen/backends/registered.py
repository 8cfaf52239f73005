"""The backends a build uses: importing this module registers them.

One job: find the backends and register them. A backend is a folder (a
package) under ``codegen/backends/`` with a module named ``backend``, whose
import registers its pieces (a loop-nest dialect, :mod:`codegen.loopnest.dialect`;
unit kinds, :func:`codegen.units.register`) and whose optional ``EXPORTS``
(name -> object) are what ``texpr.codegen`` exports of it (the default
backend's compile errors and cache). Every such module is imported here, in
the order of the folders' names; a name two backends export is an error.

A backend module's optional ``RETIRED`` (module under its package -> {retired
constant: Options field}) joins :data:`RETIRED`, which :mod:`codegen._retired`
guards.

A new backend is a new folder under ``codegen/backends/`` with its
``backend`` module: no line here (docs/extending.md, "A backend").
"""

import importlib
import os
import pkgutil

from texpr.errors import TexprError

__all__ = ["BACKENDS", "RETIRED", "CacheWarning", "CompileError", "cache_dir", "clear_memory_cache"]

_HERE = os.path.dirname(os.path.abspath(__file__))


def _backend_modules():
    """The names of the ``backend`` modules under this folder, in folder order."""
    names = []
    for info in sorted(pkgutil.iter_modules([_HERE]), key=lambda i: i.name):
        if info.ispkg and os.path.isfile(os.path.join(_HERE, info.name, "backend.py")):
            names.append(f"{__package__}.{info.name}.backend")
    return names


def _register():
    """Import every backend module; returns ``(modules, exports)``.

    Raises:
        TexprError: two backends export the same name.
    """
    modules, exports, owner = [], {}, {}
    for name in _backend_modules():
        mod = importlib.import_module(name)
        modules.append(mod)
        for key, value in getattr(mod, "EXPORTS", {}).items():
            if key in owner:
                raise TexprError(f"codegen backends: {owner[key]} and {name} both export "
                                 f"{key!r}")
            owner[key] = name
            exports[key] = value
    return modules, exports


#: the backend modules imported, in order
BACKENDS, _EXPORTS = _register()
globals().update(_EXPORTS)

#: the backends' retired module constants: module object -> {constant: Options field}
RETIRED = {}
for _mod in BACKENDS:
    _package = _mod.__name__.rpartition(".")[0]
    for _leaf, _names in getattr(_mod, "RETIRED", {}).items():
        RETIRED[importlib.import_module(f"{_package}.{_leaf}")] = dict(_names)
