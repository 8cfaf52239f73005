"""numba intrinsics for calling compiled units by address, and the address of a unit.

One job: the low-level pieces (loads and stores at raw addresses, ``malloc``,
an atomic fetch-add, a call of a unit's compiled function by address with
numba's calling convention) that the bridges' driver
(:mod:`codegen.backends.numba_cpu.native_call`) and chunked units
(:mod:`codegen.backends.numba_cpu.chunks`) are built from.
"""

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .compile import _array_type

__all__ = ["MAX_ARGS", "unit_address"]

#: the most arguments (buffers and the error flag) a unit may take here
MAX_ARGS = 24


@intrinsic
def _load(typingctx, addr):
    """The int64 stored at address ``addr``."""
    if not isinstance(addr, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return builder.load(builder.inttoptr(args[0], ir.IntType(64).as_pointer()))

    return types.int64(addr), codegen


@intrinsic
def _load32(typingctx, addr):
    """The int32 stored at address ``addr`` (widened to int64)."""
    if not isinstance(addr, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        p = builder.inttoptr(args[0], ir.IntType(32).as_pointer())
        return builder.sext(builder.load(p), ir.IntType(64))

    return types.int64(addr), codegen


@intrinsic
def _store32(typingctx, addr, value):
    """Store ``value`` as a 32-bit integer at address ``addr``."""
    if not isinstance(addr, types.Integer) or not isinstance(value, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        p = builder.inttoptr(args[0], ir.IntType(32).as_pointer())
        builder.store(builder.trunc(args[1], ir.IntType(32)), p)
        return context.get_dummy_value()

    return types.none(addr, value), codegen


@intrinsic
def _pointer(typingctx, addr, dtype):
    """``addr`` as a typed pointer to elements of ``dtype`` (a numba number class)."""
    if not isinstance(addr, types.Integer) or not isinstance(dtype, types.NumberClass):
        return None
    elem = dtype.instance_type

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_data_type(elem).as_pointer())

    return types.CPointer(elem)(addr, dtype), codegen


@intrinsic
def _malloc(typingctx, nbytes):
    """``malloc(nbytes)`` of the C library: the address, 0 when it failed."""
    if not isinstance(nbytes, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(ir.IntType(8).as_pointer(), [ir.IntType(64)])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "malloc")
        return builder.ptrtoint(builder.call(fn, [args[0]]), ir.IntType(64))

    return types.int64(nbytes), codegen


@intrinsic
def _free(typingctx, addr):
    """``free`` of the C library on the address ``addr``."""
    if not isinstance(addr, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer()])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "free")
        builder.call(fn, [builder.inttoptr(args[0], ir.IntType(8).as_pointer())])
        return context.get_dummy_value()

    return types.none(addr), codegen


