"""A Python function as an XLA FFI handler on the CPU: the call path of :mod:`texpr.jax`.

One job: :func:`register` turns ``run(inputs, outputs)`` (numpy arrays over
XLA's own buffers: the inputs to read, the outputs to write) into a named XLA
FFI target, which ``jax.ffi.ffi_call`` calls from a jitted program. The
handler is a ``ctypes`` callback that reads XLA's call frame (the typed FFI's
C API, ``xla/ffi/api/c_api.h`` in jaxlib's headers: ``XLA_FFI_CallFrame``,
``XLA_FFI_Buffer``) through precomputed field offsets and wraps the buffers as
numpy arrays without copying.

Why not ``jax.pure_callback``: it copies every operand to the host and back
and goes through JAX's Python callback machinery; on a 16x16 op it added
about 250 us per call, against tens of microseconds here (see
``benchmarks/bench_bridge.py``).

Errors: an exception raised by ``run`` becomes an XLA FFI error
(``XLA_FFI_Error_Create`` of the frame's API, code INVALID_ARGUMENT) whose
message starts with ``texpr error <n>:``; JAX raises it as a runtime error.
:func:`pop_error` gives back the original exception for that marker, so the
caller can re-raise it (a TexprError stays a TexprError).

This module imports neither jax nor numba; :mod:`texpr.jax` registers the
capsule with ``jax.ffi.register_ffi_target``.
"""

import ctypes as C
import itertools
import re
import threading

import numpy as np

__all__ = ["register", "error_callback", "pop_error", "ERROR_MARK", "LAYOUT"]

_vp = C.c_void_p


class _ExtBase(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("type", C.c_int), ("next", _vp)]


class _ApiVersion(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("extension_start", _vp),
                ("major_version", C.c_int), ("minor_version", C.c_int)]


class _Metadata(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("api_version", _ApiVersion),
                ("traits", C.c_uint32), ("state_type_id", C.c_int64)]


class _MetadataExt(C.Structure):
    _fields_ = [("extension_base", _ExtBase), ("metadata", C.POINTER(_Metadata))]


class _Args(C.Structure):  # XLA_FFI_Args and XLA_FFI_Rets have this layout
    _fields_ = [("struct_size", C.c_size_t), ("extension_start", _vp), ("size", C.c_int64),
                ("types", _vp), ("args", _vp)]


class _Attrs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("extension_start", _vp), ("size", C.c_int64),
                ("types", _vp), ("names", _vp), ("attrs", _vp)]


class _CallFrame(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("extension_start", _vp), ("api", _vp),
                ("ctx", _vp), ("stage", C.c_int), ("args", _Args), ("rets", _Args),
                ("attrs", _Attrs), ("future", _vp)]


class _Scalar(C.Structure):  # XLA_FFI_Scalar: an attribute's dtype and value pointer
    _fields_ = [("dtype", C.c_int), ("value", _vp)]


class _Buffer(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("extension_start", _vp), ("dtype", C.c_int),
                ("data", _vp), ("rank", C.c_int64), ("dims", _vp)]


class _ErrorCreateArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("extension_start", _vp), ("message", C.c_char_p),
                ("errc", C.c_int)]


class _Api(C.Structure):  # the leading fields of XLA_FFI_Api
    _fields_ = [("struct_size", C.c_size_t), ("extension_start", _vp),
                ("api_version", _ApiVersion), ("internal_api", _vp),
                ("XLA_FFI_Error_Create", _vp)]


_METADATA_EXTENSION = 1  # XLA_FFI_Extension_Metadata
_INVALID_ARGUMENT = 3  # XLA_FFI_Error_Code_INVALID_ARGUMENT
_EXT = _CallFrame.extension_start.offset
_API = _CallFrame.api.offset
_ARGS = _CallFrame.args.offset + _Args.args.offset
_RETS = _CallFrame.rets.offset + _Args.args.offset
_DATA = _Buffer.data.offset
_PTR = C.sizeof(_vp)
_HANDLER = C.CFUNCTYPE(_vp, _vp)
_ERROR_CALLBACK = C.CFUNCTYPE(C.c_int64, C.c_int64, C.c_int64, C.c_int64, C.c_int64)

#: the call frame's field offsets (bytes) for a handler compiled elsewhere
#: (:mod:`texpr.codegen.backends.numba_cpu.native_call`): the extension pointer, an extension's
#: type and its metadata pointer, the metadata's version and traits fields, the
#: operand and result pointer tables, a buffer's data pointer, the attribute
#: pointer table and a scalar attribute's value pointer; and the type number of
#: the metadata extension
LAYOUT = {
    "ext": _EXT,
    "ext_type": _ExtBase.type.offset,
    "ext_metadata": _MetadataExt.metadata.offset,
    "meta_major": _Metadata.api_version.offset + _ApiVersion.major_version.offset,
    "meta_minor": _Metadata.api_version.offset + _ApiVersion.minor_version.offset,
    "meta_traits": _Metadata.traits.offset,
    "args": _ARGS,
    "rets": _RETS,
    "data": _DATA,
    "attrs": _CallFrame.attrs.offset + _Attrs.attrs.offset,
    "scalar_value": _Scalar.value.offset,
    "metadata_type": _METADATA_EXTENSION,
}
_ERROR_CREATE = C.CFUNCTYPE(_vp, C.POINTER(_ErrorCreateArgs))

