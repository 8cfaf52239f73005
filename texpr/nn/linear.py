"""Linear maps: ``dense``, ``matmul``, ``batch_matmul``, ``bias_add`` and ``einsum``.

Each product is one reduction stage ``sum_k A[.., k] * B[.., k]``; a bias is a
second, elementwise stage.
"""

from .. import reduction as red
from ..errors import ShapeError, TexprError
from ..tensor import compute, reduce_axis
from ._util import check_bool, check_tensor, norm_axis

__all__ = ["dense", "matmul", "batch_matmul", "bias_add", "einsum"]


def bias_add(x, bias, axis=1, name="bias_add"):
    """``Y = X + bias`` broadcast along ``axis``: ``Y[..., c, ...] = X[..., c, ...] + bias[c]``.

    As ``torch.nn.functional`` layers add their bias (``axis=1`` for NCHW, ``axis=-1``
    for the features of a dense layer).

    Args:
        x: any tensor with at least one dimension. bias: 1-D, ``(x.shape[axis],)``.
        axis: the axis of ``x`` the bias runs along (negative counts from the end).
    Returns:
        a tensor of ``x``'s shape (dtype promoted).
    Raises:
        ShapeError: bad axis, bias not 1-D or of the wrong length.
    """
    op = "bias_add"
    check_tensor(x, op, "input")
    check_tensor(bias, op, "bias", ndim=1)
    axis = norm_axis(axis, x.ndim, op)
    if bias.shape[0] != x.shape[axis]:
        raise ShapeError(f"{op}: bias {bias.name} has {bias.shape[0]} entries but axis {axis} "
                         f"of {x.name} (shape {x.shape}) has extent {x.shape[axis]}")
    return compute(x.shape, lambda *i: x[i] + bias[i[axis]], name=name, tag=op)


def dense(x, weight, bias=None, name="dense"):
    """Fully connected layer ``Y = X W^T (+ b)``, as ``torch.nn.functional.linear``.

    ``Y[i, j] = sum_k X[i, k] * W[j, k]`` (+ ``bias[j]`` in a stage ``{name}_bias``).

    Args:
        x: ``(N, K)``. weight: ``(M, K)``. bias: optional ``(M,)``.
    Returns:
        ``(N, M)``.
    Raises:
        ShapeError: not 2-D, or the inner extents differ.
    """
    op = "dense"
    check_tensor(x, op, "input", ndim=2)
    check_tensor(weight, op, "weight", ndim=2)
    if x.shape[1] != weight.shape[1]:
        raise ShapeError(f"{op}: input {x.name} {x.shape} has {x.shape[1]} features but weight "
                         f"{weight.name} {weight.shape} expects {weight.shape[1]}")
    k = reduce_axis(x.shape[1], "k")
    out = compute((x.shape[0], weight.shape[0]),
                  lambda i, j: red.sum(x[i, k] * weight[j, k], axis=k), name=name, tag=op)
    return out if bias is None else bias_add(out, bias, axis=1, name=f"{name}_bias")


def matmul(a, b, transpose_a=False, transpose_b=False, name="matmul"):
    """Matrix product ``A @ B`` of 2-D tensors, as ``numpy.matmul`` / ``torch.matmul``.

    ``Y[i, j] = sum_k A[i, k] * B[k, j]`` (with ``A``/``B`` read transposed when asked).

    Args:
        a: ``(N, K)`` (``(K, N)`` with ``transpose_a``). b: ``(K, M)`` (``(M, K)`` with
        ``transpose_b``).
    Returns:
        ``(N, M)``.
    Raises:
        ShapeError: not 2-D, or inner extents differ.
    """
    op = "matmul"
    transpose_a = check_bool(transpose_a, op, "transpose_a")
    transpose_b = check_bool(transpose_b, op, "transpose_b")
    check_tensor(a, op, "a", ndim=2)
    check_tensor(b, op, "b", ndim=2)
    n, ka = (a.shape[1], a.shape[0]) if transpose_a else a.shape
    kb, m = (b.shape[1], b.shape[0]) if transpose_b else b.shape
    if ka != kb:
        raise ShapeError(f"{op}: inner extents differ: {a.name} {a.shape}"
                         f"{' (transposed)' if transpose_a else ''} and {b.name} {b.shape}"
                         f"{' (transposed)' if transpose_b else ''} give {ka} vs {kb}")
    k = reduce_axis(ka, "k")

    def body(i, j):
        av = a[k, i] if transpose_a else a[i, k]
        bv = b[j, k] if transpose_b else b[k, j]
        return red.sum(av * bv, axis=k)

    return compute((n, m), body, name=name, tag=op)


