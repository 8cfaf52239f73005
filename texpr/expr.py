"""Scalar and index expression nodes: immutable and interned.

Every node has two fields that say everything about it:

* ``args`` -- the tuple of child expressions (what passes rewrite), and
* ``attr`` -- the hashable payload that is not an expression (a constant's
  value, a variable's identity, an intrinsic's name, a load's tensor, ...),

plus its ``dtype`` (derived at construction). Nodes are hash-consed: building
the same kind with the same ``attr`` and the same (identical) children twice
returns the same object, so structural equality *is* identity (``a is b``).
Python's ``==`` on expressions builds an :class:`EQ` node (as in TVM); use
``is`` or :meth:`Expr.same_as` to compare nodes.

What each kind's fields hold:

=============  ===========================================  =========================
kind           attr                                         args
=============  ===========================================  =========================
Const          the Python value (int, float or bool)        ()
Var            (name, uid)                                  ()
IterVar        (name, uid, (lo, hi), kind)                  ()
Add ... Max    None                                         (a, b)
EQ ... GE      None                                         (a, b)
And, Or        None                                         (a, b)
Not            None                                         (a,)
Select         None                                         (cond, true_value, false_value)
Cast           target dtype                                 (value,)
Call           intrinsic name                               (arg, ...)
Load           the Tensor read                              (index, ...)
Reduce         (combiner, axes, value_index)                (source, ..., where)
=============  ===========================================  =========================
"""

import itertools
import math
import weakref

import numpy as np

from . import dtypes as dt
from .errors import ConcretizationError, DTypeError, ShapeError, TexprError

#: the interning table: key -> the live node. A key holds no object, only ids and plain
#: values (see _key_of): the node holds its children, its tensor and its combiner, so
#: while it lives their ids are theirs; when it dies its entry goes with it
_INTERN = weakref.WeakValueDictionary()
_UID = itertools.count()


# ---- what this module calls in the modules above it, installed by them ----------------
#
# Printing a node is texpr.printer's job, the errors of the Python protocols that
# need a value are texpr.habits' (they print expressions and know tensors), and the
# built-in reducers' combiners are texpr.reduction's. Those modules build on this
# one, so it imports none of them: each installs what is needed here when it is
# imported (texpr's package face imports all three, and importing any texpr module
# runs the face first).


class _Installed:
    #: ``expr_str(e)``, the text of a node (``repr(e)``): :mod:`texpr.printer`
    expr_str = None
    #: the module building the errors of ``float(e)``, ``bool(e)``, ``np.exp(e)``, ...:
    #: :mod:`texpr.habits`
    habits = None


#: kind (``"sum"``, ...) -> ``combiner(dtypes)``, the shared :class:`Combiner` of a
#: built-in reducer (pickling loads the local one): filled by :mod:`texpr.reduction`
BUILTIN_COMBINERS = {}


def install_printer(expr_str):
    """Make ``repr(e)`` of every node ``expr_str(e)`` (called by :mod:`texpr.printer`).

    Args:
        expr_str: function Expr -> str.
    """
    _Installed.expr_str = expr_str


def install_habits(habits):
    """Make the Python protocols that need a value raise the errors ``habits`` builds
    (called by :mod:`texpr.habits` with itself).

    Args:
        habits: an object with ``no_float``, ``no_int``, ``no_complex``,
            ``no_index``, ``no_bool``, ``array_ufunc`` and ``array_function``.
    """
    _Installed.habits = habits


def _key_of(cls, attr, args, dtype):
    """The interning key of a node: its kind, its ``attr`` with every object in it (a
    load's tensor, a reduction's combiner and axes) replaced by its id, its children's
    ids and its dtype.

    A key that held the tensor itself kept it, its operation and everything that
    operation reads alive after the graph was dropped, until the loads over it had
    been collected and their entries removed: one collection freed one layer of a
    graph, so dropped graphs piled up (issue 52)."""
    if cls is Const:
        # keep 0.0 and -0.0, 1 and 1.0 and True apart
        attr = (type(attr).__name__, repr(attr))
    elif cls is Load:
        attr = id(attr)
    elif cls is Reduce:
        combiner, axes, value_index = attr
        attr = (id(combiner), tuple(id(a) for a in axes), value_index)
    return (cls, attr, tuple(id(a) for a in args), dtype)


