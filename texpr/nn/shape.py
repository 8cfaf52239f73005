"""Shape and data-movement operators: ``flatten``, ``reshape``, ``transpose``, ``squeeze``,
``expand_dims``, ``broadcast_to``, ``concatenate``, ``split``, ``pad``, ``take``,
``embedding``, ``upsample_nearest``, ``pixel_shuffle``.

Every one is a single elementwise stage of loads (``split``: one per piece) whose
indices are quasi-affine in the output axes (``//`` and ``%`` by constants), or,
for ``take``/``embedding``, read from an int tensor. A reshape only uses
division/modulo inside the groups of dimensions whose extents actually merge or
split (``(N, C, H, W) -> (N, C*H*W)`` reads ``X[n, f // (H*W), f // W % H, f % W]``).
"""

from .. import dtypes as dt
from ..errors import ShapeError
from ..expr import as_expr, floordiv, floormod, maximum, minimum, select
from ..tensor import compute, row_major_strides
from ._util import (all_of, check_choice, check_int, check_shape, check_tensor, norm_axes,
                    norm_axis, ntuple)

__all__ = ["flatten", "reshape", "transpose", "squeeze", "expand_dims", "broadcast_to",
           "concatenate", "split", "pad", "take", "embedding", "upsample_nearest",
           "pixel_shuffle"]


def _unravel(flat, shape):
    """Indices into ``shape`` of the row-major flat index ``flat`` (the first without ``%``,
    the last without ``//``; extents of 1 give 0)."""
    out = []
    strides = row_major_strides(shape)
    for d, (n, s) in enumerate(zip(shape, strides)):
        if n == 1:
            out.append(0)
            continue
        v = floordiv(flat, s) if s != 1 else flat
        if d > 0 and any(m > 1 for m in shape[:d]):
            v = floormod(v, n)
        out.append(v)
    return out


def _ravel(idx, shape):
    """The row-major flat index of ``idx`` in ``shape`` (extent-1 dims skipped)."""
    flat = None
    stride = 1
    for v, n in reversed(list(zip(idx, shape))):
        if n != 1:
            term = v * stride if stride != 1 else v
            flat = term if flat is None else term + flat
        stride *= n
    return 0 if flat is None else flat


def _reshape_groups(in_shape, out_shape):
    """Pair up runs of non-unit dimensions whose extents multiply to the same value.

    Returns a list of ``(in_dims, out_dims)`` (lists of dimension numbers)."""
    ins = [d for d, n in enumerate(in_shape) if n != 1]
    outs = [d for d, n in enumerate(out_shape) if n != 1]
    groups = []
    i = j = 0
    while i < len(ins) or j < len(outs):
        gi, gj, pi, pj = [], [], 1, 1
        while True:
            if pi <= pj and i < len(ins):
                gi.append(ins[i]); pi *= in_shape[ins[i]]; i += 1
            elif j < len(outs):
                gj.append(outs[j]); pj *= out_shape[outs[j]]; j += 1
            else:
                gi.append(ins[i]); pi *= in_shape[ins[i]]; i += 1
            if pi == pj and gi and gj:
                break
        groups.append((gi, gj))
    return groups


def reshape(x, shape, name="reshape"):
    """Row-major reshape, as ``numpy.reshape`` (one ``-1`` extent is inferred).

    ``Y[j] = X[unravel(ravel(j))]``, with the ravel/unravel arithmetic limited to the
    groups of dimensions that merge or split.

    Args:
        x: any tensor. shape: tuple of ints, at most one ``-1``.
    Returns:
        a tensor of the new shape.
    Raises:
        ShapeError: the sizes differ, several ``-1``, negative extents.
    """
    op = "reshape"
    check_tensor(x, op, "input")
    if isinstance(shape, (int,)) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (list, tuple)):
        raise ShapeError(f"{op}: shape must be a tuple of ints, got {shape!r}")
    shape = [check_int(s, op, f"shape {tuple(shape)!r} entry", -1) for s in shape]
    if shape.count(-1) > 1:
        raise ShapeError(f"{op}: at most one -1 in the new shape {tuple(shape)}")
    if -1 in shape:
        rest = 1
        for s in shape:
            if s != -1:
                rest *= s
        if rest == 0 or x.size % rest:
            raise ShapeError(f"{op}: cannot reshape {x.name} of shape {x.shape} (size {x.size}) "
                             f"into {tuple(shape)}")
        shape[shape.index(-1)] = x.size // rest
    shape = tuple(shape)
    size = 1
    for s in shape:
        size *= s
    if size != x.size:
        raise ShapeError(f"{op}: cannot reshape {x.name} of shape {x.shape} (size {x.size}) "
                         f"into {shape} (size {size})")
    if size == 0:
        return compute(shape, lambda *j: as_expr(0, like=x.dtype) if x.dtype != "bool"
                       else as_expr(False), name=name, tag=op)
    groups = _reshape_groups(x.shape, shape)

    def body(*j):
        idx = [0] * x.ndim
        for gi, gj in groups:
            if len(gi) == 1 and len(gj) == 1:
                idx[gi[0]] = j[gj[0]]
                continue
            flat = _ravel([j[d] for d in gj], [shape[d] for d in gj])
            for d, v in zip(gi, _unravel(flat, [x.shape[d] for d in gi])):
                idx[d] = v
        return x[tuple(idx)]

    return compute(shape, body, name=name, tag=op, attrs=dict(shape=shape))


