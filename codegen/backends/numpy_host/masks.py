"""Masks of a GEMM plan's operands, evaluated by numpy: affine conditions over the
piece's axes and data-dependent condition trees.

One job: the boolean arrays :func:`codegen.backends.numpy_host.gemm._operand` applies
to an operand view (its ``masks``, ``exact_masks`` and ``data_masks``,
:class:`codegen.ir.contraction_plan.OperandView`), by ``te.evaluate``'s rules.
"""

import weakref

import numpy as np

from texpr import expr as E
from texpr.errors import TexprError
from texpr.evaluate import int_arith_exactly

__all__ = []

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

