"""Tap splitting (codegen/rewrite/tap_split.py): a contraction whose im2col copy would be
larger than its result times its taps runs as a GEMM over its channels and a
col2im loop nest, with the values of the stage it replaces -- against the
evaluator (finite and non-finite inputs), finite differences and PyTorch."""

import numpy as np
import pytest

import texpr as te
from texpr import codegen, simplify
from texpr import expr as E
from texpr.codegen.rewrite.tap_split import split_taps
from texpr.tensor import topo_order

from conv_testutil import assert_same_values, check_conv_kernel, conv_loss
from fuzz import every_contraction_on_blas as blas_at_any_size  # the cost rule off

nn = te.nn


def _split_names(L, wrt):
    outs = simplify.simplify([L] + list(te.differentiate(L, wrt).result))
    with blas_at_any_size():
        _, made, _ = split_taps(outs)
    return sorted(op.name for op in made)


def test_the_input_gradient_splits_where_it_has_fewer_channels():
    # dX has 3 channels, its contraction sums over 5: the taps' stage (3 x 9 per
    # pixel) is smaller than H's im2col (5 x 9 per pixel)
    L, (X, W, H) = conv_loss(3, 5)
    assert _split_names(L, [X, W]) == ["d_X__conv_taps"]
    # the forward stage splits the other way round: 3 -> 2 channels
    L, (X, W, H) = conv_loss(3, 2)
    assert _split_names(L, [X, W]) == ["conv_taps"]
    # equal channels: the im2col copy is no larger, nothing splits
    L, (X, W, H) = conv_loss(3, 3)
    assert _split_names(L, [X, W]) == []


def test_a_strided_input_gradient_splits_when_its_tap_sum_moves_only_valid_points(
        monkeypatch):
    # stride 2: dX reads W at mixed indices (j - 2 * r + 1) and the GEMM path packs
    # H once per residue class, more elements than the taps' stage holds; its tap
    # sum is sparse (an output point reads 1 or 2 of its taps per axis), which a
    # shift plan's moves do not visit
    L, (X, W, H) = conv_loss(3, 5, stride=2)
    assert _split_names(L, [X, W]) == ["d_X__conv_taps"]
    # as a loop nest over its box the sparse tap sum does not pay (MIN_DENSITY)
    import texpr.codegen.analysis.shifts as S
    monkeypatch.setattr(S, "ENABLED", False)
    assert _split_names(L, [X, W]) == []


@pytest.mark.parametrize("cin,cout,stride,dilation,padding,k", [
    (3, 5, 1, 1, 1, 3),   # dX splits
    (3, 5, 1, 2, 2, 3),   # dilated: dX splits
    (4, 2, 1, 1, 0, 2),   # forward splits, no padding, even kernel
    (3, 5, 2, 1, 1, 3),   # strided: dX splits (H's per-class copies are larger)
    (5, 3, 2, 1, 1, 3),   # strided: nothing pays
])
def test_split_kernels_match_the_evaluator_fd_and_torch(cin, cout, stride, dilation, padding, k):
    L, ins = conv_loss(cin, cout, stride, dilation, padding, k)
    X, W, H = ins
    grads = list(te.differentiate(L, [X, W]).result)
    with blas_at_any_size():
        kernel = codegen.build([L] + grads, ins)
    stages = [u.stage for u in kernel.units]
    assert any(s.endswith("_taps") for s in stages) == ((cin, cout) != (5, 3)), stages
    check_conv_kernel(kernel, L, ins, grads, stride, dilation, padding, cin * 10 + cout)


@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
def test_non_finite_head_reaches_the_evaluators_outputs(value):
    # the taps' GEMM meets the infinity (its exact path), the loop nest adds it
    # at exactly the outputs whose taps read it: a border value reaches fewer
    L, ins = conv_loss(3, 5, dtype="float32")
    X, W, H = ins
    dX = te.differentiate(L, [X]).result[0]
    with blas_at_any_size():
        kernel = codegen.build([dX], ins)
    assert any(u.stage == "d_X__conv_taps" and u.kind == "blas" for u in kernel.units)
    rng = np.random.default_rng(1)
    feed = {t: rng.standard_normal(t.shape).astype("float32") for t in ins}
    for pos in [(0, 1, 0, 0), (1, 4, 3, 3), (0, 0, 6, 2)]:
        f = dict(feed)
        f[H] = feed[H].copy()
        f[H][pos] = value
        got, = kernel(*[f[t] for t in ins])
        want = te.evaluate(dX, f)
        assert_same_values(got, want)


