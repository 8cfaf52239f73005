"""How a GEMM plan runs on numpy's BLAS at run time: the plain data a matched
contraction stage becomes (:mod:`codegen.ir.contraction_plan`; decided at build time by
:mod:`codegen.analysis.contraction`) is run here, and this module registers
:func:`run_plan` as the plans' runner.

A :class:`ContractionPlan` holds :class:`GemmPiece` s, each one (batched) GEMM
over two :class:`OperandView` s of the kernel's flat buffers.
:meth:`ContractionPlan.run` computes the stage's output:

* **Operands.** A view is ``np.lib.stride_tricks.as_strided`` of its flat
  buffer (zero-copy) where its strides merge into ``(batch, M, K)`` and
  ``(batch, K, N)``; else it is packed (im2col): copied into a buffer of that
  layout, first into a zero-padded copy of the buffer where the view reaches
  outside it (a convolution's padding; per thread and per plan, kept from run
  to run), with its masks applied (elements outside them are zeros).
* **Chunks.** A packing copy above half the last-level cache
  (``options.gemm_chunk_min_bytes``) is made in pieces of about ``options.gemm_chunk_bytes`` along one
  axis, each multiplied while it is in cache, the products summed (a cut
  reduction axis) or written to their slices (a cut spatial axis). The worker
  threads take the chunks as they come free; summed chunks by fixed lanes, so
  the sum's order does not depend on the threads' timing.
* **Cache sets.** A packed copy's rows are padded where their length is a
  multiple of 1 KiB, and an operand view whose rows lie a multiple of 4 KiB
  apart (a window stage's per-image slice) is copied chunk by chunk as well
  (:mod:`codegen.backends.numpy_host.packing`): rows that far apart share a
  cache set, and numpy's OpenBLAS ran a convolution's per-image GEMM on them at
  a half to two thirds of its speed on padded rows.
* **Orientation.** A GEMM whose right operand is column-major with many
  columns and whose result is small runs turned around (``C^T = B^T A^T``):
  numpy's BLAS runs it faster that way (:func:`_flip_pays`).
* **Threads.** ``options.gemm_threads`` says how a GEMM uses the cores: the BLAS's
  own threads, or parts on worker threads with a one-thread BLAS each (the
  mode of an oversubscribed machine, where OpenBLAS's busy-waiting threads
  lose; the BLAS's thread count is limited with threadpoolctl).
* **Non-finite and huge values.** Padded and masked terms are ``0 * x``. The
  GEMMs' result is used where :mod:`codegen.ir.gemm_policy`'s rule accepts it
  (every operand value finite, ``K * max|A| * max|B| * |c|`` within the
  dtype's range, bounded through each buffer's ``sqrt(sum x^2)``); else the
  exact path (:func:`run_exact`, :mod:`codegen.backends.numpy_host.exact`)
  computes again exactly the output elements the GEMMs cannot be trusted with,
  whatever the BLAS does with ``0 * inf`` or a fused multiply-add.
"""

import contextlib
import glob
import math
import os
import threading
import weakref

import numpy as np

from texpr.errors import TexprError, in_stage

from .. import workers as _workers
from . import exact as _exact
from . import parking as _parking
from .masks import _MASKS, _eval_tree, _mask_array
from .packing import (_by_stride, _copy_parts, _cut, _direct_layout, _last_is_finer, _pack,
                      _pack_batched, _pack_into, _packed_copy_bytes)
from ...ir import contraction_plan as _plan
from ...ir.contraction_plan import ContractionPlan, GemmPiece, OperandView, byte_view as _byte_view
from ...options import current as _opts

__all__ = ["ContractionPlan", "GemmPiece", "OperandView", "CHUNKED", "run_plan",
           "run_exact"]

# the plan's data lives in codegen.ir.contraction_plan; its old private names stay here
_tree_nodes, _tree_keys = _plan.tree_nodes, _plan.tree_keys


# ---- running a plan ----------------------------------------------------------------

def run_plan(plan, arrays):
    """Compute the stage's output into ``arrays[out_key]`` (a flat C-contiguous
    buffer of ``prod(shape)`` elements of ``dtype``) from the operand
    buffers ``arrays[key]`` (flat, or of the tensor's shape), by
    :mod:`codegen.ir.gemm_policy`'s rule: the GEMMs' result where the rule
    accepts it, else the exact path (:func:`run_exact`).

    Args:
        plan: a :class:`codegen.ir.contraction_plan.ContractionPlan`.
        arrays: the kernel's buffers by key.
    Returns:
        The output buffer.
    Raises:
        TexprError: (its message ``stage NAME: ...``, as the loop nest's) for
            integer division by zero or integer overflow in a data-dependent
            condition, where the evaluator raises.
    """
    try:
        return _run(plan, arrays)
    except TexprError as exc:
        raise in_stage(plan.stage, exc) from None


