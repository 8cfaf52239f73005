"""Which stages are materialised, and how many points computing a graph visits.

The rule (shared by the inlining pass, :func:`iteration_count` and codegen's
default schedule):

* placeholders are inputs, not stages;
* the requested output tensors, every reduction, every scatter-add stage and
  every multi-output stage are **materialised** (computed into a buffer);
* a cheap elementwise stage that only initialises scans (see below) is
  computed straight into their states' first steps (the scan's init copy,
  counted by the scan) instead of into a buffer of its own;
* an elementwise stage is **inlined** into its consumers (recomputed at each
  access, not a separate loop nest) when that does not duplicate real work:

  - its body is *cheap*: only index arithmetic, loads, selects, casts,
    comparisons, ``+ - * min max`` (no intrinsic calls, no true division), at
    most :data:`CHEAP_NODES` nodes -- the identity head, the Jacobian
    indicators, masks, padding guards, re-indexings (flatten, transpose...)
    and adjoint sums all are;
  - or it is read by exactly one load whose index map is injective on the
    consumer's domain (each point is read once, so inlining recomputes
    nothing): an elementwise consumer's box, or a reduction's domain. A
    broadcast is not: the adjoint of ``Y[i] = sum of 62 terms of X[i, k]``,
    read as ``dY[j0]`` by every ``dX[j0, j1]``, was recomputed 62 times per
    point (a 198 KB kernel built in 186 s; materialised: 19 KB, 12 s), and
    whose body, written out at each occurrence of that load in the consumer's
    tree, stays within :data:`INLINE_ONCE_TREE_NODES`;

  otherwise (an expensive body read at different indices by more than one
  consumer access, or re-read along a reduction) it is materialised, and so is
  a stage :mod:`texpr.simplify.hoist` stored (tagged :data:`HOISTED_TAG`).

The iteration count of a graph is the sum over its materialised stages of the
points of their iteration domains: the spatial box for an elementwise stage,
``spatial box x reduce box`` cut by the affine part of ``where`` for a
reduction, the domain (cut by ``where``) for a scatter-add (so an elementwise
stage zero outside an affine region, written as a support stage by
:mod:`texpr.simplify.support`, counts that region's points). An inlined stage
is counted inside its consumers (their points). Counting uses barvinok's
symbolic ``card``, so 10^8-point domains cost milliseconds.
"""

import numpy as np

from texpr import dtypes as dt
from texpr import expr as E
from texpr.errors import TexprError
from texpr.expr import Reduce
from texpr.jacobian import quasi_affine_index
from texpr.scan import ScanOp
from texpr.tensor import ComputeOp, PlaceholderOp, ScatterAddOp, as_tensor_list, topo_order
from texpr.visitor import post_order, substitute

from .affine_index import is_scattered
from .domain import access_is_injective, domain_count
from .graph import accesses, is_elementwise

#: the largest body (in distinct nodes) still cheap enough to recompute at each access
CHEAP_NODES = 48
#: the largest body written out as a tree still cheap: a subexpression read twice
#: counts twice, and so does the body of an inlined producer at each of its
#: loads, with its axes replaced by the load's indices at each of their uses.
#: Without it, chains of cheap stages that each read their producer a few
#: times grew geometrically once inlined (a fuzzed gradient stage of 143 KB of
#: text that numba compiled for over 10 minutes in 10 GB)
CHEAP_TREE_NODES = 96
#: the largest body, written out at its one load, of a stage inlined because one
#: load reads it: a chain of reflect paddings, each index using its axis three
#: times, grew 3x per stage (7 stages: 107 KB of text, a 607 s build; 8 ran out
#: of 21 GB)
INLINE_ONCE_TREE_NODES = 2000
#: the tag of a stage :mod:`texpr.simplify.hoist` stored out of an oversized body:
#: never inlined back
HOISTED_TAG = "hoisted"