def test_a_tap_mixed_with_an_axis_the_other_operand_reads_is_not_split():
    # out[i, j] = sum(A[i + r, s] * B[j, i, r, s]): B reads i, which A mixes with
    # the tap r; the taps' stage could not hold B's dependence on i
    A = te.placeholder((9, 6), "A", "float64")
    B = te.placeholder((3, 6, 4, 6), "B", "float64")
    r, s = te.reduce_axis(4, "r"), te.reduce_axis(6, "s")
    out = te.compute((6, 3), lambda i, j: te.sum(A[i + r, s] * B[j, i, r, s], axis=[r, s]),
                     name="out")
    with blas_at_any_size():
        _, made, _ = split_taps([out])
    assert made == []


def test_a_stage_reading_a_split_stage_is_kept_in_the_returned_list():
    # pack_operands hands its packed stages to split_taps (keep=): one that reads
    # a split stage is rebuilt, and the list names the rebuilt op (the build
    # materialises what it returns; a stale op was inlined and lost its masks)
    L, (X, W, H) = conv_loss(3, 5)
    outs = simplify.simplify([L] + list(te.differentiate(L, [X]).result))
    dx = outs[1]
    reader = te.compute(dx.shape, lambda *i: dx[i] * 2.0, name="reader")
    with blas_at_any_size():
        new, made, kept = split_taps([reader], keep=[reader.op])
    assert [op.name for op in made] == ["d_X__conv_taps"]
    assert kept == [new[0].op] and new[0].op is not reader.op
    assert new[0].op in topo_order(new)


def test_a_tap_over_a_shrunk_domain_is_read_at_its_offset():
    # a reduction axis over [1, 3) (as the simplifier leaves a shrunk domain): the
    # taps' stage's axis runs over [0, 2) and is read at k - 1
    H = te.placeholder((2, 5, 9), "H", "float64")
    W = te.placeholder((5, 3, 3), "W", "float64")
    o, k = te.reduce_axis(5, "o"), te.reduce_axis((1, 3), "k")
    out = te.compute((2, 3, 8), lambda n, c, h: te.sum(H[n, o, h + k - 1] * W[o, c, k],
                                                       axis=[o, k]), name="out")
    with blas_at_any_size():
        new, made, _ = split_taps([out])
        kernel = codegen.build([out], [H, W])
    assert [op.name for op in made] == ["out_taps"] and made[0].output(0).shape[1] == 2
    assert "out_taps" in kernel.stages
    rng = np.random.default_rng(2)
    feed = {H: rng.standard_normal(H.shape), W: rng.standard_normal(W.shape)}
    want = te.evaluate(out, feed)
    np.testing.assert_allclose(te.evaluate(new[0], feed), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(kernel(feed[H], feed[W])[0], want, rtol=1e-10, atol=1e-10)


def test_an_input_gradient_behind_a_relu_splits_with_its_mask():
    # conv0 -> relu -> conv1: dX of conv0 multiplies a packed operand (the head
    # masked by the relu) whose condition moves into the taps' stage, applied on
    # the GEMM path's exact path only (the packed operand is zero where it fails)
    from conv_testutil import assert_same_values
    X = te.placeholder((2, 3, 7, 7), "X", "float64")
    W0 = te.placeholder((5, 3, 3, 3), "W0", "float64")
    b0 = te.placeholder((5,), "b0", "float64")
    W1 = te.placeholder((4, 5, 3, 3), "W1", "float64")
    h = nn.relu(nn.conv2d(X, W0, b0, padding=1, name="conv0"), name="relu0")
    y = nn.conv2d(h, W1, padding=1, name="conv1")
    H = te.placeholder(y.shape, "H", "float64")
    ax = [te.reduce_axis(s, a) for s, a in zip(y.shape, "ncij")]
    L = te.compute((), lambda: te.sum(y[tuple(ax)] * H[tuple(ax)], axis=ax), name="L")
    ins = [X, W0, b0, W1, H]
    grads = list(te.differentiate(L, [X]).result)
    with blas_at_any_size():
        kernel = codegen.build([L] + grads, ins)
    taps = [u for u in kernel.units if u.stage == "d_X__conv0_taps"]
    assert taps and taps[0].kind == "blas", kernel.stages
    # (the units keep no op: the plan says the stage is a packed one)
    assert all(v.masks_only_non_finite for p in taps[0].plan.pieces for v in (p.a, p.b))
    rng = np.random.default_rng(8)
    feed = {t: rng.standard_normal(t.shape) for t in ins}
    got = kernel(*[feed[t] for t in ins])
    for g, w in zip(got, te.evaluate([L] + grads, feed)):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)
    from texpr.testing import numeric_gradient
    np.testing.assert_allclose(got[1], numeric_gradient(L, X, feed), rtol=1e-6, atol=1e-7)
    ref = simplify.simplify([L] + grads)
    for t, pos, v in ((W0, (1, 0, 0, 0), np.inf), (H, (0, 1, 0, 0), np.nan),
                      (W1, (2, 3, 2, 2), -np.inf)):
        f = dict(feed)
        f[t] = feed[t].copy()
        f[t][pos] = v
        for g, w in zip(kernel(*[f[s] for s in ins]), te.evaluate(ref, f)):
            assert_same_values(np.asarray(g), np.asarray(w), rtol=1e-10, atol=1e-10)