def _run(plan, arrays):
    out = arrays[plan.out_key].reshape(-1)
    keys = {v.key for p in plan.pieces for v in (p.a, p.b)}
    # a sum that overflows is inf (or NaN where both infinities meet), as in
    # the loop nest, which never warns: numpy's overflow warnings are silenced
    with np.errstate(over="ignore", invalid="ignore"):
        if not _exact.accepted(plan, arrays):
            return run_exact(plan, arrays, out, keys)
        _run_into(plan, out, arrays, arrays, plan.scale, add=plan.fill)
    return out


def run_exact(plan, arrays, out, keys):
    """The run :mod:`codegen.ir.gemm_policy` prescribes where it does not accept the
    GEMMs' result: :func:`codegen.backends.numpy_host.exact.run_exact` with this
    module's piece runner, the BLAS's threads as for a GEMM run.

    Args:
        plan: the plan; ``arrays``: the buffers by key; ``out``: the flat output
            buffer; ``keys``: the operand buffers' keys.
    Returns:
        ``out``.
    """
    with _blas_threads_limited(), np.errstate(over="ignore", invalid="ignore"):
        return _exact.run_exact(plan, arrays, out, keys, _run_piece, _operand)


def _run_into(plan, out, arrays_a, arrays_b, scale, add):
    # this thread's zero-padded buffers of this plan, kept from run to run; taken
    # out for the run and put back after it: a run re-entering this plan on this
    # thread (a signal handler or callback calling the kernel) finds none and
    # allocates its own instead of overwriting those this run still reads
    spaces = getattr(_WORKSPACES, "plans", None)
    if spaces is None:
        spaces = _WORKSPACES.plans = weakref.WeakKeyDictionary()
    workspace = spaces.pop(plan, None)
    if workspace is None:
        workspace = {}
    with _blas_threads_limited():
        if _MODE.parts <= 1 and _wakes_blas(plan):
            _parking.note_blas_woken()
        _run_pieces(plan, out, arrays_a, arrays_b, scale, add, workspace)
    spaces[plan] = workspace


def _wakes_blas(plan):
    """Whether a GEMM of this plan is large enough for OpenBLAS to run it on
    its worker threads (:data:`codegen.backends.numpy_host.parking.THREADED_MNK`), which then spin
    until parked."""
    wakes = getattr(plan, "_wakes", None)
    if wakes is None:
        wakes = plan._wakes = any(m * n * k > _parking.THREADED_MNK
                                  for _, m, n, k in (p.gemm_dims() for p in plan.pieces))
    return wakes


def _run_pieces(plan, out, arrays_a, arrays_b, scale, add, workspace=None):
    if add:
        out.fill(0)
    # the pieces of one run share their zero-padded operand copies
    padded = {} if arrays_a is arrays_b else None
    for p in plan.pieces:
        _run_piece(p, arrays_a, arrays_b, out, scale, add, plan.dtype, padded=padded,
                   workspace=workspace)


# options.gemm_threads (default 0): How a GEMM uses the cores. A positive value: cut each
#   GEMM into this many parts (along a batch axis or the rows), run on worker threads, each
#   a one-thread BLAS call (1: one call on the BLAS's own threads). 0 (the default): one
#   part per backend thread. In a model OpenBLAS's own workers spin after each GEMM and starve
#   the parallel loop nests that follow it: on an idle 2-core machine the mini-GPT's step
#   took 83 ms with them, 53 ms cut into parts (the ResNet's 667 vs 503 ms; kernel.profile,
#   2026-12-07, load 1.3-2). Alone, OpenBLAS's threads are the faster on an idle machine
#   (value-and-grad of dense 3.0 ms vs 4.3 ms cut in two, conv2d_s1 32.5 vs 40.1, in one run
#   alternating), but they busy-wait for each other: on a loaded 2-core machine a 2-thread
#   SGEMM ran 6x slower than one thread (dense 124 ms vs 20 ms); Python's pool waits on a
#   lock instead.
# options.gemm_split_min (default 1 << 20): a GEMM with fewer multiply-adds runs in one call

_POOL = []
_LIMITER = []
_MODE = threading.local()
#: per thread, per plan (weakly): the zero-padded operand buffers kept between runs
_WORKSPACES = threading.local()


def _gemm_parts():
    """How many parts the GEMMs of one plan run are cut into (see ``options.gemm_threads``)."""
    threads = _opts().gemm_threads
    return threads if threads > 0 else _workers.threads()