_CHEAP_KINDS = (E.Const, E.Var, E.Add, E.Sub, E.Mul, E.Min, E.Max, E.EQ, E.NE, E.LT, E.LE,
                E.GT, E.GE, E.And, E.Or, E.Not, E.Select, E.Cast, E.FloorDiv, E.FloorMod,
                E.Load)


class Written:
    """A stage's body written out as a tree (:func:`written_out`): ``size`` nodes,
    ``uses[d]`` occurrences of the stage's ``d``-th axis, each of which an
    inlined load replaces by its ``d``-th index, ``work`` float operations
    (arithmetic, ``min``/``max`` and intrinsic calls on float values; index
    arithmetic, comparisons and selects are free) and ``loads`` loads of
    tensors (each occurrence counted)."""

    __slots__ = ("size", "uses", "work", "loads")

    def __init__(self, size, uses, work=0, loads=0):
        self.size, self.uses, self.work, self.loads = size, tuple(uses), work, loads

    def __repr__(self):
        return (f"Written(size={self.size}, uses={self.uses}, work={self.work}, "
                f"loads={self.loads})")


_WORK_KINDS = (E.Add, E.Sub, E.Mul, E.Div, E.Min, E.Max)


def _is_work(n):
    """Whether ``n`` is a float operation of :attr:`Written.work`. A product with a
    constant and a negation are not: a contraction's summand may hold constant
    factors, which the GEMM path folds into its scale."""
    if isinstance(n, E.Call):
        return not _free_call(n)
    if not isinstance(n, _WORK_KINDS) or dt.is_int(n.dtype) or n.dtype == "bool":
        return False
    if isinstance(n, E.Mul) and any(isinstance(a, E.Const) for a in n.args):
        return False
    if isinstance(n, E.Sub) and isinstance(n.args[0], E.Const) and n.args[0].value == 0:
        return False
    return True


def written_out(body, axes=(), inlined=None):
    """``body`` written out as a tree (each use of a shared subexpression counted),
    with every load of a stage in ``inlined`` (``{id(op): Written}``) replaced
    by that stage's body, its axes by the load's indices: a :class:`Written`
    with the occurrences of ``axes``. Exact, and linear in the distinct nodes
    (the counts are Python ints: a geometric blow-up is counted, not built)."""
    inlined = inlined or {}
    pos = {id(a): d for d, a in enumerate(axes)}
    zero = (0,) * len(axes)
    size, uses, work, loads = {}, {}, {}, {}
    for n in post_order(body):
        w = inlined.get(id(n.tensor.op)) if isinstance(n, E.Load) else None
        if w is not None:
            # the producer's body, each use of its axis d replaced by index d
            k = w.size + sum(c * (size[id(i)] - 1) for c, i in zip(w.uses, n.args))
            u = [sum(c * uses[id(i)][d] for c, i in zip(w.uses, n.args))
                 for d in range(len(axes))]
            wk = w.work + sum(c * work[id(i)] for c, i in zip(w.uses, n.args))
            ld = w.loads + sum(c * loads[id(i)] for c, i in zip(w.uses, n.args))
        else:
            k = 1 + sum(size[id(c)] for c in n.args)
            u = [sum(uses[id(c)][d] for c in n.args) for d in range(len(axes))]
            if id(n) in pos:
                u[pos[id(n)]] += 1
            wk = int(_is_work(n)) + sum(work[id(c)] for c in n.args)
            ld = int(isinstance(n, E.Load)) + sum(loads[id(c)] for c in n.args)
        size[id(n)] = k
        uses[id(n)] = tuple(u) if axes else zero
        work[id(n)], loads[id(n)] = wk, ld
    return Written(size[id(body)], uses[id(body)], work[id(body)], loads[id(body)])


def tree_counts(body):
    """``(size, mult)`` of ``body`` (an Expr or a tuple of Exprs) written out as a
    tree: ``size[id(n)]`` the nodes of each distinct subexpression ``n`` written
    out, ``mult[id(n)]`` how many times ``n`` occurs in the whole tree."""
    roots = (body,) if isinstance(body, E.Expr) else tuple(body)
    order = post_order(roots)
    size, mult = {}, {id(n): 0 for n in order}
    for n in order:
        size[id(n)] = 1 + sum(size[id(c)] for c in n.args)
    for r in roots:
        mult[id(r)] += 1
    for n in reversed(order):  # parents before children
        for c in n.args:
            mult[id(c)] += mult[id(n)]
    return size, mult


