"""The simplifier's and the differentiation's test cases, run through ``codegen.build``.

Every case of the gradient suite (docs/testing.md) at its test size (``test_simplify_cases.suite(small=True)``):
the forward value and the gradients, simplified (the default build, which runs
the simplifier again: it is idempotent) and raw (the unsimplified adjoints,
built with an explicit schedule so that codegen gets the Jacobian form alone),
plus the 27-case conv2d sweep. Every output must equal ``te.evaluate``.

Compilation dominates (numba's time grows faster than linearly with a kernel's
size), so by default each group runs a representative subset (the cases the
other codegen tests do not cover) as one kernel; ``TEXPR_CODEGEN_ALL_CASES=1``
runs every case (about 8 minutes on 2 cores).
"""

import os

import numpy as np
import pytest

from texpr import codegen
import texpr as te
from test_codegen_grad import innermost_loop_bodies
from test_simplify_cases import gradients, suite, sweep_cases
from texpr.testing import random_feed
from texpr.tensor import PlaceholderOp, topo_order

RTOL = ATOL = 2e-5  # float32 placeholders
ALL = os.environ.get("TEXPR_CODEGEN_ALL_CASES") == "1"
SIMPLIFIED = ("dense", "depthwise", "conv2d_transpose_s2", "upsample2", "pixel_shuffle2",
              "flatten_dense", "transpose_sum", "layernorm", "softmax_xent")
RAW = ("conv2d_s2", "maxpool2", "pixel_shuffle2", "transpose_sum", "softmax_xent")
SWEEP = ((3, 2, 2), (2, 3, 1), (1, 2, 3))


def _pick(cases, names):
    return [(n, c) for n, c in cases if ALL or n in names]


def _group(cases, simplify_):
    outs, names = [], []
    for name, (Y, inputs, _ideal) in cases:
        grads, _H = gradients(Y, inputs, simplify_=simplify_)
        outs += [Y] + grads
        names += [f"{name}:out"] + [f"{name}:d{t.name}" for t in inputs]
    placeholders = [op.output(0) for op in topo_order(outs) if isinstance(op, PlaceholderOp)]
    return outs, names, placeholders


def _check(outs, names, placeholders, kernel):
    feed = random_feed(placeholders, seed=0)
    got = kernel(*[feed[t] for t in placeholders])
    want = te.evaluate(outs, feed)
    for n, g, w in zip(names, got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, n
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=n)


@pytest.fixture(scope="module")
def simplified_suite():
    outs, names, phs = _group(_pick(suite(small=True).items(), SIMPLIFIED), True)
    return outs, names, phs, codegen.build(outs, phs)


@pytest.fixture(scope="module")
def raw_suite():
    outs, names, phs = _group(_pick(suite(small=True).items(), RAW), False)
    return outs, names, phs, codegen.build(outs, phs, codegen.create_schedule(outs))


@pytest.fixture(scope="module")
def sweep():
    cases = [(f"k{k}s{s}d{d}", case) for (k, s, d), case in sweep_cases()
             if ALL or (k, s, d) in SWEEP]
    outs, names, phs = _group(cases, True)
    return outs, names, phs, codegen.build(outs, phs)


def test_suite_value_and_simplified_gradients(simplified_suite):
    _check(*simplified_suite)


def test_suite_value_and_raw_gradients(raw_suite):
    _check(*raw_suite)


def test_conv_sweep_value_and_gradients(sweep):
    _check(*sweep)


def test_conv_sweep_has_no_modulo_test_inside_innermost_loops(sweep):
    # stride 3 leaves 2 of 3 residues of an input row: one strided loop per residue class
    for body in innermost_loop_bodies(sweep[3].source):
        for ln in body:
            assert not (ln.lstrip().startswith("if ") and "%" in ln), ln
