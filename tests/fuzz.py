"""A random program generator and the oracle checks every fuzzed program goes through.

One program is a few stages over float placeholders (and int index lists),
then a scalar loss ``L = sum(C * Y)`` with ``C`` a fed head. The generator is a
seeded :class:`random.Random`: :func:`make_program` ``(seed)`` always builds the
same program (``dtype=`` rebuilds it at another float dtype for finite
differences). It covers

* affine and quasi-affine indices (``a*i + b*k + c``, ``// d``, ``% d``),
  guarded by ``te.if_then_else`` or clamped with ``te.max/te.min``;
* extent-1 axes (spatial and reduction), ``where=`` domains that are empty for
  some outputs (then a max gives -inf), sums, max/min, ``(value, index)``
  argmax tuple reducers whose index is gathered through later (one in five
  with its components in the other order, or the value read alone:
  ``argmax(...)[0]``);
* data-dependent gathers ``X[I[...]]``, guarded or not, whose index lists may
  hold out-of-range entries (then every path must raise OutOfBoundsError);
* elementwise selects on data, intrinsics, non-finite inputs (inf, -inf, nan);
* reduction domains that read data (``where=src > k / 3 - 1``) and finite
  inputs near the dtype's largest value (their products overflow);
* placeholder and stage names with odd (printable) characters;
* whole conv -> bias and activation -> conv programs (strided, dilated or
  causally masked; :func:`conv_activation_conv`, 6% of the programs), whose
  folded activation and masked gradients codegen packs into stages of their
  own so that the convolutions run as GEMMs (:mod:`codegen.rewrite.operands`).

Where an input is near the dtype's largest value, a sum's partial sums can
overflow in one order of its terms and not in another: such elements are
judged against the float64 twin (:func:`compare_orders`).

:func:`check_programs` runs, for a batch of programs: ``te.evaluate`` of the
forward, raw and simplified gradients (NaN/inf patterns equal, values close;
each element of a simplified gradient as the raw one's under IEEE arithmetic
or under symbolic zeros, see docs/conventions.md "Zeros");
one compiled kernel (texpr.codegen.build) of every program's forward, loss
and simplified gradients against ``te.evaluate`` of the same simplified graphs
(raw vs simplified forward: with finite inputs; see docs/conventions.md, "Zeros"),
and the same kernel run by the bridges' compiled driver
(:mod:`texpr.codegen.backends.numba_cpu.native_call`) and as a PyTorch operator
(``texpr.torch.op``: torch tensors, contiguous or strided, written through
their data pointers) against the kernel, bit for bit (an out-of-range index
raises OutOfBoundsError on every path); and, for smooth programs with
finite inputs, the raw gradients in float64 against central finite
differences. In mode ``"threads"`` each kernel also runs from several threads at
once and re-entrantly (a call nested in every unit, :func:`reentrant_outputs`);
:func:`check_extreme_programs` checks convolutions with empty and size-1 axes and
huge strides, paddings and dilations. Findings are returned as :class:`Finding`
records (seed, kind, message, program text), so a run reports all of them, not
the first.
"""

import contextlib
import dataclasses
import importlib
import os
import random
import re
import sys
import threading
import traceback

import numpy as np

import texpr as te
from texpr import codegen, simplify
from texpr.testing import numeric_gradient, symbolic_zero_products

#: names with odd, printable characters (control characters are the names check's job)
ODD_NAMES = ["x y", "Ω", "a'b", 'q"r', "#c", "a-b", "1x", "x.y", "\\", "é_ü", "in", "def",
             "X_0", "{z}", "%s"]
#: names with control characters and line breaks (drawn from a second stream:
#: the programs of older seeds stay the same)
CONTROL_NAMES = ["a\nb", "\x00", "t\tab", "c\rd", "\x1b[31m", "e\u2028f", "\"\"\"", "#\n1/0"]
#: coefficients near the int64 limit (issue 10: index arithmetic that can wrap)
BIG_COEFFICIENTS = [2**31, 2**40, 2**61, 2**62 - 5, -(2**62)]


#: regression seeds (tests/test_fuzz.py) found before the generator drew integer
#: value arithmetic (:meth:`_Gen.with_int_value`), whose programs would now draw it:
#: they keep the programs they were found with
SEEDS_BEFORE_INT_VALUES = frozenset({7000000475, 7000003194, 7000003318})
#: regression seeds whose programs the integer conditions in a where (the tenth
#: stream, :meth:`_Gen.stage`) would have changed: they keep their programs
SEEDS_BEFORE_INT_WHERE = frozenset({7001702771})
#: regression seeds whose programs te.stop_gradient (the eleventh stream,
#: :meth:`_Gen._value`) would have changed: they keep their programs
SEEDS_BEFORE_STOP_GRADIENT = frozenset({7000000475, 7007400007})


@dataclasses.dataclass
class Program:
    """One fuzzed program.

    ``floats``: the differentiable float placeholders; ``ints``: the int64
    index lists; ``head``: ``C``; ``y``: the last stage; ``loss``: ``L``;
    ``feed``: dict placeholder -> array; ``smooth``: no construct whose
    derivative has kinks at the fed point that finite differences would see
    (max/min/argmax, abs, data selects, floor), nor a te.stop_gradient (whose
    derivative finite differences do not see); ``text``: the printed graph;
    ``reshape``: the generator could draw reshape loads (see :func:`make_program`).
    """

    seed: int
    dtype: str
    floats: list
    ints: list
    head: object
    y: object
    loss: object
    feed: dict
    smooth: bool
    finite_inputs: bool
    text: str
    big: bool = False
    reshape: bool = True
    #: an input holds a finite value near the dtype's largest (its products and
    #: sums can leave the range: partial sums then depend on the order of terms)
    near_max: bool = False
    #: integer value arithmetic on data near the int limits (:meth:`_Gen.with_int_value`):
    #: te.evaluate may raise "would wrap around" or "division by zero"
    int_arith: bool = False
    #: that arithmetic in a reduction's where (:meth:`_Gen.stage`)
    int_where: bool = False
    #: drawn as a conv -> activation -> conv program whatever the seed
    #: (``make_program(conv=True)``: the conv profile)
    conv: bool = False

    @property
    def inputs(self):
        return self.floats + self.ints + [self.head]


@dataclasses.dataclass
class Finding:
    """A mismatch or unexpected error: ``seed`` replays it with :func:`make_program`."""

    seed: int
    kind: str
    message: str
    text: str

    def __str__(self):
        return f"[seed {self.seed}] {self.kind}: {self.message}\n{self.text}"


