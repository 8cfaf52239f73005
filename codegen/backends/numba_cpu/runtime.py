"""The run-time helper module every compiled unit imports its helpers from.

One job: the text of that module and its name. Units call a few small numba
functions -- NaN-propagating ``_fmax_<dtype>``/``_fmin_<dtype>``,
``_fill_<dtype>``/``_copy_<dtype>``/``_copy_n_<dtype>`` and the checks
``_ck``/``_rk``/``_nz``/``_fail`` and ``_iadd``/``_isub``/``_imul``/``_ifloordiv``
-- each compiled for one signature only, and the intrinsic ``_radd`` (a float add
LLVM may reassociate, :data:`REASSOC_HELPER`) (see
:data:`_PER_DTYPE`; :func:`codegen.backends.numba_cpu.disk_cache.compile_unit` checks it). They are
defined once, in a module of their own that :mod:`codegen.backends.numba_cpu.compile` writes
to the cache directory and loads before any unit (``texpr_k_rt<hash>.py``, its
machine code in numba's disk cache beside it, like a unit's), instead of in
every unit's module with ``inline="always"``.

Why: numba inlines an ``inline="always"`` function at the level of its own IR,
copying the callee's blocks into the caller at every call site and running its
passes over the copies, and a unit defining its helpers recompiles each one
it calls. Measured on 16 fuzzed programs (94 units, compiled one by one in
one process, a fresh cache directory, a quiet 2-core machine, 2026-12-01):
70-75 s of numba with the inlined helpers, 35-40 s with this module. A suite
case built into an empty cache directory pays instead for compiling the
helpers it calls once per process (about 5% more cold build time, an A/B of
six cases). The helpers are small, so LLVM inlines them when it links the
unit (no call to them is left in a unit's optimised IR: checked on
max_pool2d's and layer_norm's units; the vector instructions of the suite's
units are the same), and the suite's kernels ran within the noise of the old
ones (targeted runs, old and new alternating).

Two kinds of helper are the exception, ``inline="always"``: ``_fill_<dtype>``
(one call per zeroed output) and ``_fail`` (called only by the checks, which
stay compiled functions). Compiling one on its own costs about 0.03-0.05 s of
numba's fixed work in every cold cache. Measured 2026-12-05 by timing each
unit's compile (an ad hoc script; cold cache, workers off, quiet 2-core
machine, with ``_fmax``/``_fmin`` inlined too; the cold builds with this and
the other changes of that day are benchmarks/bench_compile.py's, beside JAX):
softmax_xent's numba time 0.78 -> 0.63-0.65 s, maxpool2's 0.57 -> 0.49-0.50
s; 30 fuzzed programs (seeds 500-529, 159 units) 29.0-29.3 s before,
29.8-30.0 s after. A helper with many call sites in one unit must stay a
function: inlining the checks too (``_ck``/``_rk``/``_nz``, many call sites
in a gather) took those 30 programs to 41.8 s, and with ``_fmax``/``_fmin``
inlined one unit of 511 float max/min calls took 88.5 s to build instead of
7.8 s (attack helper-30). An inlined helper has no machine code of its own in
the cache, so nothing of it can be damaged there.

The name carries the sha256 of the text, so a unit's text -- which names the
module in its import line -- and with it the unit's cache key change whenever
a helper does: machine code cached with an old helper linked in is never
loaded again (numba's own index is valid for one numba version only).
"""

import hashlib
import textwrap

from texpr.dtypes import DTYPES, FLOATS

__all__ = ["SOURCE", "NAMES", "MODULE", "IMPORT_LINE", "GEMM_GUARD", "REASSOC_HELPER", "CHECK_NAMES"]

