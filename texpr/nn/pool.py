"""Pooling, NCHW: ``max_pool2d``, ``avg_pool2d``, ``global_avg_pool2d``,
``adaptive_avg_pool2d``.

One reduction stage each over the window axes ``(kh, kw)``. Padding is a
guard inside the reduction (``-inf`` for max, ``0`` for average), emitted only
on the sides where a window can leave the input. The average's divisor is a
closed-form integer expression of the output position (no extra stage).
"""

import math

from .. import reduction as red
from ..errors import ShapeError, TexprError
from ..expr import cast, floordiv, maximum, minimum, select
from ..tensor import compute, reduce_axis
from ._util import all_of, check_bool, check_tensor, float_const, ntuple

__all__ = ["max_pool2d", "avg_pool2d", "global_avg_pool2d", "adaptive_avg_pool2d"]


def _window(op, x, kernel, stride, padding, dilation):
    check_tensor(x, op, "input", ndim=4)
    kernel = ntuple(kernel, 2, op, "kernel", 1)
    stride = kernel if stride is None else ntuple(stride, 2, op, "stride", 1)
    pads = ntuple(padding, 2, op, "padding", 0)
    dilation = ntuple(dilation, 2, op, "dilation", 1)
    size = x.shape[2:]
    out = []
    for dim, (h, k, s, p, d) in enumerate(zip(size, kernel, stride, pads, dilation)):
        if p > k // 2:
            raise TexprError(f"{op}: padding {p} in spatial dimension {dim} must be at most "
                             f"half the kernel extent {k} (as torch)")
        eff = d * (k - 1) + 1
        if h + 2 * p < eff:
            raise ShapeError(f"{op}: window of extent {k} (dilation {d}, effective {eff}) is "
                             f"larger than the padded input extent {h} + 2*{p} in spatial "
                             f"dimension {dim} (input {x.name} {x.shape})")
        out.append((h + 2 * p - eff) // s + 1)
    need_lo = [p > 0 for p in pads]
    need_hi = [(o - 1) * s + (k - 1) * d - p > h - 1
               for o, s, k, d, p, h in zip(out, stride, kernel, dilation, pads, size)]
    return kernel, stride, pads, dilation, tuple(out), need_lo, need_hi


def _taps(sp, rk, stride, dilation, pads, size, need_lo, need_hi):
    idx, conds = [], []
    for v, r, s, d, p, h, nl, nh in zip(sp, rk, stride, dilation, pads, size, need_lo, need_hi):
        i = v * s + r * d - p
        idx.append(i)
        if nl:
            conds.append(i >= 0)
        if nh:
            conds.append(i < h)
    return idx, all_of(conds)


def max_pool2d(x, kernel, stride=None, padding=0, dilation=1, name="max_pool2d"):
    """Max pooling, NCHW, as ``torch.nn.functional.max_pool2d`` (``ceil_mode=False``).

    ``Y[n, c, h, w] = max_{kh, kw} Xpad[n, c, h*sh + kh*dh - ph, w*sw + kw*dw - pw]``
    with ``Xpad`` padded by ``-inf`` (a select inside the reduction).
    Gradient: the subgradient rule of ``te.max``: the first maximum of a window (row-major
    order) receives the whole adjoint, tied ones 0 (docs/conventions.md, "Ties").

    Args:
        x: ``(N, C, H, W)``. kernel: int or pair. stride: int or pair (default: kernel).
        padding: int or pair, at most half the kernel. dilation: int or pair.
    Returns:
        ``(N, C, Ho, Wo)``, ``Ho = (H + 2*ph - dh*(KH-1) - 1) // sh + 1``.
    Raises:
        ShapeError: not 4-D, window larger than the padded input.
        TexprError: bad kernel/stride/padding/dilation values.
    """
    op = "max_pool2d"
    kernel, stride, pads, dilation, out, nlo, nhi = _window(op, x, kernel, stride, padding,
                                                            dilation)
    rk = [reduce_axis(kernel[0], "kh"), reduce_axis(kernel[1], "kw")]

    def body(n, c, h, w):
        idx, cond = _taps((h, w), rk, stride, dilation, pads, x.shape[2:], nlo, nhi)
        v = x[(n, c) + tuple(idx)]
        if cond is not True:
            v = select(cond, v, -math.inf)
        return red.max(v, axis=rk)

    return compute(x.shape[:2] + out, body, name=name, tag=op,
                   attrs=dict(kernel=kernel, stride=stride, padding=pads, dilation=dilation))


def _valid_count(v, k, s, d, p, h):
    """Number of window taps ``r < k`` with ``0 <= v*s + r*d - p < h`` (an int expression)."""
    # r >= ceil((p - v*s) / d) and r <= floor((h - 1 + p - v*s) / d)
    lo_num = p - v * s
    lo = -floordiv(-lo_num, d) if d > 1 else lo_num
    hi_num = h - 1 + p - v * s
    hi = floordiv(hi_num, d) if d > 1 else hi_num
    return minimum(hi, k - 1) - maximum(lo, 0) + 1


def avg_pool2d(x, kernel, stride=None, padding=0, count_include_pad=True, dilation=1,
               name="avg_pool2d"):
    """Average pooling, NCHW, as ``torch.nn.functional.avg_pool2d`` (``ceil_mode=False``).

    ``Y[n, c, h, w] = sum_{kh, kw} Xpad[n, c, h*sh + kh*dh - ph, w*sw + kw*dw - pw] / D``
    with zero padding (a guard inside the reduction) and the divisor ``D``:
    ``KH*KW`` with ``count_include_pad=True``, else the number of window taps inside
    the input (a closed-form integer expression of ``h, w``; no extra stage). The
    division is folded into the summand so the operator is one stage.
    ``dilation`` is an extension (torch's avg_pool2d has none): taps ``kh*dh`` apart.

    Args:
        x: ``(N, C, H, W)``. kernel: int or pair. stride: int or pair (default: kernel).
        padding: int or pair, at most half the kernel.
        count_include_pad: count padded taps in the divisor.
        dilation: int or pair.
    Returns:
        ``(N, C, Ho, Wo)``, ``Ho = (H + 2*ph - dh*(KH-1) - 1) // sh + 1``.
    Raises:
        ShapeError: not 4-D, window larger than the padded input.
        TexprError: bad kernel/stride/padding/dilation values.
    """
    op = "avg_pool2d"
    count_include_pad = check_bool(count_include_pad, op, "count_include_pad")
    kernel, stride, pads, dilation, out, nlo, nhi = _window(op, x, kernel, stride, padding,
                                                            dilation)
    rk = [reduce_axis(kernel[0], "kh"), reduce_axis(kernel[1], "kw")]
    size = x.shape[2:]

    def body(n, c, h, w):
        idx, cond = _taps((h, w), rk, stride, dilation, pads, size, nlo, nhi)
        v = x[(n, c) + tuple(idx)]
        if cond is not True:
            v = select(cond, v, 0)
        if count_include_pad or not any(nlo + nhi):
            scaled = v * float_const(1.0 / (kernel[0] * kernel[1]), v)
        else:
            # the divisor is a product of per-dimension float counts (exact for these small
            # integers); each count is an int expression of one output axis
            fdt = v.dtype if v.dtype.startswith("float") else "float32"
            count = None
            for sp, k, s, d, p, hh, nl, nh in zip((h, w), kernel, stride, dilation, pads, size,
                                                  nlo, nhi):
                cnt = cast(_valid_count(sp, k, s, d, p, hh) if (nl or nh) else k, fdt)
                count = cnt if count is None else count * cnt
            scaled = v / count
        return red.sum(scaled, axis=rk)

    return compute(x.shape[:2] + out, body, name=name, tag=op,
                   attrs=dict(kernel=kernel, stride=stride, padding=pads, dilation=dilation,
                              count_include_pad=bool(count_include_pad)))


def global_avg_pool2d(x, name="global_avg_pool2d"):
    """Mean over the spatial axes, NCHW: ``Y[n, c, 0, 0] = mean_{h, w} X[n, c, h, w]``.

    As ``torch.nn.functional.adaptive_avg_pool2d(x, 1)``.

    Args:
        x: ``(N, C, H, W)`` with ``H*W > 0``.
    Returns:
        ``(N, C, 1, 1)``.
    Raises:
        ShapeError: not 4-D or empty spatial extent.
    """
    op = "global_avg_pool2d"
    check_tensor(x, op, "input", ndim=4)
    hh, ww = x.shape[2:]
    if hh * ww == 0:
        raise ShapeError(f"{op}: input {x.name} has an empty spatial extent {x.shape}")
    rh, rw = reduce_axis(hh, "rh"), reduce_axis(ww, "rw")
    scale = 1.0 / (hh * ww)
    return compute(x.shape[:2] + (1, 1),
                   lambda n, c, h, w: red.sum(x[n, c, rh, rw] * float_const(scale, x),
                                              axis=[rh, rw]), name=name, tag=op)


def adaptive_avg_pool2d(x, output_size, name="adaptive_avg_pool2d"):
    """Adaptive average pooling, NCHW, as ``torch.nn.functional.adaptive_avg_pool2d``.

    Output row ``i`` averages input rows ``[floor(i*H/Ho), ceil((i+1)*H/Ho))`` (same
    for columns). One stage: the reduction runs over the largest window with a
    ``where=`` bound for the window of each output position.

    Args:
        x: ``(N, C, H, W)``. output_size: int or pair ``(Ho, Wo)``, each >= 1.
    Returns:
        ``(N, C, Ho, Wo)``.
    Raises:
        ShapeError: not 4-D, empty input. TexprError: bad output_size.
    """
    op = "adaptive_avg_pool2d"
    check_tensor(x, op, "input", ndim=4)
    osz = ntuple(output_size, 2, op, "output_size", 1)
    size = x.shape[2:]
    if 0 in size:
        raise ShapeError(f"{op}: input {x.name} has an empty spatial extent {x.shape}")

    def bounds(o, n):
        starts = [(i * n) // o for i in range(o)]
        ends = [-((-(i + 1) * n) // o) for i in range(o)]
        return max(e - s for s, e in zip(starts, ends)), all(
            e - s == ends[0] - starts[0] for s, e in zip(starts, ends))

    kmax = [bounds(o, n) for o, n in zip(osz, size)]
    rk = [reduce_axis(kmax[0][0], "kh"), reduce_axis(kmax[1][0], "kw")]

    def body(n, c, h, w):
        idx, conds, counts = [], [], []
        for v, r, o, nn, (km, uniform) in zip((h, w), rk, osz, size, kmax):
            start = floordiv(v * nn, o) if nn % o else v * (nn // o)
            end = -floordiv(-(v + 1) * nn, o) if nn % o else (v + 1) * (nn // o)
            idx.append(start + r)
            if uniform:
                counts.append(km)
            else:
                conds.append(r < end - start)
                counts.append(end - start)
        val = x[(n, c) + tuple(idx)]
        if all(isinstance(cnt, int) for cnt in counts):
            scaled = val * float_const(1.0 / (counts[0] * counts[1]), val)
        else:
            fdt = val.dtype if val.dtype.startswith("float") else "float32"
            scaled = val / (cast(counts[0], fdt) * cast(counts[1], fdt))
        return red.sum(scaled, axis=rk, where=all_of(conds) if conds else None)

    return compute(x.shape[:2] + osz, body, name=name, tag=op, attrs=dict(output_size=osz))
