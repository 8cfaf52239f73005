"""The bridges' compiled driver: a kernel's numba units run from compiled code,
with no Python between the caller (XLA, or torch through one call) and the units.

One job: :func:`describe` turns a :class:`codegen.build.Kernel` into a
*descriptor* (an int64 array: where each buffer lives, each unit's compiled
function and arguments, the outputs to copy), which one compiled driver runs
for every kernel. The driver is a module of generated text, compiled and
cached like a unit (:func:`codegen.backends.numba_cpu.compile.compile_source`):

* ``core(d, io)``: given the data pointers of the inputs and of one buffer per
  output, allocates the temporaries and the error flag (one ``malloc``),
  calls each unit's compiled function by address (numba's calling convention,
  the one its compiled functions use among themselves), copies the outputs
  that are inputs or are listed twice, and frees the allocation;
  :class:`Runner` calls it from Python (the PyTorch bridge);
* ``handler``: a ``cfunc`` that XLA calls with its call frame (the typed FFI's
  C API, ``xla/ffi/api/c_api.h``; the offsets come from :mod:`texpr.jax_ffi`):
  it answers XLA's metadata query, reads the descriptor's address from the
  call's one attribute (an int64 scalar), collects the operand and result
  pointers and calls ``core`` (:func:`ffi_handler`, the JAX bridge).

Why: a Python handler (a ``ctypes`` callback) cost about 20 us per call on
this machine (the callback's entry, reading the frame, wrapping buffers and the
kernel's Python driver), against about 11 us for JAX's own call of a jitted
function; the compiled handler adds a few microseconds to the units. One
driver for all kernels, not one per kernel: compiling a handler per operator
cost about 0.6 s each.

A unit that flags an error (an out-of-range index, ...) makes the handler call
back into Python: ``on_error(frame, unit, code, value) -> XLA_FFI_Error*``, a C
function (a ``ctypes`` callback) whose address the descriptor holds.

Safety:

* every unit argument is a 1-D C-contiguous array; numba passes one as its
  flattened fields (meminfo, parent, length, item size, data pointer, shape,
  stride), the same machine types for every dtype, so the handler builds them
  from the descriptor (length, item size, data pointer) and calls with them;
  :func:`describe` returns None (the caller keeps the kernel's Python driver)
  for a unit whose compiled overload is not exactly that, with more than
  :data:`MAX_ARGS` arguments, a unit that is not a numba unit (a GEMM), or a
  chunked unit (:mod:`codegen.backends.numba_cpu.chunks`: its parts are launched from Python),
  or while kernel calls are profiled (:mod:`codegen.profile`: the Python
  driver times each unit);
* XLA has checked the operands' shapes and dtypes against the call's declared
  types, and the PyTorch bridge checks its tensors, so every buffer has the
  size the units were compiled for;
* descriptors and unit addresses are per process: the caller names its FFI
  targets with a per-process token, so a program compiled in another process
  (JAX's persistent cache) finds no target instead of a stale address.
"""

import hashlib

import numpy as np
from numba import types

from texpr.jax_ffi import LAYOUT as _FFI_LAYOUT, array_view

from . import forksafe as _forksafe
from . import intrinsics as _intrinsics
from ... import profile as _profile
from .intrinsics import MAX_ARGS, unit_address as _unit_overload
from .. import workers as _workers
from ..unit_errors import unit_error
from .compile import compile_source
from .units import NumbaUnit, one_thread

__all__ = ["describe", "serialise", "ffi_handler", "handler_address", "runner", "Runner", "MAX_ARGS"]

_HEAD = 8  # header words: length, buffers, units, copies, bytes, on_error, inputs, outputs
_UNIT = 2 + MAX_ARGS  # words per unit: address, argument count, buffer indices
_KINDS = {"input": 0, "result": 1, "temp": 2}


def _driver_source():
    """The text of the driver: ``core(d, io)`` and the FFI ``handler`` (a cfunc),
    compiled and cached like a unit (:func:`codegen.backends.numba_cpu.compile.compile_source`:
    content key, checked disk entries, numba's files repaired). It names this
    file's hash, so a change to the intrinsics it imports makes a new entry;
    the call frame's offsets are literals in it."""
    h = hashlib.sha256()
    for path in (__file__, _intrinsics.__file__):
        with open(path, "rb") as f:
            h.update(f.read())
    digest = h.hexdigest()[:16]
    L = _FFI_LAYOUT
    return _header(digest) + "\n\n\n" + _core_text() + _handler_text(L)


def _header(digest):
    """The driver module's first lines: its name and hash, and its imports."""
    return f"""# texpr native driver, codegen/backends/numba_cpu/native_call.py {digest}
import numpy as np
from numba import carray, cfunc, njit, types

from texpr.codegen.backends.numba_cpu.intrinsics import (_call_c, _call_unit_any, _free, _load,
                                                    _load32, _malloc, _pointer, _store32)"""