@contextlib.contextmanager
def _blas_threads_limited():
    """The context of one plan run: its GEMMs are cut into :func:`_gemm_parts`
    parts; when more than one, numpy's BLAS is held at one thread (threadpoolctl;
    restored on exit) while the parts run on the worker threads."""
    outer = getattr(_MODE, "parts", None)
    parts = _gemm_parts() if outer is None else outer
    _MODE.parts = parts
    try:
        if parts <= 1 or outer is not None:
            yield
            return
        with _blas_one_thread():
            yield
    finally:
        _MODE.parts = outer


_ONE_THREAD = [threading.Lock(), 0, None]  # (lock, holders, the entered limit)


def _after_fork_in_child():
    """A forked child starts with a free BLAS-limit lock and no holders (another
    thread of the parent may have held the lock at the fork: the child's first
    chunked or split GEMM then waited for good), and its BLAS's own thread count
    (the parent's threads inside the limit do not exist in the child)."""
    limit = _ONE_THREAD[2]
    _ONE_THREAD[:] = [threading.Lock(), 0, None]
    if limit is not None:
        try:
            limit.restore_original_limits()
        except Exception:  # noqa: BLE001 - threadpoolctl state in a child: best effort
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def _blas_one_thread():
    """numpy's BLAS held at one thread (threadpoolctl, if installed) while any thread
    is inside: the limit is process-wide, so it is taken by the first thread to
    enter and restored by the last to leave (per-thread limits restored out of
    order left the BLAS at one thread for good)."""
    if not _LIMITER:
        try:
            from threadpoolctl import ThreadpoolController
            _LIMITER.append(ThreadpoolController().select(user_api="blas"))
        except Exception:  # noqa: BLE001 - optional: without it, the BLAS keeps its threads
            _LIMITER.append(None)
    ctl = _LIMITER[0]
    if ctl is None:
        yield
        return
    lock = _ONE_THREAD[0]
    with lock:
        if _ONE_THREAD[1] == 0:
            _ONE_THREAD[2] = ctl.limit(limits=1)
        _ONE_THREAD[1] += 1
    try:
        yield
    finally:
        with lock:
            _ONE_THREAD[1] -= 1
            if _ONE_THREAD[1] == 0:
                _ONE_THREAD[2].restore_original_limits()
                _ONE_THREAD[2] = None


def _quiet_matmul(a, b, out):
    # on a worker thread, which does not inherit the caller's np.errstate
    with np.errstate(over="ignore", invalid="ignore"):
        return np.matmul(a, b, out=out)


def _matmul(a, b, out=None):
    """``np.matmul(a, b, out=out)``, cut into parts run on worker threads (see
    ``options.gemm_threads``) when it is large enough: along the leading batch axis when
    it has enough entries, else along the rows of ``a``."""
    n = getattr(_MODE, "parts", None) or _gemm_parts()
    rows, inner, cols = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    work = math.prod(batch) * rows * inner * cols
    if n <= 1 or work < _opts().gemm_split_min:
        return np.matmul(a, b, out=out)
    if out is None:
        out = np.empty(batch + (rows, cols), dtype=np.result_type(a, b))
    parts = []
    if batch and batch[0] >= n:
        cuts = np.linspace(0, batch[0], n + 1).astype(int)
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            pa = a[lo:hi] if a.ndim == len(batch) + 2 and a.shape[0] > 1 else a
            pb = b[lo:hi] if b.ndim == len(batch) + 2 and b.shape[0] > 1 else b
            parts.append((pa, pb, out[lo:hi]))
    elif rows >= n:
        cuts = np.linspace(0, rows, n + 1).astype(int)
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            parts.append((a[..., lo:hi, :], b, out[..., lo:hi, :]))
    else:
        return np.matmul(a, b, out=out)
    futures = [_workers.pool().submit(_quiet_matmul, pa, pb, po) for pa, pb, po in parts[1:]]
    np.matmul(*parts[0][:2], out=parts[0][2])
    for f in futures:
        f.result()
    return out

