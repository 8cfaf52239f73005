"""The lowered program: its buffers and the description of each unit, as plain data.

One job: what lowering hands to the backends (:mod:`codegen.loopnest.lower` makes
a :class:`Program`; :mod:`codegen.units` turns its unit descriptions into
runnable units). Everything here pickles with its kernel.
"""

import numpy as np

__all__ = ["BufferInfo", "ViewInfo", "alias_info", "UnitSource", "ContractionUnitSource",
           "ShiftUnitSource", "Program"]


class BufferInfo:
    """A buffer of the kernel: ``name`` in the source, ``tensor``, ``role``
    (input/output/temp), ``shape`` (0-d tensors are stored with shape ``(1,)``)."""

    def __init__(self, name, tensor, role):
        self.name, self.tensor, self.role = name, tensor, role
        self.shape = tuple(tensor.shape) if tensor.shape else (1,)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.dtype = tensor.dtype


class ViewInfo(BufferInfo):
    """A tensor stored inside another tensor's buffer (``base``, a BufferInfo)
    through an axis permutation with reversals: the state of a scan whose only
    reader re-indexes it (:func:`texpr.simplify.materialize.scan_view`).
    ``perm[j] = (d, reversed)``: the tensor's axis ``j`` is the base's axis ``d``
    (``n - 1 - i`` when reversed). :func:`codegen.loopnest.emit.element` applies it."""

    def __init__(self, base, tensor, perm, extents=None):
        super().__init__(base.name, tensor, base.role)
        self.base, self.perm = base, list(perm)
        self.extents = tuple(extents or tensor.shape)  # the state's (for reversals)

    def alias(self, tensor, base=None):
        """The same layout for another tensor indexed like the state (a loop
        nest that writes some of its steps), over ``base`` (default: the same)."""
        return ViewInfo(base or self.base, tensor, self.perm, self.extents)

    def physical(self, idx):
        """``(index strings, shape)`` in the base buffer for the index strings ``idx``."""
        out = [None] * len(self.perm)
        for s, (d, rev), n in zip(idx, self.perm, self.extents):
            out[d] = f"({n - 1} - ({s}))" if rev else s
        return out, self.base.shape


def alias_info(info, tensor):
    """A BufferInfo for ``tensor`` in the storage of ``info`` (same layout)."""
    if isinstance(info, ViewInfo):
        return info.alias(tensor)
    return BufferInfo(info.name, tensor, info.role)


class UnitSource:
    """One materialised stage, lowered: what a compiled unit is made from.

    ``kind`` (the dialect's unit kind, :attr:`codegen.loopnest.dialect.Dialect.unit_kind`:
    ``module_source`` is compiled by that backend); ``stage`` (the op's name);
    ``definition`` (``te.tensor_str`` of its output, for messages);
    ``module_source`` (canonical text defining ``unit(b0, .., err)``, see the
    module docstring); ``args`` (indices into :attr:`Program.buffers`, in
    parameter order); ``arg_specs`` (``(dtype, 1)`` per parameter, then
    ``("int64", 1)`` for ``err``); ``errors`` (flag code - 1 -> message, naming
    the stage); ``parallel`` (the text has a ``prange`` loop); ``source`` (the
    readable text of the unit, as in :attr:`Program.source`); ``chunks`` (0, or
    the extent ``n`` of the spatial axis a *chunked* unit splits: its text
    defines ``unit(b0, .., part, err)``, serial, which runs the points whose
    value of that axis is in ``part[0] <= v < part[1]``, and the parts
    ``[0, n)`` is cut into run at the same time, each starting at a multiple of
    ``chunk_align``, the backend's chunked units (docs/stages.md)). Picklable."""

    def __init__(self, stage, definition, module_source, args, arg_specs, errors, parallel,
                 source, chunks=0, chunk_align=1, kind=None):
        self.kind = kind
        self.stage, self.definition, self.module_source = stage, definition, module_source
        self.args, self.arg_specs, self.errors = tuple(args), list(arg_specs), list(errors)
        self.parallel, self.source, self.chunks = parallel, source, chunks
        self.chunk_align = chunk_align or 1

    def describe(self):
        """``"the stage <definition>"`` (shortened), for messages."""
        d = self.definition
        return "the stage " + (d if len(d) < 400 else d[:400] + " ...")


class Program:
    """The lowered kernel: ``units`` (a :class:`UnitSource` per materialised
    stage, in execution order), ``buffers`` (the kernel's flat arrays, argument
    order: inputs, outputs, temps; each unit's ``args`` index them),
    ``source`` (readable Python text: the units with buffers named after their
    tensors and each stage's definition in a comment, then the driver
    ``kernel``), ``stages`` (names of the materialised stages), ``parallel``
    (whether some unit uses prange), ``ops`` (the materialised operations, one
    per unit, in unit order: what each unit computes, for
    :mod:`codegen.profile`), ``plans`` (the :class:`codegen.strategy.StagePlan`
    of each unit, in unit order, with what the loop-nest lowering chose),
    ``inline_plans`` (those of the inlined stages)."""

    def __init__(self, source, buffers, units, stages, parallel, ops=(), plans=(),
                 inline_plans=()):
        self.source, self.buffers, self.units = source, buffers, units
        self.stages, self.parallel = stages, parallel
        self.ops = list(ops)
        self.plans, self.inline_plans = list(plans), list(inline_plans)


class ContractionUnitSource:
    """The description of a stage run as GEMMs, beside the loop-nest units of a
    program (:mod:`codegen.units`): ``kind`` ``"blas"``, ``stage``,
    ``definition``, ``plan`` (its keys are buffer positions), ``args`` (the
    buffers it reads and writes), ``errors`` (none: a plan checks nothing at run
    time, isl proved its loads in bounds), ``parallel`` (False: the BLAS has
    its own threads), ``source`` (the readable comment of ``Kernel.source``).
    Picklable."""

    kind = "blas"

    def __init__(self, stage, definition, plan, readable):
        self.stage, self.definition, self.plan = stage, definition, plan
        self.args = tuple(sorted(plan.keys()))
        self.errors, self.parallel, self.source = [], False, readable
        self.module_source, self.arg_specs = None, []

    def describe(self):
        d = self.definition
        return "the stage " + (d if len(d) < 400 else d[:400] + " ...")



class ShiftUnitSource(ContractionUnitSource):
    """The description of a stage run as a :class:`ShiftPlan`, beside the loop-nest units
    of a program (:mod:`codegen.units`), as a GEMM stage's: ``kind`` ``"shift"``.
    Picklable."""

    kind = "shift"
