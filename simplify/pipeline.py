"""The Jacobian simplifier: one explicit, ordered list of passes.

Each pass is a pure function ``list[Tensor] -> list[Tensor]`` (same order,
shapes, dtypes and values; placeholders kept). :func:`simplify` runs the list
until the graph stops changing (at most :data:`MAX_ROUNDS` rounds), so it is
idempotent: running it on its own output changes nothing. A scan's body runs
:data:`BODY_PIPELINE`, the same list without the passes that build
scatter-adds, scans and support stages (:mod:`texpr.simplify.scan_body`).
Running a list once, and the environment switches, are
:mod:`texpr.simplify.runner`'s job.

Environment variables:

* ``TEXPR_PRINT_PASSES=1`` -- print the graph after every pass (to stderr).
* ``TEXPR_VERIFY=1`` -- evaluate every pass's input and output on random data
  (graphs up to :data:`VERIFY_MAX_POINTS` points) and raise
  :class:`SimplifyError` naming the pass if they differ.

The algorithm is TVM's zero elimination for tensor-expression autodiff
(S. Grechanik, "Automatic differentiation for tensor expressions", TVM RFC
#1996) with the integer reasoning done by ISL (Verdoolaege, ICMS 2010) and the
counting by barvinok (Verdoolaege et al., Algorithmica 2007).
"""

from . import runner, scan_body
from .cleanup import algebraic_cleanup, eliminate_common_stages
from .inline import inline_elementwise, inline_tail_accesses
from .lift import lift_conditions, split_sums
from .prefix_scan import prefix_sums_to_scans
from .propagate import propagate_zero_conditions
from .record import SimplifyRecord
from .runner import SimplifyError, VERIFY_MAX_POINTS, verify_equal  # noqa: F401 - re-exported
from .scatter import gathers_to_scatters
from .solve import solve_equalities, tighten_domains
from .support import restrict_to_support
from .zeros import explicit_zero_products


def simplify_scan_bodies(tensors):
    """Every scan stage's body simplified as a graph of its own, by
    :data:`BODY_PIPELINE` (:func:`texpr.simplify.scan_body.simplify_bodies`)."""
    return scan_body.simplify_bodies(tensors, BODY_PIPELINE)


#: the passes, in order (a name may appear twice: it runs twice per round)
PIPELINE = (
    simplify_scan_bodies,       # a scan's body is a graph of its own: the same passes on it
    inline_elementwise,         # identity head, Jacobian indicators, cheap producers
    explicit_zero_products,     # select(c, a, 0) * b -> select(c, a * b, 0): symbolic zeros
    propagate_zero_conditions,  # a producer's zero region guards its loads in sums
    lift_conditions,            # select(c, v, 0) in a sum's summand -> where=c
    split_sums,                 # sum(a + b) with different conditions -> sum(a) + sum(b)
    solve_equalities,           # reduction axes fixed by equalities disappear
    tighten_domains,            # reduction boxes shrink to the projection; gist where
    prefix_sums_to_scans,       # sums over triangles (k <= j) -> scans: O(n), not O(n^2)
    gathers_to_scatters,        # data-dependent index equalities -> scatter-add
    inline_elementwise,         # stages that became elementwise go into their consumers
    inline_tail_accesses,       # reshape/flatten/adjoint sum after reductions: fold them in
    algebraic_cleanup,          # ISL / sympy canonical forms of index arithmetic
    eliminate_common_stages,    # identical stages merged; max reads its argmax stage
    restrict_to_support,        # an output zero outside an affine region iterates over it only
)

#: the passes a scan's body runs: all but those that turn stages into scatter-adds,
#: scans or support stages (a body holds compute stages only), and this one
BODY_PIPELINE = tuple(p for p in PIPELINE if p not in (
    simplify_scan_bodies, prefix_sums_to_scans, gathers_to_scatters, restrict_to_support))

MAX_ROUNDS = 4


def run_passes(tensors, passes=PIPELINE, record=None):
    """Run ``passes`` (by default :data:`PIPELINE`) once over ``tensors``; as
    :func:`texpr.simplify.runner.run_passes`."""
    return runner.run_passes(tensors, passes, record)


def _simplify_with_record(tensors):
    """:func:`texpr.simplify.simplify_with_record` without the cache."""
    record = SimplifyRecord(tensors)
    fp = runner.fingerprint(tensors)
    for rnd in range(MAX_ROUNDS):
        def step(p, before, after, rnd=rnd):
            record.steps.append((rnd + 1, p.__name__, list(before), list(after)))

        tensors = run_passes(tensors, record=step)
        record.rounds = rnd + 1
        new_fp = runner.fingerprint(tensors)
        if new_fp == fp:
            record.converged = True
            break
        fp = new_fp
    record.outputs = list(tensors)
    return tensors, record
