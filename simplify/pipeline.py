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
from .inline import inline_elementwise, inline_tail_accesses
from .lift import lift_conditions, split_sums
from .materialize import as_tensor_list, iteration_count
from .propagate import propagate_zero_conditions
from .scatter import gathers_to_scatters
from .solve import solve_equalities, tighten_domains
from .support import restrict_to_support

#: the passes, in order (a name may appear twice: it runs twice per round)
PIPELINE = (
    inline_elementwise,         # identity head, Jacobian indicators, cheap producers
    propagate_zero_conditions,  # a producer's zero region guards its loads in sums
    lift_conditions,            # select(c, v, 0) in a sum's summand -> where=c
    split_sums,                 # sum(a + b) with different conditions -> sum(a) + sum(b)
    solve_equalities,           # reduction axes fixed by equalities disappear
    tighten_domains,            # reduction boxes shrink to the projection; gist where
    gathers_to_scatters,        # data-dependent index equalities -> scatter-add
    inline_elementwise,         # stages that became elementwise go into their consumers
    inline_tail_accesses,       # reshape/flatten/adjoint sum after reductions: fold them in
    algebraic_cleanup,          # ISL / sympy canonical forms of index arithmetic
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


def simplify(tensors):
    """Simplify a graph of (gradient) tensors so that it visits only nonzero terms.

    Args:
        tensors: list of Tensors (e.g. the raw adjoints of ``te.differentiate``).
    Returns:
        list of Tensors in the same order, with the same shapes, dtypes and
        values; placeholders are shared with the input graph. Idempotent.
    Raises:
        TexprError: the argument is not a list of Tensors; SimplifyError with
            ``TEXPR_VERIFY=1`` when a pass changes a value.
    """
    tensors = as_tensor_list(tensors, allow_single=False)
    fp = _fingerprint(tensors)
    for _ in range(MAX_ROUNDS):
        tensors = run_passes(tensors)
        new_fp = _fingerprint(tensors)
        if new_fp == fp:
            break
        fp = new_fp
    return tensors


def explain(tensor):
    """The pipeline's record for one tensor: for every pass of every round, the
    iteration count before and after it (``=`` when the pass changed nothing),
    then the final printed definition (every stage the tensor needs).

    Args:
        tensor: a Tensor (e.g. a raw adjoint).
    Returns:
        str.
    Raises:
        TexprError: ``tensor`` is not a Tensor.
    """
    if not isinstance(tensor, Tensor):
        raise TexprError(f"explain: expected a Tensor, got {type(tensor).__name__}")
    lines = [f"explain {tensor.name}: iteration count {iteration_count([tensor]):,} (input)"]
    tensors = [tensor]
    fp = _fingerprint(tensors)
    for rnd in range(MAX_ROUNDS):
        record_lines = []

        def record(p, before, after):
            if all(a is b for a, b in zip(after, before)):
                record_lines.append(f"  round {rnd + 1} {p.__name__:24s} =")
                return
            record_lines.append(f"  round {rnd + 1} {p.__name__:24s} "
                                f"{iteration_count(before):>18,} -> "
                                f"{iteration_count(after):>18,}")

        tensors = run_passes(tensors, record=record)
        new_fp = _fingerprint(tensors)
        if new_fp == fp:
            lines.append(f"  round {rnd + 1}: no pass changed the graph")
            break
        lines.extend(record_lines)
        fp = new_fp
    lines.append(f"final: iteration count {iteration_count(tensors):,}")
    lines.append(graph_str(tensors))
    return "\n".join(lines)
