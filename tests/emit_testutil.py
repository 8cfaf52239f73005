"""Helpers of the tests that drive codegen's expression emitter directly
(codegen.loopnest.emit.ExprEmitter): an emitter over named buffers, and the run-time
helpers its text calls, in plain Python, so that the emitted lines can be run
with ``exec`` against ``te.evaluate``."""

import numpy as np

from texpr.codegen.loopnest.emit import ExprEmitter


class Buf:
    """What the emitter reads of a buffer: its name in the text and its shape."""

    def __init__(self, name, shape):
        self.name, self.shape = name, shape


def emitter(*tensors):
    """An ExprEmitter of stage ``S`` whose buffers are ``tensors``, named ``bx``
    (the first), ``bi`` (the second), ``b2``, ``b3``, ... in the text."""
    names = ["bx", "bi"] + [f"b{k}" for k in range(2, len(tensors))]
    return ExprEmitter({}, {id(t): Buf(n, t.shape) for t, n in zip(tensors, names)}, "S", [])


def nesting(text):
    """The deepest nesting of brackets in ``text`` (CPython's parser allows 200)."""
    depth = deepest = 0
    for ch in text:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth -= 1
    return deepest


class CheckFailed(Exception):
    """A run-time check of the emitted text failed: ``args[0]`` is its code."""


def _ck(i, n, err, code):
    if not 0 <= i < n:
        raise CheckFailed(int(code))
    return i


def namespace(**buffers):
    """Globals to ``exec`` emitted lines in: numpy, the float min/max helpers, a
    bounds check that raises :class:`CheckFailed`, and ``buffers``."""
    ns = {"np": np, "_ck": _ck, "err": None, "_fmax_float64": max, "_fmin_float64": min}
    ns.update(buffers)
    return ns
