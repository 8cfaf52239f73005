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
``prefix_scan``     sums over triangles -> scans
``scan_body``       a scan's body simplified as a graph of its own
``runner``          run a pass list once; the env switches, the verifier
``pipeline``        the ordered list and the fixpoint
``entry``           simplify(), explain(): the symbolic cache first, the pipeline on a miss
``record``          SimplifyRecord: what a run did (kept on adjoint stages)
==================  =========================================================

Names are imported on first access: a process whose graphs are all in the
symbolic cache never imports the pass pipeline (nor SymPy).
"""

import importlib as _importlib

#: public name -> the module defining it; imported on first access, so that a
#: process that only loads cached kernels (codegen's loop-nest helpers import
#: ``isl_bridge`` and ``loop_ast``) never imports the pass pipeline and SymPy
_EXPORTS = {
    "simplify": "entry", "simplify_with_record": "entry", "SimplifyRecord": "record",
    "keep_record": "record", "explain": "entry", "PIPELINE": "pipeline",
    "SimplifyError": "runner", "run_passes": "pipeline", "verify_equal": "runner",
    "iteration_count": "materialize", "materialized_stages": "materialize",
    "stage_count": "materialize", "should_inline": "materialize", "is_cheap": "materialize",
    "inlined_stages": "materialize", "tree_size": "materialize", "written_out": "materialize",
    "Written": "materialize",
    "is_support_stage": "support",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'texpr.simplify' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
