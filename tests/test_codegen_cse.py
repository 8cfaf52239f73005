"""codegen.loopnest.cse: repeated subexpressions computed once, large selects as if
statements; the text runs the same (pure Python here, numba in the kernels),
and nothing guarded by a condition is evaluated where it was not."""

import ast

import numpy as np

import texpr as te
from texpr import codegen
from texpr.codegen.loopnest.cse import hoist_common_subexpressions

_HEAD = "import numpy as np\n\n\ndef unit(b0, b1, out):\n"


def _run(text, b0, b1):
    ns = {"np": np}
    exec(text, ns)
    out = np.zeros(3)
    ns["unit"](b0, b1, out)
    return out


def _body(*lines):
    return _HEAD + "".join("    " + ln + "\n" for ln in lines) + "    return 0\n"


def test_repeats_are_computed_once():
    e = "np.tanh(b0[0] * 2.0 + b1[1])"
    text = _body(f"out[0] = {e} * {e} + np.exp({e})")
    new = hoist_common_subexpressions(text, "unit")
    assert new.count("np.tanh(") == 1 and "cse" in new
    b0, b1 = np.array([0.3, 0.1]), np.array([0.2, -0.4])
    np.testing.assert_array_equal(_run(new, b0, b1), _run(text, b0, b1))


def test_a_repeat_only_inside_a_branch_stays_there():
    # b1[5] is out of range: only the branch that is not taken reads it
    guarded = "np.exp(b1[5] * 3.0 + 1.0)"
    text = _body(f"out[0] = ({guarded} + {guarded} if b0[0] > 1.0 else 2.0)")
    new = hoist_common_subexpressions(text, "unit")
    b0, b1 = np.array([0.5, 0.1]), np.array([0.2, -0.4])
    np.testing.assert_array_equal(_run(new, b0, b1), [2.0, 0.0, 0.0])
    tree = ast.parse(new)
    hoisted = [n for n in ast.walk(tree) if isinstance(n, ast.Assign)
               and isinstance(n.targets[0], ast.Name) and n.targets[0].id.startswith("cse")]
    for h in hoisted:  # any temporary for the guarded load sits inside the if
        assert "b1[5]" not in ast.unparse(h) or h.col_offset > 4


def test_a_sum_of_large_selects_becomes_if_statements():
    big = " + ".join(f"np.sin(b0[{k % 2}] * {k}.0)" for k in range(12))
    assert len(list(ast.walk(ast.parse(big)))) >= codegen.Options().cse_split_nodes
    text = _body(f"out[1] += (({big}) if b0[0] > 0.2 else 0.0) + (({big}) * 2.0 if b0[1] < 0.0 "
                 "else -1.0)")
    new = hoist_common_subexpressions(text, "unit")
    assert new.count("if b0[0] > 0.2") == 1 and "else:" in new
    with np.errstate(invalid="ignore"):  # sin(inf) is NaN, as intended
        for b0 in (np.array([0.5, 0.1]), np.array([0.1, -0.3]), np.array([np.nan, -np.inf])):
            b1 = np.zeros(2)
            np.testing.assert_array_equal(_run(new, b0, b1), _run(text, b0, b1))


def test_only_its_own_temporaries():
    text = _body("cse0 = b0[0] + b0[1] + b0[0] + b0[1]", "out[0] = cse0")
    assert hoist_common_subexpressions(text, "unit") == text


def test_a_select_behind_and_is_not_evaluated_first():
    # (found by an attack on this pass) a bool stage `p and <large select>`: the
    # select must not run where p is false (its load would be out of range)
    big = " + ".join(f"np.sin(b0[_ck(b1[0], 2, err, 1)] * {k}.0)" for k in range(12))
    text = ("import numpy as np\n\n\ndef unit(b0, b1, out, err):\n"
            f"    out[0] = b1[0] < 2 and ((({big}) if b0[0] > 0.2 else 0.0) > 1.0)\n"
            "    return 0\n")
    assert hoist_common_subexpressions(text, "unit") == text


def test_no_check_runs_before_an_earlier_one():
    # (found by an attack on this pass) the first failing check is the one
    # reported: a large select after a check stays in place, and so does a
    # repeated subexpression that holds a check
    big = " + ".join(f"np.sin(b0[0] // _nz(b1[1], err, 2) * {k}.0)" for k in range(12))
    text = ("import numpy as np\n\n\ndef unit(b0, b1, out, err):\n"
            f"    out[0] = b0[_ck(b1[0], 2, err, 1)] + (({big}) if b0[0] > 0.2 else 0.0)\n"
            "    out[1] = b0[_ck(b1[0], 2, err, 1)] * 2.0 + b0[_ck(b1[0], 2, err, 1)]\n"
            "    return 0\n")
    assert hoist_common_subexpressions(text, "unit") == text


def test_kernel_of_a_guarded_gather_behind_and_raises_as_the_evaluator():
    # the attack's case end to end: a bool stage (I[i] < n) & (select(...) > 1) whose
    # select reads X[I[i]]; te.evaluate raises nothing, nor may the kernel
    n = 5
    X = te.placeholder((n,), name="X")
    I = te.placeholder((n,), dtype="int64", name="I")

    def body(i):
        g = X[I[i]]
        big = (te.exp(g) * te.sigmoid(g) + te.tanh(g) * te.exp(g) * te.sigmoid(g)
               + te.log(te.abs(g) + 1) * te.tanh(g))
        sel = te.if_then_else(g > 0.5, big * big + te.sigmoid(g), te.sigmoid(g) * g * big)
        return (I[i] < n) & (sel > 1.0)
    Y = te.compute((n,), body, name="Y")
    kernel = codegen.build([Y], [X, I])
    x = np.random.default_rng(3).random(n).astype("float32")
    i = np.array([0, 7, 2, 9, 4])
    np.testing.assert_array_equal(kernel(x, i)[0], te.evaluate(Y, {X: x, I: i}))
