"""GEMM plans and how they run: the plain data a matched contraction stage
becomes (:mod:`codegen.analysis.contraction` decides, at build time, whether and how a
stage is one) and the code that runs it on numpy's BLAS at run time.

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
  (``CHUNK_MIN_BYTES``) is made in pieces of about ``CHUNK_BYTES`` along one
  axis, each multiplied while it is in cache, the products summed (a cut
  reduction axis) or written to their slices (a cut spatial axis).
* **Orientation.** A GEMM whose right operand is column-major with many
  columns and whose result is small runs turned around (``C^T = B^T A^T``):
  numpy's BLAS runs it faster that way (:func:`_flip_pays`).
* **Threads.** ``GEMM_THREADS`` says how a GEMM uses the cores: the BLAS's
  own threads, or parts on worker threads with a one-thread BLAS each (the
  mode of an oversubscribed machine, where OpenBLAS's busy-waiting threads
  lose; the BLAS's thread count is limited with threadpoolctl).
* **Non-finite values.** Padded and masked terms are ``0 * x``; where an
  operand holds inf or NaN the result is computed again exactly
  (:meth:`ContractionPlan._non_finite`), so it is the loop nest's whatever the
  BLAS does with ``0 * inf``.
"""

import contextlib
import glob
import math
import os
import threading
import weakref

import numpy as np

from texpr import expr as E
from texpr.errors import TexprError, in_stage
from texpr.evaluate import int_arith_exactly

from .. import workers as _workers
from . import parking as _parking

__all__ = ["ContractionPlan", "GemmPiece", "OperandView",
           "GEMM_THREADS", "GEMM_SPLIT_MIN", "CHUNK_MIN_BYTES", "CHUNK_BYTES", "CHUNKED"]

# ---- the plan (picklable data) -------------------------------------------------------

class OperandView:
    """One operand of a GEMM piece: the buffer ``key``, its ``shape``, the
    zero padding ``pad`` (per dimension ``(lo, hi)``, or None: the buffer itself),
    and the view over the piece's axes ``axes`` (positions in the piece's axis
    list): element ``offset`` and ``strides`` in the (padded) flat buffer, and
    ``masks``: conditions ``sum(coef[k] * value(axes[k])) + const >= 0`` (or
    ``== 0``), given as ``(coefs, const, is_eq)``, outside which the view's
    elements count as zeros; ``data_masks``: data-dependent conditions over the
    same axes (expression trees, see :func:`_tree`; a ReLU's adjoint reads
    ``where=dense[i, j] > 0``), the same way; ``exact_masks``: conditions like
    ``masks`` applied only on the exact path (:meth:`ContractionPlan._non_finite`):
    outside them a window stage (:mod:`codegen.rewrite.windows`) holds zeros, which
    stand for absent terms."""

    def __init__(self, key, shape, pad, axes, offset, strides, masks, data_masks=(),
                 exact_masks=()):
        self.key, self.shape, self.pad = key, tuple(shape), pad
        self.axes, self.offset, self.strides = tuple(axes), int(offset), tuple(strides)
        self.masks = list(masks)
        self.data_masks = list(data_masks)
        self.exact_masks = list(exact_masks)

    def padded_shape(self):
        if self.pad is None:
            return self.shape
        return tuple(n + lo + hi for n, (lo, hi) in zip(self.shape, self.pad))


class GemmPiece:
    """One GEMM (batched) of a plan. ``axes``: ``(lo, extent, kind)`` per axis
    (kind ``spatial``/``reduce``); ``out_offset``, ``out_strides``: the output
    slice (element offset and strides per spatial axis, in ``axes`` order of
    the spatial ones); ``a``, ``b``: :class:`OperandView`; ``out_masks``:
    conditions over the spatial axes outside which the output is zero;
    ``points``: the domain's multiply-adds."""

    def __init__(self, axes, out_offset, out_strides, a, b, out_masks, points):
        self.axes, self.out_offset, self.out_strides = list(axes), int(out_offset), tuple(out_strides)
        self.a, self.b, self.out_masks, self.points = a, b, list(out_masks), int(points)

    def roles(self):
        """``(batch, m, n, k, a_only, b_only, neither)``: axis positions by role.
        A reduction axis of extent 1 that neither operand reads (a residue class's
        one tap) has no role: it sums one term (:func:`match` refuses longer ones)."""
        batch, m, n, k, a_only, b_only, neither = [], [], [], [], [], [], []
        for p, (_lo, ext, kind) in enumerate(self.axes):
            ina, inb = p in self.a.axes, p in self.b.axes
            if kind == "spatial":
                (batch if ina and inb else m if ina else n if inb else neither).append(p)
            elif ina or inb or ext != 1:
                (k if ina and inb else a_only if ina else b_only if inb else neither).append(p)
        return batch, m, n, k, a_only, b_only, neither

    def gemm_dims(self):
        """``(batch, M, N, K)`` sizes of the GEMM."""
        batch, m, n, k, _, _, _ = self.roles()
        size = lambda ps: math.prod(self.axes[p][1] for p in ps)  # noqa: E731
        return size(batch), size(m), size(n), size(k)