#: the value helpers, one function per dtype (``_fmax_float32``, ``_fill_int64``,
#: ...): each is compiled for one signature only. numba's disk cache of a
#: function with several signatures is one index file naming a data file per
#: signature, written without a lock: two processes compiling two signatures of
#: one helper at once could leave the index pointing a float64 signature at the
#: float32 machine code (an attack found it, forcing the order of the writes),
#: and every later process would load it (a float64 max rounded to float32).
_PER_DTYPE = """
@njit(cache=True, inline="always")
def _fill_{dt}(a, v):
    # a serial loop: in a parallel unit a.fill(v) becomes a parfor of its own,
    # which numba compiles as one more gufunc (about 0.5 s)
    for i in range(a.size):
        a[i] = v


@njit(cache=True)
def _copy_{dt}(a, b):
    # a[:] = b, serially (see _fill_{dt})
    for i in range(a.size):
        a[i] = b[i]


@njit(cache=True)
def _copy_n_{dt}(a, b, n):
    # a[:n] = b[:n], serially: numba compiles a slice assignment in about 1 s
    for i in range(n):
        a[i] = b[i]
"""

#: NaN-propagating float min and max, per float dtype
_PER_FLOAT = """
@njit(cache=True)
def _fmax_{dt}(a, b):
    return a if (a > b or a != a) else b


@njit(cache=True)
def _fmin_{dt}(a, b):
    return a if (a < b or a != a) else b
"""

#: float32 erf as the rational approximation XLA and Eigen use for it (Eigen's
#: ``generic_fast_erf_float``: the argument clamped to [-4, 4], then an odd
#: polynomial of degree 13 over an even one of degree 8): no call, so a loop of it
#: vectorises. libm's ``erff``, called once per element, made GELU's forward and
#: backward passes a quarter of a mini-GPT step (a 524,288-element GELU: 8.6 ms
#: on one thread, 0.20 ms with this; PyTorch's 0.15). The error against float64
#: erf is 4e-7 (3.3 ulp at 1; within float32's own rounding of a GELU (1.4e-6 absolute on values
#: up to 12, against 1.2e-6 for PyTorch's float32 GELU); NaN stays NaN and
#: erf(+-inf) is +-1, and no value leaves [-1, 1]. float64 keeps libm's erf.
_ERF32 = """
@njit(cache=True, inline="always")
def _erf_float32(x0):
    x = min(max(x0, np.float32(-4.0)), np.float32(4.0)) if x0 == x0 else x0
    x2 = x * x
    a = np.float32(-2.72614225801306e-10)
    a = a * x2 + np.float32(2.77068142495902e-08)
    a = a * x2 + np.float32(-2.10102402082508e-06)
    a = a * x2 + np.float32(-5.69250639462346e-05)
    a = a * x2 + np.float32(-7.34990630326855e-04)
    a = a * x2 + np.float32(-2.95459980854025e-03)
    a = a * x2 + np.float32(-1.60960333262415e-02)
    a = a * x
    b = np.float32(-1.45660718464996e-05)
    b = b * x2 + np.float32(-2.13374055278905e-04)
    b = b * x2 + np.float32(-1.68282697438203e-03)
    b = b * x2 + np.float32(-7.37332916720468e-03)
    b = b * x2 + np.float32(-1.42647390514189e-02)
    r = a / b
    # the polynomial overshoots 1 by an ulp near |x| = 4: erf stays within [-1, 1];
    # erf(-0.0) is -0.0
    return np.float32(1.0) if r > np.float32(1.0) else (
        np.float32(-1.0) if r < np.float32(-1.0) else (r if x0 != np.float32(0.0) else x0))
"""

#: float32 exp without a libm call (Cephes' ``expf``: ``x = n ln2 + r``, a degree-6
#: polynomial of ``r``, times ``2**n`` built from its bits in two halves so that a
#: subnormal result is rounded once more, not flushed): a loop of it vectorises.
#: Within 0.68 ulp of exp over the normal range (libm's: 0.5), the same infinities,
#: zeros and subnormals (to 1e-45) over [-110, 95] and NaN kept; 2 M elements: 1.1 ms
#: on one thread, 5.4-8.2 ms with libm's. float64 keeps libm's exp.
_EXP32 = """
@njit(cache=True, inline="always")
def _exp_float32(x):
    y = x if x == x else np.float32(0.0)
    y = np.float32(-104.0) if y < np.float32(-104.0) else (
        np.float32(89.0) if y > np.float32(89.0) else y)
    fn = np.floor(y * np.float32(1.44269504088896341) + np.float32(0.5))
    r = y - fn * np.float32(0.693359375) - fn * np.float32(-2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * (r * r) + r + np.float32(1.0)
    n = np.int32(fn)
    n1 = n >> 1
    e = p * _bits_float32((n1 + 127) << 23) * _bits_float32((n - n1 + 127) << 23)
    return e if x == x else x
"""