def _operand(view, arrays, piece_axes, dtype, real=None, padded=None, workspace=None):
    """The operand's values over its axes (an ndarray, view or copy); its
    data-dependent masks read ``real`` (default ``arrays``). ``padded``: a dict
    that keeps zero-padded copies for the other pieces of the same run.
    ``workspace``: a dict that keeps the zero-padded buffers from run to run
    (this thread's, of this plan: only their interiors are copied again)."""
    key = (view.key, tuple(map(tuple, view.pad)) if view.pad is not None else None)
    buf = None if padded is None else padded.get(key)
    if buf is None:
        buf = np.asarray(arrays[view.key]).reshape(-1)
        if buf.dtype != np.dtype(dtype):
            buf = buf.astype(dtype)
        if view.pad is not None:
            shape = view.padded_shape()
            pad = None if workspace is None else workspace.get(key)
            if pad is None or pad.shape != tuple(shape) or pad.dtype != buf.dtype:
                pad = np.zeros(shape, dtype=buf.dtype)
                if workspace is not None:
                    workspace[key] = pad
            # the border stays zero: nothing writes into the padded buffer
            _copy_parts(pad[tuple(slice(lo, lo + n) for n, (lo, _hi) in
                                  zip(view.shape, view.pad))], buf.reshape(view.shape))
            buf = pad.reshape(-1)
        if padded is not None:
            padded[key] = buf
    shape = [piece_axes[p][1] for p in view.axes]
    v = _byte_view(buf, view.offset, shape, view.strides)
    ok = _mask_array(view.masks, view.axes, piece_axes, shape, view) if view.masks else None
    exact = getattr(view, "exact_masks", None)
    if exact and real is not None:
        # a window stage's zeros (codegen.rewrite.windows): absent terms, masked where the
        # exact path classifies non-finite values (elsewhere they are 0 * x = 0)
        more = _mask_array(exact, view.axes, piece_axes, shape)
        ok = more if ok is None else ok & more
    if view.data_masks and (real is not None or not getattr(view, "masks_only_non_finite", False)):
        grid = {}
        for d, q in enumerate(view.axes):
            lo, ext, _ = piece_axes[q]
            grid[q] = (lo + np.arange(ext, dtype=np.int64)).reshape(
                [ext if i == d else 1 for i in range(len(shape))])
        ok = np.ones(shape, dtype=bool) if ok is None else np.broadcast_to(ok, shape).copy()
        # in order, each where the ones before it hold: te.evaluate's `&&`, so a
        # condition that can raise (a divisor of 0) is evaluated where the evaluator
        # evaluates it (codegen.analysis.contraction matches such a stage only where the
        # view's affine masks are the conjuncts before it)
        with np.errstate(all="ignore"):
            for t in view.data_masks:
                ok &= np.broadcast_to(
                    _eval_tree(t, grid, arrays if real is None else real, ok), shape)
    if ok is not None:
        # into a buffer kept from run to run: a fresh 512 KB result cost
        # causal_scores' two masked heads about 0.1 ms of page faults per run
        kept = None if workspace is None else workspace.get(("masked", id(view)))
        if kept is None or kept.shape != v.shape or kept.dtype != v.dtype:
            kept = np.empty(v.shape, dtype=v.dtype)
            if workspace is not None:
                workspace[("masked", id(view))] = kept
        kept.fill(0)
        np.copyto(kept, v, where=ok)
        v = kept
    return v

def _flat(arrays, key, dtype):
    """``arrays[key]`` as a flat C-contiguous array of ``dtype``, or None."""
    buf = arrays.get(key) if isinstance(arrays, dict) else arrays[key]
    if not isinstance(buf, np.ndarray) or buf.dtype != dtype or not buf.flags.c_contiguous:
        return None
    return buf.reshape(-1)


def _run_recorded(rec, arrays_a, arrays_b, out, dtype):
    """The piece's GEMM from its recorded views (see :func:`_record_direct`):
    ``np.matmul`` of two strided views of the operand buffers into a view of
    ``out``. Returns False (nothing done) when a buffer is not as recorded."""
    (ka, off_a, shape_a, str_a, size_a), (kb, off_b, shape_b, str_b, size_b), \
        (off_o, shape_o) = rec
    dtype = np.dtype(dtype)
    fa, fb = _flat(arrays_a, ka, dtype), _flat(arrays_b, kb, dtype)
    if fa is None or fb is None or fa.size != size_a or fb.size != size_b \
            or out.dtype != dtype or not out.flags.c_contiguous:
        return False
    # numpy checks each view against its buffer's bounds
    am = np.ndarray(shape_a, dtype, buffer=fa, offset=off_a, strides=str_a)
    bm = np.ndarray(shape_b, dtype, buffer=fb, offset=off_b, strides=str_b)
    target = np.ndarray(shape_o, dtype, buffer=out, offset=off_o)
    _matmul(am, bm, out=target)
    return True


