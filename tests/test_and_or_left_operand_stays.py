"""``x && false`` and ``x || true`` keep ``x`` where evaluating it may fail: it is
evaluated first (attack helper-32 on c628ca3: with ``k != k`` decided when built,
an out-of-range gather on the left of ``&& k != k`` had stopped raising, in
te.evaluate and in the kernel; before, the comparison stayed undecided)."""

import numpy as np
import pytest

import texpr as te
from texpr import codegen
from texpr.errors import OutOfBoundsError
from texpr.visitor import substitute


def _x():
    A = te.placeholder((4,), "A", "float64")
    idx = te.placeholder((4,), "idx", "int64")
    return A, idx


def test_x_and_false_after_substitution_keeps_x():
    A, idx = _x()
    i, j = te.reduce_axis(4, "i"), te.reduce_axis(4, "j")
    x = A[idx[j]] > 0
    assert te.expr_str(substitute(x & (i != j), {i: j})) != "false"
    assert te.expr_str(substitute(x | (i == j), {i: j})) != "true"


@pytest.mark.parametrize("path", ["evaluate", "build"])
def test_a_failing_left_operand_of_and_k_ne_k_still_raises(path):
    A, idx = _x()
    Y = te.compute((4,), lambda k: te.if_then_else((A[idx[k]] > 0) & (k != k), 1.0, 2.0),
                   name="Y")
    a, ix = np.arange(4.0), np.array([0, 1, 7, 2])
    with pytest.raises(OutOfBoundsError):
        if path == "evaluate":
            te.evaluate(Y, {A: a, idx: ix})
        else:
            codegen.build([Y], [A, idx])(a, ix)
