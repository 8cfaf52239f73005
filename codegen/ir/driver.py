"""The kernel driver as data: which buffers a call uses, which units it runs on
them in what order, and which outputs it copies.

One job: :class:`DriverPlan`, built once per kernel from its lowered
:class:`codegen.ir.program.Program` (:meth:`DriverPlan.from_program`). Every
driver runs this one object and re-derives nothing:

* :class:`codegen.build.Kernel` interprets it in Python (``Kernel._execute``);
* the bridges' compiled driver serialises it into its int64 descriptor
  (the loop-nest backend's ``native_call.describe``, :mod:`codegen.backends`);
* ``Kernel.source`` ends with its text (:meth:`DriverPlan.lines`).

A call of a kernel, as the plan says: the inputs fill the first slots; every
other slot (a *temporary*) is allocated, or, when it is the first listing of
an output (``Temp.output``), is that output's buffer; the units run in
``calls`` order on the slots they name, and the first whose error flag is set
stops the run; then each output that is not its slot's own (an input listed
as an output, an output listed twice: ``Output.own`` False) is a copy of its
slot. Plain data: it pickles with its kernel.
"""

from dataclasses import dataclass

import numpy as np

__all__ = ["Slot", "Temp", "Call", "Output", "DriverPlan"]


@dataclass(frozen=True)
class Slot:
    """A flat buffer of the kernel: ``index`` (its position, the index units name),
    ``name`` (its identifier in ``Kernel.source``), ``tensor`` (the tensor's
    name), ``kind`` (``"input"``: the caller's array; ``"result"``: an output's
    buffer; ``"temp"``: allocated by the driver), ``where`` (for an input, its
    position among the inputs; for a result, the output's position; for a
    temp, its position among the temporaries), ``size`` (elements), ``dtype``
    (a numpy dtype name), ``itemsize`` (bytes)."""

    index: int
    name: str
    tensor: str
    kind: str
    where: int
    size: int
    dtype: str
    itemsize: int

    @property
    def nbytes(self):
        """The buffer's bytes."""
        return self.size * self.itemsize


@dataclass(frozen=True)
class Temp:
    """A slot the driver provides (every slot after the inputs): ``slot``,
    ``size``, ``dtype``, ``output`` (the output's position when this slot is the
    first listing of that output, else None)."""

    slot: int
    size: int
    dtype: str
    output: object


@dataclass(frozen=True)
class Call:
    """One unit call: ``unit`` (its position in ``Kernel.units``), ``stage``,
    ``kind`` (the unit kind: ``"blas"``, ``"shift"``, a loop-nest backend's, ...),
    ``args`` (the slots it reads and writes, in parameter order), ``chunks`` (0,
    or the extent a chunked unit's parts cut)."""

    unit: int
    stage: str
    kind: str
    args: tuple
    chunks: int = 0


@dataclass(frozen=True)
class Output:
    """An output of a call: ``slot`` (the buffer holding it), ``shape``, ``own``
    (True: the slot's array is the output itself; False: the output is a copy
    of the slot, an input listed as an output or an output listed again)."""

    slot: int
    shape: tuple
    own: bool


@dataclass(frozen=True)
class DriverPlan:
    """What a kernel call does, as data (see the module docstring): ``slots``
    (a :class:`Slot` per buffer, inputs first), ``n_inputs``, ``temps`` (a
    :class:`Temp` per slot after the inputs, in slot order), ``calls`` (a
    :class:`Call` per unit, in execution order), ``outputs`` (an
    :class:`Output` per output, in the kernel's order)."""

    slots: tuple
    n_inputs: int
    temps: tuple
    calls: tuple
    outputs: tuple

    @classmethod
    def from_program(cls, program, inputs, outputs, names=None):
        """The plan of ``program`` (a :class:`codegen.ir.program.Program`) run
        with ``inputs`` (its placeholders, in argument order) for ``outputs``
        (Tensors, in the order a call returns them; one may repeat, or be an
        input). ``names``: an identifier per buffer for :meth:`lines` (default:
        the buffers' own names).

        Raises:
            KeyError: an output that has no buffer in ``program``.
        """
        bufs = list(program.buffers)
        n_in = len(inputs)
        names = [b.name for b in bufs] if names is None else list(names)
        slot_of = {id(b.tensor): s for s, b in enumerate(bufs)}
        outs, first = [], {}
        for k, t in enumerate(outputs):
            s = slot_of[id(t)]
            own = s >= n_in and s not in first
            if own:
                first[s] = k
            outs.append(Output(s, tuple(t.shape), own))
        slots, temps = [], []
        for s, b in enumerate(bufs):
            dt = np.dtype(b.dtype)
            if s < n_in:
                kind, where = "input", s
            elif s in first:
                kind, where = "result", first[s]
            else:
                kind, where = "temp", s - n_in
            slots.append(Slot(s, names[s], b.tensor.name, kind, where, int(b.size), dt.name,
                              dt.itemsize))
            if s >= n_in:
                temps.append(Temp(s, int(b.size), dt.name, first.get(s)))
        calls = tuple(Call(k, u.stage, u.kind, tuple(int(a) for a in u.args),
                           int(getattr(u, "chunks", 0) or 0))
                      for k, u in enumerate(program.units))
        return cls(tuple(slots), n_in, tuple(temps), calls, tuple(outs))

    @property
    def copies(self):
        """``(output position, slot)`` of each output the driver copies, in order."""
        return tuple((k, o.slot) for k, o in enumerate(self.outputs) if not o.own)

    def lines(self):
        """The driver as comment lines of ``Kernel.source``: the temporaries it
        allocates, each unit call in order on its buffers, and the outputs it
        copies after the run."""
        name = [s.name for s in self.slots]
        out = ["# ---- the driver (codegen.ir.driver.DriverPlan): what codegen.build.Kernel",
               "# runs and what the bridges' compiled driver runs, the same plan: each unit in",
               "# order on the buffers above, each compiled as a module of its own; the first",
               "# unit whose error flag is set stops the run and raises"]
        for t in self.temps:
            s = self.slots[t.slot]
            what = (f"output {t.output} (a new array, or the caller's out= buffer)"
                    if t.output is not None else "a temporary, reused from call to call")
            out.append(f"# {s.name}: {s.size} x {s.dtype}, {what}")
        for c in self.calls:
            args = ", ".join(name[a] for a in c.args)
            if c.kind == "blas":
                out.append(f"# unit{c.unit}: {c.stage}: GEMMs on numpy's BLAS over {args} "
                           "(its comment)")
            elif c.kind == "shift":
                out.append(f"# unit{c.unit}: {c.stage}: a shift plan (strided copies and adds) "
                           f"over {args} (its comment)")
            elif c.chunks:
                out.append(f"# unit{c.unit}({args}, part, err) for the parts [lo, hi) of "
                           f"0..{c.chunks}, one per thread at the same time")
            else:
                out.append(f"# unit{c.unit}({args}, err)")
        for k, s in self.copies:
            out.append(f"# output {k} = copy of {name[s]}")
        rets = ", ".join(name[o.slot] if o.own else f"output {k}"
                         for k, o in enumerate(self.outputs))
        out.append(f"# return ({rets})")
        return out
