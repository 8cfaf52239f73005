"""The runnable units of a kernel: what :class:`codegen.build.Kernel` calls in order.

One job: turn a :class:`codegen.loopnest.lower.Program`'s unit descriptions
(:class:`codegen.loopnest.lower.UnitSource`, picklable) into runnable units, compiling
the numba ones in one batch (:func:`codegen.backends.numba_cpu.compile.compile_units`: memory,
disk, worker processes).

The interface every unit kind implements (the driver relies on nothing else):

* ``run(arrays, err)``: compute the stage. ``arrays`` is the kernel's list of
  flat (1-D, C-contiguous) numpy arrays in :attr:`Program.buffers` order; the
  unit reads and writes ``arrays[i]`` for ``i`` in its ``args`` only. ``err``
  is an ``int64[2]`` array, zero on entry; a failed run-time check sets
  ``err[0]`` to its code (1-based, into ``errors``) and ``err[1]`` to the
  offending value; the driver raises after the unit returns.
* attributes: ``kind`` (str), ``stage`` (the op's name), ``args`` (tuple of
  buffer indices), ``errors`` (list of messages, each naming the stage),
  ``key`` (content key or None), ``path`` (module on disk or None),
  ``compile_seconds``, ``from_disk_cache``, ``from_memory_cache``,
  ``compiled`` (True when this build compiled it: numba ran, here or in a
  worker). Optional: ``calls_blas`` (a numba unit whose code calls a BLAS,
  besides the ``"blas"`` kind: the kernel then parks the BLAS's worker
  threads after a call, :mod:`codegen.backends.numpy_host.parking`).

Adding a kind (e.g. a contraction run by a library call instead of a loop
nest): give its description in ``Program.units`` a ``kind`` of its own, write
a class with the interface above, and register a factory
``description -> unit`` in :data:`FACTORIES`. Numba units are batched so that
their compilation can run concurrently; other kinds are built one by one.
"""

from texpr.errors import TexprError

from .backends.numba_cpu.shift_units import ShiftUnit
from .backends.numba_cpu.units import NumbaUnit, compile_descriptions
from .backends.numpy_host.units import ContractionUnit

__all__ = ["FACTORIES", "make_units"]


#: kind -> factory(description) for the unit kinds not compiled by numba
#: (``"blas"``: a contraction stage run as GEMMs, :mod:`codegen.analysis.contraction`;
#: ``"shift"``: a window or tap-sum stage run as strided moves, :mod:`codegen.analysis.shifts`)
FACTORIES = {"blas": ContractionUnit, "shift": ShiftUnit}


def make_units(program):
    """The runnable units of ``program`` (a list, in order). Raises
    :class:`codegen.CompileError` (naming the stage) when numba rejects a
    unit; TexprError for a unit kind without a factory."""
    numba_descs = [u for u in program.units if u.kind == "numba"]
    compiled = compile_descriptions(numba_descs)
    by_id = {id(u): c for u, c in zip(numba_descs, compiled)}
    out = []
    for u in program.units:
        if u.kind == "numba":
            out.append(NumbaUnit(u, by_id[id(u)]))
        elif u.kind in FACTORIES:
            out.append(FACTORIES[u.kind](u))
        else:
            raise TexprError(f"stage {u.stage}: no unit kind {u.kind!r} is registered")
    return out