class NeedsValue:
    """Python protocols that need a concrete value (``float(e)``, ``math.exp(e)``,
    ``range(e)``, ``np.exp(e)``): each raises a ConcretizationError naming the
    texpr spelling (built by :mod:`texpr.habits`, see :func:`install_habits`).
    Shared by :class:`Expr` and :class:`texpr.tensor.Tensor`."""

    __slots__ = ()

    def _scalar(self):
        """This value as a scalar expression (:func:`as_expr` of a non-Expr calls it:
        a Tensor reads its only element)."""
        raise NotImplementedError

    def __float__(self):
        raise _Installed.habits.no_float(self)

    def __int__(self):
        raise _Installed.habits.no_int(self)

    def __complex__(self):
        raise _Installed.habits.no_complex(self)

    def __index__(self):
        raise _Installed.habits.no_index(self)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        out = _Installed.habits.array_ufunc(self, ufunc, method, inputs, kwargs)
        if isinstance(out, Exception):
            raise out
        return out

    def __array_function__(self, func, types, args, kwargs):
        raise _Installed.habits.array_function(self, func)


class Expr(NeedsValue):
    """Base class of all expression nodes (see the module docstring for fields)."""

    __slots__ = ("args", "attr", "dtype", "__weakref__")

    def __new__(cls, *a, **k):  # pragma: no cover - construction goes through _make
        raise TypeError(f"build {cls.__name__} nodes with the texpr API, not directly")

    @classmethod
    def _make(cls, attr, args, dtype):
        key = _key_of(cls, attr, args, dtype)
        node = _INTERN.get(key)
        if node is None:
            node = object.__new__(cls)
            object.__setattr__(node, "args", tuple(args))
            object.__setattr__(node, "attr", attr)
            object.__setattr__(node, "dtype", dtype)
            _INTERN[key] = node
        return node

    def __setattr__(self, name, value):
        raise AttributeError("texpr expressions are immutable")

    def __reduce__(self):
        # pickle rebuilds through the interning constructor (see _unpickle_node)
        return (_unpickle_node, (type(self), self.attr, self.args, self.dtype))

    def with_args(self, args):
        """The same kind of node with new children (interned)."""
        args = tuple(args)
        if all(x is y for x, y in zip(args, self.args)) and len(args) == len(self.args):
            return self
        return type(self)._rebuild(self.attr, args)

    @classmethod
    def _rebuild(cls, attr, args):
        return cls._make(attr, args, cls._infer_dtype(attr, args))

    def same_as(self, other):
        return self is other

    def __hash__(self):
        return object.__hash__(self)

    # ---- Python protocols that need a value (see texpr.habits) -------------------
    def __bool__(self):
        raise _Installed.habits.no_bool(self)

    def __round__(self, ndigits=None):
        if ndigits is not None:
            raise ConcretizationError(
                f"round(`{self!r}`, {ndigits!r}): te.round takes no digits; write "
                f"te.round(x * 10**{ndigits}) / 10**{ndigits}")
        return call("round", self)

    def __floor__(self): return call("floor", self)
    def __ceil__(self): return call("ceil", self)
    def __trunc__(self): return call("trunc", self)

    def __repr__(self):
        return _Installed.expr_str(self)

    # ---- operator overloading -------------------------------------------------
    def __add__(self, o): return add(self, o)
    def __radd__(self, o): return add(o, self)
    def __sub__(self, o): return sub(self, o)
    def __rsub__(self, o): return sub(o, self)
    def __mul__(self, o): return mul(self, o)
    def __rmul__(self, o): return mul(o, self)
    def __truediv__(self, o): return div(self, o)
    def __rtruediv__(self, o): return div(o, self)
    def __floordiv__(self, o): return floordiv(self, o)
    def __rfloordiv__(self, o): return floordiv(o, self)
    def __mod__(self, o): return floormod(self, o)
    def __rmod__(self, o): return floormod(o, self)
    def __pow__(self, o): return call("power", self, o)
    def __rpow__(self, o): return call("power", o, self)
    def __neg__(self): return sub(const(0, self.dtype), self)
    def __pos__(self): return self
    def __abs__(self): return call("abs", self)
    def __lt__(self, o): return _cmp(LT, self, o)
    def __le__(self, o): return _cmp(LE, self, o)
    def __gt__(self, o): return _cmp(GT, self, o)
    def __ge__(self, o): return _cmp(GE, self, o)
    def __eq__(self, o): return _cmp(EQ, self, o)
    def __ne__(self, o): return _cmp(NE, self, o)
    def __invert__(self): return logical_not(self)
    def __and__(self, o): return logical_and(self, o)
    def __rand__(self, o): return logical_and(o, self)
    def __or__(self, o): return logical_or(self, o)
    def __ror__(self, o): return logical_or(o, self)


