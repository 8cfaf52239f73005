"""Adjoint accumulation: reverse mode over the graph of stages.

Walks the stages reachable from ``output`` in reverse topological order. The
adjoint of ``output`` is the head; every other tensor ``t`` on a path from an
input to the output gets the sum of the *contributions* of its consumers
(:func:`texpr.jacobian.contribution`, or a user's ``manual`` function). A
tensor with one contribution takes it as its adjoint (no ``0 + x`` stage);
a tensor with several gets one elementwise stage ``c1[p, j] + c2[p, j] + ...``
(tag ``"adjoint_sum"``). Int and bool tensors have no adjoint; a structurally
zero contribution is never built, and a tensor all of whose contributions are
zero has no adjoint (``DifferentiationResult.result`` then holds a zeros stage).

The raw adjoint form (what ``simplify`` receives)
--------------------------------------------------
With ``head`` of shape ``prefix + out.shape`` (the adjoint of the consumer
``out``, axes ``i``, body ``B``) the contribution of ``out`` to an input ``inp``
is ONE compute stage (tag ``"adjoint_contribution"``, ``attrs`` ``{"out",
"inp"}``) over ``prefix + inp.shape`` with axes ``(p..., j...)``::

    d_inp__out[p, j] = sum(H[p, i'] * D(i', k', j),
                           axis=[i'..., k'...], where=W(i', k'))

* ``i'`` are fresh reduction axes mirroring ``out``'s axes (names ``r_<axis>``),
  ``k'`` mirror ``B``'s reduction axes (same bounds), ``W`` is ``B``'s
  ``where=`` condition (``True`` for an elementwise body); with no axes at all
  (a scalar elementwise ``out``) the body is just ``H[p] * D``.
* ``D = sum over loads L = inp[f(i, k)] of B's source:
  select(all(f(i', k') == j), dB/dL, 0)`` (:func:`texpr.jacobian.derivative`),
  the partials built by the rule table of :mod:`texpr.rules` (symbolic zeros,
  constants folded, nothing else simplified).
* Non-sum reducers keep this shape with their extra factors:
  ``max``/``min``: ``select(flat(k') == argidx[i'], H[p, i'] * D, 0)`` with
  ``argidx`` an argmax stage (tag ``"argmax"``);
  ``prod``/custom: ``H[p, i'] * sum_c dY/dx_c * D_c`` through
  ``Y = (before (+) x) (+) after``, ``before``/``after`` the reductions over the
  points before and after ``k'`` (tag ``"reduction_rest"``).
* Scatter-add stages ``out[idx(q)] += value(q)``: the same form with ``H[p, idx(q')]``
  summed over the domain ``q'``; the ``init`` tensor receives ``H`` itself.
* A load whose index reads data (``inp[I[k]]``, a *gather*) is left out of ``D``:
  its term is a scatter-add stage ``d[p, I[k']] += H[p, i'] * dB/dL`` over
  ``(p, i', k')`` where ``W`` holds and the load is evaluated
  (:func:`texpr.jacobian.gather_loads`), added onto the compute stage above
  (its ``init``; that stage is then named ``d_inp__out_dense``). Its index is
  checked like the forward's: out of range raises, never drops the term.
* ``head=None`` means the identity head: an inlineable compute (tag
  ``"identity_head"``) ``I[p, i] = select(all(p == i), 1, 0)`` of shape
  ``out.shape + out.shape`` (for a scalar output: the constant 1).

The simplifier then lifts those selects into the reduction domains and
solves the equalities; this module does not simplify.
"""

from . import dtypes as dt
from .adjoint_stages import identity_head, sum_stage, zeros
from .errors import DTypeError, NotDifferentiableError, ShapeError, TexprError
from .jacobian import check_head, contribution
from .scan import ScanOp, check_not_in_a_body
from .scan_adjoint import scan_contributions
from .tensor import PlaceholderOp, Tensor, as_tensor_list, topo_order


