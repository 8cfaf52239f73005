"""Split reductions: a reduction to few outputs over a large domain, across cores.

One job: rewrite, before scheduling, a reduction stage with at most
``options.split_reduction_max_outputs`` output points and at least ``options.split_reduction_min_points`` points in its
box (a loss, a logsumexp over a whole array, a norm) -- or at most
``options.split_reduction_strided_outputs`` where a load's layout puts the
split axis outside an output axis (BatchNorm's sums, :func:`_outside`) -- into
two stages, as XLA's and Inductor's split reductions do:

    Y_parts[p, i..] = reduce(source, axis=[r', ...], where=where && r < n)   r = p * c + r'
    Y[i..]          = reduce(Y_parts[p, i..], axis=p)

The first reduces ``options.split_reduction_parts`` contiguous slices of the first reduction axis
long enough to split (``c`` = ceil(n / options.split_reduction_parts) of its ``n`` values each): its
``options.split_reduction_parts x outputs`` points run in parallel, each with the inner loop's
independent accumulators of any long reduction (:mod:`codegen.loopnest.stage`). The
second combines the partial results in slice order. A stage that no thread
could share (one output: a scalar loss) ran on one core with one
loop-carried accumulator: 6.0 ms for the max and the sum of a 1.28 M-element
logsumexp.

Only the built-in combiners are split (sum, prod, max, min: associative; a
custom reducer keeps its row-major order of points on one path). The
partition does not depend on the thread count, so a result is the same for
every run of the same kernel; a sum is added in another order than the
unsplit stage's (slice by slice, then the slices in order), within its
dtype's rounding of it. A stage the GEMM path could run (a contraction) is
left to it.
"""

from texpr import expr as E
from texpr.expr import Reduce, iter_var
from texpr.simplify.graph import rebuild
from texpr.tensor import ComputeOp
from texpr.visitor import free_vars, post_order, substitute

from ..analysis import contraction, matches
from ..options import current as _opts

__all__ = ["split_reductions", "SPLIT"]

# options.split_reductions (default True): False: no reduction is split (for A/B timings)

# options.split_reduction_parts (default 16): slices of the split axis (fixed: the
#   partition, and so the result, does not depend on the number of threads)
# options.split_reduction_max_outputs (default 8): a reduction with more output points than
#   this is parallel over its outputs already
# options.split_reduction_min_points (default 1 << 19): the fewest points (outputs x
#   reduction box) a split stage has: below, one thread's pass is shorter than waking a
#   second one
# options.split_reduction_strided_outputs (default 256): ... or this many where a load puts
#   the split axis outside an output axis and a reduction axis inside it (:func:`_outside`)
#: the tag of a stage of partial results (``attrs["of"]``: the stage it was split from)
SPLIT = "split_reduction"

_SPLIT_KINDS = ("sum", "prod", "max", "min")


def split_reductions(outputs, remap=None):
    """The graph of ``outputs`` with its long reductions to few outputs split (see
    the module docstring). Returns ``(tensors, parts)``: the output Tensors
    (the same objects where nothing changed) and the stages of partial results
    made. Never raises for a stage it cannot split: that stage is kept.

    ``remap`` (a dict, optional) receives ``id(stage of the input graph) -> its
    stage in the result``: every stage downstream of a split one is rebuilt,
    and the earlier passes' records (the operands a GEMM reads, the windows)
    name the input graph's."""
    parts = []
    if not _opts().split_reductions:
        return list(outputs), parts

    def fn(op, orig, tmap):
        split = _split(op)
        if split is None:
            if remap is not None:
                remap[id(orig)] = op
            return None
        part_op, combined = split
        parts.append(part_op)
        if remap is not None:
            remap[id(orig)] = combined
        return combined.output(0)

    return rebuild(list(outputs), fn), parts


