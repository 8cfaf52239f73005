"""GEMM stages run in chunks (texpr.codegen.backends.numpy_host.gemm._run_chunked): three
defects an attack on the chunked path found, each a test that failed before its
fix -- summed chunks that disagreed on a turned-around GEMM's orientation (a raw
ValueError, timing-dependent), a constant factor applied after the GEMM (inf
where the value is finite), and a forked child that waited for good on the BLAS
limit's lock."""

import os
import select
import signal
import threading
import time

import numpy as np
import pytest

import texpr as te
from texpr.codegen.backends import workers
from texpr import codegen
from texpr.codegen.backends.numpy_host import gemm as G
from fork_testutil import FORKS_WITHOUT_JAX
from test_codegen_contraction import _count_chunked

nn = te.nn


def _conv_dw_kernel():
    """A convolution's dW alone on BLAS: rows = 16 output channels, cols = 8x3x3 = 72
    (the im2col operand), K = 3 images x 8x8 = 192: the packing copy of X is cut
    along the images (reduction chunks, mode "k")."""
    x, w = te.placeholder((3, 8, 10, 10), "X"), te.placeholder((16, 8, 3, 3), "W")
    y = nn.conv2d(x, w)
    h = te.placeholder(y.shape, "H")
    (dw,) = te.differentiate(y, [w], head=h).result
    s = codegen.create_schedule([dw])
    s[dw].blas(True)
    k = codegen.build([dw], [x, h], s)
    assert [u.kind for u in k.units] == ["blas"]
    return k, x, h, dw


def test_reduction_chunks_agree_on_the_turned_around_gemm(monkeypatch):
    """_run_chunked decided the orientation of the summed chunks' GEMMs once, in a
    shared ``flip`` cell, from whichever worker's *first chunk* got there first
    (check-then-set, no lock); now each chunk decides its own and its product is
    summed as (rows, cols). _flip_pays depends on the chunk's K length
    (rows*cols*8 <= am.size + bm.size), so the full chunk (K=128: turned around)
    and the short last chunk (K=64: not) disagree; when both workers test the
    cell before either sets it, one partial product is (cols, rows) and the other
    (rows, cols), and ``total += x`` raises numpy's broadcast ValueError (a raw
    exception from kernel(); with equal shapes it would add a transposed
    product). The race window is widened here by a delay inside _flip_pays (its
    result unchanged); naturally it needs a thread switch inside that window."""
    k, x, h, dw = _conv_dw_kernel()
    monkeypatch.setattr(G, "CHUNK_MIN_BYTES", 0)
    monkeypatch.setattr(G, "CHUNK_BYTES", 55000)  # chunks of 2 images, then 1
    monkeypatch.setattr(G, "GEMM_THREADS", 2)
    runs = _count_chunked(monkeypatch)
    orig_flip = G._flip_pays

    def slow_flip(am, bm):
        r = orig_flip(am, bm)
        time.sleep(0.05 if r else 0.25)  # both workers read the cell as unset
        return r
    monkeypatch.setattr(G, "_flip_pays", slow_flip)
    rng = np.random.default_rng(0)
    a = rng.standard_normal(x.shape).astype("float32")
    g = rng.standard_normal(h.shape).astype("float32")
    ref = te.evaluate(dw, {x: a, h: g})
    (got,) = k(a, g)
    assert runs and runs[0][1] == "k" and runs[0][2] == 2, runs
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)


def _padded_conv_kernel():
    x, w = te.placeholder((4, 8, 12, 12), "X"), te.placeholder((16, 8, 3, 3), "W")
    y = nn.conv2d(x, w, padding=1)
    s = codegen.create_schedule([y])
    s[y].blas(True)
    k = codegen.build([y], [x, w], s)
    assert [u.kind for u in k.units] == ["blas"]
    return k, x, w, y


def _run_in_child(fn, timeout=60):
    """fn() in a forked child: b"1" (True), b"0" (False), b"E..." (raised) or b"hung"."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(w, b"1" if fn() else b"0")
        except BaseException as exc:  # noqa: BLE001
            os.write(w, b"E" + repr(exc).encode()[:200])
        finally:
            os._exit(0)
    os.close(w)
    ready, _, _ = select.select([r], [], [], timeout)
    got = os.read(r, 300) if ready else b"hung"
    if not ready:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(r)
    return got


@FORKS_WITHOUT_JAX
def test_a_chunked_gemm_runs_in_a_child_forked_while_another_thread_runs_one(monkeypatch):
    """_blas_one_thread's process-wide lock (_ONE_THREAD[0]) is taken by every
    chunked run on two worker threads, also in the default mode (GEMM_THREADS=0
    on an idle machine: _run_chunked enters it itself). A fork while another
    thread held it (inside ctl.limit / restore) left the child a lock no thread
    would release: the child's first chunked GEMM hung for good (an
    os.register_at_fork handler now gives the child a free lock). Seen naturally: 1 hang in 150 forks while a second thread
    called the kernel in a loop (faulthandler: contraction.py, `with lock:` in
    _blas_one_thread). Here the other thread holds the lock at the fork
    deterministically, as it does for the span of threadpoolctl's limit()."""
    k, x, w, y = _padded_conv_kernel()
    monkeypatch.setattr(G, "CHUNK_MIN_BYTES", 0)
    monkeypatch.setattr(G, "CHUNK_BYTES", 1)
    monkeypatch.setattr(G, "GEMM_THREADS", 0)
    monkeypatch.setattr(workers, "oversubscribed", lambda: False)
    rng = np.random.default_rng(0)
    a = rng.standard_normal(x.shape).astype("float32")
    b = rng.standard_normal(w.shape).astype("float32")
    ref = te.evaluate(y, {x: a, w: b})
    chunked = G.CHUNKED[0]
    np.testing.assert_allclose(k(a, b)[0], ref, rtol=1e-4, atol=1e-4)
    assert G.CHUNKED[0] > chunked  # the chunked path (and its BLAS limit) ran
    held, release = threading.Event(), threading.Event()

    def other_thread():  # a thread of the parent inside _blas_one_thread's lock
        with G._ONE_THREAD[0]:
            held.set()
            release.wait(120)
    t = threading.Thread(target=other_thread)
    t.start()
    held.wait(10)
    try:
        got = _run_in_child(lambda: bool(np.allclose(k(a, b)[0], ref, rtol=1e-4, atol=1e-4)),
                            timeout=30)
    finally:
        release.set()
        t.join()
    assert got == b"1", got


