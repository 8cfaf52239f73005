"""One :func:`codegen.analysis.contraction.match` per contraction stage and build.

One job: remember, for the length of one ``codegen.build``, what the GEMM
matcher said of each stage, so that the graph rewrites
(:mod:`codegen.rewrite.operands`, :mod:`codegen.rewrite.tap_split`,
:mod:`codegen.rewrite.windows`, :mod:`codegen.rewrite.split_reductions`) and the
strategy (:mod:`codegen.strategy`) share one analysis. Before, a dense gradient
of two contraction stages ran the matcher 10 times (issue 49, finding 3).

The memo is keyed by the stage's operation object (held, so that its id is
not reused) and by the inlined stages its body reaches: a rewritten stage is a
new object and gets its own analysis, never a stale one; a stage matched
before the schedule is made (no stage inlined) and again by the strategy
shares the analysis when none of the stages it reads is inlined. A plan is
analysed with tensors as its keys and handed out keyed anew
(:func:`codegen.analysis.contraction.rekey`) for every caller; the matcher's
reason for a refusal and its exceptions are remembered too.

Outside :func:`build_scope` (a rewrite called on its own, as tests do) every
call runs the matcher.
"""

import contextlib
import contextvars

from texpr.tensor import ComputeOp

from . import contraction

__all__ = ["match", "build_scope"]

#: the memo of the build under way: ``{id(op): (op, {inlined key: outcome})}``, or None
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
    slot = (_reached_inlined(op, inl),)
    held = memo.get(id(op))
    if held is None or held[0] is not op:
        held = memo[id(op)] = (op, {})
    outcome = held[1].get(slot)
    if outcome is None:
        reasons = []
        try:
            outcome = ("plan", contraction.match(op, inl, key=_same, why=reasons), reasons)
        except Exception as exc:  # noqa: BLE001 - remembered, raised to every caller
            outcome = ("raise", exc, reasons)
        held[1][slot] = outcome
    kind, value, reasons = outcome
    if kind == "raise":
        raise value
    if value is None:
        if why is not None:
            why.extend(reasons)
        return None
    return contraction.rekey(value, key)