def _transpose_loss(cin, cout, stride, padding, k, size=4, output_padding=0):
    X = te.placeholder((2, cin, size, size), "X", "float64")
    W = te.placeholder((cin, cout, k, k), "W", "float64")
    y = nn.conv2d_transpose(X, W, stride=stride, padding=padding,
                            output_padding=output_padding, name="convt")
    H = te.placeholder(y.shape, "H", "float64")
    ax = [te.reduce_axis(s, a) for s, a in zip(y.shape, "ncij")]
    L = te.compute((), lambda: te.sum(y[tuple(ax)] * H[tuple(ax)], axis=ax), name="L")
    return L, [X, W, H], y


@pytest.mark.parametrize("cin,cout,stride,padding,k,output_padding", [
    (5, 3, 2, 1, 4, 0),   # the suite's conv2d_transpose_s2, smaller
    (4, 2, 3, 1, 6, 0),   # stride 3: 9 residue classes of 2 x 2 taps
    (6, 2, 2, 2, 5, 1),   # odd kernel, output padding
])
def test_a_transposed_convolution_splits_into_taps_and_strided_moves(
        cin, cout, stride, padding, k, output_padding):
    # its value reads X at (h + p - kh) // s where (h + p - kh) % s == 0: the taps'
    # stage reads X as a view (no per-class packing), and the tap sum adds each
    # tap's slice at stride s (codegen.analysis.shifts' lattice moves)
    L, ins, y = _transpose_loss(cin, cout, stride, padding, k, output_padding=output_padding)
    X, W, H = ins
    grads = list(te.differentiate(L, [X, W]).result)
    with blas_at_any_size():
        kernel = codegen.build([L] + grads, ins)
    kinds = {u.stage: u.kind for u in kernel.units}
    assert kinds.get("convt_taps") == "blas" and kinds.get("convt") == "shift", kinds
    check_conv_kernel(kernel, L, ins, grads, stride, 1, padding, cin * 100 + stride,
                      output_padding=output_padding)
    rng = np.random.default_rng(cin * 100 + stride)
    feed = {t: rng.standard_normal(t.shape) for t in ins}
    # an infinity in X reaches exactly the outputs whose taps read it
    f = dict(feed)
    f[X] = feed[X].copy()
    f[X][1, 0, 2, 1] = np.inf
    with blas_at_any_size():
        vk = codegen.build([y], [X, W])
    assert {u.stage: u.kind for u in vk.units}.get("convt") == "shift"
    assert_same_values(vk(f[X], f[W])[0], te.evaluate(y, f))


