"""Expression emission: IR expressions -> Python text inside a compiled unit.

One job: the text of values (:class:`ExprEmitter`, :func:`const_str`), of buffer
elements (:func:`element`: flat buffers, row-major offsets with static extents)
and the line writer (:class:`_Writer`, canonical and readable comments). It
decides nothing about loops (:mod:`codegen.loopnest.stage`) or bounds
(:mod:`codegen.analysis.bounds` tells it which loads to check).
"""

import numpy as np

from texpr import dtypes as dt
from texpr import expr as E
from texpr.errors import TexprError
from texpr.printer import expr_str
from texpr.visitor import post_order, tree_sizes

from ..analysis.bounds import DATA_INDEX_LIMIT
from .source import comment_text
from ..options import current as _opts

__all__ = ["ExprEmitter", "const_str", "element"]


def _nodes(e):
    return post_order(e)


_NP = {"float32": "np.float32", "float64": "np.float64", "int32": "np.int32",
       "int64": "np.int64", "bool": "np.bool_"}
_CMP = {E.EQ: "==", E.NE: "!=", E.LT: "<", E.LE: "<=", E.GT: ">", E.GE: ">="}
_ARITH = {E.Add: "+", E.Sub: "-", E.Mul: "*"}
_UNARY_NP = {"exp": "np.exp", "log": "np.log", "sqrt": "np.sqrt", "tanh": "np.tanh",
             "floor": "np.floor", "ceil": "np.ceil", "round": "np.rint", "trunc": "np.trunc",
             "sin": "np.sin", "cos": "np.cos"}


def const_str(value, dtype):
    """A Python literal of ``value`` typed as ``dtype`` inside compiled code."""
    if dtype == "bool":
        return "True" if value else "False"
    if dt.is_int(dtype):
        v = int(value)
        return str(v) if dtype == "int64" else f"np.int32({v})"
    v = float(value)
    if v != v:
        text = "np.nan"
    elif v in (float("inf"), float("-inf")):
        text = "np.inf" if v > 0 else "-np.inf"
    else:
        text = repr(v)
    return text if dtype == "float64" else f"np.float32({text})"


def fill_value(value, dtype):
    """:func:`const_str` of ``value`` for the value argument of ``_fill_<dtype>``:
    never a compile-time literal (see :func:`helper_int`), so the helper has one
    signature."""
    text = const_str(value, dtype)
    if dtype == "int64":
        return f"np.int64({text})"
    return f"np.bool_({text})" if dtype == "bool" else text


def helper_int(text):
    """``text``, an integer expression passed to a helper of the backend's runtime helpers,
    as an int64 that is never a compile-time literal: the compiler types a constant, or a
    variable holding one (``i0_0 = 0``), as its value (``Literal[int](4)``) and
    compiles the helper once per value it is called with (52 versions of
    ``_ck`` for 16 fuzzed programs)."""
    return text if text.startswith("np.int64(") else f"np.int64({text})"


