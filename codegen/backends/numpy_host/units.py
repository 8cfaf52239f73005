"""The unit kind that runs a contraction plan on numpy's BLAS (``kind`` ``"blas"``).

One job: the runnable unit (:mod:`codegen.units` interface) of a stage planned as
GEMMs by :func:`codegen.analysis.contraction.match`; the plan itself runs in
:mod:`codegen.backends.numpy_host.gemm` (imported here: it registers the plans'
runner, :func:`codegen.ir.contraction_plan.register_runner`).
"""

from ... import units as _units
from ..plan_unit import PlanUnit
from . import gemm as _gemm

__all__ = ["ContractionUnit"]


class ContractionUnit(PlanUnit):
    """A runnable unit (:mod:`codegen.units` interface): ``run(arrays, err)`` runs
    the plan on the kernel's flat buffers. Nothing is compiled."""

    kind = "blas"

    def run(self, arrays, err):
        _gemm.run_plan(self.plan, arrays)


_units.register("blas", ContractionUnit)
