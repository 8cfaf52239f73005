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
from texpr.tensor import PlaceholderOp, Tensor, as_tensor_list

from .cleanup import algebraic_cleanup, eliminate_common_stages
from .inline import inline_elementwise, inline_tail_accesses
from .lift import lift_conditions, split_sums
from .materialize import iteration_count
from .propagate import propagate_zero_conditions
from .scatter import gathers_to_scatters
from .scan_body import simplify_scan_bodies
from .solve import solve_equalities, tighten_domains
from .support import restrict_to_support

#: the passes, in order (a name may appear twice: it runs twice per round)
PIPELINE = (
    simplify_scan_bodies,       # a scan's body is a graph of its own: the same passes on it
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
    return simplify_with_record(tensors)[0]


def simplify_with_record(tensors):
    """:func:`simplify`, keeping the record of what every pass did.

    Args:
        tensors: list of Tensors.
    Returns:
        ``(simplified, record)``: the list :func:`simplify` returns and a
        :class:`SimplifyRecord` of the run (``record.explain(ts)`` prints the
        iteration counts before and after every pass for any of ``simplified``).
    Raises:
        as :func:`simplify`.
    """
    tensors = as_tensor_list(tensors, "simplify", allow_single=False)
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


class SimplifyRecord:
    """What one :func:`simplify` run did to a graph, kept for :func:`explain`.

    Attributes:
        inputs: the list of Tensors simplified.
        outputs: the list returned (same order).
        steps: one ``(round, pass name, before, after)`` per pass run, ``before``
            and ``after`` the whole list of Tensors around that pass.
        rounds: how many rounds of :data:`PIPELINE` ran.
        converged: whether the last round changed nothing (the fixpoint).

    Iteration counts are computed only when :meth:`explain` asks for them.
    """

    def __init__(self, inputs):
        self.inputs = list(inputs)
        self.outputs = None
        self.steps = []
        self.rounds = 0
        self.converged = False

    def positions(self, tensors):
        """The positions of ``tensors`` (members of :attr:`outputs`, by identity).

        Raises:
            TexprError: a tensor is not one of the outputs of this run.
        """
        out = []
        for t in as_tensor_list(tensors, "explain"):
            pos = [n for n, o in enumerate(self.outputs) if o is t]
            if not pos:
                raise TexprError(f"explain: {t.name} is not one of the tensors this "
                                 "simplification returned")
            out.append(pos[0])
        return out

    def explain(self, tensors):
        """The table :func:`explain` prints, for some of this run's outputs.

        Args:
            tensors: a Tensor or list of Tensors, each one of :attr:`outputs`.
        Returns:
            str: the iteration count of their graph before the pipeline, then for
            every pass of every round the count before and after it (``=`` when
            the pass changed none of them), then the final graph.
        Raises:
            TexprError: a tensor is not one of the outputs.
        """
        pos = self.positions(tensors)
        names = ", ".join(self.outputs[n].name for n in pos)

        def pick(graph):
            return [graph[n] for n in pos]

        lines = [f"explain {names}: iteration count "
                 f"{iteration_count(pick(self.inputs)):,} (input)"]
        last_round = self.rounds if self.converged else None
        width = max([len(name) for _r, name, _b, _a in self.steps] + [1])
        for rnd, name, before, after in self.steps:
            if rnd == last_round:
                continue
            b, a = pick(before), pick(after)
            if all(x is y for x, y in zip(a, b)):
                lines.append(f"  round {rnd} {name:{width}s} =")
            else:
                lines.append(f"  round {rnd} {name:{width}s} {iteration_count(b):>12,} -> "
                             f"{iteration_count(a):>12,}")
        if last_round is not None:
            lines.append(f"  round {last_round}: no pass changed the graph")
        final = pick(self.outputs)
        lines.append(f"final: iteration count {iteration_count(final):,}")
        lines.append(graph_str(final))
        return "\n".join(lines)


def record_of(tensor):
    """The :class:`SimplifyRecord` kept on the stage of ``tensor`` by
    ``te.differentiate``, or None (see :func:`keep_record`)."""
    record = getattr(tensor.op, "simplify_record", None)
    if record is None or not any(o is tensor for o in record.outputs or ()):
        return None
    return record


def keep_record(record):
    """Attach ``record`` to the stage of each of its outputs (placeholders
    excepted), so that :func:`explain` of any of them prints it."""
    for t in record.outputs:
        if not isinstance(t.op, PlaceholderOp):
            t.op.simplify_record = record


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
