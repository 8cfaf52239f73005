"""The Jacobian simplifier: one explicit, ordered list of passes.

Each pass is a pure function ``list[Tensor] -> list[Tensor]`` (same order,
shapes, dtypes and values; placeholders kept). :func:`simplify` runs the list
until the graph stops changing (at most :data:`MAX_ROUNDS` rounds), so it is
idempotent: running it on its own output changes nothing.

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

import os
import sys

import numpy as np

from texpr.errors import TexprError
from texpr.printer import graph_str
from texpr.testing import random_feed
from texpr.tensor import Tensor

from .cleanup import algebraic_cleanup, eliminate_common_stages
from .hoist import hoist_invariants
from .inline import inline_elementwise, inline_tail_accesses
from .lift import lift_conditions, split_sums
from .materialize import iteration_count
from .entry import simplify, simplify_with_record  # noqa: F401 - re-exported
from .record import SimplifyRecord, keep_record, record_of  # noqa: F401 - re-exported
from .propagate import propagate_zero_conditions
from .scatter import gathers_to_scatters
from .prefix_scan import prefix_sums_to_scans
from .scan_body import simplify_scan_bodies
from .solve import solve_equalities, tighten_domains
from .support import restrict_to_support
from .zeros import explicit_zero_products

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
    hoist_invariants,           # oversized bodies: shared invariant parts become stages
    eliminate_common_stages,    # identical stages merged; max reads its argmax stage
    restrict_to_support,        # an output zero outside an affine region iterates over it only
)

MAX_ROUNDS = 4
VERIFY_MAX_POINTS = 2_000_000


class SimplifyError(TexprError):
    """A pass changed the value of a graph (found by ``TEXPR_VERIFY=1``)."""


def _fingerprint(tensors):
    return graph_str(tensors, canonical=True)


def verify_equal(before, after, what="pass", seed=0):
    """Evaluate two graphs with the same outputs on one random feed; raise
    :class:`SimplifyError` if they differ. Returns False when the graph is too
    big to evaluate or cannot be evaluated on that feed (nothing checked)."""
    from texpr.errors import OutOfBoundsError
    from texpr.evaluate import evaluate

    try:
        if iteration_count(before) > VERIFY_MAX_POINTS:
            return False
    except TexprError:
        return False
    feed = random_feed(list(before) + list(after), seed, int_high=1)
    try:
        want = evaluate(list(before), feed)
    except OutOfBoundsError:
        return False
    got = evaluate(list(after), feed)
    for t, a, b in zip(before, want, got):
        scale = max(1.0, float(np.max(np.abs(a))) if a.size else 1.0)
        if a.shape != b.shape or not np.allclose(a, b, rtol=1e-4, atol=1e-4 * scale,
                                                 equal_nan=True):
            raise SimplifyError(f"simplify: {what} changed the value of {t.name}")
    return True


def run_passes(tensors, passes=PIPELINE, record=None):
    """Run ``passes`` once over ``tensors``; ``record(pass, before, after)`` is
    called after each pass when given."""
    printing = os.environ.get("TEXPR_PRINT_PASSES", "") not in ("", "0")
    verifying = os.environ.get("TEXPR_VERIFY", "") not in ("", "0")
    for p in passes:
        before = tensors
        tensors = p(tensors)
        if printing:
            print(f"--- after {p.__name__}:\n{graph_str(tensors)}", file=sys.stderr)
        if verifying:
            verify_equal(before, tensors, p.__name__)
        if record is not None:
            record(p, before, tensors)
    return tensors


def _simplify_with_record(tensors):
    """:func:`simplify_with_record` without the cache."""
    record = SimplifyRecord(tensors)
    fp = _fingerprint(tensors)
    for rnd in range(MAX_ROUNDS):
        def step(p, before, after, rnd=rnd):
            record.steps.append((rnd + 1, p.__name__, list(before), list(after)))

        tensors = run_passes(tensors, record=step)
        record.rounds = rnd + 1
        new_fp = _fingerprint(tensors)
        if new_fp == fp:
            record.converged = True
            break
        fp = new_fp
    record.outputs = list(tensors)
    return tensors, record


def explain(tensor):
    """The pipeline's record for one tensor: for every pass of every round, the
    iteration count before and after it (``=`` when the pass changed nothing),
    then the final printed definition (every stage the tensor needs).

    For a tensor returned by ``te.differentiate`` (its ``result`` or its
    ``adjoints`` values) this is the record of the simplification that built
    it, over the whole graph of that call. Any other tensor (e.g. a raw
    adjoint of ``differentiate(..., simplify=False)``) is simplified here on
    its own and that run is printed.

    Args:
        tensor: a Tensor.
    Returns:
        str.
    Raises:
        TexprError: ``tensor`` is not a Tensor.
    """
    if not isinstance(tensor, Tensor):
        raise TexprError(f"explain: expected a Tensor, got {type(tensor).__name__}")
    record = record_of(tensor)
    if record is None:
        (tensor,), record = simplify_with_record([tensor])
    return record.explain([tensor])
