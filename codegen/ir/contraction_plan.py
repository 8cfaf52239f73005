"""The plan of a contraction stage run as GEMMs: plain data, picklable with its kernel.

One job: what :func:`codegen.analysis.contraction.match` decides about a stage
(its GEMM pieces, their operand views over the kernel's flat buffers, masks and
padding) and what reads that description (:meth:`ContractionPlan.describe`,
the cost rule's sizes). Running a plan (numpy's BLAS, packing, chunks,
threads, the exact non-finite path) is a backend's job:
:mod:`codegen.backends.numpy_host.gemm` registers the runner that
:meth:`ContractionPlan.run` calls (:func:`register_runner`), so neither
:mod:`codegen.ir` nor :mod:`codegen.analysis` imports a backend.
"""

import math

import numpy as np

from texpr import expr as E
from texpr.errors import TexprError

__all__ = ["ContractionPlan", "GemmPiece", "OperandView", "TREE_OP_TYPES", "tree_nodes",
           "tree_keys", "byte_view", "register_runner"]

#: the binary operations a data-dependent mask tree may hold (its node kinds besides
#: ``c``, ``v``, ``ld``, ``ldc``, ``not``, ``sel``, ``cast``, ``abs``); the runner evaluates each
TREE_OP_TYPES = (E.Add, E.Sub, E.Mul, E.Div, E.FloorDiv, E.FloorMod, E.Min, E.Max, E.EQ,
                 E.NE, E.LT, E.LE, E.GT, E.GE, E.And, E.Or)

#: the function that runs a plan, ``runner(plan, arrays) -> out`` (set by the backend)
_RUNNER = []


def register_runner(runner):
    """Make ``runner(plan, arrays)`` the function :meth:`ContractionPlan.run` calls
    (:mod:`codegen.backends.numpy_host.gemm` registers its own on import).

    Args:
        runner: a callable ``(plan, arrays) -> output buffer``.
    """
    _RUNNER[:] = [runner]


class OperandView:
    """One operand of a GEMM piece: the buffer ``key``, its ``shape``, the
    zero padding ``pad`` (per dimension ``(lo, hi)``, or None: the buffer itself),
    and the view over the piece's axes ``axes`` (positions in the piece's axis
    list): element ``offset`` and ``strides`` in the (padded) flat buffer, and
    ``masks``: conditions ``sum(coef[k] * value(axes[k])) + const >= 0`` (or
    ``== 0``), given as ``(coefs, const, is_eq)``, outside which the view's
    elements count as zeros; ``data_masks``: data-dependent conditions over the
    same axes (expression trees, see :func:`codegen.analysis.contraction._tree`;
    a ReLU's adjoint reads ``where=dense[i, j] > 0``), the same way;
    ``exact_masks``: conditions like ``masks`` applied only on the exact path
    (:func:`codegen.backends.numpy_host.gemm.run_exact`): outside them a window
    stage (:mod:`codegen.rewrite.windows`) holds zeros, which stand for absent
    terms."""

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
        self.axes, self.out_offset = list(axes), int(out_offset)
        self.out_strides = tuple(out_strides)
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
                    keys |= tree_keys(t)
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
        buffers ``arrays[key]`` (flat, or of the tensor's shape), with the
        registered runner (:func:`codegen.backends.numpy_host.gemm.run_plan`: its
        non-finite policy is :mod:`codegen.analysis.gemm_policy`'s).

        Returns:
            The output buffer.
        Raises:
            TexprError: no runner is registered (the backend was not imported),
                or the runner's errors (``stage NAME: ...``).
        """
        if not _RUNNER:
            raise TexprError(f"stage {self.stage}: no GEMM runner is registered; import "
                             "texpr.codegen (its numpy_host backend registers one)")
        return _RUNNER[0](self, arrays)

    def __repr__(self):
        return f"ContractionPlan({self.stage}: {self.describe()})"


def tree_nodes(t):
    """The nodes of an expression tree (:func:`codegen.analysis.contraction._tree`), each a
    tuple whose first item names its kind, in pre-order."""
    yield t
    for x in t[1:]:
        if isinstance(x, tuple) and x and isinstance(x[0], (str, type)):
            yield from tree_nodes(x)
        elif isinstance(x, tuple):
            for y in x:
                if isinstance(y, tuple) and y and isinstance(y[0], (str, type)):
                    yield from tree_nodes(y)


def tree_keys(t):
    """The buffer keys an expression tree (:func:`codegen.analysis.contraction._tree`)
    loads from."""
    return {n[1] for n in tree_nodes(t) if n[0] in ("ld", "ldc")}


def byte_view(flat, offset, shape, strides, writeable=False):
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