def flatten(x, start_axis=1, end_axis=-1, name="flatten"):
    """Merge axes ``start_axis..end_axis`` into one, as ``torch.flatten`` (default: keep
    the batch axis, ``(N, C, H, W) -> (N, C*H*W)``). A :func:`reshape`.

    Raises:
        ShapeError: bad axes or ``start_axis > end_axis``.
    """
    op = "flatten"
    check_tensor(x, op, "input")
    if x.ndim == 0:
        return reshape(x, (1,), name=name)
    s = norm_axis(start_axis, x.ndim, op, "start_axis")
    e = norm_axis(end_axis, x.ndim, op, "end_axis")
    if s > e:
        raise ShapeError(f"{op}: start_axis {start_axis} comes after end_axis {end_axis} for "
                         f"{x.name} of shape {x.shape}")
    merged = 1
    for n in x.shape[s:e + 1]:
        merged *= n
    return reshape(x, x.shape[:s] + (merged,) + x.shape[e + 1:], name=name)


def transpose(x, axes=None, name="transpose"):
    """Permute axes, as ``numpy.transpose``: ``Y[j] = X[j permuted back]``; ``axes`` None
    reverses them. Output axis ``d`` is input axis ``axes[d]``.

    Raises:
        ShapeError: ``axes`` is not a permutation of ``range(x.ndim)``.
    """
    op = "transpose"
    check_tensor(x, op, "input")
    if axes is None:
        axes = tuple(reversed(range(x.ndim)))
    if not isinstance(axes, (list, tuple)) or len(axes) != x.ndim:
        raise ShapeError(f"{op}: axes {axes!r} must list all {x.ndim} axes of {x.name} "
                         f"{x.shape}")
    axes = tuple(norm_axis(a, x.ndim, op) for a in axes)
    if sorted(axes) != list(range(x.ndim)):
        raise ShapeError(f"{op}: axes {axes!r} is not a permutation of 0..{x.ndim - 1}")
    inv = [0] * x.ndim
    for d, a in enumerate(axes):
        inv[a] = d
    return compute(tuple(x.shape[a] for a in axes), lambda *j: x[tuple(j[inv[d]]
                                                                       for d in range(x.ndim))],
                   name=name, tag=op, attrs=dict(axes=axes))


def squeeze(x, axis=None, name="squeeze"):
    """Remove extent-1 axes (all of them, or those in ``axis``), as ``numpy.squeeze``.

    Raises:
        ShapeError: bad axis, or an axis in ``axis`` whose extent is not 1.
    """
    op = "squeeze"
    check_tensor(x, op, "input")
    if axis is None:
        axes = tuple(d for d, n in enumerate(x.shape) if n == 1)
    else:
        axes = norm_axes(axis, x.ndim, op)
        for d in axes:
            if x.shape[d] != 1:
                raise ShapeError(f"{op}: axis {d} of {x.name} {x.shape} has extent "
                                 f"{x.shape[d]}, not 1")
    kept = [d for d in range(x.ndim) if d not in axes]

    def body(*j):
        idx = [0] * x.ndim
        for d, v in zip(kept, j):
            idx[d] = v
        return x[tuple(idx)]

    return compute(tuple(x.shape[d] for d in kept), body, name=name, tag=op)


