"""GEMM operands whose rows alias in the cache (texpr.codegen.backends.numpy_host.packing):
packed copies with padded rows, views whose rows lie a multiple of 4 KiB apart
copied chunk by chunk, chunks taken by the threads as they come free, and no
window stage above ``window_max_bytes``. Every value against te.evaluate of the
simplified graph (the kernels' oracle: a convolution's padding is no term there,
docs/conventions.md "Zeros"; the unsimplified conv computes ``0 * inf``)."""

import time

import numpy as np
import pytest

import texpr as te
from texpr import codegen, simplify
from texpr.codegen.backends.numpy_host import gemm as G
from texpr.codegen.backends.numpy_host import packing as P
from fuzz import every_contraction_on_blas as blas_at_any_size  # the cost rule off
from test_codegen_contraction import _count_chunked

nn = te.nn

#: every packing copy chunked (about one 16x16 image's im2col at a time)
CHUNKS = {"gemm_chunk_min_bytes": 0, "gemm_chunk_bytes": 1 << 14, "gemm_threads": 2}


def test_packed_rows_are_padded_and_aliased_views_are_found():
    assert P._padded_ld(1024, 4) == 1040          # 4 KiB rows: one cache line more
    assert P._padded_ld(256, 4) == 272            # 1 KiB rows
    assert P._padded_ld(128, 8) == 136
    assert P._padded_ld(100, 4) == 100            # 400 bytes: left alone
    assert P._padded_ld(128, 4) == 128            # 512 bytes: left alone
    x = P._padded_empty([3, 5, 1024], np.float32)
    assert x.shape == (3, 5, 1024) and x.strides == (5 * 1040 * 4, 1040 * 4, 4)
    assert not P._aliased(x)
    assert P._padded_empty([0, 1024], np.float32).shape == (0, 1024)
    big = np.zeros((288, 4096), np.float32)
    assert P._aliased(big[:, :1024])               # rows 16 KiB apart
    assert P._aliased(big[:, :1024].T)             # the same, column-major
    assert P._aliased(np.zeros((288, 1024), np.float32))
    assert not P._aliased(np.zeros((288, 1000), np.float32))
    assert not P._aliased(big[:8, :1024])          # too few rows to matter
    assert not P._aliased(big[:, ::2])             # no unit stride: no BLAS view