def batch_matmul(a, b, transpose_a=False, transpose_b=False, name="batch_matmul"):
    """Batched matrix product, as ``torch.bmm`` (batch extent 1 broadcasts).

    ``Y[p, i, j] = sum_k A[p, i, k] * B[p, k, j]`` (with transposes as asked).

    Args:
        a: ``(P, N, K)`` (``(P, K, N)`` with ``transpose_a``). b: ``(P, K, M)``
        (``(P, M, K)`` with ``transpose_b``, TVM's layout for ``Q K^T``).
    Returns:
        ``(P, N, M)`` where ``P`` is the larger of the two batch extents.
    Raises:
        ShapeError: not 3-D, batch extents differ (and neither is 1), inner extents differ.
    """
    op = "batch_matmul"
    transpose_a = check_bool(transpose_a, op, "transpose_a")
    transpose_b = check_bool(transpose_b, op, "transpose_b")
    check_tensor(a, op, "a", ndim=3)
    check_tensor(b, op, "b", ndim=3)
    pa, pb = a.shape[0], b.shape[0]
    if pa != pb and 1 not in (pa, pb):
        raise ShapeError(f"{op}: batch extents differ: {a.name} {a.shape} vs {b.name} {b.shape}")
    n, ka = (a.shape[2], a.shape[1]) if transpose_a else a.shape[1:]
    kb, m = (b.shape[2], b.shape[1]) if transpose_b else b.shape[1:]
    if ka != kb:
        raise ShapeError(f"{op}: inner extents differ: {a.name} {a.shape} and {b.name} "
                         f"{b.shape} give {ka} vs {kb}")
    k = reduce_axis(ka, "k")

    def body(p, i, j):
        qa = p if pa > 1 else 0
        qb = p if pb > 1 else 0
        av = a[qa, k, i] if transpose_a else a[qa, i, k]
        bv = b[qb, j, k] if transpose_b else b[qb, k, j]
        return red.sum(av * bv, axis=k)

    return compute((max(pa, pb), n, m), body, name=name, tag=op)


def _parse_einsum(subscripts, operands, op):
    if not isinstance(subscripts, str):
        raise TexprError(f"{op}: subscripts must be a string like 'ij,jk->ik', got {subscripts!r}")
    spec = subscripts.replace(" ", "")
    if "." in spec:
        raise TexprError(f"{op}: ellipsis ('...') is not supported in {subscripts!r}")
    if "->" in spec:
        lhs, out = spec.split("->", 1)
        if "->" in out:
            raise TexprError(f"{op}: more than one '->' in {subscripts!r}")
    else:
        lhs, out = spec, None
    ins = lhs.split(",")
    if len(ins) != len(operands):
        raise TexprError(f"{op}: {subscripts!r} names {len(ins)} operand(s) but "
                         f"{len(operands)} were given")
    for s in ins + ([out] if out is not None else []):
        for ch in s:
            if not ch.isalpha():
                raise TexprError(f"{op}: subscript letter {ch!r} in {subscripts!r} is not a letter")
    if out is None:  # implicit: the letters seen once, alphabetically (numpy)
        counts = {}
        for s in ins:
            for ch in s:
                counts[ch] = counts.get(ch, 0) + 1
        out = "".join(sorted(ch for ch, c in counts.items() if c == 1))
    if len(set(out)) != len(out):
        raise TexprError(f"{op}: output subscripts {out!r} repeat a letter")
    return ins, out


def einsum(subscripts, *operands, name="einsum"):
    """Einstein summation over texpr tensors, as ``numpy.einsum`` (a subset).

    Supported: explicit (``"ij,jk->ik"``) and implicit (``"ij,jk"``: output letters are
    those seen once, sorted) modes, any number of operands, repeated letters inside an
    operand (diagonals, ``"ii->i"``), letters summed away (``"ij->"``). Not supported:
    ellipsis ``...`` and broadcasting of extent-1 dimensions. One stage:
    ``Y[out] = sum_{other letters} prod_t T_t[letters of t]`` (no reduction when every
    letter is an output letter).

    Args:
        subscripts: the einsum string. operands: the tensors, one per comma group.
    Returns:
        a tensor whose shape follows the output letters.
    Raises:
        TexprError: malformed subscripts, ellipsis, wrong operand count, an output letter
            not found in any operand. ShapeError: a letter with two different extents, an
            operand whose rank differs from its subscripts.
    """
    op = "einsum"
    if not operands:
        raise TexprError(f"{op}: no operands given")
    for t in operands:
        check_tensor(t, op, "operand")
    ins, out = _parse_einsum(subscripts, operands, op)
    extent = {}
    for s, t in zip(ins, operands):
        if len(s) != t.ndim:
            raise ShapeError(f"{op}: subscripts {s!r} have {len(s)} letters but operand "
                             f"{t.name} has shape {t.shape}")
        for ch, n in zip(s, t.shape):
            if extent.setdefault(ch, n) != n:
                raise ShapeError(f"{op}: letter {ch!r} has extent {extent[ch]} and {n} "
                                 f"(operand {t.name} of shape {t.shape}) in {subscripts!r}")
    for ch in out:
        if ch not in extent:
            raise TexprError(f"{op}: output letter {ch!r} appears in no operand of {subscripts!r}")
    summed = [ch for ch in dict.fromkeys("".join(ins)) if ch not in out]
    raxes = {ch: reduce_axis(extent[ch], ch) for ch in summed}

    def body(*idx):
        env = dict(zip(out, idx))
        env.update(raxes)
        prod = None
        for s, t in zip(ins, operands):
            v = t[tuple(env[ch] for ch in s)]
            prod = v if prod is None else prod * v
        if not raxes:
            return prod
        return red.sum(prod, axis=[raxes[ch] for ch in summed])

    return compute(tuple(extent[ch] for ch in out), body, name=name, tag=op,
                   attrs=dict(subscripts=subscripts))
