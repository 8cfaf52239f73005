"""Packing a GEMM operand: the layouts of an operand view as ``(batch, rows, K)``
matrices, and the copies (im2col) where its strides do not merge.

One job: turning :func:`codegen.backends.numpy_host.gemm._operand`'s views into the
matrices numpy's ``matmul`` takes, a view where the strides allow, else a copy
(made in parts on the worker threads when large).
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