class ExprEmitter:
    """Python source of IR expressions inside a compiled kernel.

    ``names``: id(Var) -> source name; ``buffers``: id(Tensor) -> BufferInfo;
    ``checks``: ids of loads needing a bounds check; ``flat``: loads addressed
    by an affine row-major offset (:func:`codegen.analysis.affine.affine_offsets`);
    ``errors``: the error table (list of messages; the flag holds the 1-based
    code)."""

    def __init__(self, names, buffers, stage_name, errors):
        self.names, self.buffers, self.stage_name, self.errors = names, buffers, stage_name, errors
        #: id(node) -> the variable holding its value (:meth:`bind_shared`)
        self.bound = {}
        self.checks = set()
        self.value_checks = set()  # ids of int loads / casts range-checked (DATA_INDEX_LIMIT)
        #: ids of integer + - * on values that may leave their dtype (codegen.analysis.bounds):
        #: written as the checked helpers _iadd/_isub/_imul/_ifloordiv
        self.arith_checks = set()
        #: id(load) -> its row-major offset as an affine expression (codegen.analysis.affine)
        self.flat = {}
        #: ids of selects whose two arms are evaluated before choosing (``_sel``: no
        #: branch), decided by the stage (:func:`codegen.loopnest.stage.speculative_selects`)
        self.speculative = set()

    def _value_check(self, e, text):
        if id(e) not in self.value_checks:
            return text
        code = self._err(
            f"stage {self.stage_name}: the value of `{expr_str(e)}` is used in index "
            f"arithmetic and must lie in [-{DATA_INDEX_LIMIT}, {DATA_INDEX_LIMIT}) "
            "(the arithmetic is proven exact in int64 for such values only)")
        return f"_rk({helper_int(text)}, np.int64({DATA_INDEX_LIMIT}), err, np.int64({code}))"

    def _checked_arith(self, e, a=None, b=None):
        """An integer ``+ - * //`` on values that may leave its dtype: computed by a
        helper that fails (``te.evaluate``'s error) instead of wrapping around.
        ``a``, ``b``: the operands' text, if already written (a checked divisor)."""
        d = e.dtype
        info = np.iinfo(np.dtype(d))
        code = self._err(
            f"stage {self.stage_name}: the integer arithmetic `{expr_str(e)}` leaves {d} "
            f"[{info.min}, {info.max}] (it would wrap around)")
        fn = {E.Add: "_iadd", E.Sub: "_isub", E.Mul: "_imul",
              E.FloorDiv: "_ifloordiv"}[type(e)]
        a = helper_int(self.cast(e.a, d) if a is None else a)
        b = helper_int(self.cast(e.b, d) if b is None else b)
        out = f"{fn}({a}, {b}, np.int64({int(d == 'int32')}), err, np.int64({code}))"
        return f"np.int32({out})" if d == "int32" else out

    def _unchecked(self, e):
        """``e`` without its own range check (an operand that is not arithmetic:
        the guard ``A[i] < sentinel`` must not fail on the sentinel it tests)."""
        if id(e) not in self.value_checks:
            return self(e)
        self.value_checks.discard(id(e))
        try:
            return self(e)
        finally:
            self.value_checks.add(id(e))

    def cast(self, e, dtype):
        s = self(e)
        if e.dtype == dtype:
            return s
        if isinstance(e, E.Const):
            return const_str(e.value, dtype)
        if dtype == "bool":
            return f"({s} != 0)"
        return f"{_NP[dtype]}({s})"

    def _err(self, msg):
        self.errors.append(msg)
        return len(self.errors)

    def bind_shared(self, exprs, write, prefix, checked_before=False, later=(), expand=None):
        """Write ``name = value`` for the shared subexpressions of a statement about to
        be written with the values ``exprs``, and emit them by name from now on
        (until :meth:`unbind`). Returns the bound nodes' ids.

        Only a statement whose tree (each use of a shared node counted again) has
        more than ``options.let_tree_nodes`` nodes: a chain of selects each reading the
        level below several times is a DAG of O(d) nodes and a text of O(3^d) (an
        attack's chain of depth 5 gave 89 KB units that the backend compiled in 300 s;
        smaller statements keep their text, :mod:`codegen.loopnest.cse` shares their
        repeats). A node used twice or more, of at least ``options.let_min_nodes``
        tree nodes, is bound when

        * the statement always evaluates it (not only in one branch of a select
          or behind a short-circuit ``and``/``or``), or
        * it cannot fail and reads nothing the statement does not always read:
          no run-time check, no integer division, every load in it always
          evaluated. Computing it where the statement would not costs a few
          operations and is harmless (the tangent of a stacked ``max(v, 0)``
          sits in two of the three branches of its tie rule, which wrote
          2^depth copies).

        Whatever its size, a statement whose text would nest deeper than
        ``options.text_max_height`` parentheses has each node at that height bound on the
        same terms as a shared node (a long sum of terms is written as a few
        partial sums).

        The bindings are written in the statement's order of evaluation. A node
        holding a run-time check is bound only where its first evaluation is
        unconditional and no check outside the bindings comes before it (the
        check that fails first stays the one reported); every such
        always-evaluated checked load is bound in that order too, so that checks
        do not hold each other back. A node with a value range check of its own
        (``value_checks``: an int load in index arithmetic) is never bound: a
        comparison reads it unchecked (:meth:`_unchecked`, a sentinel guard),
        the binding would check it.
        ``write(text)`` writes one line; ``prefix`` makes the names unique in the
        unit; ``checked_before``: the statement runs a check of its own before
        these values (a scatter's index), so no checked node is bound; ``later``:
        values evaluated after these, perhaps not at all (the body under a
        reduction's ``where`` test): their uses count, their nodes are not bound;
        ``expand(node)``, if given, runs just before a node's binding is written
        (it may write statements computing the node's large branches first)."""
        roots = list(exprs)
        order, size, uses = tree_sizes(roots + list(later))
        large = sum(size[id(r)] for r in roots + list(later)) > _opts().let_tree_nodes
        deep = self.unbound_height(roots) > _opts().text_max_height
        if not (large or deep) or (len(order) > _opts().let_max_dag_nodes and not deep):
            return []
        checked, unsafe, always, loads_always = self._node_kinds(order, roots)
        names, seen = [], set()
        height = {}  # id -> how deep the node's text nests now (a bound node: 0)
        pending = [checked_before]  # a check in the statement's text comes before here

        def visit(n, conditional):  # in Python's order of evaluation of the emitted text
            if id(n) in self.bound:
                return
            if id(n) in seen:  # written again here: its checks run again here
                if id(n) in checked:
                    pending[0] = True
                return
            seen.add(id(n))
            before = pending[0]
            if isinstance(n, E.Select):
                parts = ((n.cond, conditional), (n.true_value, True), (n.false_value, True))
            elif isinstance(n, (E.And, E.Or)):
                parts = ((n.a, conditional), (n.b, conditional or not _cheap_and_safe(n.b)))
            else:
                parts = tuple((c, conditional) for c in n.args)
            for c, cc in parts:
                visit(c, cc)
            height[id(n)] = self.text_weight(n) + max(
                (0 if id(c) in self.bound else height[id(c)] for c in n.args), default=0)
            deep_here = height[id(n)] >= _opts().text_max_height
            shared = large and uses.get(id(n), 0) >= 2 and size[id(n)] >= _opts().let_min_nodes
            if id(n) in checked:
                # a checked load, or a shared node holding checks: bound at an
                # unconditional first evaluation only, after every check before it
                ok = (id(n) in always and not conditional and not before
                      and (shared or deep_here or self._has_own_check(n)))
            else:
                ok = (shared or deep_here) and (
                    id(n) in always or (id(n) not in unsafe and id(n) in loads_always))
            if ok and id(n) not in self.value_checks:
                if expand is not None:
                    expand(n)
                name = f"{prefix}{len(names)}"
                write(f"{name} = {self(n)}")
                self.bound[id(n)] = name
                names.append(id(n))
                pending[0] = before  # its checks run in the binding, in order
            elif self._has_own_check(n):
                pending[0] = True

        for r in roots:
            visit(r, False)
        return names

    def _node_kinds(self, order, roots):
        """For :meth:`bind_shared`: the ids of the nodes of ``order`` (children
        first) that hold a run-time check (``checked``), that hold an integer
        division (``unsafe``), that the statement of values ``roots`` always
        evaluates (``always``), and whose loads it always evaluates
        (``loads_always``)."""
        checked, unsafe = set(), set()
        for n in order:
            kids = [id(c) for c in n.args]
            if self._has_own_check(n) or any(k in checked for k in kids):
                checked.add(id(n))
            if isinstance(n, (E.FloorDiv, E.FloorMod)) or any(k in unsafe for k in kids):
                unsafe.add(id(n))
        always = _always_evaluated(roots)
        loads_always = set()
        for n in order:
            if (all(id(c) in loads_always for c in n.args)
                    and (not isinstance(n, E.Load) or id(n) in always)):
                loads_always.add(id(n))
        return checked, unsafe, always, loads_always

    @staticmethod
    def tree_nodes(exprs):
        """The nodes of ``exprs`` as trees (each use of a shared node counted again)."""
        _order, size, _uses = tree_sizes(exprs)
        return sum(size[id(e)] for e in exprs)

    def unbound_tree_nodes(self, exprs):
        """The nodes of ``exprs`` as trees, as the text would write them now: each use
        of a shared node counted again, a bound node (:meth:`bind_shared`) one leaf."""
        size = {}
        for n in post_order(list(exprs)):
            size[id(n)] = 1 if id(n) in self.bound else 1 + sum(size[id(c)] for c in n.args)
        return sum(size[id(e)] for e in exprs)

    def text_weight(self, n):
        """At least as many parentheses as the text of ``n`` nests around each of
        its operands: a load ``b[np.uint64((_ck(np.int64(...`` (and its row-major
        offset, one more per dimension), a cast or call, a checked or int32
        operation, an integer division, else one."""
        if isinstance(n, E.Load):
            return 4 + 2 * len(n.args)
        if isinstance(n, (E.Cast, E.Call)):
            return 2
        if type(n) in _ARITH:
            return 3 if id(n) in self.arith_checks else 2 if n.dtype == "int32" else 1
        if isinstance(n, (E.FloorDiv, E.FloorMod)) and dt.is_int(n.dtype):
            return 4  # np.int32(_ifloordiv(.., _nz(np.int64(b) at most
        return 1

    def unbound_height(self, exprs):
        """How many parentheses deep the text of ``exprs`` nests as it would be
        written now (:meth:`text_weight` per node): a bound node
        (:meth:`bind_shared`) is a name, of height 0."""
        height = {}
        for n in post_order(list(exprs)):
            height[id(n)] = 0 if id(n) in self.bound else self.text_weight(n) + max(
                (height[id(c)] for c in n.args), default=0)
        return max((height[id(e)] for e in exprs), default=0)

    def unbind(self, ids):
        """Forget the bindings :meth:`bind_shared` returned."""
        for i in ids:
            self.bound.pop(i, None)

    def _has_own_check(self, n):
        """Whether emitting ``n`` itself (not its operands) writes a run-time check."""
        if id(n) in self.checks or id(n) in self.value_checks or id(n) in self.arith_checks:
            return True
        return (isinstance(n, (E.FloorDiv, E.FloorMod)) and dt.is_int(n.dtype)
                and not (isinstance(n.b, E.Const) and n.b.value != 0))

    def __call__(self, e):
        hit = self.bound.get(id(e))
        if hit is not None:
            return hit
        cls = type(e)
        if cls is E.Const:
            return const_str(e.value, e.dtype)
        if isinstance(e, E.Var):
            try:
                return self.names[id(e)]
            except KeyError:
                raise TexprError(f"stage {self.stage_name}: variable `{e.name}` is not bound "
                                 "in the generated code") from None
        d = e.dtype
        if cls in _ARITH:
            if id(e) in self.arith_checks:
                return self._checked_arith(e)
            out = f"({self.cast(e.a, d)} {_ARITH[cls]} {self.cast(e.b, d)})"
            return f"np.int32{out}" if d == "int32" else out
        if cls is E.Div:
            return f"({self.cast(e.a, d)} / {self.cast(e.b, d)})"
        if cls in (E.FloorDiv, E.FloorMod):
            op = "//" if cls is E.FloorDiv else "%"
            a, b = self.cast(e.a, d), self.cast(e.b, d)
            if dt.is_int(d) and not (isinstance(e.b, E.Const) and e.b.value != 0):
                code = self._err(f"stage {self.stage_name}: integer division by zero in "
                                 f"`{expr_str(e)}`")
                b = f"_nz({helper_int(b)}, err, np.int64({code}))"
            if id(e) in self.arith_checks:  # INT_MIN // -1
                return self._checked_arith(e, a, b)
            out = f"({a} {op} {b})"
            return f"np.int32{out}" if d == "int32" else out
        if cls in (E.Min, E.Max):
            a, b = self.cast(e.a, d), self.cast(e.b, d)
            if dt.is_float(d):
                return f"_f{'min' if cls is E.Min else 'max'}_{d}({a}, {b})"
            return f"{'min' if cls is E.Min else 'max'}({a}, {b})"
        if cls in _CMP:  # a comparison is exact at any int64 value: no range check
            return f"({self._unchecked(e.a)} {_CMP[cls]} {self._unchecked(e.b)})"
        if cls is E.And:
            op = "&" if _cheap_and_safe(e.b) else "and"
            return f"({self(e.a)} {op} {self(e.b)})"
        if cls is E.Or:
            op = "|" if _cheap_and_safe(e.b) else "or"
            return f"({self(e.a)} {op} {self(e.b)})"
        if cls is E.Not:
            return f"(not {self(e.a)})"
        if cls is E.Select:
            if id(e) in self.speculative:
                return (f"_sel({self(e.cond)}, {self.cast(e.true_value, d)}, "
                        f"{self.cast(e.false_value, d)})")
            return f"({self(e.true_value)} if {self(e.cond)} else {self(e.false_value)})"
        if cls is E.Cast:
            return self._value_check(e, self.cast(e.value, d))
        if cls is E.Call:
            return self._call(e)
        if cls is E.Load:
            return self._value_check(e, self._load(e))
        if cls is E.Reduce:
            raise TexprError(f"stage {self.stage_name}: a reduction below the top of a body "
                             f"(`{expr_str(e)}`) reached code generation")
        raise TexprError(f"codegen: unknown expression kind {cls.__name__}")

    def _call(self, e):
        d, name = e.dtype, e.name
        if name == "abs":
            return f"abs({self.cast(e.args[0], d)})"
        if name == "stop_gradient":
            return self.cast(e.args[0], d)
        if name == "power":
            return f"np.power({self.cast(e.args[0], d)}, {self.cast(e.args[1], d)})"
        x = self.cast(e.args[0], d)
        one = const_str(1.0, d)
        if name == "exp" and d == "float32":  # no libm call: it vectorises (the backend's runtime helpers)
            return f"_exp_float32({x})"
        if name in _UNARY_NP:
            return f"{_UNARY_NP[name]}({x})"
        if name == "rsqrt":
            return f"({one} / np.sqrt({x}))"
        if name == "sigmoid":
            e = f"_exp_float32(-{x})" if d == "float32" else f"np.exp(-{x})"
            return f"({one} / ({one} + {e}))"
        if name == "erf":
            if d == "float32":  # no libm call: a loop of it vectorises (the backend's runtime helpers)
                return f"_erf_float32({x})"
            return f"{_NP[d]}(math.erf({x}))"
        raise TexprError(f"codegen: intrinsic {name} has no code generator")

    def _load(self, e):
        t = e.tensor
        buf = self.buffers[id(t)]
        if not e.args:
            return f"{buf.name}[0]"
        offset = self.flat.get(id(e))
        if offset is not None and getattr(buf, "physical", None) is None:
            return f"{buf.name}[np.uint64({self(offset)})]"
        idx = [self(i) for i in e.args]
        if id(e) in self.checks:
            code = self._err(
                f"stage {self.stage_name}: load `{expr_str(e)}` reads {t.name} outside its "
                f"shape {t.shape}; guard the load with te.if_then_else if the index can leave "
                "the tensor")
            idx = [f"_ck({helper_int(s)}, np.int64({n}), err, np.int64({code}))"
                   for s, n in zip(idx, t.shape)]
        return element(buf, idx)


