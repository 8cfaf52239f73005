"""codegen: schedules, isl loop nests and Numba kernels for texpr graphs.

    s = codegen.create_schedule([Y])          # optional
    k = codegen.build([Y], [X, W], s)         # -> Kernel
    (y,) = k(x, w)

See :mod:`codegen.schedule` (primitives), :mod:`codegen.lower` (how stages
become loop nests) and :mod:`codegen.compile` (numba and the caches).
"""

from .build import Kernel, build
from .compile import CompileError, cache_dir, clear_memory_cache
from .schedule import Schedule, Stage, create_schedule

__all__ = ["build", "Kernel", "create_schedule", "Schedule", "Stage", "CompileError",
           "cache_dir", "clear_memory_cache"]