# ---- leaves ---------------------------------------------------------------------


class Const(Expr):
    """A constant. ``attr`` is the Python value (int, float or bool)."""

    __slots__ = ()

    @property
    def value(self):
        return self.attr


class Var(Expr):
    """A scalar variable with its own identity. ``attr`` is ``(name, uid)``."""

    __slots__ = ()

    def __reduce__(self):
        # a loaded variable gets a fresh uid: the uid of the pickling process could
        # name another variable here (see _unpickle_var)
        return (_unpickle_var, (type(self), self.attr, self.dtype))

    @property
    def name(self):
        return self.attr[0]


class IterVar(Var):
    """An index variable bound to a range: a compute's axis or a reduction axis.

    ``attr`` is ``(name, uid, (lo, hi), kind)``: the variable runs over
    ``lo <= v < hi``; ``kind`` is ``"spatial"`` (an output axis) or ``"reduce"``.
    """

    __slots__ = ()

    @property
    def dom(self):
        return self.attr[2]

    @property
    def kind(self):
        return self.attr[3]

    @property
    def extent(self):
        return self.attr[2][1] - self.attr[2][0]


def const(value, dtype=None):
    """A constant node; ``dtype`` defaults to the weak dtype of the Python value."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if not isinstance(value, (bool, int, float, np.number, np.bool_)):
        raise DTypeError(f"constant {value!r}: expected a number (a Python or numpy scalar), "
                         f"got {type(value).__name__}")
    dtype = dt.scalar_dtype(value) if dtype is None else dt.normalize(dtype)
    try:
        if dtype == "bool":
            value = bool(value)
        elif dt.is_int(dtype):
            if isinstance(value, (float, np.floating)) and not float(value).is_integer():
                raise DTypeError(f"constant {value!r} is not an integer but dtype {dtype} was asked")
            value = int(value)
        else:
            value = float(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise DTypeError(f"constant {value!r}: expected a number (a Python or numpy scalar) "
                         f"of dtype {dtype}") from exc
    if dt.is_int(dtype):
        info = np.iinfo(np.dtype(dtype))
        if not info.min <= value <= info.max:
            raise DTypeError(f"the integer constant {value} does not fit {dtype} "
                             f"([{info.min}, {info.max}]); index arithmetic is int64")
    return Const._make(value, (), dtype)


def var(name="v", dtype=dt.INDEX_DTYPE):
    """A fresh scalar variable (distinct from every other, whatever its name)."""
    return Var._make((str(name), next(_UID)), (), dt.normalize(dtype))


def iter_var(lo, hi, name, kind):
    """A fresh :class:`IterVar` over ``lo <= v < hi`` (``kind``: spatial or reduce)."""
    return IterVar._make((str(name), next(_UID), (int(lo), int(hi)), kind), (), dt.INDEX_DTYPE)


def as_expr(value, like=None):
    """Convert a Python scalar (weakly typed next to dtype ``like``) or Expr to an Expr."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, NeedsValue):  # a Tensor
        return value._scalar()
    if isinstance(value, (bool, int, float, np.number, np.bool_)):
        return const(value, dt.scalar_dtype(value, like))
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return as_expr(value[()], like)
    if isinstance(value, np.ndarray):
        raise TexprError(
            f"a numpy array of shape {value.shape} was used in a texpr expression; data "
            "enters a graph as a te.placeholder (fed to te.evaluate or a kernel) and is read "
            "by indexing it inside te.compute")
    raise TexprError(
        f"expected a texpr expression or a number, got {type(value).__name__}: {value!r}"
    )


# ---- arithmetic -------------------------------------------------------------------


class BinaryOp(Expr):
    """``a op b`` for arithmetic ops; dtype promotes like numpy."""

    __slots__ = ()

    @property
    def a(self):
        return self.args[0]

    @property
    def b(self):
        return self.args[1]

    @classmethod
    def _infer_dtype(cls, attr, args):
        return dt.promote(args[0].dtype, args[1].dtype)