# options.let_tree_nodes (default 400): a statement whose values' tree has more nodes than
#   this has its shared subexpressions written once each (:meth:`ExprEmitter.bind_shared`)
# options.let_min_nodes (default 4): the smallest shared subexpression (tree nodes) given a
#   variable of its own there
# options.let_max_dag_nodes (default 2000): a statement with more distinct nodes than this
#   is left to codegen.loopnest.cse (the analysis keeps a set of nodes per node)
# options.text_max_height (default 120): a value's text nests at most this many parentheses
#   deep, as estimated node by node (:meth:`ExprEmitter.text_weight`): a deeper node is
#   given a variable (:meth:`ExprEmitter.bind_shared`). CPython's parser allows 200 nested
#   parentheses and its compiler about 1,000 nested nodes. A fuzzed gradient (seed
#   7007500472) summed 216 terms in one line of 216 parentheses, and a chain of 45 checked
#   gathers (5 parentheses each) wrote 225: SyntaxError "too many nested parentheses".


def _always_evaluated(roots):
    """Ids of the nodes that evaluating ``roots`` (in order, as emitted) always
    evaluates: a select's condition and what both its branches always evaluate;
    the first operand of ``and``/``or``, and the second where it is emitted as
    ``&``/``|`` (:func:`_cheap_and_safe`); every operand of anything else."""
    memo = {}
    for n in _nodes(roots):  # children first
        if isinstance(n, E.Select):
            out = memo[id(n.cond)] | (memo[id(n.true_value)] & memo[id(n.false_value)])
        elif isinstance(n, (E.And, E.Or)):
            out = memo[id(n.a)] | (memo[id(n.b)] if _cheap_and_safe(n.b) else frozenset())
        else:
            out = frozenset().union(*(memo[id(c)] for c in n.args)) if n.args else frozenset()
        memo[id(n)] = out | {id(n)}
    return frozenset().union(*(memo[id(r)] for r in roots))