def _outside(red, axis, r):
    """Whether a load of ``red``'s source indexes a dimension by the reduction axis
    ``r`` before (row-major: outside) one it indexes by an output axis of
    ``axis``, and a later one by a reduction axis: BatchNorm's ``x[n, c, h, w]``
    summed over ``n, h, w`` per ``c``. One output's pass then reads runs of the
    inner dimensions far apart (4 KB every 128 KB for a (64, 32, 32, 32)
    float32 ``x``: 1.5 ms from memory for 8 MB); the slices of ``r`` read the
    rows along, each slice's runs one after the other (0.5 ms). Where no
    reduction axis is inside the output's (a bias gradient's ``dy[i, o]``), the
    stage runs its reduction loop outside its output loop and reads the rows
    along already: not split."""
    outs = {id(a) for a in axis}
    rd = {id(a) for a in red.axes}
    for ld in post_order(red.source[0]):
        if not isinstance(ld, E.Load):
            continue
        seen_r = seen_out = False
        for ix in ld.indices:
            names = {id(v) for v in free_vars(ix)}
            if seen_out and names & rd:
                return True
            seen_out = seen_out or (seen_r and bool(names & outs))
            seen_r = seen_r or id(r) in names
    return False


def _split(op):
    """``(parts stage, combining stage)`` for ``op``, or None when it is not split."""
    if not isinstance(op, ComputeOp) or op.num_outputs != 1 or not isinstance(op.body[0], Reduce):
        return None
    red = op.body[0]
    comb = red.combiner
    if comb.kind not in _SPLIT_KINDS or len(red.source) != 1 or op.tag == SPLIT:
        return None
    outputs = 1
    for n in op.shape:
        outputs *= n
    box = outputs
    for a in red.axes:
        box *= a.dom[1] - a.dom[0]
    if outputs > _opts().split_reduction_strided_outputs \
            or box < _opts().split_reduction_min_points:
        return None
    long_axes = [a for a in red.axes if a.dom[1] - a.dom[0] >= 2 * _opts().split_reduction_parts]
    if not long_axes:
        return None
    if outputs > _opts().split_reduction_max_outputs and not _outside(red, op.axis, long_axes[0]):
        return None
    if contraction.float_sum(op) is not None and matches.match(op) is not None:
        return None  # a GEMM (a dot product) runs it
    r = long_axes[0]
    lo, hi = r.dom
    chunk = -(-(hi - lo) // _opts().split_reduction_parts)
    p = iter_var(0, _opts().split_reduction_parts, "p", "spatial")
    inner = iter_var(0, chunk, r.name, "reduce")
    axis = tuple(iter_var(a.dom[0], a.dom[1], a.name, "spatial") for a in op.axis)
    fresh = {a: iter_var(a.dom[0], a.dom[1], a.name, "reduce") for a in red.axes if a is not r}
    mapping = dict(zip(op.axis, axis))
    mapping.update(fresh)
    mapping[r] = p * chunk + inner + lo
    source = substitute(red.source[0], mapping)
    # the slice's bound first: a data-dependent where (a relu mask's load) is
    # evaluated only inside the axis (the last slice is short)
    where = E.logical_and(p * chunk + inner + lo < hi, substitute(red.where, mapping))
    axes = tuple(inner if a is r else fresh[a] for a in red.axes)
    body = E.make_reduce(comb, (source,), axes, where, 0)
    part_op = ComputeOp(f"{op.name}_parts", (p,) + axis, (body,), SPLIT, {"of": op.name})
    parts_t = part_op.output(0)
    out_axis = tuple(iter_var(a.dom[0], a.dom[1], a.name, "spatial") for a in op.axis)
    q = iter_var(0, _opts().split_reduction_parts, "p", "reduce")
    total = E.make_reduce(comb, (parts_t[(q,) + out_axis],), (q,), None, 0)
    combined = ComputeOp(op.name, out_axis, (total,), op.tag, op.attrs)
    return part_op, combined