def expand_dims(x, axis, name="expand_dims"):
    """Insert extent-1 axes at ``axis`` (an int or tuple, positions in the *output*), as
    ``numpy.expand_dims``.

    Raises:
        ShapeError: an axis out of ``[-out_ndim, out_ndim)`` or repeated.
    """
    op = "expand_dims"
    check_tensor(x, op, "input")
    n_new = len(axis) if isinstance(axis, (list, tuple)) else 1
    out_ndim = x.ndim + n_new
    axes = norm_axes(axis, out_ndim, op)
    shape, src = [], []
    it = iter(range(x.ndim))
    for d in range(out_ndim):
        if d in axes:
            shape.append(1)
        else:
            src.append(d)
            shape.append(x.shape[next(it)])
    return compute(tuple(shape), lambda *j: x[tuple(j[d] for d in src)], name=name, tag=op)


def broadcast_to(x, shape, name="broadcast_to"):
    """Broadcast to ``shape`` by numpy's rules (trailing axes aligned, extent 1 repeats),
    as ``numpy.broadcast_to``.

    Raises:
        ShapeError: the shapes are not compatible or ``shape`` has fewer axes.
    """
    op = "broadcast_to"
    check_tensor(x, op, "input")
    shape = check_shape(shape, op)
    lead = len(shape) - x.ndim
    if lead < 0 or any(n not in (1, m) for n, m in zip(x.shape, shape[lead:])):
        raise ShapeError(f"{op}: cannot broadcast {x.name} of shape {x.shape} to {shape}")
    return compute(shape, lambda *j: x[tuple(0 if n == 1 else j[lead + d]
                                             for d, n in enumerate(x.shape))],
                   name=name, tag=op)


def concatenate(tensors, axis=0, name="concatenate"):
    """Join tensors along ``axis``, as ``numpy.concatenate``: one stage of nested selects
    ``select(j < n0, A[j], select(j < n0 + n1, B[j - n0], ...))``; dtypes promote.

    Raises:
        ShapeError: no tensors, ranks differ, extents differ off ``axis``, bad axis.
    """
    op = "concatenate"
    if isinstance(tensors, (list, tuple)) and tensors:
        tensors = [check_tensor(t, op, "input") for t in tensors]
    else:
        raise ShapeError(f"{op}: expected a non-empty list of tensors, got {tensors!r}")
    first = tensors[0]
    if first.ndim == 0:
        raise ShapeError(f"{op}: cannot concatenate scalars ({first.name})")
    axis = norm_axis(axis, first.ndim, op)
    for t in tensors[1:]:
        if t.ndim != first.ndim or any(a != b for d, (a, b) in enumerate(zip(t.shape, first.shape))
                                       if d != axis):
            raise ShapeError(f"{op}: {t.name} of shape {t.shape} does not match {first.name} "
                             f"of shape {first.shape} off axis {axis}")
    pieces = [t for t in tensors if t.shape[axis] > 0] or [first]
    offsets = [0]
    for t in pieces:
        offsets.append(offsets[-1] + t.shape[axis])
    shape = first.shape[:axis] + (offsets[-1],) + first.shape[axis + 1:]

    def body(*j):
        def load(k):
            t = pieces[k]
            idx = list(j)
            if offsets[k]:
                idx[axis] = j[axis] - offsets[k]
            return t[tuple(idx)]

        v = load(len(pieces) - 1)
        for k in range(len(pieces) - 2, -1, -1):
            v = select(j[axis] < offsets[k + 1], load(k), v)
        return v

    return compute(shape, body, name=name, tag=op, attrs=dict(axis=axis))


def _slice(x, axis, start, stop, name):
    shape = x.shape[:axis] + (stop - start,) + x.shape[axis + 1:]

    def body(*j):
        idx = list(j)
        if start:
            idx[axis] = j[axis] + start
        return x[tuple(idx)]

    return compute(shape, body, name=name, tag="split", attrs=dict(axis=axis, start=start))