class Add(BinaryOp):
    """``a + b``."""

    __slots__ = ()


class Sub(BinaryOp):
    """``a - b``."""

    __slots__ = ()


class Mul(BinaryOp):
    """``a * b``."""

    __slots__ = ()


class Div(BinaryOp):
    """True division; integer operands give ``float32`` (use ``//`` for floor division)."""

    __slots__ = ()

    @classmethod
    def _infer_dtype(cls, attr, args):
        d = dt.promote(args[0].dtype, args[1].dtype)
        return d if dt.is_float(d) else dt.DEFAULT_FLOAT


class FloorDiv(BinaryOp):
    """Floor division with Python semantics (rounds toward -inf)."""

    __slots__ = ()


class FloorMod(BinaryOp):
    """Floor modulo with Python semantics (result has the divisor's sign)."""

    __slots__ = ()


class Min(BinaryOp):
    """Elementwise minimum of two expressions."""

    __slots__ = ()


class Max(BinaryOp):
    """Elementwise maximum of two expressions."""

    __slots__ = ()


class CmpOp(BinaryOp):
    """A comparison; dtype ``bool``."""

    __slots__ = ()

    @classmethod
    def _infer_dtype(cls, attr, args):
        return "bool"


class EQ(CmpOp):
    """``a == b``."""

    __slots__ = ()


class NE(CmpOp):
    """``a != b``."""

    __slots__ = ()


class LT(CmpOp):
    """``a < b``."""

    __slots__ = ()


class LE(CmpOp):
    """``a <= b``."""

    __slots__ = ()


class GT(CmpOp):
    """``a > b``."""

    __slots__ = ()


class GE(CmpOp):
    """``a >= b``."""

    __slots__ = ()


class And(BinaryOp):
    """Logical and; the right operand is only evaluated where the left holds."""

    __slots__ = ()

    @classmethod
    def _infer_dtype(cls, attr, args):
        return "bool"


class Or(BinaryOp):
    """Logical or; the right operand is only evaluated where the left fails."""

    __slots__ = ()

    @classmethod
    def _infer_dtype(cls, attr, args):
        return "bool"


class Not(Expr):
    """Logical negation (``~cond``)."""

    __slots__ = ()

    @property
    def a(self):
        return self.args[0]

    @classmethod
    def _infer_dtype(cls, attr, args):
        return "bool"


class Select(Expr):
    """``cond ? true_value : false_value``; only the taken branch is evaluated."""

    __slots__ = ()

    @property
    def cond(self):
        return self.args[0]

    @property
    def true_value(self):
        return self.args[1]

    @property
    def false_value(self):
        return self.args[2]

    @classmethod
    def _infer_dtype(cls, attr, args):
        return dt.promote(args[1].dtype, args[2].dtype)


class Cast(Expr):
    """Conversion to ``attr`` (a dtype name); float to int truncates toward zero."""

    __slots__ = ()

    @property
    def value(self):
        return self.args[0]

    @classmethod
    def _infer_dtype(cls, attr, args):
        return attr


#: intrinsic name -> number of arguments
INTRINSICS = {
    "exp": 1, "log": 1, "sqrt": 1, "rsqrt": 1, "tanh": 1, "sigmoid": 1, "abs": 1,
    "power": 2, "floor": 1, "ceil": 1, "round": 1, "trunc": 1, "sin": 1, "cos": 1,
    "erf": 1, "stop_gradient": 1,
}
#: intrinsics that keep integer dtypes (the rest compute in floating point)
INT_PRESERVING = ("abs", "stop_gradient")


class Call(Expr):
    """An intrinsic function call; ``attr`` is its name (see :data:`INTRINSICS`)."""

    __slots__ = ()

    @property
    def name(self):
        return self.attr

    @classmethod
    def _infer_dtype(cls, attr, args):
        d = args[0].dtype
        for x in args[1:]:
            d = dt.promote(d, x.dtype)
        if attr in INT_PRESERVING and dt.is_int(d):
            return d
        return d if dt.is_float(d) else dt.DEFAULT_FLOAT


class Load(Expr):
    """``tensor[indices]``; ``attr`` is the Tensor, ``args`` the integer indices."""

    __slots__ = ()

    @property
    def tensor(self):
        return self.attr

    @property
    def indices(self):
        return self.args

    @classmethod
    def _infer_dtype(cls, attr, args):
        return attr.dtype