class ContractionPlan:
    """A stage run as GEMMs: ``out_key`` (the output buffer), ``shape``, ``dtype``,
    ``scale``, ``pieces`` (:class:`GemmPiece`), ``fill`` (zero the output first:
    some pieces add, or some output points belong to no piece), ``stage``
    (the stage's name). Plain data: a plan pickles with its kernel."""

    def __init__(self, stage, out_key, shape, dtype, scale, pieces, fill):
        self.stage, self.out_key, self.shape, self.dtype = stage, out_key, tuple(shape), dtype
        self.scale, self.pieces, self.fill = scale, list(pieces), fill

    @property
    def flop(self):
        """Floating-point operations of the GEMMs (2 per multiply-add)."""
        return sum(2 * b * m * n * k for b, m, n, k in (p.gemm_dims() for p in self.pieces))

    def operand_elements(self, i):
        """Elements of operand ``i`` (0: the pieces' ``a``, 1: their ``b``, in the
        order of the stage's two loads) that the GEMMs read: per piece, the product
        of its view's extents (the size of its packed copy where it is one)."""
        return sum(math.prod(p.axes[q][1] for q in (p.a if i == 0 else p.b).axes)
                   for p in self.pieces)

    def keys(self):
        """The buffers the plan reads and writes (those its data masks read too)."""
        keys = {self.out_key} | {v.key for p in self.pieces for v in (p.a, p.b)}
        for p in self.pieces:
            for v in (p.a, p.b):
                for t in v.data_masks:
                    keys |= _tree_keys(t)
        return keys

    @property
    def points(self):
        """Multiply-adds of the stage's domain (the loop nest's work)."""
        return sum(p.points for p in self.pieces)

    def describe(self):
        """One line: the GEMMs, for ``Kernel.source`` and ``Kernel.stages``."""
        dims = [p.gemm_dims() for p in self.pieces]
        shown = ", ".join(f"{b}x({m}x{k} @ {k}x{n})" if b > 1 else f"({m}x{k} @ {k}x{n})"
                          for b, m, n, k in dims[:4])
        more = f", ... ({len(dims)} GEMMs)" if len(dims) > 4 else ""
        return (f"BLAS: {len(dims)} GEMM{'s' if len(dims) > 1 else ''} {shown}{more}; "
                f"{self.flop / 1e6:.1f} MFLOP for {self.points / 1e6:.2f} M multiply-adds")

    def run(self, arrays):
        """Compute the stage's output into ``arrays[out_key]`` (a flat C-contiguous
        buffer of ``prod(shape)`` elements of ``dtype``) from the operand
        buffers ``arrays[key]`` (flat, or of the tensor's shape). Returns the
        output buffer.

        Where an operand holds an infinity or a NaN, the terms that involve one
        are classified exactly (see :meth:`_non_finite`): the result is the loop
        nest's, whatever the BLAS does with ``0 * inf`` and whatever padding
        or mask surrounds the value.

        Raises TexprError (its message ``stage NAME: ...``, as the loop nest's)
        for integer division by zero or integer overflow in a data-dependent
        condition, where the evaluator raises."""
        try:
            return self._run(arrays)
        except TexprError as exc:
            raise in_stage(self.stage, exc) from None

    def _run(self, arrays):
        out = arrays[self.out_key].reshape(-1)
        keys = {v.key for p in self.pieces for v in (p.a, p.b)}
        # a sum that overflows is inf (or NaN where both infinities meet), as in
        # the loop nest, which never warns: numpy's overflow warnings are silenced
        with np.errstate(over="ignore", invalid="ignore"):
            if out.size < sum(np.asarray(arrays[k]).size for k in keys):
                # the smaller side is checked: a non-finite operand value that a
                # GEMM multiplies (by a term of the domain, or by a padding or mask
                # zero) makes its output element inf or NaN, so a finite output
                # holds only finite terms, the loop nest's among them, and the
                # rest exact zeros; else the exact path computes it again
                self._run_into(out, arrays, arrays, self.scale, add=self.fill)
                if np.isfinite(out).all():
                    return out
                return self._non_finite(arrays, out, keys)
            if not all(np.isfinite(np.asarray(arrays[k])).all() for k in keys):
                return self._non_finite(arrays, out, keys)
            self._run_into(out, arrays, arrays, self.scale, add=self.fill)
        return out

    def _run_into(self, out, arrays_a, arrays_b, scale, add):
        # this thread's zero-padded buffers of this plan, kept from run to run; taken
        # out for the run and put back after it: a run re-entering this plan on this
        # thread (a signal handler or callback calling the kernel) finds none and
        # allocates its own instead of overwriting those this run still reads
        spaces = getattr(_WORKSPACES, "plans", None)
        if spaces is None:
            spaces = _WORKSPACES.plans = weakref.WeakKeyDictionary()
        workspace = spaces.pop(self, None)
        if workspace is None:
            workspace = {}
        with _blas_threads_limited():
            if _MODE.parts <= 1 and self._wakes_blas():
                _parking.note_blas_woken()
            self._run_pieces(out, arrays_a, arrays_b, scale, add, workspace)
        spaces[self] = workspace

    def _wakes_blas(self):
        """Whether a GEMM of this plan is large enough for OpenBLAS to run it on
        its worker threads (:data:`codegen.backends.numpy_host.parking.THREADED_MNK`), which then spin
        until parked."""
        wakes = getattr(self, "_wakes", None)
        if wakes is None:
            wakes = self._wakes = any(m * n * k > _parking.THREADED_MNK
                                      for _, m, n, k in (p.gemm_dims() for p in self.pieces))
        return wakes

    def _run_pieces(self, out, arrays_a, arrays_b, scale, add, workspace=None):
        if add:
            out.fill(0)
        # the pieces of one run share their zero-padded operand copies
        padded = {} if arrays_a is arrays_b else None
        for p in self.pieces:
            _run_piece(p, arrays_a, arrays_b, out, scale, add, self.dtype, padded=padded,
                       workspace=workspace)

    def _non_finite(self, arrays, out, keys):
        """The run when an operand holds inf or NaN: the GEMMs of the finite parts
        (non-finite values as zeros), then, per output element, whether some term
        of its domain is NaN (a NaN factor, or an infinity times zero), +inf or
        -inf, found by GEMMs of 0/1 indicators (padding and masks stay absent,
        as in the loop nest, which never visits those terms); NaN where both
        infinities occur (IEEE: the order of the terms does not matter). That
        infinity (or NaN) is added to the finite terms' result, so a finite
        product that overflowed to an infinity of the other sign gives NaN."""
        with _blas_threads_limited():
            return self._non_finite_now(arrays, out, keys)

    def _non_finite_now(self, arrays, out, keys):
        raw = {k: np.asarray(arrays[k]).reshape(-1) for k in keys}
        zeroed = {k: np.where(np.isfinite(v), v, np.zeros((), v.dtype)) for k, v in raw.items()}
        if self.fill:
            out.fill(0)
        for p in self.pieces:
            _run_piece(p, zeroed, zeroed, out, self.scale, self.fill, self.dtype, real=arrays)
        dt_ = np.dtype(self.dtype)

        def classes(v):
            one = lambda m: m.astype(dt_)  # noqa: E731
            return {"any": np.ones(v.shape, dt_), "nan": one(np.isnan(v)),
                    "zero": one(v == 0), "pinf": one(v == np.inf), "minf": one(v == -np.inf),
                    "pos": one(v > 0), "neg": one(v < 0),
                    "inf": one(np.isinf(v))}
        ca = {k: classes(v) for k, v in raw.items()}
        n = out.size
        tmp = np.empty(n, dt_)

        def count(pairs):
            total = np.zeros(n, dt_)
            for x, y in pairs:
                ok = True
                for p in self.pieces:
                    if not (ca[p.a.key][x].any() and ca[p.b.key][y].any()):
                        continue
                    ok = False
                    break
                if ok:
                    continue
                tmp.fill(0)
                for p in self.pieces:
                    _run_piece(p, {p.a.key: ca[p.a.key][x]}, {p.b.key: ca[p.b.key][y]},
                               tmp, 1.0, True, self.dtype, real=arrays)
                total += tmp
            return total > 0
        nan = count([("nan", "any"), ("any", "nan"), ("inf", "zero"), ("zero", "inf")])
        pinf = count([("pinf", "pos"), ("minf", "neg"), ("pos", "pinf"), ("neg", "minf")])
        minf = count([("pinf", "neg"), ("minf", "pos"), ("pos", "minf"), ("neg", "pinf")])
        with np.errstate(invalid="ignore", over="ignore"):
            special = np.where(nan | (pinf & minf), np.nan, np.where(pinf, np.inf, -np.inf))
            special = (special * self.scale).astype(dt_)
            # added to the finite terms' sum, not written over it: a finite product
            # that overflowed to +inf meets a -inf term as NaN, as in the loop nest
            hit = nan | pinf | minf
            out[hit] += special[hit]
        return out

    def __repr__(self):
        return f"ContractionPlan({self.stage}: {self.describe()})"


