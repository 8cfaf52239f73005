"""The user-facing entry point: ``te.differentiate``.

This is the only module under ``texpr/`` that imports the ``texpr.simplify``
package: it hands the raw adjoints to the simplifier. Nothing in
``texpr.simplify`` imports this module or the ``texpr`` package face, so the
import graph stays acyclic: IR <- simplify <- this entry point, and codegen
above both (docs/pipeline.md; ``tests/test_layering.py`` checks it). The
``texpr.simplify`` package face is light: it imports its passes (and SymPy)
on first use.
"""

from . import simplify as simplify_pkg
from . import symcache
from .adjoint import DifferentiationResult, accumulate
from .errors import TexprError
from .forward import tangents as _tangents
from .tensor import as_tensor_list


def differentiate(output, inputs=None, head=None, manual=None, simplify=True):
    """Reverse-mode derivative of ``output`` w.r.t. ``inputs``.

    Args:
        output: a float Tensor.
        inputs: a Tensor or list of Tensors (placeholders or intermediate
            tensors); ``None`` means every float placeholder ``output`` depends on.
        head: the seed adjoint, a float Tensor of shape ``prefix + output.shape``;
            each result then has shape ``prefix + input.shape``. ``None`` means
            the identity: the result is the full Jacobian
            (``output.shape + input.shape``), the gradient for a scalar output.
        manual: dict ``{(out, inp): fn}``: ``fn(out, inp, head) -> Tensor`` gives the
            adjoint contribution of the consumer ``out`` to its input ``inp`` when
            ``out``'s adjoint is ``head`` (shape ``prefix + out.shape`` ->
            ``prefix + inp.shape``), replacing the automatic one. Either key may
            be ``None`` (a wildcard); the most specific entry wins. ``fn``
            returning ``None`` raises ``TexprError`` naming the edge (return a
            stage of zeros for an edge that contributes nothing). Its result
            must have the automatic contribution's dtype, ``promote(head.dtype,
            out.dtype)`` (float64 in a float64 graph): another dtype raises
            ``DTypeError`` naming the edge and both dtypes, as JAX's
            ``custom_vjp`` refuses one; it is never cast silently.
        simplify: hand the adjoints to the Jacobian simplifier
            (:func:`texpr.simplify.simplify`, docs/pipeline.md) before returning
            them, and keep the record of that run (``res.explain()``,
            ``texpr.simplify.explain(t)``); ``False`` returns the raw adjoints
            (the form described in :mod:`texpr.adjoint`). The simplified
            result is kept on disk (:mod:`texpr.symcache`, unless ``manual``
            is given): a later run with the same graph loads it, bound to
            its own tensors, instead of differentiating again.
    Returns:
        :class:`DifferentiationResult`: ``.result`` (the adjoints of ``inputs``,
        in order; the object unpacks like that list), ``.adjoints`` (tensor ->
        adjoint for every tensor on a path from an input to ``output``),
        ``.adjoint_summands`` (tensor -> {consumer: raw contribution}),
        ``.explain()`` (iteration counts before and after every pass). Int and
        bool tensors get no adjoint. Stage names: ``d_X__Y`` is the contribution
        of the consumer ``Y`` to ``X``, ``d_X`` a sum of several (or zeros);
        see docs/conventions.md. The raw form is described in
        :mod:`texpr.adjoint`; the rules and their conventions (max/min ties,
        select, sqrt and power at 0) in :mod:`texpr.rules` and :mod:`texpr.jacobian`.
    Raises:
        NotDifferentiableError: ``output``, ``head`` or an input is not a float tensor.
        ShapeError: ``head`` (or a manual function's result) has the wrong shape.
        DTypeError: a manual function's result has another dtype than the
            automatic contribution's.
        TexprError: a manual entry matches no edge of the graph, or a manual
            function returns None or a non-Tensor; bad arguments.

    The algorithm follows TVM's tensor-expression autodiff (Grechanik, TVM
    RFC #1996): per-stage Jacobians contracted with the head, accumulated in
    reverse topological order, simplified afterwards (docs/pipeline.md).

    >>> import numpy as np
    >>> import texpr as te
    >>> X = te.placeholder((3,), name="X")
    >>> k = te.reduce_axis(3, "k")
    >>> L = te.compute((), lambda: te.sum(X[k] * X[k], axis=k), name="L")
    >>> (dX,) = te.differentiate(L, [X])
    >>> print(dX)
    d_X__L[j0<3] = X[j0] + X[j0]  # float32
    >>> te.evaluate(dX, {X: np.array([1.0, 2.0, 3.0], dtype="float32")})
    array([2., 4., 6.], dtype=float32)
    """
    if not simplify:
        return accumulate(output, inputs, head, manual)
    if manual is None:
        # a warm run loads the simplified result (texpr.symcache): no symbolic work again
        try:
            roots = [output] + ([] if inputs is None else as_tensor_list(inputs, "differentiate"))
        except TexprError:  # accumulate names the bad argument
            roots = None
        if roots is not None:
            return symcache.memo(
                "differentiate", roots + ([] if head is None else [head]),
                ["inputs", inputs, "head", head],
                lambda: _simplified(accumulate(output, inputs, head, manual), output),
                check=lambda r: None if isinstance(r, DifferentiationResult) else "not a result",
                after_load=lambda r: _kept(r, output))
    return _simplified(accumulate(output, inputs, head, manual), output)