def occurrences(body, node):
    """How many times ``node`` occurs in ``body`` (an Expr or a tuple of Exprs)
    written out as a tree."""
    return tree_counts(body)[1].get(id(node), 0)


def tree_size(body, inlined=None):
    """Nodes of ``body`` written out as a tree (:func:`written_out`): each use of a
    shared subexpression counted, and every load of a stage in ``inlined``
    (``{id(op): Written}``, :func:`inlined_stages`) replaced by its body."""
    return written_out(body, (), inlined).size


def is_cheap(body, inlined=None):
    """Whether an elementwise body is cheap to recompute (see the module
    docstring): at most :data:`CHEAP_NODES` distinct nodes, all of cheap kinds,
    and at most :data:`CHEAP_TREE_NODES` as a tree (:func:`tree_size`, with the
    producers in ``inlined``, ``{id(op): Written}``, written out)."""
    nodes = post_order(body)
    if len(nodes) > CHEAP_NODES:
        return False
    if not all(isinstance(n, _CHEAP_KINDS) or _free_call(n) for n in nodes):
        return False
    return tree_size(body, inlined) <= CHEAP_TREE_NODES


def _free_call(n):
    # te.stop_gradient: its argument's value, no code of its own (attack helper-29: a
    # stage under it was materialised where the same stage without it was inlined)
    return isinstance(n, E.Call) and n.name == "stop_gradient"


def scan_init_only(consumer, op):
    """Whether ``consumer`` is a scan that reads ``op`` only as the init of its
    states (copied once into the first steps, never read by the body)."""
    if not isinstance(consumer, ScanOp):
        return False
    return (any(t.op is op for t in consumer.init)
            and not any(t.op is op for t in consumer.externals))


def _unconditional_loads(e):
    """The loads of ``e`` that every evaluation of ``e`` performs: not inside a
    select's branches nor the right side of ``&&`` / ``||`` (evaluated only
    where the left side lets it)."""
    out, stack = [], [e]
    while stack:
        x = stack.pop()
        if isinstance(x, E.Load):
            out.append(x)
        if isinstance(x, E.Select):
            stack.append(x.cond)
        elif isinstance(x, (E.And, E.Or)):
            stack.append(x.args[0])
        else:
            stack.extend(x.args)
    return out


def _index_stays_checked(op, ld):
    """Whether inlining the elementwise stage ``op`` at the load ``ld`` keeps the
    bounds check of each index known only where it is evaluated (a
    data-dependent ``P[I[k]]``, or one computed through floating point or not
    quasi-affine, ``P[int64(floor(k * 0.6 - 1))]``:
    :func:`texpr.jacobian.quasi_affine_index`; out of range, it must raise on
    every path): the inlined body then reads, whatever the index, a tensor of
    the same extent at that axis (``P[i] = X[i] * H[i]`` becomes ``X[I[k]] *
    H[I[k]]``). A body that does not read that axis (a constant stage), or reads
    it only under a condition or into a longer tensor, would let the index
    through unchecked: ``op`` stays materialised."""
    body = op.body[0]
    plain = None
    for d, (arg, ax) in enumerate(zip(ld.args, op.axis)):
        if quasi_affine_index(arg):
            continue
        if plain is None:
            plain = _unconditional_loads(body)
        n = ax.dom[1] - ax.dom[0]
        if not any(ix is ax and ax.dom[0] == 0 and t_n == n
                   for other in plain for ix, t_n in zip(other.args, other.tensor.shape)):
            return False
    return True