def _core_text():
    """The text of ``core(d, io)``: run descriptor ``d`` on the buffers ``io`` points to."""
    return f"""@njit(cache=True, nogil=True)
def core(d, io):
    nb, nu, nc, nbytes = d[1], d[2], d[3], d[4]
    n_in, n_out = d[6], d[7]
    e = n_in + n_out
    kind = d[{_HEAD}:{_HEAD} + nb]
    where = d[{_HEAD} + nb:{_HEAD} + 2 * nb]
    sizes = d[{_HEAD} + 2 * nb:{_HEAD} + 3 * nb]
    items = d[{_HEAD} + 3 * nb:{_HEAD} + 4 * nb]
    units = {_HEAD} + 4 * nb
    copies = units + {_UNIT} * nu
    # one allocation: the error flag, the data pointers, then the temporaries
    mem = _malloc(nbytes + 64)
    if mem == 0:
        io[e] = -2
        io[e + 1] = 0
        io[e + 2] = -1
        return 1
    base = (mem + 63) // 64 * 64
    err = carray(_pointer(base, np.int64), 2)
    err[0] = 0
    err[1] = 0
    ptrs = carray(_pointer(base + 16, np.int64), nb)
    for s in range(nb):
        if kind[s] == 0:
            ptrs[s] = io[where[s]]
        elif kind[s] == 1:
            ptrs[s] = io[n_in + where[s]]
        else:
            ptrs[s] = base + where[s]
    for u in range(nu):
        row = units + {_UNIT} * u
        idx = d[row + 2:row + 2 + {MAX_ARGS}]
        if _call_unit_any(d[row], ptrs, sizes, items, idx, err, d[row + 1]) != 0:
            io[e] = -1
            io[e + 1] = 0
            io[e + 2] = u
            _free(mem)
            return 1
        if err[0] != 0:
            io[e] = err[0]
            io[e + 1] = err[1]
            io[e + 2] = u
            _free(mem)
            return 1
    for c in range(nc):
        k, s, n = d[copies + 3 * c], d[copies + 3 * c + 1], d[copies + 3 * c + 2]
        dst = carray(_pointer(io[n_in + k], np.uint8), n)
        src = carray(_pointer(ptrs[s], np.uint8), n)
        for b in range(n):  # (not dst[:] = src: its shape check compiles numba's
            dst[b] = src[b]  # string formatting, 5 s of the driver's compile)
    _free(mem)
    return 0


"""


def _handler_text(L):
    """The text of the FFI ``handler`` (a cfunc) for the call frame layout ``L``."""
    return f"""@cfunc(types.int64(types.int64), cache=True)
def handler(frame):
    # XLA_FFI_Error* handler(XLA_FFI_CallFrame*); 0: success
    ext = _load(frame + {L["ext"]})
    if ext != 0:
        if _load32(ext + {L["ext_type"]}) == {L["metadata_type"]}:  # the API version query
            meta = _load(ext + {L["ext_metadata"]})
            _store32(meta + {L["meta_major"]}, 0)
            _store32(meta + {L["meta_minor"]}, 1)
            _store32(meta + {L["meta_traits"]}, 0)
            return 0
    # the call's one attribute: an int64 scalar, the descriptor's address
    addr = _load(_load(_load(_load(frame + {L["attrs"]})) + {L["scalar_value"]}))
    head = carray(_pointer(addr, np.int64), {_HEAD})
    on_error, n_in, n_out = head[5], head[6], head[7]
    d = carray(_pointer(addr, np.int64), head[0])
    n = n_in + n_out + 3
    mem = _malloc(8 * n)
    if mem == 0:
        return _call_c(on_error, frame, -1, -2, 0)
    io = carray(_pointer(mem, np.int64), n)
    args = _load(frame + {L["args"]})
    rets = _load(frame + {L["rets"]})
    for k in range(n_in):
        io[k] = _load(_load(args + 8 * k) + {L["data"]})
    for k in range(n_out):
        io[n_in + k] = _load(_load(rets + 8 * k) + {L["data"]})
    if core(d, io) != 0:
        code, value, unit = io[n - 3], io[n - 2], io[n - 1]
        _free(mem)
        return _call_c(on_error, frame, unit, code, value)
    _free(mem)
    return 0
"""


_CORE = []  # [(core's entry point, core, the handler's address)] once compiled


def _core():
    """``(entry point, dispatcher, handler address)`` of the driver, compiled or
    loaded on first use. ``core(d, io)``: run the kernel of descriptor ``d`` on
    the buffers whose data pointers ``io`` holds (the inputs', then one per
    output), then three words for an error: code, offending value, unit.
    Returns 0, or 1 after writing the error (code -1: the unit raised inside
    numba; -2, unit -1: no memory for the temporaries). The handler (a cfunc
    of the same module) fills ``io`` from XLA's call frame and calls it."""
    if not _CORE:
        c = compile_source(_driver_source(), [("int64", 1), ("int64", 1)],
                           "the native driver", entry="core")
        handler = c.fn.py_func.__globals__["handler"]
        _CORE.append((c.entry, c.fn, handler.address))
    return _CORE[0]


_I64S = types.Array(types.int64, 1, "C")


def handler_address():
    """The address of the FFI handler (compiled with the driver core, on first use)."""
    return _core()[2]