class _Gen:
    def __init__(self, seed, dtype, reshape=True):
        self.reshape = reshape
        self.rng = random.Random(seed)
        # a second stream for the kinds added later (control-character names,
        # int64-limit coefficients), so that older seeds keep their programs
        self.rng2 = random.Random(seed * 7919 + 17)
        # a third for reshape loads (a flat position split back into indices)
        self.rng3 = random.Random(seed * 104729 + 31)
        # a fourth for conditions that read data (with int / int arithmetic) and
        # finite inputs near the dtype's largest value (products overflow)
        self.rng4 = random.Random(seed * 1299709 + 7)
        # a fifth for whole conv -> activation -> conv programs (packed operands)
        self.rng5 = random.Random(seed * 15485863 + 11)
        # a sixth for indices computed through floating point or not quasi-affine
        # (their adjoint must check them as a data-dependent gather's is)
        self.rng6 = random.Random(seed * 32452843 + 13)
        # a seventh for a tuple reduction's components read out of order or alone
        # (the stage computes them all)
        self.rng7 = random.Random(seed * 86028121 + 19)
        # an eighth for a chain of selects each reading the level below several
        # times: a DAG far smaller than its tree (codegen's shared bindings)
        self.rng8 = random.Random(seed * 122949823 + 23)
        # a ninth for integer value arithmetic (+ - * // % min max) on int64 and
        # int32 data near the dtype's limits, cast into a float value
        self.rng9 = random.Random(seed * 179424673 + 29)
        # a tenth for integer value arithmetic in a reduction's where (the GEMM
        # path evaluates such conditions itself, in the order te.evaluate does)
        self.rng10 = random.Random(seed * 217645177 + 37)
        # an eleventh for te.stop_gradient in a value (a constant to differentiation:
        # the finite-difference check is skipped for such a program, the others hold)
        self.rng11 = random.Random(seed * 275604541 + 41)
        self.draw_stop_gradient = reshape and seed not in SEEDS_BEFORE_STOP_GRADIENT
        self.draw_int_values = reshape and seed not in SEEDS_BEFORE_INT_VALUES
        self.draw_int_where = self.draw_int_values and seed not in SEEDS_BEFORE_INT_WHERE
        self.int_arith = False
        self.int_where = False
        self.big = False
        # draw the dtype even when it is given: the twin must draw the same program
        self.dtype = self.rng.choice(["float32", "float64"])
        if dtype:
            self.dtype = dtype
        self.smooth = True
        self.ints = []
        self.int_values = {}
        self.names = 0

    def name(self, base):
        self.names += 1
        if self.rng.random() < 0.25:
            return self.rng.choice(ODD_NAMES) + str(self.names)
        if self.rng2.random() < 0.1:
            return self.rng2.choice(CONTROL_NAMES) + str(self.names)
        return f"{base}{self.names}"

    def extent(self, lo=1, hi=5):
        r = self.rng
        return 1 if r.random() < 0.2 else r.randint(lo, hi)

    # ---- indices ---------------------------------------------------------------
    def affine(self, vars):
        r = self.rng
        v = r.choice(vars)
        w = r.choice(vars)
        a, b, c = r.randint(-2, 3), r.randint(-1, 2), r.randint(-2, 3)
        e = a * v + b * w + c if (a or b) else v + c
        kind = r.choice(["plain", "plain", "div", "mod", "divmod"])
        d = r.randint(2, 3)
        if kind == "div":
            e = e // d
        elif kind == "mod":
            e = e % d + v
        elif kind == "divmod":
            e = (e // d) * 2 + e % d
        if self.rng2.random() < 0.015:
            # a coefficient near the int64 limit, clamped back into a small range:
            # exact arithmetic gives an in-range index, wrapped arithmetic another
            self.big = True
            c = self.rng2.choice(BIG_COEFFICIENTS)
            e = te.max(te.min(e * c + self.rng2.choice([0, 2**62, -(2**62)]), 3), -3) + v
        return e

    def gather_index(self, vars, n):
        """``I[clamp(affine)] (+ c)`` with a new int list ``I`` whose values target [0, n)."""
        r = self.rng
        m = r.randint(1, 4)
        I = te.placeholder((m,), self.name("I"), dtype="int64")
        vals = np.array([r.randrange(max(n, 1)) for _ in range(m)], dtype=np.int64)
        if r.random() < 0.12:  # an out-of-range entry
            vals[r.randrange(m)] = r.choice([n, n + 2, -1])
        self.ints.append(I)
        self.int_values[I] = vals
        e = self.affine(vars)
        return I[te.max(te.min(e, m - 1), 0)]

    def load(self, t, vars):
        """A load of ``t`` with random indices; guarded by a select or clamped."""
        r = self.rng
        idx, conds = [], []
        guard = r.choice(["select", "clamp", "clamp"])
        for n in t.shape:
            if r.random() < 0.15:
                e = self.gather_index(vars, n)
                if r.random() < 0.5:
                    conds += [e >= 0, e < n]
                idx.append(e)
                continue
            e = self.affine(vars)
            if guard == "clamp":
                e = te.max(te.min(e, n - 1), 0)
            else:
                conds += [e >= 0, e < n]
            idx.append(e)
        if self.reshape and self.rng6.random() < 0.03:  # (not in the older generator)
            d = self.rng6.randrange(len(t.shape)) if t.shape else None
            if d is not None:
                idx[d] = self.computed_index(vars, t.shape[d])
        if self.reshape and len(t.shape) >= 2 and t.size and self.rng3.random() < 0.08:
            return self.reshape_load(t, vars)
        if conds:
            return te.if_then_else(te.all(*conds), t[tuple(idx)], 0.0)
        return t[tuple(idx)]

    def computed_index(self, vars, n):
        """An index computed through floating point (``int64(floor(v * s + c))``,
        a nearest-neighbour resize's) or not quasi-affine (``v * w + c``), clamped
        into ``[0, n)`` or, one time in four, not (then it may leave ``[0, n)``:
        the forward raises, and every gradient path must too). Draws from its
        own stream, so other programs keep theirs."""
        r = self.rng6
        v, w = r.choice(vars), r.choice(vars)
        c = r.randint(-1, 2)
        if r.random() < 0.5:
            e = te.cast(te.floor(v * r.choice([0.5, 0.6, 1.5]) + float(c)), "int64")
        else:
            e = v * w + c
        if r.random() < 0.75:
            e = te.max(te.min(e, n - 1), 0)
        return e

    def reshape_load(self, t, vars):
        """A load through a reshape: a clamped flat position ``f`` split back into
        row-major indices ``(f // stride) % n`` (draws from its own stream, after
        the ordinary load's, so other programs keep theirs). Its offset is
        affine where the clamp is inactive, the case codegen.analysis.affine proves."""
        r = self.rng3
        a, b, c = r.randint(0, 3), r.randint(-1, 2), r.randint(-1, 2)
        f = a * r.choice(vars) + b * r.choice(vars) + c
        f = te.max(te.min(f, t.size - 1), 0)
        idx, stride = [], t.size
        for n in t.shape:
            stride //= n
            idx.append((f // stride) % n)
        return t[tuple(idx)]

    # ---- values --------------------------------------------------------------------
    def value(self, sources, vars, depth=0):
        out = self._value(sources, vars, depth)
        if self.reshape and self.rng8.random() < 0.03:
            out = self.select_chain(out)
        if self.draw_int_values and self.rng9.random() < 0.04:
            out = self.with_int_value(out, vars)
        return out

    def with_int_value(self, x, vars):
        """``x`` combined with integer value arithmetic cast to float: scaled
        into a few units (``x + cast(v) * 2**-62``) or as a select's condition
        (``cast(v) > 0``). ``v`` reads a new int list of values at and near the
        dtype's limits: exact arithmetic raises "would wrap around" (or
        "division by zero") in te.evaluate, and must in every kernel. Draws
        from its own stream, so other programs keep theirs."""
        r = self.rng9
        self.int_arith = True
        v = self.int_value(vars, r.choice(["int64", "int64", "int32"]), r.randint(1, 2))
        f = te.cast(v, self.dtype)
        if r.random() < 0.6:
            return x + f * (2.0 ** -62 if v.dtype == "int64" else 2.0 ** -30)
        self.smooth = False
        return te.if_then_else(f > 0.0, x, x * 0.5)

    def int_value(self, vars, dtype, depth, r=None):
        r = r or self.rng9
        m = r.randint(1, 4)
        info = np.iinfo(dtype)
        root = 3037000500 if dtype == "int64" else 46341  # its square leaves the dtype
        pool = [int(info.min), int(info.max), int(info.min) + 1, int(info.max) // 2 + 1,
                -(int(info.max) // 2) - 1, root, -root, 0, 1, -1, 7, -3]
        N = te.placeholder((m,), self.name("N"), dtype=dtype)
        self.ints.append(N)
        self.int_values[N] = np.array([r.choice(pool) for _ in range(m)], dtype=dtype)

        def leaf():
            if r.random() < 0.2:
                return te.const(r.choice([2, -1, 3, 0]), dtype)
            v = r.choice(vars)
            return N[(v * r.randint(1, 2) + r.randint(0, 3)) % m]

        def node(d):
            a = leaf() if d == 0 else node(d - 1)
            b = leaf()
            op = r.choice(["add", "sub", "mul", "mul", "neg", "div", "divc", "mod", "min",
                           "max"])
            if op == "neg":
                return -a
            if op == "divc":
                return a // te.const(r.choice([-1, 2, -3]), dtype)
            return {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
                    "div": lambda: a // b, "mod": lambda: a % b,
                    "min": lambda: te.min(a, b), "max": lambda: te.max(a, b)}[op]()
        return node(depth - 1)

    def select_chain(self, v):
        """``v`` through 4-7 levels of ``select(v > c, tanh(v) * v, v * a + b)``
        (bounded: each level is at most as large as the one below), drawn from
        its own stream so that other programs keep theirs."""
        r = self.rng8
        self.smooth = False
        for _ in range(r.randint(4, 7)):
            c = r.choice([-0.5, 0.0, 0.25, 0.5])
            a = r.choice([0.5, -0.5, 0.25])
            v = te.if_then_else(v > c, te.tanh(v) * v, v * a + r.choice([0.25, -0.1]))
        return v

    def _value(self, sources, vars, depth=0):
        r = self.rng
        x = self.load(r.choice(sources), vars)
        op = r.random()
        if depth < 2 and op < 0.35:
            y = self._value(sources, vars, depth + 1)
            return r.choice([lambda: x + y, lambda: x * y, lambda: x - y * 0.5])()
        if op < 0.45:
            self.smooth = False
            return te.if_then_else(x > 0.25, x * 2.0, x - 1.0)
        if op < 0.55:
            return te.tanh(x)
        if op < 0.62:
            return te.sigmoid(x) * 3.0
        if op < 0.67:
            self.smooth = False
            return te.max(x, 0.5 * x)
        if op < 0.72:
            return te.exp(te.tanh(x))
        if op < 0.76:
            self.smooth = False
            return te.abs(x)
        if self.draw_stop_gradient and self.rng11.random() < 0.06:
            self.smooth = False  # finite differences see what stop_gradient drops
            return te.stop_gradient(x) * x
        return x * r.choice([1.5, -0.75, 2.0])

    def where(self, i, k):
        r = self.rng
        w = r.choice(["none", "none", "tri", "mod", "lin"])
        if w == "tri":
            return k <= i
        if w == "mod":
            return (i + k) % r.randint(2, 3) == 0
        if w == "lin":
            return k * r.randint(-1, 2) + i < r.randint(0, 3)
        return None

    def stage(self, sources, last):
        r = self.rng
        ndim = r.choice([1, 1, 2])
        shape = tuple(self.extent() for _ in range(ndim))
        kind = r.choice(["elem", "sum", "sum", "max", "min", "argmax"])
        name = self.name("Y")
        if kind == "elem":
            return te.compute(shape, lambda *ax: self.value(sources, list(ax)), name=name)
        naxes = r.choice([1, 1, 2]) if kind != "argmax" else 1
        ks = [te.reduce_axis(self.extent(), f"k{d}") for d in range(naxes)]

        def body(*ax):
            vars = list(ax) + ks
            src = self.value(sources, vars)
            where = self.where(ax[0], ks[0]) if ax else None
            if self.reshape and self.rng4.random() < 0.15:
                # a condition on data: the GEMM path evaluates it by numpy (texpr's
                # dtypes, not numpy's promotion: k / 3 is float32)
                self.smooth = False
                data = src > ks[0] / self.rng4.choice([2, 3, 7]) - 1
                where = data if where is None else te.all(where, data)
            if self.draw_int_where and self.rng10.random() < 0.03:
                # integer value arithmetic on data, under a cast, before or after the
                # rest of the where (te.evaluate's `&&` evaluates it in that order)
                r = self.rng10
                self.int_arith = self.int_where = True
                self.smooth = False
                iv = self.int_value(vars, r.choice(["int64", "int32"]), r.randint(1, 2), r)
                data = te.cast(iv, self.dtype) > r.choice([0.0, -0.5])
                if where is not None:
                    where = te.all(data, where) if r.random() < 0.5 else te.all(where, data)
                else:
                    where = data
            if kind == "sum":
                return te.sum(src, axis=ks, where=where)
            self.smooth = False
            if kind == "max":
                return te.max(src, axis=ks, where=where)
            if kind == "min":
                return te.min(src, axis=ks, where=where)
            return ARGMAX((src, ks[0]), axis=ks, where=where)

        split = self.rng7.random() if kind == "argmax" and self.reshape else 1.0
        if split < 0.1:
            # the components in the other order
            idx, v = te.compute(shape, lambda *ax: (lambda c: (c[1], c[0]))(body(*ax)),
                                name=name)
        elif split < 0.2:
            # the value alone (its stage computes the index too: the gather
            # below reads it as the stage's second output)
            v = te.compute(shape, lambda *ax: body(*ax)[0], name=name)
            idx = v.op.output(1)
        else:
            out = te.compute(shape, body, name=name)
            if kind != "argmax":
                return out
            v, idx = out
        # use both: the value, and a gather through the index (guarded: -1 when empty)
        t = r.choice(sources)
        n0 = t.shape[0]

        def use(*ax):
            j = idx[ax]
            rest = tuple(te.max(te.min(self.affine(list(ax)), n - 1), 0) for n in t.shape[1:])
            g = te.if_then_else(te.all(j >= 0, j < n0), t[(j,) + rest], 0.0)
            return te.if_then_else(v[ax] > -1e30, v[ax], 0.0) + g
        return te.compute(shape, use, name=self.name("G"))


def conv_activation_conv(g, transposed=False):
    """A 1-d convolution, a bias and an activation (relu, leaky relu, or a select
    on the value), then a second convolution (strided, dilated, masked causally,
    or, with ``transposed``, transposed): the shape whose gradients and folded activation
    :mod:`texpr.codegen.rewrite.operands` packs into elementwise stages so that the
    convolutions run as GEMMs. Returns ``(floats, y)``; draws from ``g.rng5``
    only (and ``g.name``)."""
    r = g.rng5
    n, c0, c1, c2 = r.randint(1, 3), r.randint(1, 3), r.randint(1, 4), r.randint(1, 3)
    k1, k2, s2, d2 = r.randint(1, 3), r.randint(1, 3), r.choice([1, 1, 2]), r.choice([1, 1, 2])
    length = r.randint(k1 + d2 * (k2 - 1), k1 + d2 * (k2 - 1) + 5)
    X = te.placeholder((n, c0, length), g.name("X"), g.dtype)
    W1 = te.placeholder((c1, c0, k1), g.name("W"), g.dtype)
    b = te.placeholder((c1,), g.name("b"), g.dtype)
    W2 = te.placeholder((c2, c1, k2), g.name("W"), g.dtype)
    l1 = length - k1 + 1
    ci, ki = te.reduce_axis(c0, "c"), te.reduce_axis(k1, "k")
    Y1 = te.compute((n, c1, l1), lambda i, o, l: te.sum(X[i, ci, l + ki] * W1[o, ci, ki],
                                                       axis=[ci, ki]), name=g.name("Y"))
    act = r.choice(["relu", "leaky", "select"])

    def activation(i, o, l):
        v = Y1[i, o, l] + b[o]
        if act == "relu":
            return te.if_then_else(v > 0, v, 0.0)
        if act == "leaky":
            return te.max(v, 0.5 * v)
        return te.if_then_else(v > 0.25, v * 2.0, v - 1.0)
    A = te.compute((n, c1, l1), activation, name=g.name("A"))
    l2 = (l1 - d2 * (k2 - 1) - 1) // s2 + 1
    co, kk = te.reduce_axis(c1, "o"), te.reduce_axis(k2, "q")
    causal = r.random() < 0.3
    # in the conv profile (``transposed``), a transposed second convolution (its
    # input read at (l + pad - q * d) // s where that divides: codegen's tap split
    # and lattice moves), drawn from a generator of its own; the other profiles'
    # programs are those they drew before
    t = random.Random(r.getstate()[1][0] * 7 + 3)
    if transposed and t.random() < 0.35:
        ts, td = t.choice([1, 2, 2, 3]), t.choice([1, 1, 2])
        tk = t.randint(1, 4)
        pad = t.randint(0, td * (tk - 1))
        lt = (l1 - 1) * ts - 2 * pad + td * (tk - 1) + 1
        if lt >= 1:
            W2 = te.placeholder((c1, c2, tk), g.name("W"), g.dtype)
            co, kk = te.reduce_axis(c1, "o"), te.reduce_axis(tk, "q")

            def transposed(i, p, l):
                num = l + pad - kk * td
                return te.sum(A[i, co, num // ts] * W2[co, p, kk], axis=[co, kk],
                              where=(num % ts == 0) & (num >= 0) & (num < l1 * ts))
            Y2 = te.compute((n, c2, lt), transposed, name=g.name("Y"))
            g.smooth = False
            return [X, W1, b, W2], Y2
    Y2 = te.compute((n, c2, l2), lambda i, p, l: te.sum(
        A[i, co, l * s2 + kk * d2] * W2[p, co, kk], axis=[co, kk],
        where=(kk <= l) if causal else None), name=g.name("Y"))
    g.smooth = False
    return [X, W1, b, W2], Y2


ARGMAX = te.comm_reducer(
    lambda x, y: (te.if_then_else(x[0] >= y[0], x[0], y[0]),
                  te.if_then_else(x[0] >= y[0], x[1], y[1])),
    lambda vd, idd: (te.const(-np.inf, vd), te.const(-1, idd)), name="argmax")


def make_program(seed, dtype=None, reshape=True, conv=False):
    """The program of ``seed`` (deterministic); ``dtype`` overrides its float dtype.
    ``reshape=False``: without reshape loads (the generator before they were
    added: the regression seeds found then keep their programs). ``conv=True``:
    a conv -> activation -> conv program (:func:`conv_activation_conv`) whatever
    the seed draws (the conv profile: the GEMM path's rewrites of convolutions)."""
    g = _Gen(seed, dtype, reshape)
    r = g.rng
    if (reshape and g.rng5.random() < 0.06) or conv:
        floats, y = conv_activation_conv(g, transposed=conv)
    else:
        floats = []
        for _ in range(r.choice([1, 1, 2])):
            shape = tuple(g.extent() for _ in range(r.choice([1, 2, 2])))
            floats.append(te.placeholder(shape, g.name("X"), g.dtype))
        sources = list(floats)
        y = None
        for s in range(r.choice([1, 1, 1, 2, 2, 3])):
            y = g.stage(sources, s)
            sources.append(y)
    C = te.placeholder(y.shape, g.name("C"), g.dtype)
    axes = [te.reduce_axis(n, f"s{d}") for d, n in enumerate(y.shape)]
    if axes:
        loss = te.compute((), lambda: te.sum(C[tuple(axes)] * y[tuple(axes)], axis=axes),
                          name=g.name("L"))
    else:
        loss = te.compute((), lambda: C[()] * y[()], name=g.name("L"))
    feed = {}
    finite = True
    near_max = False
    frng = np.random.default_rng(seed)
    for x in floats:
        a = frng.uniform(-2, 2, x.shape)
        if x.size and r.random() < 0.12:
            finite = False
            for _ in range(r.randint(1, 2)):
                a.flat[r.randrange(x.size)] = r.choice([np.inf, -np.inf, np.nan])
        if reshape and x.size and g.rng4.random() < 0.1:
            # finite, but a product with it overflows to an infinity
            finite = False
            near_max = True
            a.flat[g.rng4.randrange(x.size)] = g.rng4.choice([1, -1]) * float(
                np.finfo(g.dtype).max) / 2
        feed[x] = a.astype(g.dtype)
    feed[C] = frng.uniform(-1, 1, C.shape).astype(g.dtype)
    feed.update(g.int_values)
    text = te.graph_str([y, loss])
    return Program(seed, g.dtype, floats, list(g.ints), C, y, loss, feed, g.smooth, finite,
                   text, g.big, reshape, near_max, g.int_arith, g.int_where, conv)


# ---- checks ------------------------------------------------------------------------


def _tol(dtype):
    return (2e-4, 1e-4) if dtype == "float32" else (1e-9, 1e-10)


def compare(got, want, dtype, what):
    """None when ``got`` matches ``want`` (same NaN and inf positions, finite values
    close at the dtype's tolerance, scaled by the largest magnitude), else a message."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return f"{what}: shape {got.shape} != {want.shape}"
    if not np.array_equal(np.isnan(got), np.isnan(want)):
        return f"{what}: NaN patterns differ:\n got  {got!r}\n want {want!r}"
    inf_g = np.where(np.isinf(got), np.sign(got), 0)
    inf_w = np.where(np.isinf(want), np.sign(want), 0)
    if not np.array_equal(inf_g, inf_w):
        return f"{what}: inf patterns differ:\n got  {got!r}\n want {want!r}"
    fin = np.isfinite(want)
    rtol, atol = _tol(dtype)
    scale = max(1.0, float(np.max(np.abs(want[fin]), initial=0.0)))
    if not np.allclose(got[fin], want[fin], rtol=rtol, atol=atol * scale):
        return f"{what}: values differ:\n got  {got!r}\n want {want!r}"
    return None


def _patterns_differ(a, b):
    """Where ``a`` and ``b`` (float64 arrays) differ in being NaN or a signed infinity."""
    return (np.isnan(a) != np.isnan(b)) | (
        np.where(np.isinf(a), np.sign(a), 0) != np.where(np.isinf(b), np.sign(b), 0))


def compare_orders(got, want, twin, dtype, what):
    """:func:`compare` for a program with an input near the dtype's largest value
    (``Program.near_max``), where a sum's partial sums can leave the range in one
    order of its terms and not in another (docs/conventions.md, "The order of a
    sum's terms"): the kernel's loop order or GEMM blocking and the evaluator's
    numpy reductions may then give an infinity or NaN on one side and a finite
    value on the other. Such an element is accepted when both sides are
    non-finite, or the finite one lies within the tolerance of ``twin``: the same
    program in float64 on the same input values (cast), where no partial sum of
    a float32 program leaves the range; for a float64 program, whose twin can
    overflow as well, where the twin is not finite the finite side must lie
    within 4096 (a term-count factor) of the largest float64. Every other
    element is compared as by :func:`compare`."""
    got, want, twin = (np.asarray(v, dtype=np.float64) for v in (got, want, twin))
    if got.shape != want.shape or twin.shape != want.shape:
        return compare(got, want, dtype, what)
    diff = _patterns_differ(got, want)
    if not diff.any():
        return compare(got, want, dtype, what)
    rtol, atol = _tol(dtype)
    fin = np.isfinite(twin)
    scale = max(1.0, float(np.max(np.abs(twin[fin]), initial=0.0)))
    finite_side = np.where(np.isfinite(got), got, want)
    with np.errstate(invalid="ignore"):
        near = np.isclose(finite_side, twin, rtol=rtol, atol=atol * scale)
    ok = diff & ((~np.isfinite(got) & ~np.isfinite(want)) | (np.isfinite(twin) & near))
    if dtype == "float64":
        # a float64 program's twin is itself: where its sum overflowed too, the
        # finite side must at least be within the term-count factor of the top
        with np.errstate(invalid="ignore"):
            high = np.abs(finite_side) >= float(np.finfo(np.float64).max) / 4096
        ok |= diff & ~np.isfinite(twin) & np.isfinite(finite_side) & high
        # a factor shared by two terms is taken out of their sum (``P * a + P * b``
        # as ``P * (a + b)``, docs/conventions.md): where ``P`` is 0 and ``a + b``
        # overflows, the simplified form is NaN where the raw terms were each 0
        # (fuzz seed 7020000198). Only a float64 program: a float32 one's twin
        # decides, its float64 sum does not overflow
        ok |= diff & np.isnan(got) & (want == 0)
    msg = compare(got, np.where(ok, got, want), dtype, what)
    if msg:
        msg += f"\n (an input near the largest {dtype}; float64 twin {twin!r})"
    return msg


def compare_either(got, want, other, dtype, what):
    """None when every element of ``got`` matches the same element of ``want`` or of
    ``other`` (as :func:`compare`: NaN and inf equal, finite values close at the
    tolerance scaled by ``want``'s largest magnitude), else a message."""
    got, want, other = (np.asarray(v, dtype=np.float64) for v in (got, want, other))
    if got.shape != want.shape:
        return f"{what}: shape {got.shape} != {want.shape}"
    rtol, atol = _tol(dtype)
    fin = np.isfinite(want)
    scale = max(1.0, float(np.max(np.abs(want[fin]), initial=0.0)))

    def same(a, b):
        with np.errstate(invalid="ignore"):
            close = np.isclose(a, b, rtol=rtol, atol=atol * scale)
        return (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b)) | (
            np.isfinite(a) & np.isfinite(b) & close)
    merged = np.where(same(got, other) & ~same(got, want), other, want)
    msg = compare(got, merged, dtype, what)
    if msg:
        msg += f"\n (raw: IEEE {want!r}, symbolic zeros {other!r})"
    return msg


class _Prepared:
    """A program with its reference results (or the OutOfBoundsError the forward raised)."""

    def __init__(self, p):
        self.p = p
        self.oob = self.refused = self.int_error = False
        try:
            self._prepare(p)
        except te.TexprError as exc:
            # (a refusal before the gradients are simplified is the simplifier's own:
            # int64-limit coefficients folded, below)
            if p.int_arith and refuses_int_value(exc) and hasattr(self, "simp"):
                # integer value arithmetic left its dtype or divided by zero: every
                # kernel must raise too (_check_kernel_int_error)
                self.int_error = True
                return
            # exact integer arithmetic refuses a program whose indices leave int64
            if not (p.big and refuses_wraparound(exc)):
                raise
            self.refused = True

    def twin64(self):
        """The forward, loss and simplified gradients of the program's float64 twin
        on this program's input values (cast to float64), as :attr:`ref_fwd_simp`
        + :attr:`ref_simp` are for the program (see :func:`compare_orders`)."""
        if getattr(self, "_twin", None) is None:
            p = self.p
            t = make_program(p.seed, dtype="float64", reshape=p.reshape, conv=p.conv)
            feed = {b: np.asarray(p.feed[a]).astype(np.float64)
                    if np.asarray(p.feed[a]).dtype.kind == "f" else p.feed[a]
                    for a, b in zip(p.inputs, t.inputs)}
            simp = list(simplify.simplify(list(te.differentiate(t.loss, t.floats,
                                                                simplify=False))))
            self._twin = te.evaluate([t.y, t.loss] + simp, feed)
        return self._twin

    def _prepare(self, p):
        self.raw = list(te.differentiate(p.loss, p.floats, simplify=False))
        self.simp = list(simplify.simplify(self.raw))
        try:
            self.ref_fwd = te.evaluate([p.y, p.loss], p.feed)
        except te.OutOfBoundsError:
            self.oob = True
            return
        self.ref_raw = te.evaluate(self.raw, p.feed)
        self.ref_simp = te.evaluate(self.simp, p.feed)
        # the kernel computes the simplified forward: with inf or NaN inputs it may
        # differ from the raw one where a select(c, v, 0) factor is a symbolic zero
        # (docs/conventions.md, "Zeros"), so the kernel is checked against the same
        # simplified graph, and raw vs simplified forward with finite inputs only
        self.ref_fwd_simp = te.evaluate(list(simplify.simplify([p.y, p.loss])), p.feed)

    @property
    def outputs(self):
        return [self.p.y, self.p.loss] + self.simp


def refuses_wraparound(exc):
    """Whether ``exc`` is texpr refusing integer arithmetic that would leave its
    dtype (the evaluator at run time, codegen at build time): a refusal, never a
    wrong value, so allowed for the programs with int64-limit coefficients."""
    return isinstance(exc, te.TexprError) and "wrap around" in str(exc)


def refuses_int_value(exc):
    """Whether ``exc`` is texpr refusing integer value arithmetic at run time: a
    result outside its dtype or a zero divisor (never a wrong value)."""
    return isinstance(exc, te.TexprError) and (
        "wrap around" in str(exc) or "division by zero" in str(exc))


def reads_through_data(tensors):
    """Whether a stage reachable from ``tensors`` loads at a data-dependent index
    (:func:`texpr.jacobian.gather_loads`) or scatters to one (a scatter whose
    condition is the constant false never runs: it reads nothing)."""
    from texpr.jacobian import gather_loads
    from texpr.simplify.graph import stage_exprs
    from texpr.tensor import ScatterAddOp, topo_order
    from texpr.visitor import loads
    from texpr import expr as E

    def never_runs(op):  # a scatter under `if false` (a structurally zero adjoint)
        return isinstance(op, ScatterAddOp) and isinstance(op.where, E.Const) \
            and op.where.value is False
    return any(not never_runs(op) and (
        gather_loads(stage_exprs(op), None)
        or (isinstance(op, ScatterAddOp) and any(loads(a) for a in op.indices)))
        for op in topo_order(list(tensors)))


def _finding(p, kind, msg):
    if p.conv:  # (make_program(seed, conv=True) replays it)
        kind += " (conv profile)"
    return Finding(p.seed, kind, msg, p.text)


def _check_reference(q, findings):
    """Raw vs simplified gradients through te.evaluate; OOB on every path or none."""
    p = q.p
    if q.oob:
        for what, ts in (("raw gradient", q.raw), ("simplified gradient", q.simp)):
            try:
                te.evaluate(ts, p.feed)
            except te.OutOfBoundsError:
                continue
            except te.TexprError as exc:
                # a program with int64-limit coefficients: the rewritten form may be
                # refused for its integer arithmetic first (a refusal, never a value;
                # long run seed 7019000429, where it escaped the harness)
                if p.big and refuses_wraparound(exc):
                    continue
                findings.append(_finding(p, "reference-error", traceback.format_exc(limit=-3)))
                continue
            if what == "simplified gradient" and not reads_through_data(ts):
                # structurally independent of every index tensor (d_X = 0 where
                # the forward's loads of X are all outside their guards): it
                # reads no index, so it can mask none (docs/conventions.md)
                continue
            findings.append(_finding(p, "oob-path", f"the forward raises OutOfBoundsError "
                                     f"but te.evaluate of the {what} does not"))
        return
    symbolic = None
    for i, (x, a, b) in enumerate(zip(p.floats, q.ref_raw, q.ref_simp)):
        what = f"simplified vs raw d{p.loss.name}/d{x.name}"
        msg = compare(b, a, p.dtype, what)
        if msg:
            # where a value is inf or NaN (an input, or an empty max's -inf inside
            # the graph) a raw zero that means "no such term" (an indicator, an
            # adjoint element no path reaches) times it is NaN, where the
            # simplified graph has no term (docs/conventions.md, "Zeros"): every
            # element must equal the raw one under IEEE or under symbolic zeros
            if symbolic is None:
                with symbolic_zero_products():
                    symbolic = te.evaluate(q.raw, p.feed)
            msg = compare_either(b, a, symbolic[i], p.dtype, what)
        if msg and p.near_max:
            # a partial sum near the largest float overflowed in one form's order
            msg = compare_orders(b, a, q.twin64()[2 + i], p.dtype, what)
        if msg:
            findings.append(_finding(p, "raw-vs-simplified", msg))
    if p.finite_inputs:
        symbolic = None
        for i, (t, a, b) in enumerate(zip((p.y, p.loss), q.ref_fwd, q.ref_fwd_simp)):
            what = f"simplified vs raw {t.name}"
            msg = compare(b, a, p.dtype, what)
            if msg:
                # finite inputs can still make an infinity (an empty min's +inf):
                # the simplifier reads a select(c, v, 0) factor as a symbolic zero
                # there too (docs/conventions.md, "Zeros"; fuzz seed 7000002969)
                if symbolic is None:
                    with symbolic_zero_products():
                        symbolic = te.evaluate([p.y, p.loss], p.feed)
                msg = compare_either(b, a, symbolic[i], p.dtype, what)
            if msg and p.near_max:
                msg = compare_orders(b, a, q.twin64()[i], p.dtype, what)
            if msg:
                findings.append(_finding(p, "raw-vs-simplified", msg))


@contextlib.contextmanager
def _patched(module, **values):
    """Builds inside run with ``module``'s attributes set to ``values`` (functions:
    the knobs are codegen Options, :func:`_options`) and the symbolic cache off
    (its lowering key cannot hold a replaced function)."""
    old = {k: getattr(module, k) for k in values}
    old_env = os.environ.get("TEXPR_SYMBOLIC_CACHE")
    for k, v in values.items():
        setattr(module, k, v)
    os.environ["TEXPR_SYMBOLIC_CACHE"] = "0"
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(module, k, v)
        if old_env is None:
            os.environ.pop("TEXPR_SYMBOLIC_CACHE", None)
        else:
            os.environ["TEXPR_SYMBOLIC_CACHE"] = old_env


def every_contraction_on_blas():
    """Builds inside run every stage that matches the contraction pattern as GEMMs
    (the cost rule of :mod:`texpr.codegen.analysis.contraction` off: fuzzed stages are far
    below its sizes), with the symbolic cache off."""
    from texpr.codegen.analysis import contraction

    return _patched(contraction, cost_ok=lambda plan: True)


def _options(**fields):
    """Builds inside run under codegen Options with these fields (the symbolic
    cache's lowering key holds their fingerprint)."""
    return codegen.options(**fields)


@contextlib.contextmanager
def _kernel_runs_under(kernel, **fields):
    """Calls of ``kernel`` inside run under its Options with these run-time fields
    (``Kernel.options``: a kernel runs under the Options it was built with)."""
    old = kernel.options
    kernel.options = old.replace(**fields)
    try:
        yield
    finally:
        kernel.options = old


def split_gemms(kernel):
    """Calls of ``kernel`` inside cut every GEMM into two parts on the worker
    threads, each a one-thread BLAS call (``gemm_threads=2``, the oversubscribed
    machine's mode), however small the GEMM, and make every packing copy in
    chunks of one index of its cut axis (``gemm_chunk_min_bytes=0``,
    ``gemm_chunk_bytes=1``: the path of large im2col copies)."""
    return _kernel_runs_under(kernel, gemm_threads=2, gemm_split_min=0,
                              gemm_chunk_min_bytes=0, gemm_chunk_bytes=1)


def every_subexpression_hoisted():
    """Builds inside run :mod:`texpr.codegen.loopnest.cse` at its smallest thresholds: every
    repeated subexpression of two or more nodes gets a temporary and every
    select of four or more an if statement of its own (fuzzed statements are
    small; the defaults would rarely touch them)."""
    return _options(cse_min_nodes=2, cse_split_nodes=4)


def sums_unrolled():
    """Builds inside run every float sum whose innermost loop has 4 or more values
    (float64: 2) on the unrolled paths of large stages (fuzzed stages have a few
    points, far below ``Options.unroll_min_points``): 2 partial sums by copies
    (float64: 1), or, for a loop LLVM's vectoriser takes, written once with
    ``_radd`` (``reassociate_min_trips`` lowered to 2)."""
    return _options(unroll_min_points=0, unroll=2, jam_unroll=2, reassociate_min_trips=2)


@contextlib.contextmanager
def hoisted_and_unrolled():
    """:func:`every_subexpression_hoisted` and :func:`sums_unrolled` together."""
    with every_subexpression_hoisted(), sums_unrolled():
        yield


#: BLAS units built by the fuzzer's kernels so far (to know the path is exercised),
#: and those also run with their GEMMs split (:func:`split_gemms`)
BLAS_UNITS = [0]
SPLIT_BLAS_UNITS = [0]
#: sum loops written once with ``_radd``, and sums unrolled into partial sums by
#: copies, in the fuzzer's kernels so far (:func:`sums_unrolled`)
REASSOCIATED_SUMS = [0]
UNROLLED_SUMS = [0]
#: packed-operand stages (:mod:`codegen.rewrite.operands`) in the fuzzer's kernels so far
PACKED_STAGES = [0]
#: window stages (codegen.rewrite.windows), taps' stages (codegen.rewrite.tap_split) and shift
#: units (codegen.analysis.shifts) in the fuzzer's kernels so far
WINDOW_STAGES = [0]
TAP_SPLITS = [0]
SHIFT_UNITS = [0]
#: shift units whose tap sum moves at a stride (a transposed convolution's)
LATTICE_UNITS = [0]
#: GEMMs run in chunks of their packing copies (:func:`split_gemms`) so far
CHUNKED_RUNS = [0]


def contraction_chunk_runs():
    """How many GEMMs this process has run in chunks (``gemm.CHUNKED``)."""
    from texpr.codegen.backends.numpy_host import gemm

    return gemm.CHUNKED[0]

#: the fewest points of a stage built as a parallel (prange) loop nest in the
#: fuzzer's "parallel" mode: fuzzed stages have 1 to a few hundred points, far
#: below ``Options.parallel_min_points`` (at 1, 47 of the 148 numba units of 32
#: programs were parallel; at 8, 23)
PARALLEL_FUZZ_MIN_POINTS = 1


def stages_parallel(min_points=None):
    """Builds inside run every stage of at least ``min_points`` points (default
    :data:`PARALLEL_FUZZ_MIN_POINTS`) as a parallel loop nest (``prange``,
    numba's ``parallel=True``), the path of large stages."""
    return _options(parallel_min_points=min_points or PARALLEL_FUZZ_MIN_POINTS,
                    parallel_points=1, parallel_min_work=0)


@contextlib.contextmanager
def serial_twins():
    """Kernel runs inside run every parallel unit's serial twin (its text with
    ``prange`` as ``range``), as in a child forked after numba's OpenMP layer
    started (:mod:`texpr.codegen.backends.numba_cpu.forksafe`)."""
    from texpr.codegen.backends.numba_cpu import forksafe

    old = forksafe.FORKED_FROM_OPENMP[0]
    forksafe.FORKED_FROM_OPENMP[0] = True
    try:
        yield
    finally:
        forksafe.FORKED_FROM_OPENMP[0] = old


def chunks_on_python_threads(kernel):
    """Calls of ``kernel`` inside run chunked units' parts on Python worker threads
    (the path without libgomp, :mod:`texpr.codegen.backends.numba_cpu.chunks`), not on
    OpenMP's team."""
    return _kernel_runs_under(kernel, chunk_runner="threads")


#: how a batch's kernel is built: the default rules, every contraction on BLAS
#: (then run twice: GEMMs in one call, and split on worker threads), every
#: repeated subexpression hoisted and float sums unrolled, stages of a few points
#: as parallel loop nests (then run twice: parallel, and the serial twins)
_MODES = {"default": contextlib.nullcontext, "blas": every_contraction_on_blas,
          "cse": hoisted_and_unrolled, "parallel": stages_parallel,
          "threads": contextlib.nullcontext}

#: kernels the fuzzer also ran from several threads at once (mode "threads"), and
#: re-entrantly: a call nested inside each unit of an outer call on the same thread
THREADED_RUNS = [0]
REENTRANT_RUNS = [0]
#: threads of a threaded run, and calls each makes
THREADS, CALLS_PER_THREAD = 3, 2


def threaded_outputs(kernel, arrays):
    """The outputs of ``THREADS * CALLS_PER_THREAD`` calls of ``kernel`` made from
    ``THREADS`` threads at once (they start together at a barrier): a list, one
    tuple of arrays (or the exception raised) per call."""
    barrier = threading.Barrier(THREADS)
    results = [None] * (THREADS * CALLS_PER_THREAD)

    def work(t):
        barrier.wait()
        for c in range(CALLS_PER_THREAD):
            try:
                results[t * CALLS_PER_THREAD + c] = kernel(*arrays)
            except Exception as exc:  # noqa: BLE001 - reported by the caller
                results[t * CALLS_PER_THREAD + c] = exc

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    THREADED_RUNS[0] += 1
    return results


def other_arrays(arrays):
    """``arrays`` with every float array changed (halved, plus a quarter), int ones
    (index lists) kept: a nested call that computes other values than the call it
    interrupts, so that shared temporaries show."""
    return [a * 0.5 + 0.25 if a.dtype.kind == "f" else a for a in arrays]


def reentrant_outputs(kernel, arrays):
    """One call of ``kernel`` on ``arrays`` in which every unit, before it runs,
    calls ``kernel`` again on the same thread (as a signal handler or a callback
    would) on :func:`other_arrays`: returns ``(outer outputs, [nested outputs, one
    per unit])``."""
    nested = []
    inner = other_arrays(arrays)
    units = list(kernel.units)
    originals = [u.run for u in units]
    depth = [0]

    def wrap(orig):
        def run(args, err):
            if depth[0] == 0:
                depth[0] += 1
                try:
                    nested.append(kernel(*inner))
                except Exception as exc:  # noqa: BLE001 - compared with a plain call's
                    nested.append(exc)
                finally:
                    depth[0] -= 1
            return orig(args, err)
        return run

    try:
        for u, orig in zip(units, originals):
            u.run = wrap(orig)
        outer = kernel(*arrays)
    finally:
        for u, orig in zip(units, originals):
            u.run = orig
    REENTRANT_RUNS[0] += 1
    return outer, nested


def _check_concurrent(p, kernel, arrays, got, findings):
    """Threaded and re-entrant runs of ``kernel`` give ``got`` (the plain call's)."""
    def check(out, how):
        if isinstance(out, Exception):
            findings.append(_finding(p, "kernel-threads", f"{how} raised "
                                     f"{type(out).__name__}: {out}"))
            return
        for k, (g, w) in enumerate(zip(out, got)):
            msg = compare(g, w, p.dtype, f"output {k}, {how} vs a plain call")
            if msg:
                findings.append(_finding(p, "kernel-threads", msg))
                return

    for c, out in enumerate(threaded_outputs(kernel, arrays)):
        check(out, f"call {c} of {THREADS} threads at once")
    try:
        outer, nested = reentrant_outputs(kernel, arrays)
    except Exception as exc:  # noqa: BLE001
        findings.append(_finding(p, "kernel-reentrant", f"{type(exc).__name__}: {exc}"))
        return
    check(outer, "the outer call of a re-entrant run")
    try:
        plain = kernel(*other_arrays(arrays))
    except Exception as exc:  # noqa: BLE001 - the nested calls must raise it too
        plain = exc
    for k, out in enumerate(nested):
        if isinstance(plain, Exception) or isinstance(out, Exception):
            if type(out) is not type(plain):
                findings.append(_finding(p, "kernel-reentrant", f"the call nested in unit "
                                         f"{k}: {out!r}, a plain call: {plain!r}"))
            continue
        for j, (g, w) in enumerate(zip(out, plain)):
            msg = compare(g, w, p.dtype, f"output {j}, the call nested in unit {k} vs a "
                          "plain call on the same arrays")
            if msg:
                findings.append(_finding(p, "kernel-reentrant", msg))
                break

#: parallel units (prange loops, or chunked: codegen.backends.numba_cpu.chunks) built by the fuzzer's
#: kernels so far, and their serial runs (twins; a chunked unit in one part)
PARALLEL_UNITS = [0]
SERIAL_TWIN_RUNS = [0]
#: kernels with chunked units also run with their parts on Python threads
CHUNKED_THREAD_RUNS = [0]


#: kernels the fuzzer also ran through the bridges' compiled driver
NATIVE_RUNS = [0]


def native_outputs(kernel, arrays):
    """The outputs of ``kernel`` run by the compiled driver of the bridges
    (:mod:`texpr.codegen.backends.numba_cpu.native_call`) on ``arrays``; None when it cannot run
    this kernel. Raises what the kernel raises."""
    from texpr.codegen.backends.numba_cpu import native_call

    run = native_call.runner(kernel)
    if run is None:
        return None
    ins = [np.ascontiguousarray(a, dtype=t.dtype) for a, t in zip(arrays, kernel.inputs)]
    outs = [np.empty(t.shape, dtype=t.dtype) for t in kernel.outputs]
    run.run([a.ctypes.data for a in ins] + [o.ctypes.data for o in outs])
    return outs


def _check_native(p, kernel, arrays, got, findings):
    """The bridges' compiled driver gives the kernel's outputs bit for bit (the
    same units on the same values)."""
    try:
        nat = native_outputs(kernel, arrays)
    except Exception:  # noqa: BLE001
        findings.append(_finding(p, "native-driver", traceback.format_exc(limit=-3)))
        return
    if nat is None:
        return
    NATIVE_RUNS[0] += 1
    for k, (a, b) in enumerate(zip(nat, got)):
        if not np.array_equal(a, b, equal_nan=True):
            findings.append(_finding(p, "native-driver", f"output {k} ({kernel.outputs[k].name})"
                                     f":\n driver {a!r}\n kernel {b!r}"))


#: kernels the fuzzer also ran as PyTorch operators (texpr.torch.op)
TORCH_RUNS = [0]


def torch_outputs(kernel, arrays, strided=False):
    """The outputs of ``kernel`` run as a ``texpr.torch.op`` of its outputs on
    ``arrays`` as CPU tensors (``strided``: every input a non-contiguous view
    of the same values, which the op makes contiguous), as numpy arrays; None
    without torch. The op's spec is given ``kernel`` (the same units: nothing
    is compiled again). Its outputs are fresh ``torch.empty`` tensors written
    through their data pointers by the compiled driver, or, for a kernel with a
    GEMM unit, numpy views of the tensors. Raises what the kernel raises."""
    try:
        import torch

        import texpr.torch as tt
    except ImportError:
        return None
    op = tt.op(list(kernel.outputs), list(kernel.inputs))
    op.spec._kernel = kernel
    xs = []
    for a in arrays:
        t = torch.from_numpy(np.array(a, copy=True))
        if strided and t.ndim:
            # the same values, every other element of a buffer twice as long
            wide = torch.empty((2,) + tuple(t.shape), dtype=t.dtype)
            wide[0] = t
            t = wide.movedim(0, -1)[..., 0]
        xs.append(t)
    with torch.no_grad():
        res = op(*xs)
    return [r.numpy() for r in (res if isinstance(res, tuple) else (res,))]


def _check_torch(p, kernel, arrays, got, findings, strided):
    """The PyTorch operator's outputs equal the kernel's, bit for bit."""
    try:
        res = torch_outputs(kernel, arrays, strided)
    except Exception:  # noqa: BLE001
        findings.append(_finding(p, "torch-op", traceback.format_exc(limit=-3)))
        return
    if res is None:
        return
    TORCH_RUNS[0] += 1
    for k, (a, b) in enumerate(zip(res, got)):
        if a.shape != b.shape or not np.array_equal(a, b, equal_nan=True):
            findings.append(_finding(p, "torch-op", f"output {k} ({kernel.outputs[k].name})"
                                     f":\n torch op {a!r}\n kernel {b!r}"))


#: the longest line of generated text a fuzzed kernel may have. Fuzzed programs are
#: small (their longest lines are a few thousand characters); a longer one is an
#: expression written out geometrically (seed 7003600271 had a 143 KB statement,
#: and numba compiled it for more than 10 minutes in 10 GB before the fix)
MAX_LINE_CHARS = 30_000


class CodeTooLarge(Exception):
    """A fuzzed kernel's generated text has a line above :data:`MAX_LINE_CHARS`."""


@contextlib.contextmanager
def code_size_bounded():
    """Builds inside raise :class:`CodeTooLarge` before compiling a program whose
    text has a line above :data:`MAX_LINE_CHARS` (so a blow-up is a finding, not
    a fuzz run stuck in numba)."""
    build_module = importlib.import_module("texpr.codegen.build")
    real = build_module._compile_kernel

    def bounded(program, inputs, outputs, *rest):
        longest = max((len(ln) for ln in program.source.splitlines()), default=0)
        if longest > MAX_LINE_CHARS:
            raise CodeTooLarge(f"a line of {longest} characters in the kernel's text "
                               f"(bound {MAX_LINE_CHARS})")
        return real(program, inputs, outputs, *rest)

    build_module._compile_kernel = bounded
    try:
        yield
    finally:
        build_module._compile_kernel = real


#: the longest a fuzzed build may take (seconds; ``$TEXPR_FUZZ_BUILD_SECONDS``).
#: Builds of a batch take 5-60 s; numba compiling a unit on which LLVM's loop
#: vectoriser went exponential (seed 7004500389: more than 20 minutes) cannot be
#: interrupted in the process, so the watchdog reports the programs and ends it.
MAX_BUILD_SECONDS = float(os.environ.get("TEXPR_FUZZ_BUILD_SECONDS") or 900)
#: the exit status of a process ended by :func:`build_time_bounded`
BUILD_TIME_EXIT = 97


@contextlib.contextmanager
def build_time_bounded(what, seconds=None):
    """Inside, a build that runs longer than ``seconds`` (default
    :data:`MAX_BUILD_SECONDS`) is a "build-time" finding: the watchdog writes
    ``fuzz finding (build-time): <what>`` to standard error and ends the process
    with status :data:`BUILD_TIME_EXIT` (numba cannot be interrupted)."""
    limit = MAX_BUILD_SECONDS if seconds is None else seconds

    def expire():
        sys.stderr.write(f"\nfuzz finding (build-time): {what}: the build ran for more "
                         f"than {limit:g} s\n")
        sys.stderr.flush()
        os._exit(BUILD_TIME_EXIT)

    timer = threading.Timer(limit, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _kernel_error(p, exc):
    kind = "code-size" if isinstance(exc, CodeTooLarge) else "kernel-error"
    return _finding(p, kind, traceback.format_exc(limit=-3))


def _check_kernel(qs, findings, mode="default"):
    """One kernel for all ``qs`` (none expecting OOB); on a build error, one per
    program. ``mode`` (a key of :data:`_MODES`): ``"blas"``, every contraction
    stage runs on BLAS (see :func:`every_contraction_on_blas`); ``"cse"``,
    codegen.loopnest.cse at its smallest thresholds and float sums unrolled
    (:func:`hoisted_and_unrolled`);
    ``"parallel"``, stages of a few points as parallel loop nests, run again
    with their serial twins (:func:`stages_parallel`, :func:`serial_twins`);
    ``"default"``, the default rules decide."""
    outs = [t for q in qs for t in q.outputs]
    ins = [t for q in qs for t in q.p.inputs]
    try:
        arrays = [q.p.feed[t] for q in qs for t in q.p.inputs]
        with _MODES[mode](), code_size_bounded(), build_time_bounded(
                f"seeds {[q.p.seed for q in qs]} in mode {mode!r}"):
            kernel = codegen.build(outs, ins)
        got = kernel(*arrays)
        n_blas = sum(1 for u in kernel.units if u.kind == "blas")
        BLAS_UNITS[0] += n_blas
        REASSOCIATED_SUMS[0] += kernel.source.count("= _radd(")
        UNROLLED_SUMS[0] += len(re.findall(r"\bacc\d+_\d+(?:_l\d+)?_p1 \+=", kernel.source))
        PACKED_STAGES[0] += sum(1 for u in kernel.units
                                if re.search(r"_packed[0-9]+$", u.stage or ""))
        WINDOW_STAGES[0] += sum(1 for u in kernel.units if (u.stage or "").endswith("_window"))
        TAP_SPLITS[0] += sum(1 for u in kernel.units if (u.stage or "").endswith("_taps"))
        SHIFT_UNITS[0] += sum(1 for u in kernel.units if u.kind == "shift")
        LATTICE_UNITS[0] += sum(1 for u in kernel.units if u.kind == "shift"
                                and u.plan.lattice)
        runs = [(got, "")]
        if n_blas:
            chunked = contraction_chunk_runs()
            with split_gemms(kernel):
                runs.append((kernel(*arrays), ", GEMMs split on worker threads"))
            SPLIT_BLAS_UNITS[0] += n_blas
            CHUNKED_RUNS[0] += contraction_chunk_runs() - chunked
        n_par = sum(1 for u in kernel.units
                    if getattr(u, "parallel", False) or getattr(u, "chunks", 0))
        PARALLEL_UNITS[0] += n_par
        if n_par:
            with serial_twins():
                runs.append((kernel(*arrays), ", parallel units' serial twins"))
            SERIAL_TWIN_RUNS[0] += n_par
        if any(getattr(u, "chunks", 0) for u in kernel.units):
            with chunks_on_python_threads(kernel):
                runs.append((kernel(*arrays), ", chunked units' parts on Python threads"))
            CHUNKED_THREAD_RUNS[0] += 1
    except Exception as exc:  # noqa: BLE001 - isolate the program at fault
        if len(qs) > 1:
            for q in qs:
                _check_kernel([q], findings, mode)
            return
        q = qs[0]
        if q.p.big and refuses_wraparound(exc):
            return
        findings.append(_kernel_error(q.p, exc))
        return
    _check_native(qs[0].p, kernel, arrays, got, findings)
    _check_torch(qs[0].p, kernel, arrays, got, findings, strided=mode == "cse")
    if mode == "threads":
        _check_concurrent(qs[0].p, kernel, arrays, got, findings)
    for run, how in runs:
        pos = 0
        for q in qs:
            p = q.p
            n = len(q.outputs)
            mine = run[pos:pos + n]
            pos += n
            wants = list(q.ref_fwd_simp) + list(q.ref_simp)
            names = [p.y.name, p.loss.name] + [f"d{p.loss.name}/d{x.name}" for x in p.floats]
            for k, (g, w, nm) in enumerate(zip(mine, wants, names)):
                msg = compare(g, w, p.dtype, f"kernel{how} vs te.evaluate of {nm}")
                if msg and p.near_max:
                    msg = compare_orders(g, w, q.twin64()[k], p.dtype,
                                         f"kernel{how} vs te.evaluate of {nm}")
                if msg:
                    findings.append(_finding(p, "kernel-vs-evaluate", msg))


def _check_kernel_oob(q, findings, mode="default"):
    p = q.p
    try:
        with _MODES[mode](), code_size_bounded(), build_time_bounded(
                f"seed {p.seed} in mode {mode!r}"):
            kernel = codegen.build(q.outputs, p.inputs)
    except te.OutOfBoundsError:
        # the build proved a load out of range (a constant index, as a custom
        # reducer's before/after stage reading `X[0 * k - 1]`): the error on
        # this path comes before the run (seed 7005300018)
        return
    except Exception as exc:  # noqa: BLE001
        if p.big and refuses_wraparound(exc):
            return
        findings.append(_kernel_error(p, exc))
        return
    arrays = [p.feed[t] for t in p.inputs]
    # the compiled driver (None: this kernel does not run in it), the PyTorch
    # operator (None: no torch), then the kernel
    for what, run in (("compiled driver", lambda: native_outputs(kernel, arrays)),
                      ("PyTorch operator", lambda: torch_outputs(kernel, arrays)),
                      ("kernel", lambda: kernel(*arrays))):
        try:
            got = run()
        except te.OutOfBoundsError:
            continue
        except Exception:  # noqa: BLE001
            findings.append(_finding(p, "oob-path", f"the {what} raised something else than "
                                     "OutOfBoundsError:\n" + traceback.format_exc(limit=-3)))
            return
        if got is None and what != "kernel":
            continue
        # the out-of-range load may lie outside the kernel's iteration domain, in
        # front of an index condition that excludes it (index_conditions_first)
        reordered = index_conditions_first(q.outputs)
        try:
            want = te.evaluate(reordered, p.feed)
        except te.TexprError:
            findings.append(_finding(p, "oob-path", "the forward raises OutOfBoundsError "
                                     f"in te.evaluate but the {what} returns values"))
            return
        for g, w in zip(got, want):
            msg = compare(g, w, p.dtype, f"{what} vs te.evaluate with index conditions first")
            if msg:
                findings.append(_finding(p, "kernel-vs-evaluate", msg))
                return


def _cannot_raise(cond):
    """Whether a condition reads no tensor and divides by no variable: it holds
    or fails at every point, never refuses (index arithmetic leaving int64 is
    the build's refusal, docs/conventions.md)."""
    from texpr import expr as E
    from texpr.visitor import contains
    return not contains(cond, lambda n: isinstance(n, (E.Load, E.Reduce)) or (
        isinstance(n, (E.FloorDiv, E.FloorMod, E.Div)) and not isinstance(n.b, E.Const)))


def index_conditions_first(graph):
    """``graph`` with each stage's where= reordered: the conjuncts that cannot
    raise (:func:`_cannot_raise`: the iteration domain a kernel's loop nest runs
    over) in front of the rest, each group in its written order.

    A kernel evaluates a where's data conditions only on that domain, while
    te.evaluate tests the conjuncts as written, so a data condition in front of
    an index condition may refuse (a zero divisor, an integer wrap, an
    out-of-range load) at points the domain excludes: ``d && ax0 < 0`` with
    ``ax0`` in [0, 1) refuses in te.evaluate and runs over an empty domain in
    the kernel (long run seed 7019000666; docs/conventions.md). Moving a
    condition that cannot raise changes no value where both forms evaluate."""
    from texpr import expr as E
    from texpr.tensor import ComputeOp, ScatterAddOp
    from texpr.simplify.graph import rebuild
    from texpr.simplify.terms import conjuncts

    def reorder(where):
        parts = conjuncts(where)
        front = [c for c in parts if _cannot_raise(c)]
        new = front + [c for c in parts if not _cannot_raise(c)]
        same = all(a is b for a, b in zip(new, parts))
        return where if same else E.all_of(new)

    def fn(op, orig, tmap):
        if isinstance(op, ComputeOp) and op.body and isinstance(op.body[0], E.Reduce):
            body = tuple(b.with_args(b.source + (reorder(b.where),)) for b in op.body)
            if all(a is b for a, b in zip(body, op.body)):
                return None
            return ComputeOp(op.name, op.axis, body, op.tag, op.attrs).outputs
        if isinstance(op, ScatterAddOp):
            where = reorder(op.where)
            if where is op.where:
                return None
            return ScatterAddOp(op.name, op.shape, op.dtypes[0], op.axis, op.indices,
                                op.value, where, op.init).outputs
        return None
    return rebuild(list(graph), fn)


#: kernels that raised where te.evaluate refused integer value arithmetic
INT_ERROR_KERNELS = [0]


def _refuses_with_ones(graph, p):
    """Whether te.evaluate of ``graph`` refuses (an out-of-range load, or integer
    arithmetic) when every integer input of ``p`` is all ones: the check behind
    accepting a build-time OutOfBoundsError for a program whose own inputs make
    te.evaluate refuse its integer arithmetic first."""
    feed = {t: np.ones_like(v) if np.asarray(v).dtype.kind in "iu" else v
            for t, v in p.feed.items()}
    try:
        te.evaluate(graph, feed)
    except te.TexprError as exc:
        return isinstance(exc, te.OutOfBoundsError) or refuses_int_value(exc)
    return False


def _check_build_refuses(q, findings, mode):
    """The build of a program whose simplified forward the simplifier refuses
    (integer arithmetic that would wrap around) refuses the same way."""
    p = q.p
    try:
        with _MODES[mode](), code_size_bounded(), build_time_bounded(
                f"seed {p.seed} in mode {mode!r}"):
            codegen.build(q.outputs, p.inputs)
    except te.TexprError as exc:
        if refuses_wraparound(exc):
            return
        findings.append(_kernel_error(p, exc))
        return
    except Exception as exc:  # noqa: BLE001
        findings.append(_kernel_error(p, exc))
        return
    findings.append(_finding(p, "int-value", "the simplifier refuses the forward's "
                             "integer arithmetic but the build succeeds"))


def _check_kernel_int_error(q, findings, mode="default"):
    """A program whose integer value arithmetic te.evaluate refuses somewhere: the
    kernel (built alone) raises where te.evaluate of the graph it computes (the
    simplified forward and gradients) raises, a refusal too (the integer
    arithmetic's, or an out-of-range gather's: which check fails first may
    differ), and equals it elsewhere (the simplifier may have removed the
    refused operation)."""
    p = q.p
    try:
        graph = list(simplify.simplify([p.y, p.loss])) + list(q.simp)
    except te.TexprError as exc:
        # int64-limit coefficients the simplifier folds into a constant outside
        # int64 (a refusal, never a value; seed 7022002120: `(2*ax0 + 3) * -2**62`
        # at ax0 = 0 behind te.evaluate's own int32 refusal): the build refuses too
        if not (p.big and refuses_wraparound(exc)):
            findings.append(_finding(p, "reference-error", traceback.format_exc(limit=-3)))
            return
        _check_build_refuses(q, findings, mode)
        return
    try:
        want = te.evaluate(graph, p.feed)
    except te.TexprError as exc:
        # a refusal; with an out-of-range gather too, the graph's first failing
        # check may be that one (seed 7009300398): either refusal, on every path
        if not (refuses_int_value(exc) or isinstance(exc, te.OutOfBoundsError)):
            findings.append(_finding(p, "reference-error", traceback.format_exc(limit=-3)))
            return
        want = None
    arrays = [p.feed[t] for t in p.inputs]
    try:
        with _MODES[mode](), code_size_bounded(), build_time_bounded(
                f"seed {p.seed} in mode {mode!r}"):
            kernel = codegen.build(q.outputs, p.inputs)
    except te.OutOfBoundsError as exc:
        # the build proved a load out of range for every input: te.evaluate met
        # the integer refusal first (seed 7013001999). Sound only if the graph
        # refuses also on inputs that pass its integer arithmetic (all ones)
        if want is not None or not _refuses_with_ones(graph, p):
            findings.append(_kernel_error(p, exc))
        return
    except Exception as exc:  # noqa: BLE001
        findings.append(_kernel_error(p, exc))
        return
    try:
        got = kernel(*arrays)
    except te.TexprError as exc:
        INT_ERROR_KERNELS[0] += want is None
        if want is not None or not (refuses_int_value(exc)
                                    or isinstance(exc, te.OutOfBoundsError)):
            findings.append(_finding(p, "int-value", "the kernel raised where te.evaluate "
                                     "did not, or something else:\n"
                                     + traceback.format_exc(limit=-3)))
        return
    if want is None:
        # the refusal may lie outside the kernel's iteration domain, in front of
        # an index condition that excludes it (index_conditions_first)
        reordered = index_conditions_first(graph)
        try:
            want = te.evaluate(reordered, p.feed)
        except te.TexprError:
            findings.append(_finding(p, "int-value", "te.evaluate refuses the integer "
                                     "arithmetic but the kernel returns values"))
            return
    names = [p.y.name, p.loss.name] + [f"d{p.loss.name}/d{x.name}" for x in p.floats]
    for g, w, nm in zip(got, want, names):
        msg = compare(g, w, p.dtype, f"kernel vs te.evaluate of {nm}")
        if msg:
            findings.append(_finding(p, "kernel-vs-evaluate", msg))


def _check_fd(q, findings):
    """Raw gradients of the float64 twin against central finite differences."""
    p = make_program(q.p.seed, dtype="float64", reshape=q.p.reshape, conv=q.p.conv)
    raw = te.differentiate(p.loss, p.floats, simplify=False).result
    got = te.evaluate(list(raw), p.feed)
    for x, g in zip(p.floats, got):
        fd = numeric_gradient(p.loss, x, p.feed)
        if not np.allclose(g, fd, rtol=1e-5, atol=1e-6):
            findings.append(_finding(p, "gradient-vs-fd",
                                     f"d{p.loss.name}/d{x.name}:\n got {g!r}\n fd  {fd!r}"))


#: the build modes batches take turns in (keys of :data:`_MODES`)
MODES = ("blas", "cse", "default", "parallel")


def _guarded(findings, programs, check, *args):
    """Run ``check(*args)``; an exception escaping it (the harness's own gap, or a
    library error no check expected) becomes a "check-error" finding for each of
    ``programs`` instead of ending the run (the long run on 634af09 lost the rest
    of a chunk of 100 to one, seed 7022002120)."""
    try:
        check(*args)
    except Exception:  # noqa: BLE001
        tb = traceback.format_exc(limit=-6)
        for p in programs:
            findings.append(_finding(p, "check-error", f"{check.__name__}:\n{tb}"))


def check_programs(seeds, batch=8, fd=True, compile_every=1, log=None, reshape=True,
                   modes=MODES, conv=False):
    """Run every check on the programs of ``seeds``; returns the list of findings.

    Programs are compiled ``batch`` at a time into one kernel (one numba compile
    for many programs); a program whose forward raises OutOfBoundsError is
    built alone and must raise it too. Only every ``compile_every``-th program
    (by position) is compiled (none for 0); the rest get the evaluator checks only.
    Batches take turns in ``modes`` (keys of :data:`_MODES`), from the second:
    codegen.loopnest.cse at its smallest thresholds, the default rules (loop nests at
    these sizes), stages of a few points as parallel loop nests (run again
    with their serial twins), every contraction stage on BLAS (also the last
    batch when ``modes`` has it; its kernel runs twice, GEMMs in one call and
    split on worker threads); a program expecting OutOfBoundsError is built
    alone in the modes other than BLAS, in turn (the first failing check must
    still be an OutOfBoundsError). ``reshape``, ``conv``: as for :func:`make_program`.
    """
    modes = tuple(modes)
    unknown = [m for m in modes if m not in _MODES]
    if not modes or unknown:
        raise ValueError(f"modes: expected some of {sorted(_MODES)}, got {modes!r}")
    oob_modes = tuple(m for m in modes if m != "blas") or ("default",)
    last = "blas" if "blas" in modes else modes[0]
    oob_built = int_built = 0
    findings = []
    ready = []
    batches = 0
    for pos, s in enumerate(seeds):
        compiled = bool(compile_every) and pos % compile_every == 0
        if log is not None:
            log(f"program {pos}: seed {s}, {len(findings)} finding(s) so far", findings)
        try:
            p = make_program(s, reshape=reshape, conv=conv)
        except Exception:  # noqa: BLE001 - the generator should never fail
            findings.append(Finding(s, "generator", traceback.format_exc(limit=-3), ""))
            continue
        try:
            q = _Prepared(p)
        except Exception:  # noqa: BLE001
            findings.append(_finding(p, "reference-error", traceback.format_exc(limit=-3)))
            continue
        if q.refused:
            continue
        if q.int_error:
            if compiled:  # (every mode: the GEMM path evaluates conditions itself)
                _guarded(findings, [p], _check_kernel_int_error, q, findings,
                         modes[int_built % len(modes)])
                int_built += 1
            continue
        _guarded(findings, [p], _check_reference, q, findings)
        if q.oob:
            if compiled:
                _guarded(findings, [p], _check_kernel_oob, q, findings,
                         oob_modes[oob_built % len(oob_modes)])
                oob_built += 1
            continue
        if fd and p.smooth and p.finite_inputs and np.all(np.isfinite(q.ref_fwd[1])):
            _guarded(findings, [p], _check_fd, q, findings)
        if compiled:
            ready.append(q)
        if len(ready) == batch:
            batches += 1
            _guarded(findings, [r.p for r in ready], _check_kernel, ready, findings,
                     modes[batches % len(modes)])
            ready = []
    if ready:
        _guarded(findings, [r.p for r in ready], _check_kernel, ready, findings, last)
    if log is not None:
        log(f"done: {len(findings)} finding(s)", findings)
    return findings


# ---- extreme extents: size-1 and empty axes, huge strides, paddings and dilations ----

#: per axis of an extreme convolution: strides, paddings, dilations drawn from
EXTREME_STRIDES = (1, 2, 7, 10**5, 10**6)
EXTREME_PADDINGS = (0, 1, 50, 600, 10**5, 10**6)
EXTREME_DILATIONS = (1, 2, 3, 40)
#: an extreme program's outputs stay this small (its te.evaluate is the oracle)
EXTREME_MAX_OUTPUT = 20_000


@dataclasses.dataclass
class ExtremeProgram:
    """A convolution with extreme extents, its loss and gradients (float64)."""

    seed: int
    params: dict
    inputs: list
    outputs: list
    feed: dict

    @property
    def text(self):
        return f"conv2d {self.params}"


def make_extreme_program(seed):
    """The extreme-extent program of ``seed``: ``y = conv2d(X, W, **params)`` with a
    batch or channels of 0 or 1, inputs of 1 to 6 pixels, kernels of 1 to 3 taps,
    and strides, paddings and dilations up to 10**6 per axis (drawn again until
    the output has at most :data:`EXTREME_MAX_OUTPUT` elements), then
    ``L = sum(H * y)`` and ``dL/dX``, ``dL/dW``."""
    g = random.Random(seed)
    nn = te.nn
    while True:
        n, cin, cout = g.choice((0, 1, 2)), g.choice((1, 2)), g.choice((0, 1, 3))
        h, w = g.choice((1, 2, 5)), g.choice((1, 3, 6))
        kh, kw = g.choice((1, 2, 3)), g.choice((1, 2, 3))
        st = (g.choice(EXTREME_STRIDES), g.choice(EXTREME_STRIDES))
        pad = (g.choice(EXTREME_PADDINGS), g.choice(EXTREME_PADDINGS))
        dil = (g.choice(EXTREME_DILATIONS), g.choice(EXTREME_DILATIONS))
        out = []
        for size, k, s, p, d in zip((h, w), (kh, kw), st, pad, dil):
            span = size + 2 * p - d * (k - 1)
            out.append((span - 1) // s + 1 if span >= 1 else 0)
        if min(out) >= 1 and n * cout * out[0] * out[1] <= EXTREME_MAX_OUTPUT \
                and cin * kh * kw * max(n, 1) * max(cout, 1) * out[0] * out[1] <= 10**6:
            break
    params = dict(stride=st, padding=pad, dilation=dil)
    X = te.placeholder((n, cin, h, w), "X", "float64")
    W = te.placeholder((cout, cin, kh, kw), "W", "float64")
    y = nn.conv2d(X, W, name="conv", **params)
    H = te.placeholder(y.shape, "H", "float64")
    ax = [te.reduce_axis(s, a) for s, a in zip(y.shape, "ncij")]
    L = te.compute((), lambda: te.sum(y[tuple(ax)] * H[tuple(ax)], axis=ax), name="L")
    grads = list(te.differentiate(L, [X, W]).result)
    rng = np.random.default_rng(seed % 2**32)
    feed = {t: rng.standard_normal(t.shape) for t in (X, W, H)}
    return ExtremeProgram(seed, params, [X, W, H], [y, L] + grads, feed)


def check_extreme_programs(seeds, modes=("default", "blas"), batch=4):
    """Kernels of the extreme programs of ``seeds`` (``batch`` programs a kernel,
    taking turns in ``modes``; "threads" also runs each kernel from threads at once
    and re-entrantly) against ``te.evaluate``; returns the findings."""
    findings = []
    progs = []
    for s in seeds:
        try:
            progs.append(make_extreme_program(s))
        except Exception:  # noqa: BLE001 - a refusal of a valid program is a finding
            findings.append(Finding(s, "extreme-generator", traceback.format_exc(limit=-3), ""))
    for b in range(0, len(progs), batch):
        group = progs[b:b + batch]
        mode = modes[(b // batch) % len(modes)]
        _check_extreme(group, mode, findings)
    return findings


def _check_extreme(group, mode, findings):
    outs = [t for p in group for t in p.outputs]
    ins = [t for p in group for t in p.inputs]
    arrays = [p.feed[t] for p in group for t in p.inputs]
    try:
        with _MODES[mode](), build_time_bounded(
                f"extreme seeds {[p.seed for p in group]} in mode {mode!r}"):
            kernel = codegen.build(outs, ins)
        got = kernel(*arrays)
    except Exception as exc:  # noqa: BLE001 - isolate the program at fault
        if len(group) > 1:
            for p in group:
                _check_extreme([p], mode, findings)
            return
        p = group[0]
        findings.append(Finding(p.seed, "extreme-kernel-error",
                                f"mode {mode}: {type(exc).__name__}: {exc}", p.text))
        return
    pos = 0
    for p in group:
        want = te.evaluate(p.outputs, p.feed)
        mine = got[pos:pos + len(p.outputs)]
        pos += len(p.outputs)
        for k, (g, w) in enumerate(zip(mine, want)):
            msg = compare(g, w, "float64", f"mode {mode}: output {k} vs te.evaluate")
            if msg:
                findings.append(Finding(p.seed, "extreme-kernel-vs-evaluate", msg, p.text))
    if mode == "threads":
        _check_concurrent(_ExtremeAsProgram(group[0]), kernel, arrays, got, findings)


class _ExtremeAsProgram:
    """What :func:`_finding` reads of a program, for an extreme one."""

    def __init__(self, p):
        self.seed, self.dtype, self.text, self.conv = p.seed, "float64", p.text, False