#: How a GEMM uses the cores. A positive value: cut each GEMM into this many parts
#: (along a batch axis or the rows), run on worker threads, each a one-thread
#: BLAS call (1: one call on the BLAS's own threads). 0 (the default): one part per
#: backend thread. In a model OpenBLAS's own workers spin after each GEMM and starve
#: the parallel loop nests that follow it: on an idle 2-core machine the mini-GPT's
#: step took 83 ms with them, 53 ms cut into parts (the ResNet's 667 vs 503 ms;
#: kernel.profile, 2026-12-07, load 1.3-2). Alone, OpenBLAS's threads are the faster on an idle
#: machine (value-and-grad of dense 3.0 ms vs 4.3 ms cut in two, conv2d_s1 32.5
#: vs 40.1, in one run alternating), but they busy-wait for each other: on a
#: loaded 2-core machine a 2-thread SGEMM ran 6x slower than one thread (dense
#: 124 ms vs 20 ms); Python's pool waits on a lock instead.
GEMM_THREADS = 0
#: a GEMM with fewer multiply-adds runs in one call
GEMM_SPLIT_MIN = 1 << 20
_LIMITER = []
_MODE = threading.local()
#: per thread, per plan (weakly): the zero-padded operand buffers kept between runs
_WORKSPACES = threading.local()


