"""Packing a GEMM operand: the layouts of an operand view as ``(batch, rows, K)``
matrices, and the copies (im2col) where its strides do not merge.

One job: turning :func:`codegen.backends.numpy_host.gemm._operand`'s views into the
matrices numpy's ``matmul`` takes, a view where the strides allow and its rows
do not share a cache set (:func:`_aliased`), else a copy whose rows are padded
to an odd number of cache lines (:func:`_padded_ld`; made in parts on the
worker threads when large).
"""

import math

import numpy as np

from .. import workers as _workers
from ...options import current as _opts

__all__ = []

def _copy_parts(dst, src):
    """``np.copyto(dst, src)``, in parts on the worker threads when it is large
    (numpy's copy releases the GIL)."""
    n = _workers.threads()
    if n <= 1 or src.size < _opts().gemm_split_min or src.ndim == 0 or src.shape[0] < n:
        np.copyto(dst, src)
        return
    cuts = np.linspace(0, src.shape[0], n + 1).astype(int)
    futures = [_workers.pool().submit(np.copyto, dst[lo:hi], src[lo:hi])
               for lo, hi in zip(cuts[1:-1], cuts[2:])]
    np.copyto(dst[:cuts[1]], src[:cuts[1]])
    for f in futures:
        f.result()

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


# options.gemm_run_cost (default 4.0): the cost of starting a run of a packing copy, in
#   elements read (numpy's strided copy pays it per innermost run): conv2d_s2's im2col
#   (32x14x14 by 16x3x3) copied with the 3 kernel columns innermost took 3.8 ms, with the 14
#   image columns (stride 2) innermost 1.2 ms


def _last_is_finer(v, axes, first, last):
    """Whether the packed layout ``(first, last)`` (rather than ``(last, first)``)
    makes the cheaper packing copy: the innermost dimension of each layout is its
    group's smallest stride (:func:`_by_stride`), and a copy costs, per element,
    ``options.gemm_run_cost / extent`` for starting its runs plus the cache-line fraction its
    stride reads (a convolution's image columns, 14 at stride 2, beat its 3 kernel
    columns at stride 1)."""
    if not first or not last:
        return True

    def cost(g):
        inner = min(g, key=lambda q: (abs(v.strides[axes.index(q)]), -v.shape[axes.index(q)]))
        d = axes.index(inner)
        return _opts().gemm_run_cost / max(v.shape[d], 1) + min(abs(v.strides[d]), 64) / 64.0
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
    """``t.reshape(shape)``: a view where the strides merge, else a packed copy
    (its rows at a leading dimension that does not alias, :func:`_padded_ld`),
    made in parts on the worker threads (numpy's copy releases the GIL) when it
    is large."""
    try:
        return np.reshape(t, shape, copy=False)
    except ValueError:
        pass
    out = _padded_empty(shape, t.dtype)
    _copy_parts(np.reshape(out, t.shape, copy=False), t)
    return out


# A matrix whose rows lie a multiple of 4 KiB apart maps the same column of
# every row onto one set of a core's caches (and of its TLB): a BLAS reading it
# evicts its own lines. One thread, 2026-12-07 (numpy's OpenBLAS, AMD EPYC):
# (32x288) @ (288x1024) at 34-64 GFLOP/s with the rows 4096 bytes apart, 85-91
# with 4160; (288x32) @ (32x1024) into rows 4096 bytes apart 61, 4160 apart 89;
# a convolution's weight gradient (288x65536) @ (65536x32), rows 256 KiB apart,
# 61 whole, 105 copied 2048 columns at a time into rows 8256 bytes apart.
_ALIAS_BYTES = 4096
#: a packed copy's rows are padded by one cache line where their length is a
#: multiple of this many bytes (so that they are an odd number of lines apart)
_PAD_MULTIPLE = 1024
_PAD_BYTES = 64


