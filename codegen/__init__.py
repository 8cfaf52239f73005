"""texpr.codegen: schedules, isl loop nests and Numba kernels for texpr graphs.

    s = codegen.create_schedule([Y])          # optional
    k = codegen.build([Y], [X, W], s)         # -> Kernel
    (y,) = k(x, w)

See :mod:`texpr.codegen.ir.schedule` (primitives), :mod:`texpr.codegen.loopnest.lower`
(buffers, and one compiled unit per materialised stage),
:mod:`texpr.codegen.loopnest.stage` (how a stage becomes loop nests; its values are
written by :mod:`texpr.codegen.loopnest.emit`, its checks decided by
:mod:`texpr.codegen.analysis.bounds`), :mod:`texpr.codegen.loopnest.source` (the text: user
names only in escaped comments, ``Kernel.source`` readable),
:mod:`texpr.codegen.backends.numba_cpu.units` (the unit interface the kernel's driver calls),
:mod:`texpr.codegen.analysis.contraction` (which stages are GEMMs, and their plans;
:mod:`texpr.codegen.backends.numpy_host.gemm` runs a plan on numpy's BLAS),
:mod:`texpr.codegen.profile` (``kernel.profile``, ``TEXPR_PROFILE=1``: the time of
each unit) and :mod:`texpr.codegen.backends.numba_cpu.compile` (numba, the caches and their integrity checks,
worker processes; :mod:`texpr.codegen.backends.numba_cpu.vectorize` decides, from a unit's text,
whether LLVM's loop vectoriser runs on it);
every tuning knob is a field of :class:`texpr.codegen.options.Options`
(``codegen.build(..., options=)``, ``with codegen.options(unroll=4):``,
``docs/options.md``); which stages get buffers by default is the materialisation rule of
``docs/stages.md``, and the data flow up to here is ``docs/pipeline.md``.
"""

import os as _os

from . import _aliases
from .options import Options, current as current_options, options, using

if not _os.environ.get("_TEXPR_COMPILE_WORKER"):
    # (a compile worker process, see texpr.codegen.backends.numba_cpu.compile, needs numba only: it
    # skips the simplifier, sympy and islpy that build and lower import)
    from .build import Kernel, build
    from .backends.numba_cpu.compile import CacheWarning, CompileError, cache_dir, clear_memory_cache
    from .profile import report as profile_report
    from .ir.schedule import Schedule, Stage, create_schedule

__all__ = ["build", "Kernel", "create_schedule", "Schedule", "Stage", "CompileError",
           "CacheWarning", "cache_dir", "clear_memory_cache", "profile_report",
           "Options", "options", "using", "current_options"]

_aliases.install(__name__)


def __getattr__(name):
    """``codegen.stage`` and the other modules that moved (:mod:`codegen._aliases`)."""
    return _aliases.attribute(__name__, name)