_VALUE_HELPERS = "\n\n".join(
    [_PER_FLOAT.format(dt=dt).strip() for dt in FLOATS]
    + [_PER_DTYPE.format(dt=dt).strip() for dt in DTYPES] + [_ERF32.strip()])

#: the GEMM guard of scan steps (codegen.loopnest.scan_gemm), defined in every unit's module
#: itself, not here: its operands are views whose layouts vary (several signatures)
GEMM_GUARD = '''
@njit(cache=True)
def _max_abs(a, lim):
    # the largest |value| of a, or -1.0 if one is inf, NaN or above lim
    m = 0.0
    for v in a.flat:
        x = abs(float(v))
        if not x <= lim:
            return -1.0
        m = max(m, x)
    return m


@njit(cache=True)
def _gemm_ok(a, b, k, lim):
    # every value finite and max|a| * max|b| * k <= lim: no product and no partial
    # sum can overflow, so a GEMM's result is the loop nest's up to rounding
    ma = _max_abs(a, lim)
    mb = _max_abs(b, lim)
    return ma >= 0.0 and mb >= 0.0 and ma * mb * k <= lim
'''

#: the run-time checks (numba helpers): an index outside ``[0, n)``, a value outside
#: ``[-lim, lim)``, a zero divisor, integer arithmetic on values that would leave its
#: dtype (``_iadd``/``_isub``/``_imul``/``_ifloordiv``) set ``err`` and return a safe
#: value. The first failure is kept (later ones leave ``err`` alone), so a
#: sequential loop reports the first offending point's value; in a parallel loop it
#: is one of them. Every argument is an int64 (the call sites cast:
#: :func:`codegen.loopnest.emit.helper_int`) and ``err`` an int64 array: one signature each
CHECK_HELPERS = '''
@njit(cache=True, inline="always")
def _fail(err, code, v):
    if err[0] == 0:
        err[1] = v
        err[0] = code


@njit(cache=True)
def _ck(i, n, err, code):
    if i < 0 or i >= n:
        _fail(err, code, i)
        return 0
    return i


@njit(cache=True)
def _rk(v, lim, err, code):
    if v < -lim or v >= lim:
        _fail(err, code, v)
        return 0
    return v


@njit(cache=True)
def _nz(b, err, code):
    if b == 0:
        _fail(err, code, np.int64(0))
        return 1
    return b


@njit(cache=True)
def _iadd(a, b, narrow, err, code):
    # a + b of integer values, exactly within its dtype, else a failure. The tests
    # come before the operation: LLVM assumes a signed operation does not wrap and
    # folds a test of its result (a * b // b == a is true to it). int32 values
    # (narrow != 0) are added in int64 and range-checked
    if (b > 0 and a > 9223372036854775807 - b) or (b < 0 and a < -9223372036854775807 - 1 - b):
        _fail(err, code, a)
        return np.int64(0)
    r = a + b
    if narrow != 0 and (r < -2147483648 or r > 2147483647):
        _fail(err, code, a)
        return np.int64(0)
    return r


@njit(cache=True)
def _isub(a, b, narrow, err, code):
    if (b < 0 and a > 9223372036854775807 + b) or (b > 0 and a < -9223372036854775807 - 1 + b):
        _fail(err, code, a)
        return np.int64(0)
    r = a - b
    if narrow != 0 and (r < -2147483648 or r > 2147483647):
        _fail(err, code, a)
        return np.int64(0)
    return r


@njit(cache=True)
def _imul(a, b, narrow, err, code):
    if a != 0 and b != 0:
        # |a| * |b| against the largest magnitude of the product's sign, in uint64
        # (unsigned arithmetic is defined to wrap: nothing for LLVM to assume away)
        ma = np.uint64(a) if a > 0 else np.uint64(-(a + 1)) + np.uint64(1)
        mb = np.uint64(b) if b > 0 else np.uint64(-(b + 1)) + np.uint64(1)
        top = np.uint64(9223372036854775807) + np.uint64((a > 0) != (b > 0))
        if ma > top // mb:
            _fail(err, code, a)
            return np.int64(0)
    r = a * b
    if narrow != 0 and (r < -2147483648 or r > 2147483647):
        _fail(err, code, a)
        return np.int64(0)
    return r


@njit(cache=True)
def _ifloordiv(a, b, narrow, err, code):
    # a // b (b != 0: a zero divisor is _nz's failure): only INT_MIN // -1 leaves
    # the dtype (int64: numba gives 0, numpy INT_MIN)
    if b == -1 and a == -9223372036854775807 - 1:
        _fail(err, code, a)
        return np.int64(0)
    r = a // b
    if narrow != 0 and r > 2147483647:
        _fail(err, code, a)
        return np.int64(0)
    return r
'''