_SAFE_KINDS = (E.Const, E.Var, E.EQ, E.NE, E.LT, E.LE, E.GT, E.GE, E.And, E.Or, E.Not,
               E.Add, E.Sub, E.Mul, E.Min, E.Max)


def _cheap_and_safe(e):
    """Whether a condition may be evaluated even where the short-circuit would skip
    it: comparisons of variables and constants (no load, no division, no call),
    small. ``a & b`` of such conditions compiles to straight-line code (selects)
    where ``a and b`` branches: the argmax combine of max pooling's gradient
    runs 2.6x faster (NaN propagation adds a third clause)."""
    nodes = _nodes(e)
    return len(nodes) <= 16 and all(isinstance(n, _SAFE_KINDS) for n in nodes)


def element(buf, idx):
    """``buf[idx]`` for a buffer passed flat (1-D): the row-major offset with the
    (static) extents as constants, as an unsigned index (in bounds by construction
    or by check), so that the compiler emits no negative-index wrap-around and LLVM sees
    unit strides."""
    if not idx:
        return f"{buf.name}[0]"
    shape = buf.shape
    physical = getattr(buf, "physical", None)
    if physical is not None:  # a view into another tensor's buffer (lower.ViewInfo)
        idx, shape = physical(idx)
    lin = idx[0]
    for s, n in zip(idx[1:], shape[1:]):
        lin = f"({lin}) * {n} + {s}"
    return f"{buf.name}[np.uint64({lin})]"


# ---- the source writer -------------------------------------------------------------------

class _Writer:
    """Source lines. Comments are written twice: the canonical text (no user
    names: what the caches key on and what Python runs) and the readable text
    of ``Kernel.source`` (escaped with :func:`codegen.loopnest.source.comment_text`)."""

    def __init__(self):
        self.lines = []
        self.comments = {}  # canonical comment line (stripped) -> readable text

    def __call__(self, depth, text):
        self.lines.append("    " * depth + text)

    def comment(self, depth, canonical, readable):
        line = f"# {canonical}"
        assert line not in self.comments
        self.comments[line] = f"# {comment_text(readable)}"
        self(depth, line)