def should_inline(op, accs, output_ids, inlined=None):
    """Whether the stage ``op`` is inlined into its consumers.

    A requested output is still materialised (for whoever asked for it), but a
    cheap one is also inlined into its consumers, which then do not depend on it.

    Args:
        op: an Operation.
        accs: its accesses ``[(consumer_op, Load)]`` (see :func:`texpr.simplify.graph.accesses`).
        output_ids: ids of the requested output Tensors.
        inlined: ``{id(op): Written}`` of the producers already inlined into
            ``op`` (:func:`inlined_stages`), written out when judging whether
            ``op`` is cheap, and how large it is at its one load.
    """
    if not is_elementwise(op) or not accs or op.tag == HOISTED_TAG:
        return False
    if all(ld is None and scan_init_only(c, op) for c, ld in accs):
        # a cheap scan init: computed straight into the scan's first steps
        return is_cheap(op.body[0], inlined)
    if any(ld is None for _c, ld in accs):  # the init of a scatter-add, a scan's input
        return False
    if not all(_index_stays_checked(op, ld) for _c, ld in accs):
        return False
    if is_cheap(op.body[0], inlined):
        return not stored_is_cheaper(op, accs, inlined)
    if id(op.output(0)) in output_ids:
        return False
    if len(accs) != 1:
        return False
    consumer, ld = accs[0]
    if not isinstance(consumer, ComputeOp):
        return False
    if inlined is not None:
        w = written_out(op.body[0], op.axis, inlined)
        at_load = w.size + sum(c * (tree_size(i, inlined) - 1) for c, i in zip(w.uses, ld.args))
        # the one load is written out wherever the consumer's tree repeats it (a
        # shared subexpression under several guards: issue 51's grid_sample)
        if at_load * occurrences(consumer.body, ld) > INLINE_ONCE_TREE_NODES:
            return False
    reds = [b for b in consumer.body if isinstance(b, Reduce)]
    if not reds:
        # elementwise, one output or several (a tuple reduction the simplifier
        # collapsed to one point: BUGS.md C14); a load that reads a point at
        # several of the consumer's points (a broadcast) would recompute the body
        # at each of them
        return access_is_injective(consumer.axis, None, ld.args)
    red = reds[0]  # the bodies of a tuple reduction share its axes and domain
    return access_is_injective(consumer.axis + red.axes, red.where, ld.args)




def stored_is_cheaper(op, accs, inlined=None):
    """Whether the cheap elementwise stage ``op`` is materialised all the same
    (the materialisation policy's cost rules, docs/stages.md):

    * **a reduction re-reads it** (its load in a reduction is not injective on
      the reduction's domain: every element is read at several taps, as a
      matmul or convolution reads its operands) and its body does float work
      (:attr:`Written.work`: a residual add, a bias, BatchNorm's scale, an
      adjoint sum). Inlined, the work is done again at every tap, and the
      operand is no load the GEMM path can take: stored, it is done once and
      the contraction reads a buffer. Index arithmetic, selects and
      comparisons (padding, masks, relu, gathers, re-indexings) do no work and
      stay inlined: the GEMM path reads them as views and masks, and the
      simplifier lifts their conditions into the reduction's domain;
    * **several accesses recompute it**: ``A`` distinct loads read it and
      ``(A - 1) * (work + loads - 1) > A + 1``: recomputing its work and the
      extra loads at each access costs more than one pass that stores it and
      ``A`` reads. This stores a residual stream once per layer (inlined, each
      layer re-read the whole sum of the earlier ones: code that grew with
      depth, and no two layers alike), and leaves alone a mask read twice.

    Args:
        op: an elementwise ComputeOp with a cheap body (:func:`is_cheap`).
        accs: its accesses ``[(consumer_op, Load)]``.
        inlined: ``{id(op): Written}`` of the producers already inlined into ``op``.
    """
    w = written_out(op.body[0], op.axis, inlined)
    vals = value_loads(op.body[0])
    view = w.work == 0 and len({id(v.tensor) for v in vals}) <= 1
    if view and not any(isinstance(n, (E.FloorDiv, E.FloorMod)) for n in post_order(op.body[0])):
        return False
    a = len(accs)
    if not view and (a - 1) * (w.work + max(w.loads - 1, 0)) > a + 1:
        return True
    for consumer, ld in accs:
        if not isinstance(consumer, ComputeOp):
            continue
        reds = [b for b in consumer.body if isinstance(b, Reduce)]
        if not reds or not _inside(ld, reds[0]):
            continue
        red = reds[0]
        axes = consumer.axis + red.axes
        if view and not (len(vals) == 1 and _scattered(op, vals[0], ld, axes)):
            continue
        if not access_is_injective(axes, red.where, ld.args):
            return True
    return False