class Reduce(Expr):
    """A commutative reduction over ``axes`` of ``source`` where ``where`` holds.

    ``attr`` is ``(combiner, axes, value_index)``: the :class:`Combiner`, the
    tuple of reduction :class:`IterVar` s, and which component of a tuple
    reduction this node is. ``args`` is ``(*source, where)`` (``source`` has one
    entry per component of the combiner).
    """

    __slots__ = ()

    @property
    def combiner(self):
        return self.attr[0]

    @property
    def axes(self):
        return self.attr[1]

    @property
    def value_index(self):
        return self.attr[2]

    @property
    def source(self):
        return self.args[:-1]

    @property
    def where(self):
        return self.args[-1]

    @classmethod
    def _infer_dtype(cls, attr, args):
        return args[attr[2]].dtype


class Combiner:
    """A commutative reducer instantiated at concrete dtypes.

    ``lhs`` and ``rhs`` are tuples of :class:`Var` (the accumulator and the new
    element), ``result`` the tuple of combined expressions over them, and
    ``identity`` the tuple of identity constants. ``kind`` is ``"sum"``,
    ``"prod"``, ``"max"``, ``"min"`` for the built-in reducers and ``"custom"``
    otherwise. ``order_free``: the result does not depend on the order in which
    the points are combined (beyond rounding), as for the argmax reducers that
    break ties by the index; a custom reducer without it sees its points in
    row-major order of the reduction axes on every path. Compared by identity.
    """

    __slots__ = ("name", "kind", "lhs", "rhs", "result", "identity", "order_free",
                 "__weakref__")

    def __init__(self, name, kind, lhs, rhs, result, identity, order_free=False):
        self.name, self.kind = name, kind
        self.lhs, self.rhs = tuple(lhs), tuple(rhs)
        self.result, self.identity = tuple(result), tuple(identity)
        self.order_free = bool(order_free)

    @property
    def dtypes(self):
        return tuple(v.dtype for v in self.lhs)

    def __repr__(self):
        return f"Combiner({self.name})"

    def __reduce__(self):
        if self.kind != "custom":
            # the built-in reducers' combiners are shared: load the local one
            return (_builtin_combiner, (self.kind, self.dtypes))
        return (Combiner, (self.name, self.kind, self.lhs, self.rhs, self.result,
                           self.identity, self.order_free))


# ---- pickling -------------------------------------------------------------------------
#
# Nodes are interned, so a pickled node is rebuilt through ``_make``: a loaded
# expression is identical to the same expression built here (constants and
# nodes over the same children re-intern). Variables are identities: each one
# loaded gets a fresh uid (pickle's memo keeps the sharing within one
# ``dumps``), so a loaded graph is a copy that shares no variable with graphs
# built in this process. Pickle tensors that belong together in one call.


def _unpickle_node(cls, attr, args, dtype):
    return cls._make(attr, args, dtype)


def _unpickle_var(cls, attr, dtype):
    return cls._make((attr[0], next(_UID)) + tuple(attr[2:]), (), dtype)


def _builtin_combiner(kind, dtypes):
    return BUILTIN_COMBINERS[kind](dtypes)


# ---- smart constructors (light constant folding only) ------------------------


def _is_const(e, value=None):
    return isinstance(e, Const) and (value is None or e.value == value)


def _binary(cls, a, b):
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        a = as_expr(a)
    a = as_expr(a, like=b.dtype if isinstance(b, Expr) else None)
    b = as_expr(b, like=a.dtype)
    return a, b