def describe(kernel, on_error_address=0):
    """The descriptor of ``kernel`` (an int64 numpy array) for :func:`handler` and
    :class:`Runner`, or None when a unit is not a numba unit whose compiled
    overload takes 1-D arrays and the error flag, with at most
    :data:`MAX_ARGS` arguments.

    ``on_error_address`` (for the FFI handler): the address of a C function
    ``int64 (frame, unit, code, value)`` returning the ``XLA_FFI_Error*`` for
    unit ``unit``'s failed check ``code`` (1-based, into the unit's
    ``errors``) with offending value ``value``; code -1 when the unit raised
    inside numba, and unit -1 with code -2 when the temporaries could not be
    allocated.
    """
    if _profile.ACTIVE is not None:
        # (calls are being profiled: the Python driver times each unit, this one cannot)
        return None
    addresses = []
    for u in kernel.units:
        if not isinstance(u, NumbaUnit) or u.chunks:
            # (a chunked unit runs its parts from the Python driver: codegen.backends.numba_cpu.chunks)
            return None
        a = _unit_overload(u)
        if a is None:
            return None
        addresses.append(a)
    return serialise(kernel.driver_plan, addresses, on_error_address)


def serialise(plan, addresses, on_error_address=0):
    """The descriptor of the :class:`codegen.ir.driver.DriverPlan` ``plan`` (an
    int64 numpy array), whose unit ``k`` is the compiled function at
    ``addresses[k]``: the plan's slots, calls and copies as words, the
    temporaries laid out in one allocation (64-byte aligned, after the error
    flag and the data pointers). Nothing is derived but that layout."""
    nb = len(plan.slots)
    kind, where = [], []
    offset = (16 + 8 * nb + 63) // 64 * 64  # after the error flag and the pointers
    for s in plan.slots:
        kind.append(_KINDS[s.kind])
        if s.kind == "temp":
            where.append(offset)
            offset += (s.nbytes + 63) // 64 * 64
        else:
            where.append(s.where)
    sizes = [s.size for s in plan.slots]
    items = [s.itemsize for s in plan.slots]
    units = []
    for c, a in zip(plan.calls, addresses):
        idx = list(c.args) + [0] * (MAX_ARGS - len(c.args))
        units += [a, len(c.args) + 1] + idx
    copies = []
    for k, s in plan.copies:
        copies += [k, s, plan.slots[s].nbytes]
    body = kind + where + sizes + items + units + copies
    head = [_HEAD + len(body), nb, len(plan.calls), len(copies) // 3, offset,
            on_error_address, plan.n_inputs, len(plan.outputs)]
    return np.array(head + body, dtype=np.int64)


def ffi_handler(kernel, on_error_address):
    """``(descriptor, address)`` for running ``kernel`` as an XLA FFI handler: the
    descriptor (:func:`describe`; keep it alive while XLA may call the handler
    with it, and pass its ``ctypes.data`` as the call's one int64 attribute)
    and the compiled handler's address (:func:`handler_address`). None when
    :func:`describe` gives None."""
    desc = describe(kernel, on_error_address)
    if desc is None:
        return None
    return desc, handler_address()


class Runner:
    """``kernel`` run from Python on raw buffers by the compiled driver core (the
    handler's own): ``run(pointers)`` with the data pointers of the inputs,
    then of one buffer per output (C-contiguous, of the declared shapes and
    dtypes, outputs overlapping nothing), in a list. It skips the kernel's
    Python driver (about 4 us a call here); the caller guarantees the
    buffers. Raises what a kernel call raises at run time. Build one with
    :func:`runner` (None when the kernel has no descriptor)."""

    def __init__(self, kernel, desc):
        self.kernel, self.desc = kernel, desc
        self._entry = _core()[0]
        self._tail = [0, 0, 0]
        self._parallel = any(getattr(u, "parallel", False) for u in kernel.units)

    def run(self, pointers):
        if self._parallel and _forksafe.FORKED_FROM_OPENMP[0]:
            # the descriptor holds the parallel units' addresses: in a child forked
            # after numba's GNU OpenMP started, the Python driver runs their serial
            # twins instead (codegen.backends.numba_cpu.forksafe)
            k = self.kernel
            arrays = [array_view(p, tuple(t.shape), t.dtype, int(np.prod(t.shape, dtype=np.int64)),
                                 np.dtype(t.dtype).itemsize)
                      for p, t in zip(pointers, list(k.inputs) + list(k.outputs))]
            k.run_into(arrays[:len(k.inputs)], arrays[len(k.inputs):])
            return
        io = np.array(pointers + self._tail, dtype=np.int64)
        if self._parallel and _workers.oversubscribed():
            with one_thread():  # (see codegen.backends.numba_cpu.units.one_thread)
                failed = self._entry(self.desc, io)
        else:
            failed = self._entry(self.desc, io)
        if failed:
            code, value, u = int(io[-3]), int(io[-2]), int(io[-1])
            raise unit_error(self.kernel.units[u] if u >= 0 else None, code, value)


def runner(kernel):
    """A :class:`Runner` for ``kernel``, or None (see :func:`describe`)."""
    desc = describe(kernel)
    return None if desc is None else Runner(kernel, desc)
