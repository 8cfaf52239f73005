"""simplify: the Jacobian simplifier (zero elimination with ISL and SymPy).

Public API:

* :func:`simplify` -- the pass pipeline on a whole graph (``te.differentiate``
  calls it; codegen runs it again before lowering: it is idempotent).
* :func:`iteration_count` -- exact number of points visited by a graph.
* :func:`materialized_stages` -- which stages get buffers (the rule codegen's
  default schedule uses too).
* :func:`explain` -- the per-pass record of one tensor.
* :data:`PIPELINE` -- the ordered pass list.
"""

from .materialize import is_cheap, iteration_count, materialized_stages, should_inline, stage_count
from .pipeline import PIPELINE, SimplifyError, explain, run_passes, simplify, verify_equal

__all__ = ["simplify", "iteration_count", "materialized_stages", "explain", "PIPELINE",
           "SimplifyError", "run_passes", "verify_equal", "stage_count", "should_inline",
           "is_cheap"]