def _conv_kernel(n, c, o, hw, options, **conv):
    """The convolution, its input gradient and its weight gradient in one kernel."""
    x = te.placeholder((n, c, hw, hw), "X")
    w = te.placeholder((o, c // conv.get("groups", 1), 3, 3), "W")
    y = nn.conv2d(x, w, **conv)
    h = te.placeholder(y.shape, "H")
    grads = te.differentiate(y, [x, w], head=h).result
    with blas_at_any_size():
        k = codegen.build([y, *grads], [x, w, h], options=options)
    return k, (x, w, h), (y, *grads)


def _check(k, ph, outs, vals, rtol=2e-5):
    """The kernel's outputs: NaN and infinities exactly where te.evaluate of the
    simplified graph has them, close to it elsewhere."""
    got = k(*vals)
    want = te.evaluate(simplify.simplify(list(outs)), dict(zip(ph, vals)))
    for g, ref, t in zip(got, want, outs):
        for kind in (np.isnan, np.isposinf, np.isneginf):
            np.testing.assert_array_equal(kind(g), kind(ref), err_msg=t.name)
        ok = np.isfinite(ref)
        scale = float(np.max(np.abs(ref[ok]), initial=1.0))
        np.testing.assert_allclose(g[ok], ref[ok], rtol=rtol, atol=rtol * scale, err_msg=t.name)


@pytest.mark.parametrize("n,c,o,hw,conv", [
    (4, 4, 8, 16, dict(padding=1)),                   # rows 1 KiB (packed) and 4 KiB (window)
    (1, 4, 8, 16, dict(padding=1)),                   # one image
    (4, 4, 8, 16, dict(stride=2, padding=1)),
    (4, 4, 8, 16, dict(dilation=2, padding=2)),
    (4, 4, 8, 16, dict(groups=2, padding=1)),
    (3, 4, 4, 34, dict()),                            # no padding: 32x32 outputs, 4 KiB rows
    (0, 4, 8, 16, dict(padding=1)),                   # no image
])
def test_convolutions_on_padded_and_copied_chunks_match_the_evaluator(monkeypatch, n, c, o, hw,
                                                                       conv):
    k, ph, outs = _conv_kernel(n, c, o, hw, CHUNKS, **conv)
    runs = _count_chunked(monkeypatch)
    padded = []
    orig = P._padded_empty

    def spy(shape, dtype, flat=None):
        r = orig(shape, dtype, flat)
        padded.append(r.strides[-2] != r.shape[-1] * r.itemsize if r.ndim > 1 else False)
        return r
    monkeypatch.setattr(P, "_padded_empty", spy)
    rng = np.random.default_rng(1)
    vals = [rng.standard_normal(p.shape).astype(np.float32) for p in ph]
    _check(k, ph, outs, vals)
    if n and all(conv.get(f, 1) == 1 for f in ("stride", "dilation", "groups")):
        assert runs, "no GEMM ran in chunks"
        assert any(padded), "no packed copy with padded rows"


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("where", ["X", "W", "H"])
def test_non_finite_operands_on_chunked_copies_keep_the_evaluators_values(bad, where):
    k, ph, outs = _conv_kernel(4, 4, 8, 16, CHUNKS, padding=1)
    rng = np.random.default_rng(2)
    vals = [rng.standard_normal(p.shape).astype(np.float32) for p in ph]
    i = ["X", "W", "H"].index(where)
    flat = vals[i].reshape(-1)
    flat[[0, flat.size // 2, flat.size - 1]] = bad   # corners meet the padding
    _check(k, ph, outs, vals)


def test_huge_finite_operands_on_chunked_copies_keep_the_evaluators_values():
    k, ph, outs = _conv_kernel(2, 4, 8, 16, CHUNKS, padding=1)
    rng = np.random.default_rng(3)
    vals = [rng.standard_normal(p.shape).astype(np.float32) for p in ph]
    vals[0][0, 0, 0, :4] = 3e38
    vals[1][:, 0, 0, 0] = 1e3
    _check(k, ph, outs, vals)


def test_summed_chunks_do_not_depend_on_which_thread_ran_them(monkeypatch):
    """The weight gradient's chunks are summed by lanes in a fixed order: a thread
    slowed at random takes fewer lanes, and the sum is the same to the bit."""
    k, ph, outs = _conv_kernel(8, 4, 8, 16, CHUNKS, padding=1)
    runs = _count_chunked(monkeypatch)
    rng = np.random.default_rng(4)
    vals = [rng.standard_normal(p.shape).astype(np.float32) for p in ph]
    first = [np.array(g) for g in k(*vals)]
    assert any(r[1] == "k" for r in runs), runs
    orig = P._pack_into
    delays = np.random.default_rng(5)

    def slow(*args):
        time.sleep(float(delays.uniform(0, 0.004)))
        return orig(*args)
    monkeypatch.setattr(G, "_pack_into", slow)
    for _ in range(3):
        again = k(*vals)
        for a, b in zip(first, again):
            np.testing.assert_array_equal(a, b)
    _check(k, ph, outs, vals)


def test_no_window_stage_above_window_max_bytes():
    """A window of the 4x4x16x16 input (4x3x3x4x16x16 float32, 147 KB) is made for
    the convolution and its weight gradient by default, and not with
    window_max_bytes below its size; both kernels give the evaluator's values."""
    x = te.placeholder((4, 4, 16, 16), "X")
    w = te.placeholder((8, 4, 3, 3), "W")
    y = nn.conv2d(x, w, padding=1)
    h = te.placeholder(y.shape, "H")
    (dw,) = te.differentiate(y, [w], head=h).result
    rng = np.random.default_rng(6)
    vals = [rng.standard_normal(p.shape).astype(np.float32) for p in (x, w, h)]
    for limit, windowed in ((None, True), (100_000, False)):
        opts = {} if limit is None else {"window_max_bytes": limit}
        with blas_at_any_size():
            k = codegen.build([y, dw], [x, w, h], options=opts)
        names = [u.stage for u in k.units]
        assert any(s.endswith("_window") for s in names) == windowed, names
        _check(k, (x, w, h), (y, dw), vals)