class DifferentiationResult:
    """What :func:`texpr.differentiate` returns.

    Attributes:
        result: list of the adjoints of ``inputs``, in order; each of shape
            ``prefix + input.shape``. The object itself unpacks, indexes and
            iterates like this list (``dW, db = te.differentiate(L, [W, b])``).
        adjoints: dict Tensor -> adjoint Tensor for every tensor on a path from
            an input to the output that has a (structurally nonzero) adjoint,
            the output included (its adjoint is the head).
        adjoint_summands: dict Tensor -> {consumer Tensor: contribution Tensor}
            (the raw contributions, before summation).
        head: the head used (the identity-head stage when ``head=None``).
        simplify_record: the record of the simplification ``differentiate`` ran
            (a ``texpr.simplify.SimplifyRecord``), or None when it ran none
            (``simplify=False``).
        value: the differentiated output, simplified in the same run as the
            adjoints (so it shares their forward stages), or None when no
            simplification ran. ``texpr.codegen.build([output] + grads, ...)``
            uses it in place of ``output``: the forward is computed once.
    """

    def __init__(self, result, adjoints, adjoint_summands, head=None, simplify_record=None,
                 value=None):
        self.result = list(result)
        self.adjoints = adjoints
        self.adjoint_summands = adjoint_summands
        self.head = head
        self.simplify_record = simplify_record
        self.value = value

    def explain(self, tensors=None):
        """What the simplification did: the iteration count before and after every
        pass of every round, then the final graph (as ``texpr.simplify.explain``).

        Args:
            tensors: a Tensor or list of Tensors among ``result`` and the values of
                ``adjoints``; ``None`` means ``result`` (all of it, counted together).
        Returns:
            str.
        Raises:
            TexprError: ``differentiate`` ran with ``simplify=False`` (no record;
                ``texpr.simplify.explain(t)`` simplifies one tensor and prints that
                run), or a tensor is not one this result holds.
        """
        if self.simplify_record is None:
            raise TexprError(
                "explain: this result was not simplified (differentiate(..., simplify=False)); "
                "texpr.simplify.explain(t) simplifies one of its tensors and prints that run")
        return self.simplify_record.explain(self.result if tensors is None else tensors)

    def __iter__(self):
        return iter(self.result)

    def __getitem__(self, i):
        return self.result[i]

    def __len__(self):
        return len(self.result)

    def __repr__(self):
        names = ", ".join(t.name for t in self.result)
        return f"DifferentiationResult([{names}], {len(self.adjoints)} adjoints)"


class _Manual:
    """The user's ``manual`` overrides: ``{(out, inp): fn}``, ``None`` a wildcard."""

    def __init__(self, manual, ops, output):
        self.entries = []
        if not manual:
            return
        if not isinstance(manual, dict):
            raise TexprError("differentiate: manual must be a dict {(out, inp): fn}")
        edges = [(o, t) for op in ops for o in op.outputs for t in op.input_tensors()]
        for key, fn in manual.items():
            if not (isinstance(key, tuple) and len(key) == 2):
                raise TexprError(f"differentiate: manual key {key!r} must be a pair (out, inp)")
            ko, ki = key
            for k in key:
                if k is not None and not isinstance(k, Tensor):
                    raise TexprError(f"differentiate: manual key {key!r} holds {k!r}, "
                                     "not a Tensor or None")
            if not callable(fn):
                raise TexprError(f"differentiate: manual entry for {self._key_str(key)} "
                                 f"is not callable: {fn!r}")
            if not any((ko is None or ko is o) and (ki is None or ki is t) for o, t in edges):
                raise TexprError(
                    f"differentiate: the manual entry {self._key_str(key)} matches no edge "
                    f"(consumer, input) of the graph of {output.name}; a manual function "
                    "gives the adjoint contribution of a consumer to a tensor it reads")
            self.entries.append((ko, ki, fn))

    @staticmethod
    def _key_str(key):
        return "(" + ", ".join("None" if k is None else k.name for k in key) + ")"

    def lookup(self, out, inp):
        """The most specific entry for the edge, or None; ties are an error."""
        best, best_rank, clash = None, -1, False
        for ko, ki, fn in self.entries:
            if (ko is None or ko is out) and (ki is None or ki is inp):
                rank = (ko is not None) + (ki is not None)
                if rank > best_rank:
                    best, best_rank, clash = fn, rank, False
                elif rank == best_rank:
                    clash = True
        if clash:
            raise TexprError(f"differentiate: several manual entries match the edge "
                             f"({out.name}, {inp.name}) equally; make one more specific")
        return best


