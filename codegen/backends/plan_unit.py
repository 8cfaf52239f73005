"""The base of the units that run a plan (plain data) on the host: no loop nest of
their own to compile.

One job: what such a unit holds and says (its stage, arguments, errors, plan,
and the compile-status fields of the :mod:`codegen.units` interface), shared by
the backends' plan units: :class:`codegen.backends.numpy_host.units.ContractionUnit`
(a GEMM plan on numpy's BLAS) and the loop-nest backend's ``ShiftUnit``
(a shift plan by compiled moves). Each subclass sets ``kind`` and ``run``, so
neither backend imports the other.
"""

__all__ = ["PlanUnit"]


class PlanUnit:
    """A runnable unit (:mod:`codegen.units` interface) made from a unit
    description ``desc`` (its ``stage``, ``args``, ``errors``, ``plan``):
    ``run(arrays, err)`` runs the plan on the kernel's flat buffers. Nothing is
    compiled for it (a subclass that loads compiled helpers says so in its
    ``compile_seconds``, ``compiled`` and cache fields)."""

    kind = None

    def __init__(self, desc):
        self.stage, self.args, self.errors = desc.stage, desc.args, desc.errors
        self.plan = desc.plan
        self.key = self.path = None
        self.compile_seconds = 0.0
        self.from_disk_cache, self.from_memory_cache, self.compiled = False, True, False
        self.in_worker = False

    def run(self, arrays, err):
        """Run the plan on ``arrays`` (the kernel's flat buffers); ``err`` is unused
        (a plan raises its errors)."""
        raise NotImplementedError(f"{type(self).__name__}.run")

    def __repr__(self):
        return f"{type(self).__name__}({self.stage!r}, {self.plan.describe()})"
