"""texpr.codegen: schedules, isl loop nests and Numba kernels for texpr graphs.

    s = codegen.create_schedule([Y])          # optional
    k = codegen.build([Y], [X, W], s)         # -> Kernel
    (y,) = k(x, w)

See :mod:`texpr.codegen.schedule` (primitives), :mod:`texpr.codegen.lower`
(buffers, and one compiled unit per materialised stage),
:mod:`texpr.codegen.stage` (how a stage becomes loop nests; its values are
written by :mod:`texpr.codegen.emit`, its checks decided by
:mod:`texpr.codegen.bounds`), :mod:`texpr.codegen.source` (the text: user
names only in escaped comments, ``Kernel.source`` readable),
:mod:`texpr.codegen.units` (the unit interface the kernel's driver calls),
:mod:`texpr.codegen.contraction` (which stages are GEMMs, and their plans;
:mod:`texpr.codegen.gemm` runs a plan on numpy's BLAS),
:mod:`texpr.codegen.profile` (``kernel.profile``, ``TEXPR_PROFILE=1``: the time of
each unit) and :mod:`texpr.codegen.compile` (numba, the caches and their integrity checks,
worker processes; :mod:`texpr.codegen.vectorize` decides, from a unit's text,
whether LLVM's loop vectoriser runs on it);
which stages get buffers by default is the materialisation rule of
``docs/stages.md``, and the data flow up to here is ``docs/pipeline.md``.
"""

import os as _os

if not _os.environ.get("_TEXPR_COMPILE_WORKER"):
    # (a compile worker process, see texpr.codegen.compile, needs numba only: it
    # skips the simplifier, sympy and islpy that build and lower import)
    from .build import Kernel, build
    from .compile import CacheWarning, CompileError, cache_dir, clear_memory_cache
    from .profile import report as profile_report
    from .schedule import Schedule, Stage, create_schedule

__all__ = ["build", "Kernel", "create_schedule", "Schedule", "Stage", "CompileError",
           "CacheWarning", "cache_dir", "clear_memory_cache", "profile_report"]