def _gemm_parts():
    """How many parts the GEMMs of one plan run are cut into (see ``GEMM_THREADS``)."""
    if GEMM_THREADS > 0:
        return GEMM_THREADS
    return _workers.threads()


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
    ``GEMM_THREADS``) when it is large enough: along the leading batch axis when
    it has enough entries, else along the rows of ``a``."""
    n = getattr(_MODE, "parts", None) or _gemm_parts()
    rows, inner, cols = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    work = math.prod(batch) * rows * inner * cols
    if n <= 1 or work < GEMM_SPLIT_MIN:
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


def _byte_view(flat, offset, shape, strides, writeable=False):
    """``as_strided`` view of the 1-D array ``flat``: element ``offset`` and strides;
    every element of the view is checked to lie inside ``flat``."""
    lo = hi = offset
    for n, s in zip(shape, strides):
        if n == 0:
            return np.empty(shape, flat.dtype)
        lo += min(0, (n - 1) * s)
        hi += max(0, (n - 1) * s)
    if lo < 0 or hi >= flat.size:
        raise TexprError(f"contraction: internal: a view reaches elements {lo}..{hi} of a "
                         f"buffer of {flat.size}; please report the program")
    item = flat.itemsize
    byte_strides = tuple(s * item for s in strides)
    if flat.flags.c_contiguous:
        # numpy checks the view against the buffer again; 5x faster than as_strided
        v = np.ndarray(tuple(shape), flat.dtype, buffer=flat, offset=offset * item,
                       strides=byte_strides)
        if not writeable:
            v.flags.writeable = False
        return v
    return np.lib.stride_tricks.as_strided(flat[offset:], shape=tuple(shape),
                                           strides=byte_strides, writeable=writeable)


#: the boolean arrays of :func:`_mask_array`, per owner (an OperandView or a
#: GemmPiece, weakly: they live as long as their plan), axes and shape: they
#: depend on nothing else
_MASKS = weakref.WeakKeyDictionary()


def _mask_array(masks, axes, piece_axes, shape, owner=None):
    """The boolean array (broadcastable to ``shape``) of the conditions ``masks``
    (those of ``owner``: then kept, read-only, for the next runs of its plan)."""
    if owner is None:
        return _mask_array_now(masks, axes, piece_axes, shape)
    cache = _MASKS.setdefault(owner, {})
    key = (tuple(axes), tuple(map(tuple, piece_axes)), tuple(shape))
    ok = cache.get(key)
    if ok is None:
        ok = _mask_array_now(masks, axes, piece_axes, shape)
        ok.flags.writeable = False
        cache[key] = ok
    return ok


def _mask_array_now(masks, axes, piece_axes, shape):
    ok = None
    for coefs, const, is_eq in masks:
        val = np.asarray(const, dtype=np.int64)
        for d, (p, c) in enumerate(zip(axes, coefs)):
            if not c:
                continue
            lo, ext, _ = piece_axes[p]
            r = (lo + np.arange(ext, dtype=np.int64)) * c
            val = val + r.reshape([ext if i == d else 1 for i in range(len(shape))])
        m = (val == 0) if is_eq else (val >= 0)
        ok = m if ok is None else ok & m
    return ok


def _copy_parts(dst, src):
    """``np.copyto(dst, src)``, in parts on the worker threads when it is large
    (numpy's copy releases the GIL)."""
    n = _workers.threads()
    if n <= 1 or src.size < GEMM_SPLIT_MIN or src.ndim == 0 or src.shape[0] < n:
        np.copyto(dst, src)
        return
    cuts = np.linspace(0, src.shape[0], n + 1).astype(int)
    futures = [_workers.pool().submit(np.copyto, dst[lo:hi], src[lo:hi])
               for lo, hi in zip(cuts[1:-1], cuts[2:])]
    np.copyto(dst[:cuts[1]], src[:cuts[1]])
    for f in futures:
        f.result()


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


_TREE_OPS = {E.Add: np.add, E.Sub: np.subtract, E.Mul: np.multiply, E.Div: np.true_divide,
             E.FloorDiv: np.floor_divide, E.FloorMod: np.mod, E.Min: np.minimum,
             E.Max: np.maximum, E.EQ: np.equal, E.NE: np.not_equal, E.LT: np.less,
             E.LE: np.less_equal, E.GT: np.greater, E.GE: np.greater_equal,
             E.And: np.logical_and, E.Or: np.logical_or}


#: operations whose integer results the evaluator checks against the dtype's range
_TREE_EXACT_INT = (E.Add, E.Sub, E.Mul, E.FloorDiv)


def _tree_mask(mask, cond):
    return cond if mask is None else mask & cond


def _eval_tree(t, grid, arrays, mask=None):
    """The value of an expression tree (:func:`_tree`) on the grid of axis values,
    by ``te.evaluate``'s rules (texpr/evaluate.py): every node's value in the
    node's dtype, a float operation's constants at its precision, ``/`` on
    operands cast to its dtype first, integer ``+ - * //`` outside the dtype's
    range an error (never a wrapped value: texpr.evaluate.int_arith_exactly),
    integer division by zero an error -- only where ``mask`` (None: everywhere)
    holds: a select's branch counts where its condition selects it, an
    ``and``'s / ``or``'s second operand where the first does not decide."""
    kind = t[0]
    if kind == "c":
        return np.asarray(t[1], dtype=t[2])
    if kind == "v":
        return grid[t[1]]
    if kind in ("ld", "ldc"):
        _, key, shape, dtype, idx = t
        flat = np.zeros((), dtype=np.int64)
        stride = 1
        for d in range(len(shape) - 1, -1, -1):
            i = _eval_tree(idx[d], grid, arrays, mask).astype(np.int64)
            if kind == "ldc":
                i = np.clip(i, 0, shape[d] - 1)
            flat = flat + i * stride
            stride *= shape[d]
        return np.asarray(arrays[key]).reshape(-1)[flat]
    if kind == "not":
        return np.logical_not(_eval_tree(t[1], grid, arrays, mask))
    if kind == "sel":
        c = _eval_tree(t[1], grid, arrays, mask)
        a = _eval_tree(t[2], grid, arrays, _tree_mask(mask, c))
        b = _eval_tree(t[3], grid, arrays, _tree_mask(mask, np.logical_not(c)))
        return np.where(c, a, b).astype(t[4], copy=False)
    if kind == "cast":
        return _eval_tree(t[1], grid, arrays, mask).astype(t[2])
    if kind == "abs":
        return np.abs(_eval_tree(t[1], grid, arrays, mask)).astype(t[2], copy=False)
    fn, dtype = _TREE_OPS[kind], np.dtype(t[3])
    if kind in (E.And, E.Or):
        a = _eval_tree(t[1], grid, arrays, mask)
        rest = a if kind is E.And else np.logical_not(a)
        return fn(a, _eval_tree(t[2], grid, arrays, _tree_mask(mask, rest)))

    def operand(x):
        if x[0] == "c" and dtype.kind == "f" and not isinstance(x[1], bool):
            return np.asarray(x[1], dtype=dtype)  # a weak constant, as the evaluator
        return _eval_tree(x, grid, arrays, mask)
    a, b = operand(t[1]), operand(t[2])
    if kind is E.Div:
        a, b = a.astype(dtype, copy=False), b.astype(dtype, copy=False)
    if kind in (E.FloorDiv, E.FloorMod) and dtype.kind in "iu":
        if np.any(_tree_mask(mask, b == 0)):
            raise TexprError("integer division by zero in a condition of the contraction "
                             "(its GEMM path)")
        b = np.where(b == 0, np.ones((), b.dtype), b)
    if kind in _TREE_EXACT_INT and dtype.kind in "iu":
        out, exact = int_arith_exactly(kind, a, b, dtype, mask)
        if exact is not None:
            raise TexprError(f"integer arithmetic in a condition of the contraction (its GEMM "
                             f"path) reaches {exact}, "
                             f"outside {dtype.name} (it would wrap around)")
        return out.astype(dtype, copy=False)
    with np.errstate(all="ignore"):
        return np.asarray(fn(a, b)).astype(dtype, copy=False)


def _tree_nodes(t):
    """The nodes of an expression tree (:func:`codegen.analysis.contraction._tree`), each a
    tuple whose first item names its kind, in pre-order."""
    yield t
    for x in t[1:]:
        if isinstance(x, tuple) and x and isinstance(x[0], (str, type)):
            yield from _tree_nodes(x)
        elif isinstance(x, tuple):
            for y in x:
                if isinstance(y, tuple) and y and isinstance(y[0], (str, type)):
                    yield from _tree_nodes(y)


def _tree_keys(t):
    """The buffer keys an expression tree (:func:`codegen.analysis.contraction._tree`) loads from."""
    return {n[1] for n in _tree_nodes(t) if n[0] in ("ld", "ldc")}


def _pack(v, axes, groups):
    """``v`` (dims ``axes``) transposed to the concatenated ``groups`` of axis
    positions and reshaped to one dimension per group."""
    perm = [axes.index(p) for g in groups for p in g]
    t = v.transpose(perm)
    shape = [math.prod(t.shape[i] for i in range(sum(len(x) for x in groups[:j]),
                                                  sum(len(x) for x in groups[:j + 1])))
             for j in range(len(groups))]
    return _reshaped(t, shape)


def _by_stride(v, axes, group):
    """``group`` ordered by decreasing absolute stride in ``v`` (dims ``axes``; ties:
    the longer dimension inside): the innermost dimension of a packed copy moves
    along the smallest stride."""
    return sorted(group, key=lambda p: (-abs(v.strides[axes.index(p)]),
                                        v.shape[axes.index(p)]))


#: the cost of starting a run of a packing copy, in elements read (numpy's strided
#: copy pays it per innermost run): conv2d_s2's im2col (32x14x14 by 16x3x3) copied
#: with the 3 kernel columns innermost took 3.8 ms, with the 14 image columns
#: (stride 2) innermost 1.2 ms
RUN_COST = 4.0


def _last_is_finer(v, axes, first, last):
    """Whether the packed layout ``(first, last)`` (rather than ``(last, first)``)
    makes the cheaper packing copy: the innermost dimension of each layout is its
    group's smallest stride (:func:`_by_stride`), and a copy costs, per element,
    ``RUN_COST / extent`` for starting its runs plus the cache-line fraction its
    stride reads (a convolution's image columns, 14 at stride 2, beat its 3 kernel
    columns at stride 1)."""
    if not first or not last:
        return True

    def cost(g):
        inner = min(g, key=lambda q: (abs(v.strides[axes.index(q)]), -v.shape[axes.index(q)]))
        d = axes.index(inner)
        return RUN_COST / max(v.shape[d], 1) + min(abs(v.strides[d]), 64) / 64.0
    return cost(last) <= cost(first)


def _direct_layout(spatial, batch, m, n):
    """How the GEMM's result can come out in the output's axis order: ``(prefix,
    rows, cols, swapped)`` with ``spatial == prefix + rows + cols``, the prefix
    holding every batch axis (axes of one operand there are broadcast batches:
    a convolution's images), ``rows``/``cols`` M and N (``swapped`` False) or
    N and M (True). None when there is no such split. The shortest prefix wins
    (the largest GEMMs)."""
    ms, ns, bs = set(m), set(n), set(batch)
    for cut in range(len(spatial) + 1):
        prefix, rest = spatial[:cut], spatial[cut:]
        if not bs <= set(prefix):
            continue
        for first, second, swapped in ((ms, ns, False), (ns, ms, True)):
            j = 0
            while j < len(rest) and rest[j] in first:
                j += 1
            if all(q in second for q in rest[j:]):
                return prefix, rest[:j], rest[j:], swapped
    return None


def _pack_batched(v, axes, prefix, rows, inner):
    """``v`` (dims ``axes``) as ``(*prefix, rows, inner)`` (extent 1 for a prefix
    axis it lacks), a view where the strides merge, else a packed copy."""
    present = [q for q in prefix if q in axes]
    t = v.transpose([axes.index(q) for q in present + rows + inner])
    size = lambda g: math.prod(v.shape[axes.index(q)] for q in g)  # noqa: E731
    shape = [v.shape[axes.index(q)] if q in axes else 1 for q in prefix]
    return _reshaped(t, shape + [size(rows), size(inner)])


def _reshaped(t, shape):
    """``t.reshape(shape)``: a view where the strides merge, else a packed copy,
    made in parts on the worker threads (numpy's copy releases the GIL) when it
    is large."""
    try:
        return np.reshape(t, shape, copy=False)
    except ValueError:
        pass
    out = np.empty(t.shape, dtype=t.dtype)
    _copy_parts(out, t)
    return out.reshape(shape)


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


#: a packing copy (im2col) of more than this many bytes, half the last-level
#: cache, is made and multiplied in chunks of about ``CHUNK_BYTES`` (along the
#: first prefix axis, or the outermost reduction axis) that stay in a core's
#: cache for their GEMM, spread over the worker threads (one BLAS thread each).
#: Measured on conv2d_s1 (2 cores, 32 MB L3, in-process A/B, 2026-12-02): dX's
#: 28.9 MB im2col 4.2 -> 3.8 ms in 2 MB chunks; the forward's 14.4 MB one ran
#: faster whole (2.3 vs 2.6 ms: one GEMM on the BLAS's own threads, which scale
#: better than two one-thread BLAS calls at once)
CHUNK_MIN_BYTES = _last_level_cache_bytes() // 2
#: the size of a chunk's packing copy (a core's L2 cache)
CHUNK_BYTES = 1 << 21
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


def _packed_copy_bytes(v, axes, prefix, first, second):
    """Bytes of the copy that :func:`_pack_batched` makes of ``v`` for the layout
    ``(prefix, first, second)``; 0 when the packed matrix is a view."""
    present = [q for q in prefix if q in axes]
    t = v.transpose([axes.index(q) for q in present + first + second])
    size = lambda g: math.prod(v.shape[axes.index(q)] for q in g)  # noqa: E731
    shape = [v.shape[axes.index(q)] for q in present] + [size(first), size(second)]
    try:
        np.reshape(t, shape, copy=False)
        return 0
    except ValueError:
        return t.size * t.itemsize


def _chunk_plan(a, a_axes, b, b_axes, prefix, rows, cols, k, a_rows_first, b_k_first):
    """How to run a direct-layout GEMM in chunks, or None (one call): ``(q, mode,
    length, threads)``, cutting axis ``q`` (``mode`` ``"prefix"``: the first prefix
    axis, whose chunks write disjoint output slices; ``"k"``: the outermost
    reduction axis of the copied operand, whose chunks' products are summed) into
    chunks of ``length``. Only where the packing copies exceed
    :data:`CHUNK_MIN_BYTES`."""
    copy_a = _packed_copy_bytes(a, a_axes, prefix, *((rows, k) if a_rows_first else (k, rows)))
    copy_b = _packed_copy_bytes(b, b_axes, prefix, *((k, cols) if b_k_first else (cols, k)))
    copied = copy_a + copy_b
    if copied <= max(CHUNK_MIN_BYTES, CHUNK_BYTES):
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
    length = max(1, int(CHUNK_BYTES // max(per_index, 1)))
    threads = GEMM_THREADS if GEMM_THREADS > 0 else _workers.threads()
    if threads > 1:
        length = min(length, -(-n // threads))
    if length >= n:
        return None
    return q, mode, length, threads


def _cut(v, axes, q, lo, hi):
    """``v`` (dims ``axes``) restricted to ``lo <= q < hi`` (itself if it lacks ``q``)."""
    if q not in axes:
        return v
    d = axes.index(q)
    return v[(slice(None),) * d + (slice(lo, hi),)]


def _pack_into(v, axes, prefix, first, second, scratch):
    """:func:`_pack_batched` of ``v`` with its copy (if one is needed) made in
    ``scratch`` (a list holding one reusable flat buffer, grown as needed)."""
    present = [q for q in prefix if q in axes]
    t = v.transpose([axes.index(q) for q in present + first + second])
    size = lambda g: math.prod(v.shape[axes.index(q)] for q in g)  # noqa: E731
    shape = [v.shape[axes.index(q)] if q in axes else 1 for q in prefix] + \
        [size(first), size(second)]
    try:
        return np.reshape(t, shape, copy=False)
    except ValueError:
        pass
    if scratch[0] is None or scratch[0].size < t.size or scratch[0].dtype != t.dtype:
        scratch[0] = np.empty(t.size, dtype=t.dtype)
    dst = scratch[0][:t.size].reshape(t.shape)
    np.copyto(dst, t)
    return dst.reshape(shape)


def _run_chunked(chunks, a, a_axes, b, b_axes, prefix, rows, cols, k, a_rows_first,
                 b_k_first, ext, scale, target):
    """The GEMM of :func:`_run_direct` in the chunks of ``chunks``
    (:func:`_chunk_plan`), each packed into a per-thread buffer and multiplied at
    once, the chunks spread over ``threads`` worker threads (one BLAS thread
    each). Writes into ``target`` (the contiguous output, shaped ``ext``) when
    given, else returns the result (shaped ``ext``)."""
    q, mode, length, threads = chunks
    CHUNKED[0] += 1
    n = (a if q in a_axes else b).shape[(a_axes if q in a_axes else b_axes).index(q)]
    starts = list(range(0, n, length))
    dtype = np.result_type(a, b)
    res = target
    if res is None and mode == "prefix":
        res = np.empty(ext, dtype=dtype)
    sc = None if scale == 1 else np.asarray(scale, dtype=dtype)

    def work(tid):
        sa, sb = [None], [None]
        partial = None
        for lo in starts[tid::threads]:
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
        return partial

    if threads > 1 and len(starts) > 1:
        with _blas_one_thread():
            futures = [_workers.pool().submit(work, t) for t in range(1, min(threads, len(starts)))]
            parts = [work(0)] + [f.result() for f in futures]
    else:
        parts = [work(0)]
    if mode == "prefix":
        return res
    parts = [x for x in parts if x is not None]
    total = parts[0]
    for x in parts[1:]:
        total += x
    total = np.broadcast_to(total, ext) if total.shape != tuple(ext) else total
    if target is not None:
        np.copyto(target, total)
        return target
    return total