def _padded_ld(inner, itemsize):
    """The leading dimension (elements) of a packed copy whose rows hold ``inner``
    elements: ``inner``, plus one cache line where ``inner * itemsize`` is a
    multiple of ``_PAD_MULTIPLE`` bytes."""
    if inner * itemsize >= _PAD_MULTIPLE and (inner * itemsize) % _PAD_MULTIPLE == 0:
        return inner + max(1, _PAD_BYTES // itemsize)
    return inner


def _padded_empty(shape, dtype, flat=None):
    """An uninitialised array of ``shape`` whose last dimension is a slice of rows
    :func:`_padded_ld` apart: a view of ``flat`` (a 1-D buffer of at least
    :func:`_padded_size` elements) when given, else of a new buffer."""
    shape = [int(x) for x in shape]
    dtype = np.dtype(dtype)
    if not shape or math.prod(shape) == 0:
        return np.empty(shape, dtype=dtype)
    ld = _padded_ld(shape[-1], dtype.itemsize)
    size = math.prod(shape[:-1]) * ld
    buf = np.empty(size, dtype=dtype) if flat is None else flat[:size]
    return buf.reshape(shape[:-1] + [ld])[..., :shape[-1]]


def _padded_size(shape, dtype):
    """Elements of the buffer behind :func:`_padded_empty` of ``shape``."""
    shape = [int(x) for x in shape]
    if not shape:
        return 1
    return math.prod(shape[:-1]) * _padded_ld(shape[-1], np.dtype(dtype).itemsize)


def _aliased(m):
    """Whether the matrix view ``m`` (its last two dimensions) has at least 16 rows
    (or columns, column-major) a multiple of ``_ALIAS_BYTES`` apart: a GEMM
    reads it faster from a copy (the comment above)."""
    if m.ndim < 2:
        return False
    r, c = m.shape[-2:]
    s0, s1 = m.strides[-2:]
    if s1 == m.itemsize or c == 1:
        ld, reads = abs(s0), r
    elif s0 == m.itemsize or r == 1:
        ld, reads = abs(s1), c
    else:
        return False
    return reads >= 16 and ld > 0 and ld % _ALIAS_BYTES == 0


def _packed_copy_bytes(v, axes, prefix, first, second):
    """Bytes of the copy that :func:`_pack_into` makes of ``v`` for the layout
    ``(prefix, first, second)``; 0 when the packed matrix is a view it keeps
    (not :func:`_aliased`)."""
    present = [q for q in prefix if q in axes]
    t = v.transpose([axes.index(q) for q in present + first + second])
    size = lambda g: math.prod(v.shape[axes.index(q)] for q in g)  # noqa: E731
    shape = [v.shape[axes.index(q)] for q in present] + [size(first), size(second)]
    try:
        m = np.reshape(t, shape, copy=False)
    except ValueError:
        return t.size * t.itemsize
    return t.size * t.itemsize if _aliased(m) else 0

def _cut(v, axes, q, lo, hi):
    """``v`` (dims ``axes``) restricted to ``lo <= q < hi`` (itself if it lacks ``q``)."""
    if q not in axes:
        return v
    d = axes.index(q)
    return v[(slice(None),) * d + (slice(lo, hi),)]


def _pack_into(v, axes, prefix, first, second, scratch):
    """:func:`_pack_batched` of ``v`` with its copy (if one is needed) made in
    ``scratch`` (a list holding one reusable flat buffer, grown as needed), its
    rows :func:`_padded_ld` apart. A view whose rows alias (:func:`_aliased`) is
    copied too."""
    present = [q for q in prefix if q in axes]
    t = v.transpose([axes.index(q) for q in present + first + second])
    size = lambda g: math.prod(v.shape[axes.index(q)] for q in g)  # noqa: E731
    shape = [v.shape[axes.index(q)] if q in axes else 1 for q in prefix] + \
        [size(first), size(second)]
    try:
        m = np.reshape(t, shape, copy=False)
        if not _aliased(m):
            return m
    except ValueError:
        pass
    need = _padded_size(shape, t.dtype)
    if scratch[0] is None or scratch[0].size < need or scratch[0].dtype != t.dtype:
        scratch[0] = np.empty(need, dtype=t.dtype)
    dst = _padded_empty(shape, t.dtype, scratch[0])
    np.copyto(np.reshape(dst, t.shape, copy=False), t)
    return dst