def _record_direct(p, swapped, am, bm, target, out, arrays_a, arrays_b, dtype):
    """What :func:`_run_recorded` needs to repeat this GEMM, or None: per operand
    its key, byte offset, shape, strides and buffer size, where its matrix is a
    view of its buffer (no packing copy), and the output's (a C-contiguous
    slice of the flat ``out``) offset and shape. Only plain pieces get one: no masks, padding, one-operand sums or
    scale (checked by the caller)."""
    dtype = np.dtype(dtype)
    specs = []
    for mat, view, arrays in ((am, p.b if swapped else p.a, arrays_b if swapped else arrays_a),
                              (bm, p.a if swapped else p.b, arrays_a if swapped else arrays_b)):
        buf = _flat(arrays, view.key, dtype)
        if buf is None or mat.dtype != dtype or not np.may_share_memory(mat, buf):
            return None  # a packed copy (im2col) or a cast: the general path
        off = mat.__array_interface__["data"][0] - buf.__array_interface__["data"][0]
        specs.append((view.key, off, tuple(mat.shape), tuple(mat.strides), buf.size))
    off_o = target.__array_interface__["data"][0] - out.__array_interface__["data"][0]
    if not target.flags.c_contiguous or not 0 <= off_o <= (out.size - target.size) * out.itemsize:
        return None
    return tuple(specs) + ((off_o, tuple(target.shape)),)


def _run_piece(p, arrays_a, arrays_b, out, scale, add, dtype, real=None, padded=None,
               workspace=None):
    """One piece: operand ``a`` from ``arrays_a``, ``b`` from ``arrays_b`` (their
    data-dependent masks read ``real``, default the same); the result written
    into (``add``: added to) its slice of ``out``. A plain piece whose operands
    are views (no packing copy) repeats the views of its first run
    (:func:`_run_recorded`): its fixed cost fell from about 45 to 15 us."""
    rec = getattr(p, "_recorded", None)
    if rec and not add and scale == 1 and real is None \
            and _run_recorded(rec, arrays_a, arrays_b, out, dtype):
        return
    batch, m, n, k, a_only, b_only, neither = p.roles()
    a = _operand(p.a, arrays_a, p.axes, dtype, real, padded, workspace)
    b = _operand(p.b, arrays_b, p.axes, dtype, real, padded, workspace)
    a_axes, b_axes = list(p.a.axes), list(p.b.axes)
    if a_only:
        a = a.sum(axis=tuple(a_axes.index(q) for q in a_only))
        a_axes = [q for q in a_axes if q not in a_only]
    if b_only:
        b = b.sum(axis=tuple(b_axes.index(q) for q in b_only))
        b_axes = [q for q in b_axes if q not in b_only]
    spatial = [q for q, ax in enumerate(p.axes) if ax[2] == "spatial"]
    layout = None if neither else _direct_layout(spatial, batch, m, n)
    if layout is not None:
        return _run_direct(p, a, a_axes, b, b_axes, k, layout, out, scale, add, spatial,
                           (arrays_a, arrays_b, dtype) if real is None else None)
    # the packed copies' innermost dimension follows the smallest stride
    big = a if a.size >= b.size else b
    big_axes = a_axes if big is a else b_axes
    k = _by_stride(big, big_axes, k)
    m, n = _by_stride(a, a_axes, m), _by_stride(b, b_axes, n)
    # layout (.., M, K) or (.., K, M): the one whose last group holds the smallest stride
    a_mk = _last_is_finer(a, a_axes, m, k)
    b_kn = _last_is_finer(b, b_axes, k, n)
    am = _pack(a, a_axes, [batch, m, k] if a_mk else [batch, k, m])
    bm = _pack(b, b_axes, [batch, k, n] if b_kn else [batch, n, k])
    if not a_mk:
        am = am.swapaxes(1, 2)
    if not b_kn:
        bm = bm.swapaxes(1, 2)
    if scale != 1:
        if am.size <= bm.size:
            am = am * np.asarray(scale, dtype=am.dtype)
        else:
            bm = bm * np.asarray(scale, dtype=bm.dtype)
    if am.shape[0] == 1:
        res = _product(am[0], bm[0])[None]
    else:
        res = _product(am, bm)
    ext = [p.axes[q][1] for q in batch + m + n]
    res = res.reshape(ext)
    spatial = [q for q, ax in enumerate(p.axes) if ax[2] == "spatial"]
    have = batch + m + n
    if neither:
        sp_neither = [q for q in neither if p.axes[q][2] == "spatial"]
        res = res.reshape(ext + [1] * len(sp_neither))
        have = have + sp_neither
    res = res.transpose([have.index(q) for q in spatial])
    shape = [p.axes[q][1] for q in spatial]
    res = np.broadcast_to(res, shape)
    if p.out_masks:
        res = np.where(_mask_array(p.out_masks, spatial, p.axes, shape, p), res,
                       np.zeros((), dtype=res.dtype))
    target = _byte_view(out, p.out_offset, shape, p.out_strides, writeable=True)
    if add:
        target += res
    else:
        np.copyto(target, res, casting="unsafe")