def _scattered(op, value, ld, axes):
    """Whether the view ``op`` (whose values are those of the load ``value``), read at
    ``ld`` by a reduction over ``axes``, reads its tensor at a row-major offset
    that is no affine function of ``axes`` although its index divides (``//``,
    ``%``): a reshape after a transpose (attention's heads merged into
    ``(B*T, C)``). A GEMM takes a strided view, not this one; a flatten
    (``X[n, k // 49, k // 7 % 7, k % 7]`` is ``X.reshape(-1)[784 n + k]``) is
    one."""
    idx = [substitute(i, dict(zip(op.axis, ld.args))) for i in value.args]
    return is_scattered(value.tensor, idx, axes)


def value_loads(e):
    """The loads of float tensors whose values ``e`` can take (not those read only by
    a select's condition or a comparison): one for a view, a mask or a relu
    (``select(x > 0, dy, 0)`` takes ``dy``'s), several for a concatenation
    (``select(t < n, A[t], B[t - n])``) or a sum."""
    out, stack, seen = [], [e], set()
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, E.Load):
            if not dt.is_int(x.dtype) and x.dtype != "bool":
                out.append(x)
        elif isinstance(x, E.Select):
            stack.extend(x.args[1:])
        elif isinstance(x, (E.CmpOp, E.And, E.Or, E.Not)):
            continue
        else:
            stack.extend(x.args)
    return out


def _inside(ld, red):
    """Whether the load ``ld`` occurs in the reduction ``red`` (its sources or ``where``)."""
    return any(n is ld for n in post_order(red))


def inlined_stages(tensors, output_ids=None):
    """``{id(op): Written}`` of the stages :func:`should_inline` inlines into their
    consumers, decided producers first: each one's body with the inlined
    producers of its own body written out (:func:`written_out`).

    Args:
        tensors: a Tensor or a list of Tensors (the requested outputs).
        output_ids: ids of the requested output Tensors (default: ``tensors``').
    Returns:
        dict ``id(op) -> Written`` (size in expression nodes, uses of each axis).
    Raises:
        TexprError: ``tensors`` holds something other than Tensors.
    """
    outs = as_tensor_list(tensors, "inlined_stages")
    if output_ids is None:
        output_ids = {id(t) for t in outs}
    accs = accesses(outs)
    sizes = {}
    for op in topo_order(outs):
        if isinstance(op, PlaceholderOp):
            continue
        if should_inline(op, accs.get(id(op), []), output_ids, sizes):
            sizes[id(op)] = written_out(op.body[0], op.axis, sizes)
    return sizes


def materialized_stages(tensors):
    """The operations computed into buffers to compute ``tensors`` (producers first).

    Args:
        tensors: a Tensor or a list of Tensors.
    Returns:
        list of Operations (ComputeOp / ScatterAddOp), topologically ordered;
        placeholders and inlined elementwise stages are left out.
    """
    outs = as_tensor_list(tensors, "iteration_count")
    output_ids = {id(t) for t in outs}
    inlined = inlined_stages(outs, output_ids)
    return [op for op in topo_order(outs) if not isinstance(op, PlaceholderOp)
            and (id(op) not in inlined or id(op.output(0)) in output_ids)]


