"""Packed operands: a computed factor of a contraction becomes a stage of its own.

One job: rewrite, before scheduling, the reduction stages that are a GEMM
(:mod:`codegen.analysis.contraction`) but for computed operands, so that the GEMM path
runs them. The simplifier folds an elementwise producer into its consumer: a
convolution of ``relu(conv0 + b)`` reads

    conv1[n, c, h, w] = sum((conv0[n, rc, h + kh - 1, w + kw - 1] + b[rc]) * W[c, rc, kh, kw],
                            where=<padding> && conv0[n, rc, h + kh - 1, w + kw - 1] + b[rc] > 0)

(the relu's select lifted into the ``where``), and its weight gradient
multiplies the head by the next relu's and pool's masks the same way. That is
no product of two loads, so the stage ran as a loop nest that recomputes the
operand at every tap (9 times for a 3x3 kernel), and took the compiler 5-8 s to
compile.

The rewrite groups the summand's factors and the ``where``'s data-dependent
conjuncts by the load they are functions of (the *key*: ``conv0[n, rc, h + kh
- 1, w + kw - 1]``; ``b[rc]`` reads a component of its index, so it belongs to
it). When exactly two groups remain and one or both are more than a plain
load, each such group becomes an elementwise stage over its key tensor's
index space,

    conv1_packed0[i0, i1, i2, i3] = select(conv0[i0, i1, i2, i3] + b[i1] > 0,
                                           conv0[i0, i1, i2, i3] + b[i1], 0)

(materialised: computed once per element instead of once per tap), and the
stage becomes ``sum(conv1_packed0[n, rc, h + kh - 1, w + kw - 1] * W[c, rc, kh, kw])``.
The data-dependent conjuncts stay in the ``where`` as well, so the rewritten
stage means exactly what the original meant; a packed operand is zero wherever
they fail, so the GEMM path applies them only where an operand holds an
infinity or a NaN (its exact path, :func:`codegen.backends.numpy_host.exact.run_exact`), where a
term that the original never visited must stay absent rather than give ``0 *
inf``. The stage is marked (``attrs[PACKED]``) for that.

A rewrite is kept only when the new stage matches the GEMM path and its cost
rule says BLAS pays (:func:`codegen.analysis.contraction.cost_ok`); a group is packed
only when its expressions are cheap (``texpr.simplify.materialize.is_cheap``:
no division, no intrinsic), it can raise nothing (no integer arithmetic that
may leave its dtype or divide by zero, none over loaded integers: the packed
stage computes points the original never reads, and must not refuse at
them), every load in it stays provably inside its tensor over the key's whole
index space (isl), and its key's indices are distinct; a stage with a condition
that reads no tensor yet is not quasi-affine (``i * k > 20``) is not rewritten
(it would join no group, and the GEMM path applies such a condition as a data
condition, which on a packed stage it leaves to the packed operands). Packed stages of equal
definition are shared (a relu read by the next convolution and by its weight
gradient is packed once).
"""

from texpr import expr as E
from texpr.errors import TexprError
from texpr.expr import Load
from texpr.printer import expr_str
from texpr.simplify.graph import rebuild
from texpr.simplify.isl_bridge import VarSpace, box_set, isl, to_pwaff, to_set
from texpr.simplify.materialize import is_cheap
from texpr.tensor import ComputeOp, topo_order
from texpr.visitor import free_vars, post_order, substitute, transform

from ..analysis import contraction, matches
from ..analysis.bounds import int_arith_on_data, may_refuse
from ..analysis.affine import linear_coefs as _linear
from ..ir.marks import PACKED

__all__ = ["pack_operands", "PACKED"]



def pack_operands(outputs):
    """The graph of ``outputs`` (simplified Tensors) with the computed operands of
    its contractions packed into stages of their own (see the module
    docstring). Returns ``(tensors, packed)``: the list of output Tensors (the
    same objects where nothing changed) and the list of the packed stages' ops
    (to be materialised: the schedule's default would inline them again).
    Never raises for a stage it cannot rewrite: that stage is kept."""
    shared = {}

    def fn(op, orig, tmap):
        try:
            new = _packed(op, shared)
        except TexprError:  # a rewrite it cannot make: the stage stays as it is
            return None
        return None if new is None else new.output(0)

    outs = rebuild(list(outputs), fn)
    used = {id(op) for op in topo_order(outs)}  # (a rejected rewrite's packs are not)
    return outs, [t.op for t in shared.values() if id(t.op) in used]