def test_a_tap_sum_whose_valid_points_are_no_progression_keeps_its_loop_nest():
    # out[i] = sum_k T[k, i] where (i + k) % 3 != 0: for a fixed tap the valid i are
    # two residues of three, no strided move holds them
    from texpr.codegen.analysis import shifts
    from texpr.codegen.backends.numba_cpu.shift_units import run_moves
    from texpr.codegen.rewrite.tap_split import SPLIT
    from texpr.tensor import ComputeOp
    T = te.placeholder((4, 9), "T", "float64")
    k = te.reduce_axis(4, "k")
    i = E.iter_var(0, 9, "i", "spatial")
    body = te.sum(T[k, i], axis=k, where=(i + k) % 3 != 0)
    op = ComputeOp("out", [i], (body,), "tap_split", {SPLIT: True})
    assert shifts.plan_of(op, id) is None
    # the same sum over a residue class is a plan of strided moves, and right
    body = te.sum(T[k, i], axis=k, where=(i + k) % 3 == 0)
    op = ComputeOp("out", [i], (body,), "tap_split", {SPLIT: True})
    plan = shifts.plan_of(op, id)
    assert plan is not None and all(m[3] == [3] for m in plan.moves), plan.moves
    # an empty output axis under a condition: no moves, no plan (attack helper-36:
    # a KeyError escaped plan_of)
    T0 = te.placeholder((3, 5), "T0", "float64")
    k0 = te.reduce_axis(3, "k0")
    h0 = E.iter_var(0, 0, "h0", "spatial")
    empty = ComputeOp("empty", [h0], (te.sum(T0[k0, (h0 + 1 - k0) // 2], axis=k0,
                                             where=(h0 + k0 + 1) % 2 == 0),),
                      "tap_split", {SPLIT: True})
    assert shifts.plan_of(empty, id) is None
    t = np.random.default_rng(1).standard_normal((4, 9))
    out = np.full(9, np.nan)
    run_moves(plan, {id(T): t.reshape(-1), id(op.output(0)): out})
    want = [sum(t[kk, ii] for kk in range(4) if (ii + kk) % 3 == 0) for ii in range(9)]
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


#: random transposed convolutions (strides 1-3, dilations 1-2, paddings, output
#: paddings, an infinity or a NaN in X in about a third): the lattice moves'
#: fuzz, run in CI at this count (600-program runs in the closing notes)
TRANSPOSED_SEED, TRANSPOSED_PROGRAMS = 20262600, 24


def test_random_transposed_convolutions_match_the_evaluator():
    import random
    made = lattice = 0
    for seed in range(TRANSPOSED_SEED, TRANSPOSED_SEED + TRANSPOSED_PROGRAMS):
        r = random.Random(seed)
        s, d, k = r.choice([1, 2, 2, 3, 3]), r.choice([1, 1, 2]), r.randint(1, 5)
        p = r.randint(0, d * (k - 1))
        out_pad = r.randint(0, max(0, min(s, d) - 1))
        cin, cout, size = r.randint(2, 6), r.randint(1, 3), r.randint(1, 6)
        X = te.placeholder((r.randint(1, 2), cin, size, size + r.randint(0, 2)), "X", "float64")
        W = te.placeholder((cin, cout, k, k), "W", "float64")
        try:
            y = nn.conv2d_transpose(X, W, stride=s, padding=p, output_padding=out_pad,
                                    dilation=d, name="ct")
        except te.ShapeError:  # an empty output: drawn again with the next seed
            continue
        H = te.placeholder(y.shape, "H", "float64")
        ax = [te.reduce_axis(q, a) for q, a in zip(y.shape, "ncij")]
        L = te.compute((), lambda: te.sum(y[tuple(ax)] * H[tuple(ax)], axis=ax), name="L")
        outs = [y, L] + list(te.differentiate(L, [X, W]).result)
        with blas_at_any_size():
            kernel = codegen.build(outs, [X, W, H])
        made += sum(u.stage.endswith("_taps") for u in kernel.units)
        lattice += sum(u.kind == "shift" and u.plan.lattice
                       for u in kernel.units)
        rng = np.random.default_rng(seed)
        feed = {t: rng.standard_normal(t.shape) for t in (X, W, H)}
        if r.random() < 0.35:
            feed[X].reshape(-1)[r.randrange(feed[X].size)] = r.choice([np.inf, -np.inf, np.nan])
        got = kernel(*[feed[t] for t in (X, W, H)])
        for g, w in zip(got, te.evaluate(outs, feed)):
            assert_same_values(np.asarray(g), np.asarray(w), rtol=1e-9, atol=1e-9)
    assert made >= 4 and lattice >= 2, (made, lattice)


def test_conditions_evaluate_exactly_with_floor_semantics():
    # the lattice moves find each axis's valid values with codegen.analysis.affine.eval_cond
    from texpr.codegen.analysis.affine import eval_cond
    i = E.iter_var(-9, 9, "i", "spatial")
    k = E.iter_var(0, 4, "k", "reduce")
    conds = [((i + k) % 3 == 0), ((i - k) // 2 >= -1), (i < k) | (i % 2 == 1),
             E.logical_not(i * 2 + k != 4), E.const(True), (i >= 0) & ((i // (k - 3)) == -1)]
    py = [lambda a, b: (a + b) % 3 == 0, lambda a, b: (a - b) // 2 >= -1,
          lambda a, b: a < b or a % 2 == 1, lambda a, b: not (a * 2 + b != 4),
          lambda a, b: True, None]
    for a in range(-9, 9):
        for b in range(4):
            env = {id(i): a, id(k): b}
            for c, f in zip(conds, py):
                got = eval_cond(c, env)
                if f is None:  # a division by zero at k == 3, past a true i >= 0
                    assert got == (None if a >= 0 and b == 3 else
                                   (a >= 0 and a // (b - 3) == -1))
                else:
                    assert got == f(a, b), (c, a, b)
    # a load is no index arithmetic
    T = te.placeholder((4,), "T", "int64")
    assert eval_cond(T[k] > 0, {id(k): 1}) is None