def _zero_outside(p, spatial, shape, target):
    """Zero the points of ``target`` (the piece's output slice, dims ``spatial``)
    outside the piece's output masks: the loop nest never computes them, so a
    GEMM's value there (NaN from an infinite operand included) is replaced."""
    if p.out_masks:
        inside = _mask_array(p.out_masks, spatial, p.axes, shape, p)
        outside = _MASKS.setdefault(p, {}).get("outside")
        if outside is None or outside.shape != inside.shape:
            outside = np.logical_not(inside)
            outside.flags.writeable = False
            _MASKS[p]["outside"] = outside
        np.copyto(target, np.zeros((), dtype=target.dtype), where=outside)


def _run_direct(p, a, a_axes, b, b_axes, k, layout, out, scale, add, spatial, record=None):
    """The GEMM with its result in the output's axis order (see :func:`_direct_layout`):
    written by ``np.matmul(..., out=)`` into a contiguous output slice, else copied
    (or added) once. An operand that needs a large packing copy (im2col) is
    packed and multiplied in cache-sized chunks (:func:`_chunk_plan`). ``record``:
    ``(arrays_a, arrays_b, dtype)``, to record a plain piece's views for the next
    runs (:func:`_record_direct`)."""
    prefix, rows, cols, swapped = layout
    big, big_axes = (a, a_axes) if a.size >= b.size else (b, b_axes)
    k = _by_stride(big, big_axes, k)
    if swapped:  # result (.., N, M) = B^T A^T
        a, a_axes, b, b_axes = b, b_axes, a, a_axes
    # a supplies the rows, b the columns; each packed as (rows, K) or (K, rows)
    a_rows_first = _last_is_finer(a, a_axes, rows, k)
    b_k_first = _last_is_finer(b, b_axes, k, cols)
    shape = [p.axes[q][1] for q in spatial]
    target = _byte_view(out, p.out_offset, shape, p.out_strides, writeable=True)
    size = lambda g: math.prod(p.axes[q][1] for q in g)  # noqa: E731
    ext = [p.axes[q][1] for q in prefix] + [size(rows), size(cols)]
    # the result written straight into the output (a mask's points zeroed after)
    direct = not add and target.flags.c_contiguous and target.size
    chunks = _chunk_plan(a, a_axes, b, b_axes, prefix, rows, cols, k, a_rows_first, b_k_first)
    if chunks is not None:
        res = _run_chunked(chunks, a, a_axes, b, b_axes, prefix, rows, cols, k,
                           a_rows_first, b_k_first, ext, scale,
                           target.reshape(ext) if direct else None)
        if direct:
            _zero_outside(p, spatial, shape, target)
            return
    else:
        if a_rows_first:
            am = _pack_batched(a, a_axes, prefix, rows, k)
        else:
            am = _pack_batched(a, a_axes, prefix, k, rows).swapaxes(-1, -2)
        if b_k_first:
            bm = _pack_batched(b, b_axes, prefix, k, cols)
        else:
            bm = _pack_batched(b, b_axes, prefix, cols, k).swapaxes(-1, -2)
        if scale != 1:
            if am.size <= bm.size:
                am = am * np.asarray(scale, dtype=am.dtype)
            else:
                bm = bm * np.asarray(scale, dtype=bm.dtype)
        if direct and _flip_pays(am, bm):
            np.copyto(target.reshape(ext), _product(am, bm))
            _zero_outside(p, spatial, shape, target)
            return
        if direct:
            _matmul(am, bm, out=target.reshape(ext))
            _zero_outside(p, spatial, shape, target)
            target = target.reshape(ext)
            plain = scale == 1 and not p.out_masks and not any(
                v.masks or v.data_masks or v.pad is not None for v in (p.a, p.b))
            if record is not None and plain and not hasattr(p, "_recorded"):
                p._recorded = _record_direct(p, swapped, am, bm, target, out, *record)
            return
        res = _product(am, bm)
    res = res.reshape(shape)
    if p.out_masks:
        res = np.where(_mask_array(p.out_masks, spatial, p.axes, shape, p), res,
                       np.zeros((), dtype=res.dtype))
    if add:
        target += res
    else:
        np.copyto(target, res, casting="unsafe")


def _last_level_cache_bytes():
    """The last-level cache's size in bytes (Linux: the highest level under
    /sys/devices/system/cpu/cpu0/cache), else 8 MiB."""
    best = (0, 8 << 20)
    for d in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(os.path.join(d, "level")) as f:
                level = int(f.read())
            with open(os.path.join(d, "size")) as f:
                text = f.read().strip().upper()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            size = int(text.rstrip("KMG")) * mult
        except (OSError, ValueError):
            continue
        if level > best[0] and size > 0:
            best = (level, size)
    return best[1]