def _loads(e):
    return [n for n in post_order(e) if isinstance(n, Load)]


def _packed(op, shared):
    """The rewritten stage, or None."""
    red = contraction.float_sum(op)
    if red is None or op.attrs.get(PACKED):
        return None
    dtype = red.dtype
    facs, conds, products = [], [], set()
    contraction._factors(red.source[0], facs, conds, products)
    conj = contraction._conjuncts(red.where, [])
    for c in conds:
        contraction._conjuncts(c, conj)
    consts = [f for f in facs if isinstance(f, E.Const)]
    items = [f for f in facs if not isinstance(f, E.Const)]
    data = [c for c in conj if _loads(c)]
    plain = [c for c in conj if not _loads(c)]
    if any(not _quasi_affine(c, op, red) for c in plain):
        # (`i * k > 20`: the GEMM path applies a condition isl cannot read as one of
        # the stage's data conditions, which on a stage with packed operands it
        # applies only where an operand is not finite: no packed stage holds it)
        return None
    if not data and all(isinstance(f, Load) for f in items):
        return None  # nothing computed: the GEMM path decides on the stage as it is
    try:
        if matches.match(op) is not None:
            return None
    except Exception:  # noqa: BLE001 - the matcher's own errors: leave the stage alone
        return None
    axes = {id(a) for a in op.axis} | {id(a) for a in red.axes}
    keys = []
    for x in items + data:
        for ld in _loads(x):
            if ld.args and not any(_same_load(k, ld) for k in keys):
                keys.append(ld)
    keys.sort(key=lambda ld: -len(ld.args))  # stable: the first of a rank leads
    # a key that is itself a function of another key's index joins that one's group
    # (a pooled head d_pool[n, c, h // 2, w // 2] beside conv[n, c, h, w])
    roots = [k for k in keys if not any(
        o is not k and _expressible(k, o, axes) and not _expressible(o, k, axes) for o in keys)]
    originals = list(items)
    items = [_residues_of_keys(x, roots) for x in items]
    data = [_residues_of_keys(x, roots) for x in data]
    groups = {}
    for n, x in enumerate(items + data):
        key = next((k for k in roots if _expressible(x, k, axes)), None)
        if key is None:
            return None
        g = groups.setdefault(id(key), (key, [], [], []))
        if n < len(items):
            g[1].append(x)
            g[3].append(originals[n])
        else:
            g[2].append(x)
    if len(groups) != 2:
        return None
    # the packed stage multiplies a group's factors first: only where the summand
    # does too (else X * W * X, which is (X * W) * X, would become (X * X) * W,
    # overflowing where the original does not: 1e20 * 0 * 1e20 is 0, not NaN)
    for _key, _fs, _cs, orig in groups.values():
        if len(orig) > 1:
            prod = orig[0]
            for f in orig[1:]:
                prod = prod * f
            if id(prod) not in products:
                return None
    groups = {k: g[:3] for k, g in groups.items()}
    operands = []
    for key, fs, cs in groups.values():
        if not cs and len(fs) == 1 and fs[0] is key:
            operands.append(key)
            continue
        p = _pack(op, key, fs, cs, dtype, shared, len(operands))
        if p is None:
            return None
        operands.append(E.load(p, key.args))
    source = operands[0] * operands[1]
    for c in consts:
        source = source * c
    where = E.const(True)
    for c in plain + data:
        where = c if where is E.const(True) else E.logical_and(where, c)
    new = ComputeOp(op.name, op.axis, (red.with_args((source, where)),), op.tag,
                    dict(op.attrs, **{PACKED: True}))
    try:
        plan = matches.match(new)
        if plan is None or not contraction.cost_ok(plan):
            return None
    except Exception:  # noqa: BLE001
        return None
    return new


