"""texpr.simplify: the Jacobian simplifier (zero elimination with ISL and SymPy).

The pass pipeline, ``explain`` and the environment switches are described in
``docs/pipeline.md``; the materialisation rule, scatter-add and support stages
in ``docs/stages.md``; how to add a pass in ``docs/extending.md``.

Public API:

* :func:`simplify` -- the pass pipeline on a whole graph (``te.differentiate``
  calls it; ``codegen.build`` without a schedule runs it again: it is idempotent).
* :func:`iteration_count` -- exact number of points visited by a graph
  (barvinok's symbolic ``card``: no enumeration, milliseconds at 10^8 points).
* :func:`materialized_stages` -- which stages get buffers (the rule codegen's
  default schedule uses too; see :mod:`texpr.simplify.materialize`).
* :func:`explain` -- the per-pass record of one tensor: iteration counts before
  and after every pass (for a ``te.differentiate`` result, the record of the
  simplification that built it).
* :func:`simplify_with_record` -- :func:`simplify` that also returns the
  :class:`SimplifyRecord` of the run (``te.differentiate`` keeps it).
* :func:`is_support_stage` -- whether a stage is an elementwise stage iterating
  over its nonzero region only (an identity, injective scatter-add: a consumer
  such as codegen may run its loops in parallel; see :mod:`texpr.simplify.support`).
* :data:`PIPELINE` -- the ordered pass list (:mod:`texpr.simplify.pipeline`).

Modules, one job each:

==================  =========================================================
``isl_bridge``      the only islpy importer: IR <-> PwAff/Set, counting, solving
``sympy_bridge``    the only sympy importer: canonical index arithmetic
``graph``           rebuilding a Tensor graph stage by stage
``terms``           an expression as a sum of guarded terms (nonzeroness)
``domain``          iteration domains: solve equalities, tighten boxes, count
``materialize``     the inline/materialise rule and the iteration count
``inline``          inline elementwise producers; fold reductions into tails
``propagate``       a producer's zero region guards its loads in sums
``lift``            conditions into ``where=``; split sums over ``+``
``solve``           eliminate reduction axes; tighten reduction boxes
``scatter``         data-dependent gathers -> scatter-add stages
``support``         a stage zero outside an affine region iterates over it only
``cleanup``         ISL/SymPy index forms; merge identical stages
``pipeline``        the ordered list, the fixpoint, the env switches, explain
==================  =========================================================
"""

from .materialize import is_cheap, iteration_count, materialized_stages, should_inline, stage_count
from .pipeline import (PIPELINE, SimplifyError, SimplifyRecord, explain, keep_record, run_passes,
                       simplify, simplify_with_record, verify_equal)
from .support import is_support_stage

__all__ = ["simplify", "simplify_with_record", "SimplifyRecord", "keep_record",
           "iteration_count", "materialized_stages", "explain", "PIPELINE",
           "SimplifyError", "run_passes", "verify_equal", "stage_count", "should_inline",
           "is_cheap", "is_support_stage"]
