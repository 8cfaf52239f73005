"""The backends a build uses: importing this module registers them.

One job: the registration of each backend's pieces, in one place:

* ``numba_cpu``: the loop-nest dialect (the default target,
  :mod:`codegen.loopnest.dialect`) and its unit kinds ``"numba"`` (compiled loop
  nests) and ``"shift"`` (strided moves);
* ``numpy_host``: the unit kind ``"blas"`` (contraction plans on numpy's BLAS).

A new backend is a new folder under ``codegen/backends/`` plus a line here
(docs/extending.md, "A backend").
"""

from .numba_cpu import dialect as _numba_cpu_dialect  # noqa: F401 - registers
from .numba_cpu import shift_units as _numba_cpu_shifts  # noqa: F401 - registers
from .numba_cpu import units as _numba_cpu_units  # noqa: F401 - registers
from .numpy_host import units as _numpy_host_units  # noqa: F401 - registers
# the default backend's compile errors and cache, for texpr.codegen's face
from .numba_cpu.compile import CacheWarning, CompileError, cache_dir, clear_memory_cache

__all__ = ["CacheWarning", "CompileError", "cache_dir", "clear_memory_cache"]