def _quasi_affine(c, op, red):
    """Whether isl reads the condition ``c`` (over the stage's axes) exactly."""
    space = VarSpace(list(op.axis) + list(red.axes))
    try:
        return to_set(c, space)[1] is None
    except (isl.Error, TexprError):
        return False


def _same_load(a, b):
    """Whether two loads read the same tensor at the same index expressions (nodes
    are interned: equal means identical)."""
    return a.tensor is b.tensor and len(a.args) == len(b.args) and all(
        x is y for x, y in zip(a.args, b.args))




def _residues_of_keys(x, keys):
    """``x`` with each ``e % m`` (constant ``m``) that equals ``a % m`` for an index
    expression ``a`` of one of ``keys`` written as ``a % m``: the simplifier
    writes a pooled window's parity ``(h + kh + 1) % 2`` where the key reads at
    ``h - kh + 1``; the two differ by ``2 * kh``."""
    args = [a for k in keys for a in k.args]
    forms = [(a, _linear(a)) for a in args]

    def fn(node):
        if not (isinstance(node, E.FloorMod) and isinstance(node.b, E.Const)
                and isinstance(node.b.value, int) and node.b.value > 0):
            return None
        m, f = node.b.value, _linear(node.a)
        if f is None or any(node.a is a for a in args):
            return None
        for a, g in forms:
            if g is None:
                continue
            keys_ = set(f[0]) | set(g[0])
            if all((f[0].get(v, 0) - g[0].get(v, 0)) % m == 0 for v in keys_) \
                    and (f[1] - g[1]) % m == 0:
                return E.floormod(a, node.b)
        return None

    return transform(x, fn)


def _expressible(x, key, axes):
    """Whether ``x`` reads the stage's axes only through ``key``'s index
    expressions (so it is a function of the key's index)."""
    mapping = {a: E.const(0) for a in key.args}
    rest = substitute(x, mapping)
    return not any(id(v) in axes for v in free_vars(rest))


def _pack(op, key, facs, conds, dtype, shared, k):
    """The packed stage of one group over ``key``'s tensor (a Tensor), or None."""
    if len({id(a) for a in key.args}) != len(key.args):
        return None
    t = key.tensor
    ivs = [E.iter_var(0, n, f"i{d}", "spatial") for d, n in enumerate(t.shape)]
    mapping = dict(zip(key.args, ivs))
    value = None
    for f in facs:
        f2 = substitute(f, mapping)
        value = f2 if value is None else value * f2
    if value is None:
        value = E.const(1.0, dtype)
    cond = None
    for c in conds:
        c2 = substitute(c, mapping)
        cond = c2 if cond is None else E.logical_and(cond, c2)
    body = value if cond is None else E.select(cond, value, E.const(0.0, dtype))
    if body.dtype != dtype:
        body = E.cast(body, dtype)
    if not is_cheap(body) or may_refuse(body) or int_arith_on_data(body):
        # the packed stage covers the key's whole index space: it must raise nothing
        # (a division by zero, an integer leaving its dtype, a loaded integer out of
        # a condition's checked range) at a point the contraction never reads
        return None
    own = {id(v) for v in ivs}
    if any(id(v) not in own for v in free_vars(body) if isinstance(v, E.IterVar)):
        return None
    space = VarSpace(ivs)
    box = box_set(space)
    for ld in _loads(body):
        for ix, n in zip(ld.args, ld.tensor.shape):
            pa = to_pwaff(ix, space)
            if pa is None:
                return None
            inside = pa.ge_set(space.const(0)).intersect(pa.lt_set(space.const(n)))
            if not box.is_subset(inside):
                return None
    # the printed body names tensors and variables by name: two tensors both named
    # "b" print alike, so the signature holds what it reads by identity too
    reads = tuple(id(n.tensor) if isinstance(n, Load) else id(n) for n in post_order(body)
                  if isinstance(n, Load) or (isinstance(n, E.Var) and id(n) not in own))
    sig = (id(t), expr_str(body), reads)
    hit = shared.get(sig)
    if hit is not None:
        return hit
    p = ComputeOp(f"{op.name}_packed{k}", ivs, (body,), "packed_operand",
                  {"of": op.name}).output(0)
    shared[sig] = p
    return p
