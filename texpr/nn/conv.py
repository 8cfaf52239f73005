"""Convolutions: ``conv1d``, ``conv2d`` and ``conv2d_transpose`` (NCHW / NCL layouts).

Each is one compute stage (plus a ``bias_add`` stage when a bias is given).
Zero padding is a guard *inside* the reduction,
``select(0 <= h*s + kh*d - p < H, X[..., h*s + kh*d - p, ...], 0)``, never a
materialised padded copy, and a guard is only emitted on the sides where the
window can actually leave the input. The transposed convolution is written
directly over its output (the gather form: input row ``(oh + p - kh*d) / s``
where that is an integer inside the input), not as a convolution of a dilated
input. Both forms keep every index quasi-affine in the axes, so the gradient's
nonzero terms can be found exactly by the simplifier.
"""

from .. import reduction as red
from ..errors import ShapeError, TexprError
from ..expr import floordiv, floormod, select
from ..tensor import compute, reduce_axis
from ._util import all_of, check_int, check_tensor, ntuple
from .linear import bias_add

__all__ = ["conv1d", "conv2d", "conv2d_transpose"]


def _padding(padding, kernel, dilation, stride, op):
    """Per spatial dimension ``(before, after)`` from an int, ints, pairs, ``"same"`` or ``"valid"``."""
    n = len(kernel)
    if isinstance(padding, str):
        if padding == "valid":
            return [(0, 0)] * n
        if padding == "same":
            if any(s != 1 for s in stride):
                raise TexprError(f"{op}: padding='same' needs stride 1 (as torch), got stride "
                                 f"{tuple(stride)}")
            out = []
            for k, d in zip(kernel, dilation):
                total = d * (k - 1)
                out.append((total // 2, total - total // 2))
            return out
        raise TexprError(f"{op}: padding must be an int, a tuple, 'same' or 'valid', "
                         f"got {padding!r}")
    if isinstance(padding, (list, tuple)) and len(padding) == n and all(
            isinstance(p, (list, tuple)) for p in padding):
        out = []
        for p in padding:
            lo, hi = ntuple(tuple(p), 2, op, "padding", 0)
            out.append((lo, hi))
        return out
    return [(p, p) for p in ntuple(padding, n, op, "padding", 0)]


def _check_groups(op, groups, cin, cout, w_in, x, w):
    if cin % groups:
        raise ShapeError(f"{op}: input channels {cin} of {x.name} are not divisible by "
                         f"groups={groups}")
    if cout % groups:
        raise ShapeError(f"{op}: output channels {cout} are not divisible by groups={groups}")
    if w_in * groups != cin:
        raise ShapeError(f"{op}: weight {w.name} of shape {w.shape} expects {w_in * groups} "
                         f"input channels ({w_in} per group x groups={groups}) but input "
                         f"{x.name} of shape {x.shape} has {cin}")


def _conv_nd(x, w, stride, padding, dilation, groups, nsp, op, name):
    check_tensor(x, op, "input", ndim=nsp + 2)
    check_tensor(w, op, "weight", ndim=nsp + 2)
    groups = check_int(groups, op, "groups", 1)
    stride = ntuple(stride, nsp, op, "stride", 1)
    dilation = ntuple(dilation, nsp, op, "dilation", 1)
    n, cin = x.shape[:2]
    cout, cpg = w.shape[:2]
    kernel = w.shape[2:]
    size = x.shape[2:]
    _check_groups(op, groups, cin, cout, cpg, x, w)
    pads = _padding(padding, kernel, dilation, stride, op)
    out_size = []
    for dim, (h, k, s, d, (lo, hi)) in enumerate(zip(size, kernel, stride, dilation, pads)):
        eff = d * (k - 1) + 1
        if k == 0 or h + lo + hi < eff:
            raise ShapeError(
                f"{op}: kernel of extent {k} (dilation {d}, effective {eff}) is larger than "
                f"the padded input extent {h} + {lo} + {hi} = {h + lo + hi} in spatial "
                f"dimension {dim} (input {x.name} {x.shape}, weight {w.name} {w.shape})")
        out_size.append((h + lo + hi - eff) // s + 1)
    # which guards can fail: the lower one iff there is padding before, the upper
    # one iff the last window reaches past the input
    need_lo = [lo > 0 for lo, _ in pads]
    need_hi = [(o - 1) * s + (k - 1) * d - lo > h - 1
               for o, s, k, d, (lo, _), h in zip(out_size, stride, kernel, dilation, pads, size)]
    opg = cout // groups
    rc = reduce_axis(cpg, "rc") if (groups == 1 or cpg > 1) else None
    rk = [reduce_axis(k, nm) for k, nm in zip(kernel, ("kh", "kw") if nsp == 2 else ("kl",))]

    def channel(o):
        if groups == 1:
            return rc
        group = o if opg == 1 else floordiv(o, opg)
        base = group if cpg == 1 else group * cpg
        return base if rc is None else base + rc

    def body(nn, o, *sp):
        idx, conds = [], []
        for v, r, s, d, (lo, _), h, nl, nh in zip(sp, rk, stride, dilation, pads, size,
                                                   need_lo, need_hi):
            i = v * s + r * d - lo
            idx.append(i)
            if nl:
                conds.append(i >= 0)
            if nh:
                conds.append(i < h)
        cond = all_of(conds)
        xv = x[(nn, channel(o)) + tuple(idx)]
        if cond is not True:
            xv = select(cond, xv, 0)
        wc = rc if rc is not None else 0
        axes = ([rc] if rc is not None else []) + rk
        return red.sum(xv * w[(o, wc) + tuple(rk)], axis=axes)

    attrs = dict(stride=stride, padding=tuple(pads), dilation=dilation, groups=groups)
    return compute((n, cout) + tuple(out_size), _named(body, nsp), name=name, tag=op,
                   attrs=attrs)


def _named(body, nsp):
    """``body`` with readable axis names (``n, c, h, w`` / ``n, c, l``) for printing."""
    if nsp == 2:
        return lambda n, c, h, w: body(n, c, h, w)
    return lambda n, c, l: body(n, c, l)


def conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, name="conv1d"):
    """1-D convolution (cross-correlation), as ``torch.nn.functional.conv1d``.

    ``Y[n, o, l] = sum_{c, k} Xpad[n, g(o)*C/groups + c, l*stride + k*dilation] * W[o, c, k]``
    (+ ``bias[o]``), with ``g(o) = o // (O/groups)`` the group of output channel ``o``.

    Args:
        x: input of shape ``(N, C, L)``.
        weight: ``(O, C/groups, K)``.
        bias: optional ``(O,)`` tensor (added in a second stage ``{name}_bias``).
        stride, dilation: int or 1-tuple, >= 1.
        padding: int, 1-tuple, ``((before, after),)``, ``"valid"`` (0) or ``"same"``
            (stride 1 only; the odd unit of padding goes after, as torch).
        groups: the channels split into ``groups`` independent convolutions.
    Returns:
        ``(N, O, Lout)`` with ``Lout = (L + before + after - dilation*(K-1) - 1) // stride + 1``.
    Raises:
        ShapeError: wrong ranks, channels not divisible by ``groups`` or not matching
            the weight, kernel larger than the padded input.
        TexprError: non-int or non-positive stride/dilation/groups, negative padding,
            ``"same"`` with a stride.
    """
    out = _conv_nd(x, weight, stride, padding, dilation, groups, 1, "conv1d", name)
    return out if bias is None else bias_add(out, bias, axis=1, name=f"{name}_bias")


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, name="conv2d"):
    """2-D convolution (cross-correlation), NCHW, as ``torch.nn.functional.conv2d``.

    ``Y[n, o, h, w] = sum_{c, kh, kw} Xpad[n, g(o)*C/groups + c, h*sh + kh*dh, w*sw + kw*dw]
    * W[o, c, kh, kw]`` (+ ``bias[o]``) where ``Xpad`` is ``X`` padded with zeros and
    ``g(o) = o // (O/groups)``. One stage; padding is a guard inside the reduction.
    ``groups == C`` with ``O == C`` is a depthwise convolution.

    Args:
        x: input ``(N, C, H, W)``.
        weight: ``(O, C/groups, KH, KW)``.
        bias: optional ``(O,)`` (added in a second stage ``{name}_bias``).
        stride, dilation: int or pair, >= 1.
        padding: int, pair ``(ph, pw)``, pairs ``((top, bottom), (left, right))``,
            ``"valid"`` or ``"same"`` (stride 1 only; odd padding goes after, as torch).
        groups: int >= 1 dividing ``C`` and ``O``.
    Returns:
        ``(N, O, Ho, Wo)``, ``Ho = (H + top + bottom - dh*(KH-1) - 1) // sh + 1`` (same for W).
    Raises:
        ShapeError: input/weight not 4-D, ``C`` or ``O`` not divisible by ``groups``,
            ``weight.shape[1] * groups != C``, kernel (dilated) larger than the padded input.
        TexprError: bad stride/dilation/groups/padding values.
    """
    out = _conv_nd(x, weight, stride, padding, dilation, groups, 2, "conv2d", name)
    return out if bias is None else bias_add(out, bias, axis=1, name=f"{name}_bias")


def conv2d_transpose(x, weight, bias=None, stride=1, padding=0, output_padding=0, dilation=1,
                     groups=1, name="conv2d_transpose"):
    """Transposed 2-D convolution, NCHW, as ``torch.nn.functional.conv_transpose2d``.

    The gradient of :func:`conv2d` w.r.t. its input, written directly over the output
    (gather form): with ``t = oh + ph - kh*dh``,

    ``Y[n, o, oh, ow] = sum_{c, kh, kw} [t % sh == 0 and 0 <= t // sh < H] (same for w)
    * X[n, g*Cg + c, t // sh, u // sw] * W[g*Cg + c, o % Og, kh, kw]``

    with ``g = o // Og`` the group, ``Cg = C/groups``, ``Og = weight.shape[1]``.

    Args:
        x: input ``(N, C, H, W)``.
        weight: ``(C, O/groups, KH, KW)`` (in, out, kh, kw), as torch.
        bias: optional ``(O,)``.
        stride, dilation: int or pair, >= 1.
        padding: int or pair (removed from both sides of the full output).
        output_padding: int or pair added to the bottom/right; must be smaller than
            the stride or the dilation of that dimension (as torch).
        groups: int >= 1 dividing ``C``.
    Returns:
        ``(N, O, Ho, Wo)``, ``Ho = (H-1)*sh - 2*ph + dh*(KH-1) + output_padding + 1``.
    Raises:
        ShapeError: not 4-D, ``C`` not matching ``weight.shape[0]`` or not divisible by
            ``groups``, a non-positive output extent.
        TexprError: bad stride/padding/output_padding/dilation/groups values.
    """
    op = "conv2d_transpose"
    check_tensor(x, op, "input", ndim=4)
    check_tensor(weight, op, "weight", ndim=4)
    groups = check_int(groups, op, "groups", 1)
    stride = ntuple(stride, 2, op, "stride", 1)
    dilation = ntuple(dilation, 2, op, "dilation", 1)
    pads = ntuple(padding, 2, op, "padding", 0)
    opad = ntuple(output_padding, 2, op, "output_padding", 0)
    n, cin = x.shape[:2]
    wcin, opg = weight.shape[:2]
    kernel = weight.shape[2:]
    size = x.shape[2:]
    if wcin != cin:
        raise ShapeError(f"{op}: weight {weight.name} of shape {weight.shape} expects {wcin} "
                         f"input channels but input {x.name} of shape {x.shape} has {cin}")
    if cin % groups:
        raise ShapeError(f"{op}: input channels {cin} of {x.name} are not divisible by "
                         f"groups={groups}")
    for dim in range(2):
        if opad[dim] >= max(stride[dim], dilation[dim]):
            raise TexprError(
                f"{op}: output_padding {opad[dim]} in spatial dimension {dim} must be smaller "
                f"than the stride {stride[dim]} or the dilation {dilation[dim]}")
    cout = opg * groups
    cpg = cin // groups
    out_size = []
    for dim, (h, k, s, d, p, op_) in enumerate(zip(size, kernel, stride, dilation, pads, opad)):
        o = (h - 1) * s - 2 * p + d * (k - 1) + op_ + 1
        if h == 0 or k == 0 or o <= 0:
            raise ShapeError(
                f"{op}: output extent (H-1)*stride - 2*padding + dilation*(K-1) + "
                f"output_padding + 1 = ({h}-1)*{s} - 2*{p} + {d}*({k}-1) + {op_} + 1 = {o} "
                f"is not positive in spatial dimension {dim}")
        out_size.append(o)
    rc = reduce_axis(cpg, "rc") if (groups == 1 or cpg > 1) else None
    rk = [reduce_axis(k, nm) for k, nm in zip(kernel, ("kh", "kw"))]

    def body(nn, o, *sp):
        idx, conds = [], []
        for v, r, s, d, p, h, k, o_ext in zip(sp, rk, stride, dilation, pads, size, kernel,
                                              out_size):
            t = v + p - r * d
            if p < (k - 1) * d:  # t can be negative
                conds.append(t >= 0)
            if s > 1:
                conds.append(floormod(t, s) == 0)
            if o_ext - 1 + p > (h - 1) * s:  # t can pass the last input row
                conds.append(t <= (h - 1) * s)
            idx.append(floordiv(t, s) if s > 1 else t)
        if groups == 1:
            chan, oloc = rc, o
        else:
            group = floordiv(o, opg) if opg > 1 else o
            base = group * cpg if cpg > 1 else group
            chan = base + rc if rc is not None else base
            oloc = floormod(o, opg) if opg > 1 else 0
        cond = all_of(conds)
        xv = x[(nn, chan) + tuple(idx)]
        if cond is not True:
            xv = select(cond, xv, 0)
        axes = ([rc] if rc is not None else []) + rk
        return red.sum(xv * weight[(chan, oloc) + tuple(rk)], axis=axes)

    attrs = dict(stride=stride, padding=pads, output_padding=opad, dilation=dilation,
                 groups=groups)
    out = compute((n, cout) + tuple(out_size), _named(body, 2), name=name, tag=op, attrs=attrs)
    return out if bias is None else bias_add(out, bias, axis=1, name=f"{name}_bias")
