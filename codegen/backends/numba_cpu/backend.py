"""The numba CPU backend's registration: importing this module registers it.

One job: import the pieces that register themselves (the loop-nest dialect,
the default target, :mod:`codegen.loopnest.dialect`; the unit kinds ``"numba"``,
compiled loop nests, and ``"shift"``, strided moves) and name what
``texpr.codegen`` exports of this backend (:data:`EXPORTS`: its compile errors
and its kernel cache) and its retired module constants (:data:`RETIRED`).
:mod:`codegen.backends.registered` finds this module by its name, as it finds
every backend's.

A separate module, not the package's ``__init__``: a compile worker process
imports :mod:`codegen.backends.numba_cpu.compile` only, and must not pay for
the lowering these pieces import.
"""

from . import dialect as _dialect  # noqa: F401 - registers
from . import shift_units as _shift_units  # noqa: F401 - registers
from . import units as _units  # noqa: F401 - registers
from .compile import CacheWarning, CompileError, cache_dir, clear_memory_cache

__all__ = ["EXPORTS", "RETIRED"]

#: what ``texpr.codegen`` exports of this backend (name -> object)
EXPORTS = {"CacheWarning": CacheWarning, "CompileError": CompileError,
           "cache_dir": cache_dir, "clear_memory_cache": clear_memory_cache}

#: module (under this package) -> {retired constant: the codegen Options field now}
#: (:mod:`codegen._retired`)
RETIRED = {"chunks": {"RUNNER": "chunk_runner"}}
