"""One :func:`codegen.analysis.contraction.match` per contraction stage and build.

One job: remember, for the length of one ``codegen.build``, what the GEMM
matcher said of each stage, so that the graph rewrites
(:mod:`codegen.rewrite.operands`, :mod:`codegen.rewrite.tap_split`,
:mod:`codegen.rewrite.windows`, :mod:`codegen.rewrite.split_reductions`) and the
strategy (:mod:`codegen.strategy`) share one analysis. Before, the gradient of
a dense layer (three sum stages) ran the matcher 10 times, and a convolution's 18
times (issue 49, finding 3); now 3 and 7 (tests/test_strategy.py).

The memo is keyed by what the matcher reads of a stage: its name, axes,
attributes and body, with every tensor it loads replaced by a slot (the
tensor's name, shape, dtype and, for a window stage of
:mod:`codegen.rewrite.windows`, its region). A rewrite that only re-points a
stage at a rewritten producer of the same shape (``rebuild`` makes a new
operation: the loss reading a convolution's output, after
:func:`window_operands` gave the convolution a window of its input) shares the
analysis, keyed anew for the new tensors, while a
stage whose body changed is analysed anew, never given a stale result. A
stage whose body reaches an inlined stage (the strategy's view, after the
schedule is made) is keyed by the operation object and the inlined stages it
reaches. A plan is analysed with tensors as its keys and handed out keyed anew
(:func:`codegen.analysis.contraction.rekey`) for every caller; the matcher's
reason for a refusal and its exceptions are remembered too.

Outside :func:`build_scope` (a rewrite called on its own, as tests do) every
call runs the matcher.
"""

import contextlib
import contextvars

from texpr import expr as E
from texpr.tensor import ComputeOp

from . import contraction
from ..ir.marks import WINDOW, WINDOW_ORDER

__all__ = ["match", "build_scope"]

#: the memo of the build under way: ``{stage key: (outcome, its tensors, its op)}``, or None
_MEMO = contextvars.ContextVar("texpr_codegen_match_memo", default=None)


@contextlib.contextmanager
def build_scope():
    """Share the matcher's results between the passes of one build (re-entrant:
    a build inside a build keeps the outer memo)."""
    if _MEMO.get() is not None:
        yield
        return
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def _reached_inlined(op, inlined):
    """The ids of the inlined stages ``op``'s body reaches (through inlined ones)."""
    if not inlined:
        return frozenset()
    seen, todo = set(), [op]
    while todo:
        for t in todo.pop().input_tensors():
            o = t.op
            if id(o) in inlined and id(o) not in seen and isinstance(o, ComputeOp):
                seen.add(id(o))
                todo.append(o)
    return frozenset(seen)


#: the attributes of a loaded tensor's stage that the matcher reads (a window's region)
_PRODUCER_ATTRS = (WINDOW, WINDOW_ORDER)


def _plain(attr):
    """A node attribute as a key part: plain values as they are, objects by id."""
    if attr is None or isinstance(attr, (str, int, float, bool)):
        return (type(attr).__name__, attr)
    if isinstance(attr, tuple):
        return tuple(_plain(x) for x in attr)
    return ("id", id(attr))


def _structure(op):
    """``(key, tensors)``: the stage as the matcher reads it, with the tensors it
    loads as slots (first-load order), and those tensors; None for a stage the
    walk does not know (keyed by the object then)."""
    if not isinstance(op, ComputeOp):
        return None
    tensors, slots, seen = [], {}, {}

    def slot(t):
        k = slots.get(id(t))
        if k is None:
            attrs = getattr(t.op, "attrs", None) or {}
            window = tuple((name, repr(attrs[name])) for name in _PRODUCER_ATTRS
                           if name in attrs)
            k = slots[id(t)] = (len(tensors), t.name, tuple(t.shape), t.dtype, window)
            tensors.append(t)
        return k

    def walk(node):
        got = seen.get(id(node))
        if got is not None:
            return got
        if isinstance(node, E.Load):
            out = ("ld", slot(node.tensor), tuple(walk(a) for a in node.args), node.dtype)
        elif not node.args:
            out = ("node", id(node))  # interned: equal leaves are one object
        else:
            out = (type(node).__name__, _plain(node.attr), tuple(walk(a) for a in node.args),
                   node.dtype)
        seen[id(node)] = out
        return out

    attrs = tuple((k, repr(v)) for k, v in sorted(op.attrs.items()))
    key = ("op", op.name, tuple(id(a) for a in op.axis), attrs,
           tuple(walk(b) for b in op.body))
    return key, tensors


def _same(t):
    return t


def match(op, inlined=(), key=None, why=None):
    """:func:`codegen.analysis.contraction.match`, run once per stage and build.

    Args:
        op: the stage's ComputeOp.
        inlined: ids of the inlined ops.
        key: ``tensor -> buffer key`` for the returned plan (default: the name).
        why: a list; when the stage does not match, the reason is appended.
    Returns:
        A :class:`ContractionPlan` of the caller's own (keyed by ``key``), or None.
    Raises:
        What the matcher raised for this stage (again, on every call).
    """
    memo = _MEMO.get()
    key = key or (lambda t: t.name)
    if memo is None:
        return contraction.match(op, inlined, key=key, why=why)
    inl = set(inlined)
    reached = _reached_inlined(op, inl)
    shape = None if reached else _structure(op)
    if shape is None:
        slot, tensors = ("object", id(op), reached), []
        memo.setdefault(("held", id(op)), op)  # (its id stays its own while the memo lives)
    else:
        slot, tensors = shape
    held = memo.get(slot)
    if held is None:
        reasons = []
        try:
            outcome = ("plan", contraction.match(op, inl, key=_same, why=reasons), reasons)
        except Exception as exc:  # noqa: BLE001 - remembered, raised to every caller
            outcome = ("raise", exc, reasons)
        held = memo[slot] = (outcome, tensors, op)
    (kind, value, reasons), first, first_op = held
    if kind == "raise":
        raise value
    if value is None:
        if why is not None:
            why.extend(reasons)
        return None
    # the analysed stage's tensors -> this stage's (the same slots), then the caller's keys
    moved = {id(a): b for a, b in zip(first, tensors)}
    moved[id(first_op.output(0))] = op.output(0)
    return contraction.rekey(value, lambda t: key(moved.get(id(t), t)))
