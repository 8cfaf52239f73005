"""Running a list of passes once: :func:`run_passes` and the switches beside it.

One job: apply passes in order, printing the graph after each with
``TEXPR_PRINT_PASSES=1`` and checking each with ``TEXPR_VERIFY=1``
(:func:`verify_equal`: evaluate the graph before and after on one random feed,
graphs up to :data:`VERIFY_MAX_POINTS` points, and raise
:class:`SimplifyError` naming the pass if they differ). The whole pipeline
(:mod:`texpr.simplify.pipeline`) and the pipeline a scan's body runs
(:mod:`texpr.simplify.scan_body`) both run through it, and compare rounds by
:func:`fingerprint`.
"""

import os
import sys

import numpy as np

from texpr.errors import OutOfBoundsError, TexprError
from texpr.evaluate import evaluate
from texpr.printer import graph_str
from texpr.testing import random_feed

from .materialize import iteration_count

VERIFY_MAX_POINTS = 2_000_000


class SimplifyError(TexprError):
    """A pass changed the value of a graph (found by ``TEXPR_VERIFY=1``)."""


def fingerprint(tensors):
    """The canonical text of a graph: equal texts mean a round changed nothing.

    Args:
        tensors: list of Tensors.
    Returns:
        str.
    """
    return graph_str(tensors, canonical=True)


def verify_equal(before, after, what="pass", seed=0):
    """Evaluate two graphs with the same outputs on one random feed; raise
    :class:`SimplifyError` if they differ.

    Args:
        before, after: lists of Tensors, output by output the same values.
        what: the name the error gives to what changed the value.
        seed: the random feed's seed.
    Returns:
        True when checked; False when the graph is too big to evaluate or cannot
        be evaluated on that feed (nothing checked).
    Raises:
        SimplifyError: an output's values differ.
    """
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


def run_passes(tensors, passes, record=None):
    """Run ``passes`` once over ``tensors``.

    Args:
        tensors: list of Tensors.
        passes: sequence of passes ``list[Tensor] -> list[Tensor]``.
        record: ``record(pass, before, after)``, called after each pass when given.
    Returns:
        list of Tensors: the graph after the last pass.
    Raises:
        SimplifyError: with ``TEXPR_VERIFY=1``, a pass changed a value.
    """
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
