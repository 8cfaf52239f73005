"""The unit kind that runs a contraction plan on numpy's BLAS (``kind`` ``"blas"``).

One job: the runnable unit (:mod:`codegen.units` interface) of a stage planned as
GEMMs by :func:`codegen.analysis.contraction.match`; the plan itself runs in
:mod:`codegen.backends.numpy_host.gemm`.
"""

from ... import units as _units

__all__ = ["ContractionUnit"]


class ContractionUnit:
    """A runnable unit (:mod:`codegen.units` interface): ``run(arrays, err)`` runs
    the plan on the kernel's flat buffers. Nothing is compiled."""

    kind = "blas"

    def __init__(self, desc):
        self.stage, self.args, self.errors = desc.stage, desc.args, desc.errors
        self.plan = desc.plan
        self.key = self.path = None
        self.compile_seconds = 0.0
        self.from_disk_cache, self.from_memory_cache, self.compiled = False, True, False
        self.in_worker = False

    def run(self, arrays, err):
        self.plan.run(arrays)

    def __repr__(self):
        return f"{type(self).__name__}({self.stage!r}, {self.plan.describe()})"


_units.register("blas", ContractionUnit)