def split(x, indices_or_sections, axis=0, name="split"):
    """Split along ``axis``, as ``numpy.split``: an int ``k`` gives ``k`` equal pieces; a
    sequence of increasing indices gives the pieces between them. One slice stage per
    piece (named ``{name}0``, ``{name}1``, ...).

    Returns:
        a list of tensors.
    Raises:
        ShapeError: ``k`` does not divide the extent, indices decrease or leave the
            axis, bad axis.
    """
    op = "split"
    check_tensor(x, op, "input")
    if x.ndim == 0:
        raise ShapeError(f"{op}: cannot split the scalar {x.name}")
    axis = norm_axis(axis, x.ndim, op)
    n = x.shape[axis]
    if isinstance(indices_or_sections, (list, tuple)):
        cuts = [check_int(c, op, "split index", 0) for c in indices_or_sections]
        if any(b < a for a, b in zip(cuts, cuts[1:])) or (cuts and cuts[-1] > n):
            raise ShapeError(f"{op}: split indices {cuts} must increase within the extent {n} "
                             f"of axis {axis} of {x.name} {x.shape}")
        bounds = [0] + cuts + [n]
    else:
        k = check_int(indices_or_sections, op, "sections", 1)
        if n % k:
            raise ShapeError(f"{op}: {k} sections do not divide the extent {n} of axis "
                             f"{axis} of {x.name} {x.shape}")
        bounds = [n // k * i for i in range(k + 1)]
    return [_slice(x, axis, a, b, f"{name}{i}") for i, (a, b) in enumerate(zip(bounds,
                                                                              bounds[1:]))]


def _pad_width(pad_width, ndim, op):
    if isinstance(pad_width, (int,)) and not isinstance(pad_width, bool):
        pad_width = ((pad_width, pad_width),) * ndim
    elif (isinstance(pad_width, (list, tuple)) and len(pad_width) == 2
          and all(isinstance(p, int) for p in pad_width)):
        pad_width = (tuple(pad_width),) * ndim
    if not isinstance(pad_width, (list, tuple)) or len(pad_width) != ndim:
        raise ShapeError(f"{op}: pad_width must be an int, a (before, after) pair or {ndim} "
                         f"pairs, got {pad_width!r}")
    return [ntuple(tuple(p) if isinstance(p, (list, tuple)) else p, 2, op, "pad_width", 0)
            for p in pad_width]


def pad(x, pad_width, mode="constant", value=0.0, name="pad"):
    """Pad with a constant, the edge values or a reflection, as ``numpy.pad`` (modes
    ``"constant"``, ``"edge"``, ``"reflect"``; ``torch.nn.functional.pad``'s
    ``"constant"``, ``"replicate"``, ``"reflect"`` with the pad list reversed).

    ``pad_width`` is numpy's: an int, a ``(before, after)`` pair for every axis, or one
    pair per axis. One stage: ``constant`` selects between ``X[j - before]`` and
    ``value``; ``edge`` clamps the index; ``reflect`` mirrors it about the first/last
    element (no repeat), which needs ``before, after <= extent - 1``.

    Raises:
        ShapeError: malformed pad_width; edge/reflect of an empty axis; reflect padding
            larger than extent - 1. TexprError: unknown mode.
    """
    op = "pad"
    check_tensor(x, op, "input")
    mode = check_choice(mode, ("constant", "edge", "reflect"), op, "mode")
    pw = _pad_width(pad_width, x.ndim, op)
    for d, ((b, a), n) in enumerate(zip(pw, x.shape)):
        if mode != "constant" and (b or a) and n == 0:
            raise ShapeError(f"{op}: cannot {mode}-pad the empty axis {d} of {x.name} {x.shape}")
        if mode == "reflect" and max(b, a) > n - 1 and (b or a):
            raise ShapeError(f"{op}: reflect padding {(b, a)} of axis {d} must be at most "
                             f"extent - 1 = {n - 1} ({x.name} {x.shape})")
    shape = tuple(n + b + a for n, (b, a) in zip(x.shape, pw))
    if dt.is_int(x.dtype) and float(value).is_integer():
        value = int(value)

    def body(*j):
        idx, conds = [], []
        for v, n, (b, a) in zip(j, x.shape, pw):
            i = v - b if b else v
            if mode == "constant":
                if b:
                    conds.append(i >= 0)
                if a:
                    conds.append(i < n)
            elif mode == "edge":
                if b:
                    i = maximum(i, 0)
                if a:
                    i = minimum(i, n - 1)
            else:
                if a:
                    i = select(i > n - 1, 2 * (n - 1) - i, i)
                if b:
                    i = select(i < 0, -i, i)
            idx.append(i)
        v = x[tuple(idx)]
        cond = all_of(conds)
        return v if cond is True else select(cond, v, value)

    return compute(shape, body, name=name, tag=op, attrs=dict(pad_width=tuple(pw), mode=mode))


def take(x, indices, axis=None, name="take"):
    """Gather along ``axis`` with an int tensor of indices, as ``numpy.take``:
    ``Y[a, i, b] = X[a, I[i], b]`` (``a`` the axes before ``axis``, ``b`` after); with
    ``axis=None``, from the flattened ``X``. Indices must lie in ``[0, extent)``
    (negative indices are not wrapped; evaluation raises ``OutOfBoundsError``).

    Returns:
        ``x.shape[:axis] + indices.shape + x.shape[axis+1:]`` (``indices.shape`` for None).
    Raises:
        DTypeError: non-int indices. ShapeError: bad axis.
    """
    op = "take"
    check_tensor(x, op, "input")
    check_tensor(indices, op, "indices", int_only=True)
    k = indices.ndim
    if x.ndim == 0:
        raise ShapeError(f"{op}: cannot take from the scalar {x.name}")
    if axis is None:
        return compute(indices.shape, lambda *j: x[tuple(_unravel(indices[j], x.shape))],
                       name=name, tag=op)
    axis = norm_axis(axis, x.ndim, op)
    shape = x.shape[:axis] + indices.shape + x.shape[axis + 1:]

    def body(*j):
        sel = indices[j[axis:axis + k]]
        return x[tuple(j[:axis]) + (sel,) + tuple(j[axis + k:])]

    return compute(shape, body, name=name, tag=op, attrs=dict(axis=axis))


def embedding(indices, weight, name="embedding"):
    """Look up rows of ``weight``, as ``torch.nn.functional.embedding``:
    ``Y[..., d] = W[I[...], d]`` (a :func:`take` along axis 0).

    Args:
        indices: int tensor of any shape. weight: ``(V, D)``.
    Returns:
        ``indices.shape + (D,)``.
    Raises:
        ShapeError: weight not 2-D. DTypeError: non-int indices.
    """
    check_tensor(weight, "embedding", "weight", ndim=2)
    check_tensor(indices, "embedding", "indices", int_only=True)
    return take(weight, indices, axis=0, name=name)


def upsample_nearest(x, scale_factor=2, name="upsample_nearest"):
    """Nearest-neighbour upsampling by integer factors, NCHW, as
    ``torch.nn.functional.interpolate(x, scale_factor=s, mode="nearest")``:
    ``Y[n, c, h, w] = X[n, c, h // sh, w // sw]``.

    Args:
        x: ``(N, C, H, W)``. scale_factor: int or pair, >= 1.
    Returns:
        ``(N, C, H*sh, W*sw)``.
    Raises:
        ShapeError: not 4-D. TexprError: non-int or non-positive factor.
    """
    op = "upsample_nearest"
    check_tensor(x, op, "input", ndim=4)
    sh, sw = ntuple(scale_factor, 2, op, "scale_factor", 1)
    n, c, h, w = x.shape
    return compute((n, c, h * sh, w * sw),
                   lambda nn, cc, i, j: x[nn, cc, floordiv(i, sh), floordiv(j, sw)],
                   name=name, tag=op, attrs=dict(scale_factor=(sh, sw)))


def pixel_shuffle(x, upscale_factor, name="pixel_shuffle"):
    """Rearrange ``(N, C*r*r, H, W)`` into ``(N, C, H*r, W*r)``, as
    ``torch.nn.functional.pixel_shuffle``:
    ``Y[n, c, h, w] = X[n, c*r*r + (h % r)*r + w % r, h // r, w // r]``.

    Raises:
        ShapeError: not 4-D, or channels not divisible by ``r*r``.
        TexprError: non-int or non-positive ``r``.
    """
    op = "pixel_shuffle"
    check_tensor(x, op, "input", ndim=4)
    r = check_int(upscale_factor, op, "upscale_factor", 1)
    n, c, h, w = x.shape
    if c % (r * r):
        raise ShapeError(f"{op}: channels {c} of {x.name} {x.shape} are not divisible by "
                         f"upscale_factor^2 = {r * r}")

    def body(nn, cc, i, j):
        if r == 1:
            return x[nn, cc, i, j]
        ch = cc * (r * r) + floormod(i, r) * r + floormod(j, r)
        return x[nn, ch, floordiv(i, r), floordiv(j, r)]

    return compute((n, c // (r * r), h * r, w * r), body, name=name, tag=op,
                   attrs=dict(upscale_factor=r))