def _fold(cls, a, b):
    """Fold two constants with numpy semantics; None when not foldable."""
    if not (isinstance(a, Const) and isinstance(b, Const)):
        return None
    d = cls._infer_dtype(None, (a, b))
    x, y = a.value, b.value
    try:
        if cls is Add: r = x + y
        elif cls is Sub: r = x - y
        elif cls is Mul: r = x * y
        elif cls is Div:
            if y == 0:
                return None
            r = x / y
        elif cls is FloorDiv:
            if y == 0:
                return None
            r = x // y if not dt.is_float(d) else math.floor(x / y)
        elif cls is FloorMod:
            if y == 0:
                return None
            r = x % y
        elif cls is Min: r = min(x, y)
        elif cls is Max: r = max(x, y)
        elif cls is EQ: r = x == y
        elif cls is NE: r = x != y
        elif cls is LT: r = x < y
        elif cls is LE: r = x <= y
        elif cls is GT: r = x > y
        elif cls is GE: r = x >= y
        else:
            return None
    except (OverflowError, ZeroDivisionError):
        return None
    if dt.is_float(d):
        r = float(np.dtype(d).type(r))
    elif dt.is_int(d) and not isinstance(r, bool):
        info = np.iinfo(np.dtype(d))
        if not info.min <= r <= info.max:
            raise DTypeError(
                f"the integer arithmetic `{a!r} {_OP_TEXT.get(cls, cls.__name__)} {b!r}` "
                f"is {r}, outside {d} [{info.min}, {info.max}] (it would wrap around); keep "
                "index expressions within range (smaller coefficients or extents)")
    return const(r, d)


_OP_TEXT = {Add: "+", Sub: "-", Mul: "*", FloorDiv: "//", FloorMod: "%"}


def _arith(cls, a, b):
    a, b = _binary(cls, a, b)
    for x in (a, b):
        if dt.is_bool(x.dtype) and cls not in (EQ, NE):
            raise DTypeError(
                f"arithmetic `{cls.__name__}` on a boolean expression `{x!r}`; "
                "cast it with te.cast(x, dtype) first"
            )
    folded = _fold(cls, a, b)
    if folded is not None:
        return folded
    integral = dt.is_int(a.dtype) and dt.is_int(b.dtype)
    d = cls._infer_dtype(None, (a, b))
    if cls is Add:
        if _is_const(a, 0) and (integral or b.dtype == d): return _cast_to(b, d)
        if _is_const(b, 0) and (integral or a.dtype == d): return _cast_to(a, d)
    elif cls is Sub:
        if _is_const(b, 0): return _cast_to(a, d)
    elif cls is Mul:
        if _is_const(a, 1): return _cast_to(b, d)
        if _is_const(b, 1): return _cast_to(a, d)
        if integral and (_is_const(a, 0) or _is_const(b, 0)): return const(0, d)
    elif cls in (Div, FloorDiv):
        if _is_const(b, 1) and (cls is FloorDiv or dt.is_float(a.dtype)):
            return _cast_to(a, d)
    elif cls is FloorMod:
        if integral and _is_const(b, 1): return const(0, d)
    return cls._make(None, (a, b), d)


def _cast_to(e, dtype):
    return e if e.dtype == dtype else cast(e, dtype)


def add(a, b):
    """``a + b`` with numpy promotion and light constant folding (``x + 0 -> x``)."""
    return _arith(Add, a, b)


def sub(a, b):
    """``a - b`` (``x - 0 -> x``)."""
    return _arith(Sub, a, b)


def mul(a, b):
    """``a * b`` (``x * 1 -> x``; ``x * 0 -> 0`` for integers only: floats keep NaN/inf)."""
    return _arith(Mul, a, b)


def div(a, b):
    """True division ``a / b``; integer operands give ``float32``."""
    return _arith(Div, a, b)


def floordiv(a, b):
    """``a // b`` with floor semantics (Python's), for int and float operands."""
    return _arith(FloorDiv, a, b)


def floormod(a, b):
    """``a % b`` with floor semantics: the result has ``b``'s sign (Python's)."""
    return _arith(FloorMod, a, b)


def minimum(a, b):
    """Elementwise minimum of two expressions."""
    return _arith(Min, a, b)


def maximum(a, b):
    """Elementwise maximum of two expressions."""
    return _arith(Max, a, b)


def _same_variable(cls, a, b):
    """The constant a comparison of one integer variable with itself is (a
    Jacobian's delta condition ``j == i`` after ``i := j``), else None."""
    if a is b and isinstance(a, Var) and dt.is_int(a.dtype):
        return const(cls in (EQ, LE, GE))
    return None


def _cmp(cls, a, b):
    a, b = _binary(cls, a, b)
    folded = _fold(cls, a, b)
    if folded is None:
        folded = _same_variable(cls, a, b)
    if folded is not None:
        return folded
    return cls._make(None, (a, b), "bool")


def _as_bool(e, what):
    e = as_expr(e)
    if not dt.is_bool(e.dtype):
        raise DTypeError(f"{what} expects a boolean condition, got `{e!r}` of dtype {e.dtype}")
    return e


