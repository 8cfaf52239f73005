"""The simplifier's entry points: :func:`simplify`, :func:`simplify_with_record`
and :func:`explain`.

One job: look a graph up in the symbolic cache (:mod:`texpr.symcache`) and run
the pass pipeline (:mod:`texpr.simplify.pipeline`, which imports SymPy) only
on a miss, so that a process whose graphs are all cached never imports it.
"""

from texpr import symcache
from texpr.errors import TexprError
from texpr.tensor import Tensor, as_tensor_list

from .record import SimplifyRecord, record_of

__all__ = ["simplify", "simplify_with_record", "explain"]


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


def simplify_with_record(tensors, cache=True):
    """:func:`simplify`, keeping the record of what every pass did.

    Args:
        tensors: list of Tensors.
        cache: look the result up in (and store it into) the symbolic cache
            (:mod:`texpr.symcache`: keyed by the canonical text of the graph).
    Returns:
        ``(simplified, record)``: the list :func:`simplify` returns and a
        :class:`SimplifyRecord` of the run (``record.explain(ts)`` prints the
        iteration counts before and after every pass for any of ``simplified``).
    Raises:
        as :func:`simplify`.
    """
    tensors = shared_forward(as_tensor_list(tensors, "simplify", allow_single=False))
    if cache:
        def check(r):
            ok = (isinstance(r, tuple) and len(r) == 2 and isinstance(r[1], SimplifyRecord)
                  and len(r[0]) == len(tensors))
            return None if ok else "not a simplification of this graph"

        return symcache.memo("simplify", tensors, [tensors],
                             lambda: _run(tensors), check=check)
    return _run(tensors)


def shared_forward(tensors):
    """``tensors`` with each one that a kept record of another of them simplified
    (``te.differentiate`` simplifies its output with the adjoints, first)
    replaced by that simplified form.

    A training step is built as ``[loss] + grads``: ``loss`` is the user's raw
    graph, the gradients read the forward stages of the graph ``differentiate``
    simplified. Simplified apart, the two copies of the forward need not stay
    equal (a stage inlined into the loss's reduction is materialised for the
    backward pass), and the kernel computed the forward twice. The
    replacement makes it one program: the loss reads the very stages the
    gradients read.
    """
    records = []
    for t in tensors:
        r = record_of(t)
        if r is not None and all(r is not q for q in records):
            records.append(r)
    if not records:
        return tensors
    out = list(tensors)
    for n, t in enumerate(out):
        if record_of(t) is not None:
            continue
        for r in records:
            hit = [m for m, x in enumerate(r.inputs) if x is t]
            if hit:
                out[n] = r.outputs[hit[0]]
                break
    return out


def _run(tensors):
    from .pipeline import _simplify_with_record  # the passes (and SymPy): on a miss only

    return _simplify_with_record(tensors)


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
