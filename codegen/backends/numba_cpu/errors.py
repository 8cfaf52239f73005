"""The numba CPU backend's compile error and cache warning, and its one-time warnings.

One job: the exceptions and warnings of compiling units and of their disk
cache (:mod:`codegen.backends.numba_cpu.compile`,
:mod:`codegen.backends.numba_cpu.disk_cache`), each warning issued once per
process and cause.
"""

import warnings

from texpr.errors import TexprError, TexprWarning

__all__ = ["CompileError", "CacheWarning", "warn_once"]

_WARNED = set()


class CompileError(TexprError):
    """Numba failed to compile a generated kernel (the message names the stages)."""


class CacheWarning(TexprWarning):
    """The on-disk kernel cache was repaired (a corrupt entry rebuilt) or could not
    be used (kernels are then compiled in memory)."""


def warn_once(tag, message):
    """Issue :class:`CacheWarning` ``message`` unless one of ``tag`` was issued
    in this process."""
    if tag in _WARNED:
        return
    _WARNED.add(tag)
    warnings.warn(message, CacheWarning, stacklevel=4)