#: ``options.gemm_chunk_min_bytes`` when it is None: half the last-level cache
_LLC_HALF = _last_level_cache_bytes() // 2
# options.gemm_chunk_min_bytes (default None: _LLC_HALF): a packing copy
#   (im2col) of more than this many bytes, half the last-level cache, is made and multiplied
#   in chunks of about ``options.gemm_chunk_bytes`` (along the first prefix axis, or the outermost
#   reduction axis) that stay in a core's cache for their GEMM, spread over the worker
#   threads (one BLAS thread each). Measured on conv2d_s1 (2 cores, 32 MB L3, in-process
#   A/B, 2026-12-02): dX's 28.9 MB im2col 4.2 -> 3.8 ms in 2 MB chunks; the forward's 14.4
#   MB one ran faster whole (2.3 vs 2.6 ms: one GEMM on the BLAS's own threads, which scale
#   better than two one-thread BLAS calls at once)
# options.gemm_chunk_bytes (default 1 << 21): the size of a chunk's packing copy (a core's
#   L2 cache)
#: GEMMs run in chunks in this process (a count, for tests and the fuzzer)
CHUNKED = [0]


def _flip_pays(am, bm):
    """Whether ``am @ bm`` runs faster as ``(bm^T am^T)^T`` with a small result
    (copied once): ``bm`` is a transposed (column-major) matrix with more columns
    than ``am`` has rows, ``am`` row-major. numpy's BLAS ran such a GEMM at about
    60% of the speed of the same GEMM turned around (one thread: 32x784 @
    (144x784)^T 96-100 GFLOP/s, (144x784) @ (32x784)^T 151; a convolution's dW,
    2026-12-02)."""
    item = am.itemsize
    col_major = bm.strides[-2] == item and bm.shape[-1] > 1 and bm.strides[-1] != item
    row_major = am.strides[-1] == item or am.shape[-1] == 1
    rows, cols = am.shape[-2], bm.shape[-1]
    return bool(col_major and row_major and cols > rows and cols >= 64
                and rows * cols * 8 <= am.size + bm.size)


def _product(am, bm):
    """``am @ bm`` (:func:`_matmul`), turned around where :func:`_flip_pays`."""
    if _flip_pays(am, bm):
        return _matmul(bm.swapaxes(-1, -2), am.swapaxes(-1, -2)).swapaxes(-1, -2)
    return _matmul(am, bm)