def accumulate(output, inputs=None, head=None, manual=None):
    """Reverse-mode accumulation of adjoints (raw form; see the module docstring).

    Args:
        output: the Tensor differentiated (float dtype).
        inputs: a Tensor or list of Tensors (placeholders or intermediate
            tensors); ``None``: every float placeholder ``output`` depends on.
        head: a Tensor of shape ``prefix + output.shape`` (the seed adjoint),
            or ``None`` for the identity head (full Jacobian).
        manual: dict ``{(out, inp): fn}``; ``fn(out, inp, head) -> Tensor`` of shape
            ``prefix + inp.shape`` replaces the automatic contribution of ``out``
            to ``inp`` (``out``'s adjoint ``head``); either key may be ``None``
            (wildcard); the most specific entry wins. ``fn`` must return a
            Tensor (zeros for an edge that contributes nothing): ``None`` is an
            error, not a silent zero; its dtype must be ``promote(head.dtype,
            out.dtype)``, the automatic contribution's.
    Returns:
        DifferentiationResult.
    Raises:
        NotDifferentiableError: ``output`` or an input is not a float tensor.
        ShapeError: ``head`` or a manual result has the wrong shape.
        DTypeError: a manual result's dtype is not the automatic contribution's,
            ``promote(head.dtype, out.dtype)`` (it is never cast).
        TexprError: a manual entry matches no edge, or a manual function returns
            None or a non-Tensor (the message names the edge); bad arguments.
    """
    if not isinstance(output, Tensor):
        raise TexprError(f"differentiate: output must be a Tensor, got {output!r}")
    if not dt.is_float(output.dtype):
        raise NotDifferentiableError(
            f"differentiate: output {output.name} has dtype {output.dtype}; only float "
            "tensors can be differentiated")
    ops = topo_order([output])
    if inputs is None:
        inputs = [op.output(0) for op in ops
                  if isinstance(op, PlaceholderOp) and dt.is_float(op.output(0).dtype)]
    else:
        inputs = as_tensor_list(inputs, "differentiate: inputs")
    for t in inputs:
        if not dt.is_float(t.dtype):
            raise NotDifferentiableError(
                f"differentiate: input {t.name} has dtype {t.dtype}; integer and bool tensors "
                "(indices, masks, labels) have no gradient")
    check_not_in_a_body(inputs, ops, "differentiate")
    if head is None:
        head = identity_head(output)
    elif not isinstance(head, Tensor):
        raise TexprError(f"differentiate: head must be a Tensor or None, got {head!r}")
    elif not dt.is_float(head.dtype):
        raise NotDifferentiableError(f"differentiate: head {head.name} has dtype {head.dtype}")
    prefix = check_head(output, head)
    adj_dtype = dt.promote(head.dtype, output.dtype)
    manual = _Manual(manual, ops, output)

    # tensors that depend (through float values) on an input
    input_ids = {id(t) for t in inputs}
    depends = set(input_ids)
    for op in ops:
        if any(id(t) in depends for t in op.input_tensors()):
            depends.update(id(o) for o in op.outputs if dt.is_float(o.dtype))

    adjoints, summands, cache = {}, {}, {}
    if id(output) in depends:
        adjoints[output] = head
    for op in reversed(ops):
        if isinstance(op, PlaceholderOp):
            continue
        if isinstance(op, ScanOp):
            _scan_step(op, output, adjoints, summands, depends, prefix, manual)
            continue
        for out in op.outputs:
            if out is not output:
                _finalize(out, summands, adjoints)
            h = adjoints.get(out)
            if h is None:
                continue
            seen = set()
            for inp in op.input_tensors():
                if id(inp) in seen or id(inp) not in depends or not dt.is_float(inp.dtype):
                    continue
                seen.add(id(inp))
                fn = manual.lookup(out, inp)
                if fn is not None:
                    c = fn(out, inp, h)
                    _check_manual(c, out, inp, prefix, h)
                else:
                    c = contribution(out, inp, h, cache)
                if c is not None:
                    summands.setdefault(inp, {})[out] = c
    for op in ops:
        if isinstance(op, PlaceholderOp):
            _finalize(op.output(0), summands, adjoints)

    result = []
    for t in inputs:
        a = adjoints.get(t)
        if a is None:
            a = zeros(prefix + tuple(t.shape), dt.promote(adj_dtype, t.dtype), f"d_{t.name}")
        result.append(a)
    return DifferentiationResult(result, adjoints, summands, head)


