"""Store the large shared subexpressions of an oversized stage body in stages of their own.

A stage body is a DAG: a subexpression used twice is one node. Code is written as
a tree, though, and the emitter writes a shared subexpression out again under
each guard that needs it. A body whose tree is much larger than its DAG -- the
gradient of a bilinear sampler with reflection padding, where each sample
coordinate (``|c + 0.5|``, a float ``%``, a parity, a clamp) and its
derivative are read by four corners, two weights and their bounds checks, and
the whole is summed over the channels -- became a 170 KB unit that numba and
LLVM compiled for minutes in gigabytes (issue 51).

The rule (:func:`hoist_invariants`): a stage whose body, written out with its
inlined producers (:func:`texpr.simplify.materialize.written_out`), exceeds
:data:`HOIST_TREE_NODES` nodes gets its shared subexpressions stored, the one
that shrinks the tree most first, until the tree is within half the budget.
A stored subexpression

* depends only on the stage's own axes (never on a reduction axis), and not on
  all of those of two or more points (output or reduction axes): it becomes a
  stage over the axes it uses, computed once for all the points of the others
  instead of at each (loop-invariant code motion into a stage);
* occurs at least twice in the tree and has at least :data:`HOIST_MIN_NODES`
  nodes written out;
* is not cheap (:func:`texpr.simplify.materialize.is_cheap`): a few index
  operations are not worth a buffer. The new stage is tagged
  :data:`texpr.simplify.materialize.HOISTED_TAG`, and the inlining rule keeps it;
* is a float value that cannot fail where the original did not evaluate it:
  each load's index is a constant or one of the stage's axes within the
  tensor's extent, and integer arithmetic only combines axes and constants
  (arithmetic on integer values is checked and may fail; a division by zero
  would). Float arithmetic never raises; a value computed where a select would
  not have looked at it is not read.

Values are unchanged: the same expression is evaluated at the same points.
"""

from texpr import dtypes as dt
from texpr import expr as E
from texpr.expr import Load, Reduce
from texpr.tensor import ComputeOp, topo_order
from texpr.visitor import free_vars, post_order, transform

from .graph import fresh_stage, rebuild
from .materialize import HOISTED_TAG, inlined_stages, is_cheap, tree_counts, written_out

#: a body written out as a tree larger than this gets its shared parts stored
HOIST_TREE_NODES = 2000
#: the smallest subexpression (written out) worth a stage of its own
HOIST_MIN_NODES = 16
#: at most this many subexpressions are stored per stage and pass
HOIST_MAX_STAGES = 8

_INT_ARITH = (E.Add, E.Sub, E.Mul, E.FloorDiv, E.FloorMod, E.Div, E.Min, E.Max)


def hoist_invariants(tensors):
    """Store the shared subexpressions of oversized stage bodies (module docstring)."""
    inl = inlined_stages(tensors)
    big = set()
    for op in topo_order(list(tensors)):
        if (isinstance(op, ComputeOp) and len(op.body) == 1
                and written_out(op.body[0], op.axis, inl).size > HOIST_TREE_NODES):
            big.add(id(op))
    if not big:
        return list(tensors)

    def fn(op, orig, _tmap):
        if id(orig) not in big:
            return None
        body = hoisted_body(op)
        if body is op.body[0]:
            return None
        return ComputeOp(op.name, op.axis, (body,), op.tag, op.attrs).outputs

    return rebuild(tensors, fn)


def hoisted_body(op):
    """``op``'s body with its shared invariant subexpressions read from new stages
    (the body itself when none qualifies)."""
    body = op.body[0]
    axes = {id(a): a for a in op.axis if a.dom[0] == 0}
    # parts stored by an earlier round keep their names: number the new ones after them
    first = len({id(x.tensor) for x in post_order(body)
                 if isinstance(x, Load) and getattr(x.tensor.op, "tag", "") == HOISTED_TAG})
    # the loops a stored part leaves: an axis of two or more points that it does not read
    loops = [a for a in op.axis + (body.axes if isinstance(body, Reduce) else ())
             if a.dom[1] - a.dom[0] >= 2]
    for k in range(first, first + HOIST_MAX_STAGES):
        size, mult = tree_counts(body)
        if size[id(body)] <= HOIST_TREE_NODES // 2:
            break
        best, gain = None, 0
        for n in post_order(body):
            g = (mult[id(n)] - 1) * (size[id(n)] - 1)
            if (mult[id(n)] >= 2 and size[id(n)] >= HOIST_MIN_NODES and g > gain
                    and _storable(n, axes) and _leaves_a_loop(n, loops)):
                best, gain = n, g
        if best is None:
            break
        used = [a for a in op.axis if any(v is a for v in free_vars(best))]
        stage = fresh_stage(f"{op.name}_part{k}", used, best, tag=HOISTED_TAG)
        load = stage.output(0)[tuple(used)] if used else stage.output(0)[()]
        body = transform(body, lambda node, b=best, ld=load: ld if node is b else None)
    return body


def _leaves_a_loop(n, loops):
    """Whether ``n`` does not read one of ``loops``: stored, it is computed once for
    all their points instead of at each (a stage as large as its consumer would
    only move the code)."""
    used = {id(v) for v in free_vars(n)}
    return any(id(a) not in used for a in loops)


def _storable(n, axes):
    """Whether ``n`` may become a stage over the axes in ``axes`` (module docstring)."""
    if isinstance(n, (E.Const, E.Var, Reduce)) or not dt.is_float(n.dtype):
        return False
    if isinstance(n, Load) and all(isinstance(a, (E.Const, E.Var)) for a in n.args):
        return False  # a plain load: nothing to save
    if any(id(v) not in axes for v in free_vars(n)):
        return False
    for x in post_order(n):
        if isinstance(x, Reduce):
            return False
        if isinstance(x, Load) and not _in_bounds(x, axes):
            return False
        if dt.is_int(x.dtype) and isinstance(x, _INT_ARITH) and not all(
                isinstance(a, (E.Const, E.Var)) for a in x.args):
            return False  # checked integer arithmetic on values may fail (codegen.bounds)
        if (isinstance(x, (E.FloorDiv, E.FloorMod, E.Div)) and dt.is_int(x.dtype)
                and not (isinstance(x.args[1], E.Const) and x.args[1].value != 0)):
            return False
    return not is_cheap(n)


def _in_bounds(ld, axes):
    """Whether every index of ``ld`` is a constant or a stage axis within its extent."""
    for a, n in zip(ld.args, ld.tensor.shape):
        if isinstance(a, E.Const):
            if not 0 <= a.value < n:
                return False
        elif not (isinstance(a, E.Var) and id(a) in axes and a.dom[1] <= n):
            return False
    return True