def stage_count(op):
    """Points of one stage's iteration domain (see the module docstring)."""
    if isinstance(op, ComputeOp):
        body = op.body[0]
        if isinstance(body, Reduce):
            return domain_count(op.axis + body.axes, body.where)
        return int(np.prod(op.shape, dtype=np.int64))
    if isinstance(op, ScatterAddOp):
        return domain_count(op.axis, op.where)
    if isinstance(op, ScanOp):
        return scan_count(op)
    raise TexprError(f"iteration_count: unknown operation {type(op).__name__}")


def scan_count(op):
    """Points a scan visits: its inits' steps (copied), then its materialised body
    stages at the steps ``L <= t < T`` (the body's own materialisation rule, with
    the updates materialised: they are the states)."""
    body_ids = {id(b) for b in op.body_ops}
    n = sum(t.size for t in op.init)
    L = op.init_extent
    for b in materialized_stages(list(op.update)):
        if id(b) not in body_ids:
            continue
        body = b.body[0]
        steps = b.axis[0] >= L
        if isinstance(body, Reduce):
            n += domain_count(b.axis + body.axes, body.where & steps)
        else:
            n += domain_count(b.axis, steps)
    return n


def _axis_term(e, axes):
    """``(d, reversed)`` when ``e`` is the axis ``axes[d]`` or ``(n - 1) - axes[d]``
    (``n`` its extent), else None."""
    for d, a in enumerate(axes):
        if e is a:
            return d, False
    if isinstance(e, E.Sub) and isinstance(e.a, E.Const) and not isinstance(e.a.value, bool):
        for d, a in enumerate(axes):
            if e.b is a and e.a.value == a.dom[1] - 1 and a.dom[0] == 0:
                return d, True
    return None


def scan_view(op, accs, output_ids=()):
    """The layout under which a scan's state can live in ``op``'s buffer, or None.

    ``op`` qualifies when it is an elementwise stage whose body is one load of
    the output of a single-state scan, ``op[a..] = S[e..]`` with every ``e`` an
    axis of ``op`` or its reversal (``n - 1 - a``), each axis once and extents
    equal, nothing else reads ``S`` (``accs``: :func:`accesses` of the graph;
    ``S`` is not a requested output, ``output_ids``), and the scan's body stages
    are elementwise (each step writes its state element by element). Then the scan writes ``op``'s buffer directly, through the index
    map, and ``op`` costs no pass of its own (a cumsum over a later axis, or a
    suffix sum, is written in place; see :func:`iteration_count`).

    Returns ``(scan_op, [(d, reversed) per state axis])``: state axis ``j`` is
    ``op``'s axis ``d``, reversed or not.
    """
    if not is_elementwise(op) or not isinstance(op.body[0], E.Load):
        return None
    ld = op.body[0]
    src = ld.tensor.op
    if not isinstance(src, ScanOp) or src.num_outputs != 1 \
            or not all(is_elementwise(b) for b in src.body_ops):
        return None
    if len(ld.args) != len(op.axis) or id(ld.tensor) in output_ids:
        return None
    perm = [_axis_term(e, op.axis) for e in ld.args]
    if any(p is None for p in perm) or len({d for d, _r in perm}) != len(perm):
        return None
    if any(op.axis[d].dom != (0, n) for (d, _r), n in zip(perm, ld.tensor.shape)):
        return None
    readers = accs.get(id(src), [])
    if len(readers) != 1 or readers[0][0] is not op or readers[0][1] is not ld:
        return None
    return src, perm


def iteration_count(tensors):
    """The exact number of points visited to compute ``tensors`` and every
    non-placeholder stage they need (each materialised stage's domain counted once).

    Args:
        tensors: a Tensor or a list of Tensors.
    Returns:
        int.
    A stage that is a re-indexing of a scan's state (:func:`scan_view`) counts
    nothing: the scan writes its buffer.

    Raises:
        DomainError: a domain ISL cannot count (it never enumerates points).
    """
    outs = as_tensor_list(tensors, "iteration_count")
    accs, output_ids = accesses(outs), {id(t) for t in outs}
    return sum(stage_count(op) for op in materialized_stages(outs)
               if scan_view(op, accs, output_ids) is None)