def _kept(res, output):
    """A loaded result: its record attached to its stages again (the caller's own
    stages among them, e.g. a head, are not pickled with it), and the caller's
    ``output`` named as the graph the record's first tensor simplified (its
    pickled copy is another object), so that a build of ``[output] + grads``
    finds the simplified value (:func:`texpr.simplify.simplify`)."""
    record = res.simplify_record
    if record is not None and record.inputs:
        record.inputs[0] = output
    simplify_pkg.keep_record(record)
    return res


def _simplified(res, output):
    """The raw result ``res`` of :func:`accumulate` simplified, with its record kept.

    ``output`` is simplified in the same run, first: its forward stages and the
    adjoints' are then the same objects, and ``res.value`` is its simplified
    form. A build of ``[output] + grads`` computes the forward once (the
    simplifier replaces ``output`` by ``res.value``: one program for the value
    and the gradients)."""
    order, seen = [output], {id(output)}
    for t in list(res.result) + list(res.adjoints.values()):
        if id(t) not in seen:
            seen.add(id(t))
            order.append(t)
    simplified, record = simplify_pkg.simplify_with_record(order, cache=False)
    simplify_pkg.keep_record(record)  # for texpr.simplify.explain(t)
    by_id = {id(old): new for old, new in zip(order, simplified)}
    result = [by_id[id(t)] for t in res.result]
    adjoints = {t: by_id[id(a)] for t, a in res.adjoints.items()}
    return DifferentiationResult(result, adjoints, res.adjoint_summands, res.head,
                                 simplify_record=record, value=by_id[id(output)])


def jvp(outputs, inputs, tangents, simplify=True):
    """Forward-mode derivative: the tangents of ``outputs`` along ``tangents``.

    Args:
        outputs: a float Tensor or a list of float Tensors.
        inputs: a Tensor or list of Tensors (placeholders or intermediate tensors).
        tangents: a Tensor or list of Tensors, one per input, of that input's
            shape (e.g. placeholders fed with directions): ``dX``.
        simplify: hand the tangent stages to :func:`texpr.simplify.simplify`, as
            :func:`differentiate` does with adjoints.
    Returns:
        For a Tensor ``outputs``, one Tensor; for a list, a list with one Tensor
        per output: ``dY = sum over inputs of J_Y,X . dX``, of the output's
        shape and dtype (tangent stages built per stage by :mod:`texpr.forward`;
        max/min ties and singular points follow the same conventions as
        :func:`differentiate`).
    Raises:
        NotDifferentiableError: an output, input or tangent is not a float tensor.
        ShapeError: a tangent's shape is not its input's.
        TexprError: bad arguments (not Tensors, counts that differ).

    Forward-over-reverse Hessian-vector products: ``jvp(differentiate(L, [W]).result,
    [W], [V])`` is ``H V``.
    """
    single = not isinstance(outputs, (list, tuple))
    result = _tangents(outputs, inputs, tangents)
    if simplify:
        simplified, record = simplify_pkg.simplify_with_record(result)
        simplify_pkg.keep_record(record)  # for texpr.simplify.explain(t)
        result = list(simplified)
    return result[0] if single else result