#: the message prefix of the errors this module hands to XLA
ERROR_MARK = "texpr error"
_ERRORS = {}  # marker number -> the exception
_ERROR_IDS = itertools.count(1)
_LOCK = threading.Lock()


def _ptr(address):
    return C.c_void_p.from_address(address).value


def array_view(data, shape, dtype, size, itemsize):
    """A numpy array of ``shape`` and ``dtype`` over the ``size`` elements of
    ``itemsize`` bytes at address ``data`` (no copy; a fresh empty array for
    ``size`` 0 or a null address). The caller vouches for the memory."""
    if size == 0 or not data:
        return np.empty(shape, dtype=dtype)
    raw = (C.c_char * (size * itemsize)).from_address(data)
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _fail(frame, exc):
    """An XLA_FFI_Error* for ``exc`` (kept for :func:`pop_error` under a marker)."""
    with _LOCK:
        n = next(_ERROR_IDS)
        _ERRORS[n] = exc
        while len(_ERRORS) > 64:  # errors nobody collected (e.g. under a user's jit)
            del _ERRORS[next(iter(_ERRORS))]
    msg = f"{ERROR_MARK} {n}: {type(exc).__name__}: {exc}".encode("utf-8", "replace")
    api = C.cast(_ptr(frame + _API), C.POINTER(_Api)).contents
    create = _ERROR_CREATE(api.XLA_FFI_Error_Create)
    args = _ErrorCreateArgs(C.sizeof(_ErrorCreateArgs), None, msg, _INVALID_ARGUMENT)
    return create(C.byref(args))


def pop_error(message):
    """The exception behind an error message made by a handler of this module
    (None when ``message`` has no marker or it was already taken)."""
    m = re.search(re.escape(ERROR_MARK) + r" (\d+):", str(message))
    if m is None:
        return None
    with _LOCK:
        return _ERRORS.pop(int(m.group(1)), None)


def error_callback(make_exception):
    """A C function ``int64 (frame, unit, code, value)`` for a compiled handler's
    failures: it returns the ``XLA_FFI_Error*`` of ``make_exception(unit, code,
    value)`` (kept for :func:`pop_error`). Returns the ctypes callback (keep it
    alive as long as the handler may call it) and its address."""
    def on_error(frame, unit, code, value):
        try:
            exc = make_exception(unit, code, value)
        except BaseException as e:  # noqa: BLE001 - reported to XLA all the same
            exc = e
        return _fail(frame, exc) or 0

    cb = _ERROR_CALLBACK(on_error)
    return cb, C.cast(cb, _vp).value


def register(run, inputs, outputs):
    """A handler calling ``run(input_arrays, output_arrays)``; returns the ctypes
    callback (keep it alive as long as the target may be called) and its
    address (for ``jax.ffi.pycapsule``).

    ``inputs`` / ``outputs``: ``(shape, numpy dtype)`` of every operand, in
    order; the arrays given to ``run`` have exactly these (XLA has checked the
    operands against the ``ffi_call``'s types). ``run`` must fill every output
    array completely; an exception it raises becomes the call's error."""
    ins = [(tuple(s), np.dtype(d), int(np.prod(s, dtype=np.int64)), np.dtype(d).itemsize)
           for s, d in inputs]
    outs = [(tuple(s), np.dtype(d), int(np.prod(s, dtype=np.int64)), np.dtype(d).itemsize)
            for s, d in outputs]

    # the numpy views made so far, by operand position and address: XLA often
    # passes the same buffers again (a view is only an address, shape and dtype,
    # so one made for an address is right for any later buffer there)
    seen = [{} for _ in ins], [{} for _ in outs]

    def views(table, specs, cache):
        arrays = []
        for k, (spec, c) in enumerate(zip(specs, cache)):
            data = _ptr(table[k] + _DATA)
            a = c.get(data)
            if a is None:
                if len(c) >= 8:
                    c.clear()
                a = c[data] = array_view(data, *spec)
            arrays.append(a)
        return arrays

    def handler(frame):
        try:
            ext = _ptr(frame + _EXT)
            if ext:
                base = _ExtBase.from_address(ext)
                if base.type == _METADATA_EXTENSION:
                    meta = _MetadataExt.from_address(ext).metadata.contents
                    meta.api_version.major_version = 0
                    meta.api_version.minor_version = 1
                    meta.traits = 0
                    return None
            xs = views((_vp * len(ins)).from_address(_ptr(frame + _ARGS)), ins, seen[0])
            ys = views((_vp * len(outs)).from_address(_ptr(frame + _RETS)), outs, seen[1])
            run(xs, ys)
            return None
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to XLA
            return _fail(frame, exc)

    cb = _HANDLER(handler)
    return cb, C.cast(cb, _vp).value
