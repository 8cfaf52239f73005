"""The runnable units of a kernel: what :class:`codegen.build.Kernel` calls in order.

One job: turn a :class:`codegen.ir.program.Program`'s unit descriptions
(:class:`codegen.ir.program.UnitSource` and its kin, picklable) into runnable
units, through the factory each backend registers for its unit kinds
(:func:`register`); a kind whose units are compiled gets them compiled in one
batch (memory, disk, worker processes), so that compilation can run
concurrently.

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
  ``compiled`` (True when this build compiled it, here or in a worker).
  Optional: ``calls_blas`` (a compiled unit whose code calls a BLAS, besides
  the ``"blas"`` kind: the kernel then parks the BLAS's worker threads after a
  call, :mod:`codegen.backends.numpy_host.parking`).

Adding a kind (e.g. a contraction run by a library call instead of a loop
nest): give its description in ``Program.units`` a ``kind`` of its own, write
a class with the interface above, and :func:`register` it (docs/extending.md,
"A backend").
"""

from texpr.errors import TexprError

__all__ = ["FACTORIES", "register", "make_units"]

#: kind -> ``(factory, compile_batch)``: ``factory(description)`` makes a unit, or,
#: for a kind with ``compile_batch``, ``factory(description, compiled)`` with the
#: description's entry of ``compile_batch(descriptions)``
FACTORIES = {}


def register(kind, factory, compile_batch=None):
    """Register the unit ``kind``: its ``factory`` and, for a compiled kind, the
    function compiling a list of its descriptions in one batch."""
    FACTORIES[kind] = (factory, compile_batch)


def make_units(program):
    """The runnable units of ``program`` (a list, in order). Raises
    :class:`codegen.CompileError` (naming the stage) when a unit does not
    compile; TexprError for a unit kind no backend registered."""
    for u in program.units:
        if u.kind not in FACTORIES:
            raise TexprError(f"stage {u.stage}: no unit kind {u.kind!r} is registered")
    compiled = {}
    for kind, (factory, batch) in FACTORIES.items():
        descs = [u for u in program.units if u.kind == kind]
        if batch is not None and descs:
            compiled.update(zip(map(id, descs), batch(descs)))
    out = []
    for u in program.units:
        factory, batch = FACTORIES[u.kind]
        out.append(factory(u, compiled[id(u)]) if batch is not None else factory(u))
    return out