def _scan_step(op, output, adjoints, summands, depends, prefix, manual):
    """The contributions of a scan to its inputs: all its states' adjoints at once
    (the reverse-time scan of :mod:`texpr.scan_adjoint`)."""
    for out in op.outputs:
        if out is not output:
            _finalize(out, summands, adjoints)
    heads = [adjoints.get(out) for out in op.outputs]
    if all(h is None for h in heads):
        return
    wanted = []
    for inp in op.input_tensors():
        if id(inp) not in depends or not dt.is_float(inp.dtype):
            continue
        for out in op.outputs:
            if manual.lookup(out, inp) is not None:
                raise TexprError(
                    f"differentiate: a manual entry matches the edge ({out.name}, {inp.name}) "
                    f"of the scan {op.name}; a scan's adjoint couples all its states, so its "
                    "edges cannot be overridden one by one")
        wanted.append(id(inp))
    for _tid, (inp, c) in scan_contributions(op, heads, prefix, wanted).items():
        summands.setdefault(inp, {})[op.output(0)] = c


def _finalize(t, summands, adjoints):
    if t in adjoints:
        return
    parts = list(summands.get(t, {}).values())
    if not parts:
        return
    adjoints[t] = parts[0] if len(parts) == 1 else sum_stage(t, parts, f"d_{t.name}")


def _check_manual(c, out, inp, prefix, head):
    """Refuse a manual function's result ``c`` for the edge ``(out, inp)`` (``out``'s
    adjoint ``head``) that is not a Tensor of shape ``prefix + inp.shape`` and of
    the automatic contribution's dtype, ``promote(head.dtype, out.dtype)``: as JAX's
    ``custom_vjp`` refuses a backward result of another dtype, the gradient's
    dtype never changes silently (a float32 result in a float64 graph would
    round every gradient through it)."""
    if c is None:
        # a function that forgot its ``return`` would silently drop the edge
        raise TexprError(
            f"differentiate: the manual function for the edge ({out.name}, {inp.name}) "
            f"returned None; it must return the contribution of {out.name} to the "
            f"adjoint of {inp.name}, a Tensor of shape prefix + {inp.name}.shape "
            f"(for an edge that contributes nothing, return a stage of zeros)")
    if not isinstance(c, Tensor):
        raise TexprError(f"differentiate: the manual function for ({out.name}, {inp.name}) "
                         f"returned {c!r}, not a Tensor")
    want = tuple(prefix) + tuple(inp.shape)
    if tuple(c.shape) != want:
        raise ShapeError(
            f"differentiate: the manual function for ({out.name}, {inp.name}) returned "
            f"{c.name} of shape {c.shape}; expected prefix + {inp.name}.shape = {want}")
    dtype = dt.promote(head.dtype, out.dtype)
    if c.dtype != dtype:
        raise DTypeError(
            f"differentiate: the manual function for the edge ({out.name}, {inp.name}) "
            f"returned {c.name} of dtype {c.dtype}; expected {dtype}, the dtype of the "
            f"automatic contribution (the head is {head.dtype}, {out.name} is {out.dtype}); "
            f"a manual result is never cast: build it in {dtype}, or cast it with "
            f"te.cast(x, '{dtype}') where the rounding is intended")