#: ``_radd(acc, v)``: ``acc + v`` (``v`` cast to ``acc``'s float type) as one LLVM
#: ``fadd`` carrying the ``reassoc`` flag and no other: the innermost loop of a float
#: sum written once with it (:meth:`codegen.loopnest.stage._StageLowering._emit_reassociated_sum`)
#: is a reduction LLVM's loop vectoriser may split into partial sums in vector
#: registers, which it never does to a plain ``+=`` (IEEE order). Only the order of
#: the sum's terms changes, which the evaluator does not fix either; NaN, infinities
#: and signed zeros keep IEEE semantics (no ``nnan``/``ninf``/``nsz``), and no
#: product is fused into it (no ``contract``). An intrinsic has no machine code of its
#: own: LLVM sees the instruction in the unit.
REASSOC_HELPER = '''
@intrinsic
def _bits_float32(typingctx, n):
    # the float32 whose bits are the int32 n (an LLVM bitcast)
    if not isinstance(n, types.Integer):
        return None

    def lower(context, builder, sig, args):
        i = context.cast(builder, args[0], sig.args[0], types.int32)
        return builder.bitcast(i, ir.FloatType())
    return types.float32(n), lower


@intrinsic
def _sel(typingctx, c, a, b):
    # select(c, a, b) as one LLVM select of two computed floats: no branch
    if not (isinstance(a, types.Float) and a == b):
        return None

    def lower(context, builder, sig, args):
        cond = context.cast(builder, args[0], sig.args[0], types.boolean)
        return builder.select(cond, args[1], args[2])
    return a(c, a, b), lower


@intrinsic
def _radd(typingctx, a, b):
    if not (isinstance(a, types.Float) and isinstance(b, types.Float)):
        return None

    def lower(context, builder, sig, args):
        v = context.cast(builder, args[1], sig.args[1], sig.args[0])
        return builder.fadd(args[0], v, flags=("reassoc",))
    return a(a, b), lower
'''

#: the run-time checks' names: a call to one may set a unit's error flag
CHECK_NAMES = tuple(line[4:line.index("(")] for line in CHECK_HELPERS.splitlines()
                    if line.startswith("def _"))

#: the helper module's text (numba's ``cache=True`` on every function)
SOURCE = ("import math\n\nimport numpy as np\nfrom numba import njit\n"
          "from llvmlite import ir\nfrom numba.core import types\n"
          "from numba.extending import intrinsic\n\n\n"
          + _VALUE_HELPERS.strip() + "\n\n\n" + CHECK_HELPERS.strip() + "\n\n\n"
          + REASSOC_HELPER.strip() + "\n\n\n" + _EXP32.strip() + "\n")

#: the helpers it defines, in the order they appear
NAMES = tuple(line[4:line.index("(")] for line in SOURCE.splitlines()
              if line.startswith("def _"))


#: the module's name: ``texpr_k_rt`` and 24 hex digits of the sha256 of
#: :data:`SOURCE` (the ``texpr_k_`` prefix makes it a kernel entry of the cache
#: directory for :mod:`texpr.cache`: counted, bounded and cleared with the units)
MODULE = "texpr_k_rt" + hashlib.sha256(SOURCE.encode("utf-8")).hexdigest()[:24]

#: the line that gives a unit's module the helpers
IMPORT_LINE = (f"from {MODULE} import (\n"
               + "\n".join(textwrap.wrap(", ".join(NAMES) + ")", 84, initial_indent="    ",
                                          subsequent_indent="    ")) + "\n")