#: nodes whose evaluation cannot raise (given operands that do not)
_NEVER_FAIL = (Var, Const, CmpOp, And, Or, Not)


def _may_fail(e):
    """Whether evaluating the boolean ``e`` might raise: anything but comparisons
    and logic over variables and constants (a load may read out of bounds, integer
    arithmetic may leave its dtype, a division may divide by zero)."""
    stack = [e]
    while stack:
        n = stack.pop()
        if not isinstance(n, _NEVER_FAIL):
            return True
        stack.extend(n.args)
    return False


def logical_and(a, b):
    """``a && b`` of boolean expressions; ``b`` is only evaluated where ``a`` holds.

    Raises:
        DTypeError: an operand is not boolean.
    """
    a, b = _as_bool(a, "and"), _as_bool(b, "and")
    if _is_const(a, True): return b
    if _is_const(b, True): return a
    # ``a && false`` keeps ``a`` where evaluating it may fail (it is evaluated first)
    if _is_const(a, False) or (_is_const(b, False) and not _may_fail(a)): return const(False)
    if a is b: return a
    return And._make(None, (a, b), "bool")


def logical_or(a, b):
    """``a || b`` of boolean expressions; ``b`` is only evaluated where ``a`` fails.

    Raises:
        DTypeError: an operand is not boolean.
    """
    a, b = _as_bool(a, "or"), _as_bool(b, "or")
    if _is_const(a, False): return b
    if _is_const(b, False): return a
    # ``a || true`` keeps ``a`` where evaluating it may fail (as logical_and)
    if _is_const(a, True) or (_is_const(b, True) and not _may_fail(a)): return const(True)
    if a is b: return a
    return Or._make(None, (a, b), "bool")


def logical_not(a):
    """``!a`` of a boolean expression (raises DTypeError otherwise)."""
    a = _as_bool(a, "not")
    if isinstance(a, Const): return const(not a.value)
    if isinstance(a, Not): return a.a
    return Not._make(None, (a,), "bool")


def all_of(*conds):
    """Conjunction of conditions (``te.all``); ``True`` when given none."""
    if len(conds) == 1 and isinstance(conds[0], (list, tuple)):
        conds = tuple(conds[0])
    out = const(True)
    for c in conds:
        out = logical_and(out, c)
    return out


def any_of(*conds):
    """Disjunction of conditions (``te.any``); ``False`` when given none."""
    if len(conds) == 1 and isinstance(conds[0], (list, tuple)):
        conds = tuple(conds[0])
    out = const(False)
    for c in conds:
        out = logical_or(out, c)
    return out


def select(cond, true_value, false_value):
    """``cond ? true_value : false_value``; only the taken branch is evaluated.

    Branch dtypes promote like numpy (Python scalars are weak).

    Raises:
        DTypeError: ``cond`` is not boolean.
    """
    cond = _as_bool(cond, "if_then_else")
    if isinstance(true_value, Expr) or not isinstance(false_value, Expr):
        t = as_expr(true_value)
        f = as_expr(false_value, like=t.dtype)
    else:
        f = as_expr(false_value)
        t = as_expr(true_value, like=f.dtype)
    d = dt.promote(t.dtype, f.dtype)
    t, f = _cast_to(t, d), _cast_to(f, d)
    if isinstance(cond, Const):
        return t if cond.value else f
    # a branch that tests the same condition again takes the same side
    # (select(c, select(c, a, b), d) = select(c, a, d)): adjoint sums of
    # Jacobian terms nest one select per term, seven deep in an LSTM cell
    while isinstance(t, Select) and t.cond is cond:
        t = t.true_value
    while isinstance(f, Select) and f.cond is cond:
        f = f.false_value
    if t is f:
        return t
    return Select._make(None, (cond, t, f), d)


def cast(value, dtype):
    """Convert ``value`` to ``dtype`` (float to int truncates toward zero).

    Raises:
        DTypeError: an integer constant outside the integer ``dtype``'s range.
    """
    dtype = dt.normalize(dtype, "cast")
    value = as_expr(value)
    if value.dtype == dtype:
        return value
    if isinstance(value, Const):
        v = value.value
        if dt.is_int(dtype) and not isinstance(v, float):
            return const(int(v), dtype)  # (const checks the dtype's range)
        if dt.is_int(dtype) and math.isfinite(v):
            return const(int(v), dtype)
        if not dt.is_int(dtype):
            return const(np.dtype(dtype).type(v).item(), dtype)
    return Cast._make(dtype, (value,), dtype)