def _chunk_plan(a, a_axes, b, b_axes, prefix, rows, cols, k, a_rows_first, b_k_first):
    """How to run a direct-layout GEMM in chunks, or None (one call): ``(q, mode,
    length, threads)``, cutting axis ``q`` (``mode`` ``"prefix"``: the first prefix
    axis, whose chunks write disjoint output slices; ``"k"``: the outermost
    reduction axis of the copied operand, whose chunks' products are summed) into
    chunks of ``length``. Only where the packing copies exceed
    ``options.gemm_chunk_min_bytes`` (a view whose rows alias in the cache,
    :func:`codegen.backends.numpy_host.packing._aliased`, counts as a copy: it is
    copied chunk by chunk)."""
    copy_a = _packed_copy_bytes(a, a_axes, prefix, *((rows, k) if a_rows_first else (k, rows)))
    copy_b = _packed_copy_bytes(b, b_axes, prefix, *((k, cols) if b_k_first else (cols, k)))
    copied = copy_a + copy_b
    opts = _opts()
    least = _LLC_HALF if opts.gemm_chunk_min_bytes is None else opts.gemm_chunk_min_bytes
    if copied <= max(least, opts.gemm_chunk_bytes):
        return None
    heavy, heavy_axes = (a, a_axes) if copy_a >= copy_b else (b, b_axes)
    if prefix and prefix[0] in heavy_axes and heavy.shape[heavy_axes.index(prefix[0])] > 1:
        q, mode = prefix[0], "prefix"
    else:
        cut = [q for q in _by_stride(heavy, heavy_axes, k) if heavy.shape[heavy_axes.index(q)] > 1]
        if not cut:
            return None
        q, mode = cut[0], "k"
    n = heavy.shape[heavy_axes.index(q)]
    per_index = sum(c for c, ax in ((copy_a, a_axes), (copy_b, b_axes)) if q in ax) / n
    length = max(1, int(opts.gemm_chunk_bytes // max(per_index, 1)))
    threads = opts.gemm_threads if opts.gemm_threads > 0 else _workers.threads()
    if threads > 1:
        length = min(length, -(-n // threads))
    if length >= n:
        return None
    return q, mode, length, threads


def _run_chunked(chunks, a, a_axes, b, b_axes, prefix, rows, cols, k, a_rows_first,
                 b_k_first, ext, scale, target):
    """The GEMM of :func:`_run_direct` in the chunks of ``chunks``
    (:func:`_chunk_plan`), each packed into a per-thread buffer and multiplied at
    once, the chunks spread over ``threads`` worker threads (one BLAS thread
    each). Writes into ``target`` (the contiguous output, shaped ``ext``) when
    given, else returns the result (shaped ``ext``).

    The threads take the work as they come free (a shared counter), not in a
    fixed share: on a loaded machine a thread that lost its core did half the
    chunks and the other waited for it. Disjoint output chunks (``"prefix"``)
    are taken one at a time. Summed chunks (``"k"``) are taken by *lanes*:
    ``_LANES_PER_THREAD * threads`` runs of consecutive chunks, each summed in
    chunk order into its own partial, and the partials summed in lane order, so
    the result does not depend on which thread ran which lane (it does on the
    thread count, as before)."""
    q, mode, length, threads = chunks
    CHUNKED[0] += 1
    n = (a if q in a_axes else b).shape[(a_axes if q in a_axes else b_axes).index(q)]
    starts = list(range(0, n, length))
    dtype = np.result_type(a, b)
    res = target
    if res is None and mode == "prefix":
        res = np.empty(ext, dtype=dtype)
    sc = None if scale == 1 else np.asarray(scale, dtype=dtype)
    if mode == "prefix":
        tasks = [[lo] for lo in starts]
    else:
        lanes = min(len(starts), max(1, threads) * _LANES_PER_THREAD)
        cuts = np.linspace(0, len(starts), lanes + 1).astype(int)
        tasks = [starts[lo:hi] for lo, hi in zip(cuts[:-1], cuts[1:])]
    partials = [None] * len(tasks)
    claim = _Counter()

    def work():
        sa, sb = [None], [None]
        while True:
            t = claim.next()
            if t >= len(tasks):
                return
            partial = None
            for lo in tasks[t]:
                hi = min(n, lo + length)
                ac, bc = _cut(a, a_axes, q, lo, hi), _cut(b, b_axes, q, lo, hi)
                if a_rows_first:
                    am = _pack_into(ac, a_axes, prefix, rows, k, sa)
                else:
                    am = _pack_into(ac, a_axes, prefix, k, rows, sa).swapaxes(-1, -2)
                if b_k_first:
                    bm = _pack_into(bc, b_axes, prefix, k, cols, sb)
                else:
                    bm = _pack_into(bc, b_axes, prefix, cols, k, sb).swapaxes(-1, -2)
                with np.errstate(over="ignore", invalid="ignore"):
                    if sc is not None:
                        # the constant joins the smaller operand before the GEMM, as on
                        # the one-call path: c * x * w stays finite where x * w would not
                        if am.size <= bm.size:
                            am = am * sc
                        else:
                            bm = bm * sc
                    if mode == "prefix":
                        np.matmul(am, bm, out=res[lo:hi])
                        continue
                    # each chunk's own orientation (its K decides), summed as (rows, cols)
                    prod = np.matmul(bm.swapaxes(-1, -2), am.swapaxes(-1, -2)).swapaxes(-1, -2) \
                        if _flip_pays(am, bm) else np.matmul(am, bm)
                    if partial is None:
                        partial = np.array(prod)
                    else:
                        partial += prod
            partials[t] = partial

    if threads > 1 and len(tasks) > 1:
        with _blas_one_thread():
            futures = [_workers.pool().submit(work) for _ in range(1, min(threads, len(tasks)))]
            try:
                work()
            finally:
                for f in futures:
                    f.result()
    else:
        work()
    if mode == "prefix":
        return res
    parts = [x for x in partials if x is not None]
    total = parts[0]
    with np.errstate(over="ignore", invalid="ignore"):
        for x in parts[1:]:
            total += x
    total = np.broadcast_to(total, ext) if total.shape != tuple(ext) else total
    if target is not None:
        np.copyto(target, total)
        return target
    return total


#: lanes of summed chunks per thread (:func:`_run_chunked`): a thread that comes
#: free takes the next lane
_LANES_PER_THREAD = 4


class _Counter:
    """A thread-safe counter: :meth:`next` returns 0, 1, 2, ... once each."""

    def __init__(self):
        self._lock = threading.Lock()
        self._n = 0

    def next(self):
        with self._lock:
            n = self._n
            self._n += 1
            return n





_plan.register_runner(run_plan)