@intrinsic
def _fetch_add(typingctx, addr, value):
    """Atomically add ``value`` to the int64 at address ``addr``; the old value
    (sequentially consistent: the part counter of :mod:`codegen.backends.numba_cpu.chunks`)."""
    if not isinstance(addr, types.Integer) or not isinstance(value, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        p = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        v = context.cast(builder, args[1], sig.args[1], types.int64)
        return builder.atomic_rmw("add", p, v, "seq_cst")

    return types.int64(addr, value), codegen


@intrinsic
def _call_c(typingctx, addr, a, b, c, d):
    """Call the C function ``int64 f(int64, int64, int64, int64)`` at ``addr``."""
    if not all(isinstance(x, types.Integer) for x in (addr, a, b, c, d)):
        return None

    def codegen(context, builder, sig, args):
        i64 = ir.IntType(64)
        fn = builder.inttoptr(args[0], ir.FunctionType(i64, [i64] * 4).as_pointer())
        return builder.call(fn, list(args[1:]))

    return types.int64(addr, a, b, c, d), codegen


_BYTES = types.Array(types.uint8, 1, "C")


def _unit_array(context, builder, sig, llargs, j):
    """The 1-D byte array (numba's array struct) of the ``j``-th argument of a unit
    call (:func:`_call_unit`): ``sizes[b]`` elements of ``items[b]`` bytes at
    ``ptrs[b]``, ``b = idx[j]``; ``j`` an LLVM int64."""
    def word(k_arg, k):
        data = context.make_array(sig.args[k_arg])(context, builder, llargs[k_arg]).data
        return builder.load(builder.gep(data, [k]))

    b = word(4, j)
    size, item = word(2, b), word(3, b)
    ptr = builder.inttoptr(word(1, b), ir.IntType(8).as_pointer())
    ary = context.make_array(_BYTES)(context, builder)
    # the unit's own dtype has this layout: only the item size differs
    ary.meminfo = cgutils.get_null_value(ary.meminfo.type)
    ary.parent = cgutils.get_null_value(ary.parent.type)
    ary.nitems = size
    ary.itemsize = item
    ary.data = ptr
    ary.shape = cgutils.pack_array(builder, [size])
    ary.strides = cgutils.pack_array(builder, [item])
    return ary._getvalue()


def _unit_call(context, builder, addr, arrays, err, errty):
    """Call the unit at ``addr`` with the array structs ``arrays`` and ``err``;
    an LLVM int64: 0, or -1 when the unit raised inside numba."""
    i64 = ir.IntType(64)
    argtys = [_BYTES] * len(arrays) + [errty]
    fnty = context.call_conv.get_function_type(types.int64, argtys)
    fn = builder.inttoptr(addr, fnty.as_pointer())
    status, _ = context.call_conv.call_function(builder, fn, types.int64, argtys,
                                                list(arrays) + [err])
    return builder.select(status.is_error, ir.Constant(i64, -1), ir.Constant(i64, 0))


@intrinsic
def _call_unit(typingctx, addr, ptrs, sizes, items, idx, err, nargs):
    """Call the compiled unit at ``addr`` (returning int64, as every unit does) with
    ``nargs`` (a literal) arguments: for
    ``j < nargs - 1`` the 1-D array of ``sizes[b]`` elements of ``items[b]``
    bytes at ``ptrs[b]`` (``b = idx[j]``), then ``err``. Returns 0, or -1 when
    the unit raised inside numba."""
    if not isinstance(addr, types.Integer) or not isinstance(nargs, types.IntegerLiteral):
        return None
    n = nargs.literal_value - 1

    def codegen(context, builder, sig, llargs):
        i64 = ir.IntType(64)
        arrays = [_unit_array(context, builder, sig, llargs, ir.Constant(i64, j))
                  for j in range(n)]
        return _unit_call(context, builder, llargs[0], arrays, llargs[5], sig.args[5])

    return types.int64(addr, ptrs, sizes, items, idx, err, nargs), codegen


@intrinsic
def _call_unit_any(typingctx, addr, ptrs, sizes, items, idx, err, nargs):
    """:func:`_call_unit` with ``nargs`` known at run time only (2 to
    :data:`MAX_ARGS`; another count returns -1 without a call). The array
    structs are built once, in a loop, then a switch on the count has one call
    site per count, each loading its structs: the driver's code grows with
    ``MAX_ARGS``, not with its square (one literal call site per count built
    every struct again, and the driver took numba 8 s of its 14 s)."""
    if not isinstance(addr, types.Integer) or not isinstance(nargs, types.Integer):
        return None

    def codegen(context, builder, sig, llargs):
        i64 = ir.IntType(64)
        aryty = context.get_value_type(_BYTES)
        slots = cgutils.alloca_once(builder, aryty, size=ir.Constant(i64, MAX_ARGS))
        count = llargs[6]
        n = builder.sub(count, ir.Constant(i64, 1))
        in_range = builder.and_(builder.icmp_signed(">=", count, ir.Constant(i64, 2)),
                                builder.icmp_signed("<=", count, ir.Constant(i64, MAX_ARGS)))
        n = builder.select(in_range, n, ir.Constant(i64, 0))
        with cgutils.for_range(builder, n) as loop:
            value = _unit_array(context, builder, sig, llargs, loop.index)
            builder.store(value, builder.gep(slots, [loop.index]))
        result = cgutils.alloca_once_value(builder, ir.Constant(i64, -1))
        end = builder.append_basic_block("unit_call_end")
        switch = builder.switch(count, end)
        for k in range(2, MAX_ARGS + 1):
            block = builder.append_basic_block(f"unit_call_{k}")
            switch.add_case(ir.Constant(i64, k), block)
            with builder.goto_block(block):
                arrays = [builder.load(builder.gep(slots, [ir.Constant(i64, j)]))
                          for j in range(k - 1)]
                builder.store(_unit_call(context, builder, llargs[0], arrays, llargs[5],
                                         sig.args[5]), result)
                builder.branch(end)
        builder.position_at_end(end)
        return builder.load(result)

    return types.int64(addr, ptrs, sizes, items, idx, err, nargs), codegen


def unit_address(unit):
    """The address of a numba unit's compiled function when its overload takes 1-D
    C-contiguous arrays, then the int64 error flag, and returns an int64; None
    otherwise."""
    specs = getattr(unit, "arg_specs", None)
    if not specs or len(specs) > MAX_ARGS or len(specs) < 2:
        return None
    if any(nd != 1 for _, nd in specs) or tuple(specs[-1]) != ("int64", 1):
        return None
    sig = tuple(_array_type(dt, nd) for dt, nd in specs)
    try:
        cres = unit.fn.overloads[sig]
    except (AttributeError, KeyError):
        return None
    returned = cres.signature.return_type  # units return 0: Literal[int](0), an int64
    if getattr(returned, "literal_type", returned) != types.int64:
        return None  # the call's return slot is an int64
    return cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)


_unit_overload = unit_address