def call(name, *args):
    """An intrinsic call, ``name`` one of :data:`INTRINSICS`.

    Raises:
        TexprError: unknown intrinsic or wrong number of arguments.
    """
    if name not in INTRINSICS:
        raise TexprError(f"unknown intrinsic {name!r}; known: {sorted(INTRINSICS)}")
    if len(args) != INTRINSICS[name]:
        raise TexprError(f"intrinsic {name} takes {INTRINSICS[name]} argument(s), got {len(args)}")
    if len(args) == 2:
        a, b = _binary(Call, args[0], args[1])
        args = (a, b)
    else:
        args = (as_expr(args[0]),)
    for x in args:
        if dt.is_bool(x.dtype):
            raise DTypeError(f"intrinsic {name} on a boolean expression `{x!r}`")
    node = Call._make(name, args, Call._infer_dtype(name, args))
    return node


def load(tensor, indices):
    """``tensor[indices]``: checks the number of indices and that they are integers.

    Raises:
        ShapeError: wrong number of indices.
        DTypeError: an index is not an integer expression.
    """
    indices = tuple(indices)
    if len(indices) != len(tensor.shape):
        raise ShapeError(
            f"tensor {tensor.name} has {len(tensor.shape)} dimension(s) (shape {tensor.shape}) "
            f"but was indexed with {len(indices)} index(es)"
        )
    out = []
    for pos, ix in enumerate(indices):
        if isinstance(ix, (float, np.floating)):
            raise DTypeError(
                f"index {pos} of tensor {tensor.name} is the float {ix!r}; indices must be integers"
            )
        e = as_expr(ix, like=dt.INDEX_DTYPE)
        if not dt.is_int(e.dtype):
            raise DTypeError(
                f"index {pos} of tensor {tensor.name} is `{e!r}` of dtype {e.dtype}; "
                "indices must be integer expressions (use te.cast(x, 'int64') for data)"
            )
        if e.dtype != dt.INDEX_DTYPE:
            e = cast(e, dt.INDEX_DTYPE)
        out.append(e)
    return Load._make(tensor, tuple(out), tensor.dtype)


def make_reduce(combiner, sources, axes, where, value_index):
    """Build a :class:`Reduce` node (used by the reducers in :mod:`texpr.reduction`)."""
    sources = tuple(sources)
    where = const(True) if where is None else _as_bool(where, "where=")
    return Reduce._make((combiner, tuple(axes), value_index), sources + (where,),
                        sources[value_index].dtype)


def _rebuild_reduce(attr, args):
    return Reduce._make(attr, args, args[attr[2]].dtype)


Reduce._rebuild = classmethod(lambda cls, attr, args: _rebuild_reduce(attr, args))
Const._rebuild = classmethod(lambda cls, attr, args: Const._make(attr, (), None))
Load._rebuild = classmethod(lambda cls, attr, args: load(attr, args))
Select._rebuild = classmethod(lambda cls, attr, args: select(*args))
Cast._rebuild = classmethod(lambda cls, attr, args: cast(args[0], attr))
Call._rebuild = classmethod(lambda cls, attr, args: call(attr, *args))
Not._rebuild = classmethod(lambda cls, attr, args: logical_not(args[0]))
And._rebuild = classmethod(lambda cls, attr, args: logical_and(*args))
Or._rebuild = classmethod(lambda cls, attr, args: logical_or(*args))
for _cls in (Add, Sub, Mul, Div, FloorDiv, FloorMod, Min, Max):
    _cls._rebuild = classmethod(lambda cls, attr, args: _arith(cls, *args))
for _cls in (EQ, NE, LT, LE, GT, GE):
    _cls._rebuild = classmethod(lambda cls, attr, args: _cmp(cls, *args))

#: every concrete expression kind (the derivative-rule table must cover these)
KINDS = (Const, Var, IterVar, Add, Sub, Mul, Div, FloorDiv, FloorMod, Min, Max,
         EQ, NE, LT, LE, GT, GE, And, Or, Not, Select, Cast, Call, Load, Reduce)