def _scaled_conv(kind):
    """A contraction with a constant factor 0.25 whose packing copy (im2col of X)
    is chunked: the forward (chunks along the images, mode "prefix") or a
    dW-like stage (chunks along the images, a reduction axis: mode "k")."""
    X = te.placeholder((2, 4, 10, 10), "X")
    c, kh, kw = te.reduce_axis(4, "c"), te.reduce_axis(3, "kh"), te.reduce_axis(3, "kw")
    if kind == "prefix":
        W = te.placeholder((8, 4, 3, 3), "W")
        Y = te.compute((2, 8, 8, 8), lambda n, o, h, w: te.sum(
            0.25 * X[n, c, h + kh, w + kw] * W[o, c, kh, kw], axis=[c, kh, kw]), name="Y")
    else:
        W = te.placeholder((2, 8, 8, 8), "H")
        n, h, w = te.reduce_axis(2, "n"), te.reduce_axis(8, "h"), te.reduce_axis(8, "w")
        Y = te.compute((8, 4, 3, 3), lambda o, c_, i, j: te.sum(
            0.25 * W[n, o, h, w] * X[n, c_, h + i, w + j], axis=[n, h, w]), name="Y")
    return X, W, Y


@pytest.mark.parametrize("kind", ["prefix", "k"])
def test_chunked_gemm_scales_before_it_can_overflow(kind, monkeypatch):
    """A plan's constant factor c multiplies the smaller packed operand before the
    GEMM on the one-call path (am * c), as the loop nest multiplies each term;
    _run_chunked multiplied the GEMM's *result* (dst *= sc, total * sc), now the
    smaller chunk operand too. A term
    c * x * w that is finite (0.25 * 1e19 * 4e19 = 1e38) but whose x * w
    overflows float32 (4e38) is then inf instead of 1e38: te.evaluate (raw and
    simplified), the loop nest and the unchunked GEMM all give 1e38; only the
    chunked GEMM (forced here with CHUNK_MIN_BYTES=0; by default any packing
    copy above half the last-level cache) gives inf. The output-side inf check
    then reruns the same chunked GEMM on the exact path and keeps the inf."""
    X, W, Y = _scaled_conv(kind)
    s = codegen.create_schedule([Y])
    s[Y].blas(True)
    k = codegen.build([Y], [X, W], s)
    assert [u.kind for u in k.units] == ["blas"]
    x, w = np.zeros(X.shape, "float32"), np.zeros(W.shape, "float32")
    if kind == "prefix":
        x[0, 0, 3, 3], w[0, 0, 1, 1] = 1e19, 4e19     # Y[0, 0, 2, 2] = 1e38
        x[1, 2, 5, 5], w[3, 2, 0, 0] = 2.0, 3.0
    else:
        w[0, 0, 2, 2], x[0, 0, 3, 3] = 4e19, 1e19     # Y[0, 0, 1, 1] = 1e38
        w[1, 3, 5, 5], x[1, 2, 5, 5] = 3.0, 2.0
    from texpr import simplify
    with np.errstate(all="ignore"):
        ref = te.evaluate(list(simplify.simplify([Y]))[0], {X: x, W: w})
        assert np.isfinite(te.evaluate(Y, {X: x, W: w})).all()
        assert np.isfinite(ref).all() and np.abs(ref).max() == pytest.approx(1e38, rel=1e-6)
        np.testing.assert_allclose(k(x, w)[0], ref, rtol=1e-6)  # one call: finite
        runs = _count_chunked(monkeypatch)
        monkeypatch.setattr(G, "CHUNK_MIN_BYTES", 0)
        monkeypatch.setattr(G, "CHUNK_BYTES", 1)
        monkeypatch.setattr(G, "GEMM_THREADS", 1)
        got = k(x, w)[0]
    assert runs and runs[0][1] == kind, runs
    assert np.isfinite(got).all(), np.argwhere(~np.isfinite(got)).tolist()
    np.testing.assert_allclose(got, ref, rtol=1e-6)
