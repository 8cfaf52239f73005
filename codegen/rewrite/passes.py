"""codegen's graph rewrites as one ordered list of passes, beside simplify's pipeline.

One job: run the rewrites that prepare a simplified graph for its lowerings, in
order, each a pass ``list[Tensor] -> list[Tensor]`` (same outputs, same values)
run by :func:`texpr.simplify.runner.run_passes`, so that
``TEXPR_PRINT_PASSES=1`` prints the graph after each and ``TEXPR_VERIFY=1``
checks each on random data, as for the simplifier's passes:

1. ``pack_operands`` -- a contraction's computed operands into stages of their
   own (:mod:`codegen.rewrite.operands`), so that the GEMM reads buffers;
2. ``split_taps`` -- a convolution-like contraction into a GEMM stage and a
   col2im loop nest (:mod:`codegen.rewrite.tap_split`);
3. ``window_operands`` -- sliding-window operands read from window stages
   (:mod:`codegen.rewrite.windows`);
4. ``split_reductions`` -- a long reduction to few outputs into parallel slices
   (:mod:`codegen.rewrite.split_reductions`; parallel builds only).

What a pass decides for the schedule (which new stages get buffers, which run
in parallel) is collected in a :class:`Rewritten`, which the build applies.
"""

from texpr.simplify.runner import run_passes

from .operands import pack_operands
from .split_reductions import split_reductions
from .tap_split import split_taps
from .windows import window_operands

__all__ = ["Rewritten", "rewrite_passes", "rewrite"]


class Rewritten:
    """What the rewrites leave to the schedule: ``materialize`` (ops a GEMM or a
    shift plan reads: computed once into a buffer, never inlined at every tap),
    ``windows`` (window stages: their sources get buffers too) and ``parts``
    (split reductions' slice stages: their slices run in parallel)."""

    def __init__(self):
        self.materialize, self.windows, self.parts = [], [], []


def _named(fn, name):
    fn.__name__ = fn.__qualname__ = name
    return fn


def rewrite_passes(found, gemms=True, parallel=True):
    """The passes, in order, recording into ``found`` (a :class:`Rewritten`).
    ``gemms``: the three rewrites for GEMMs and shift plans; ``parallel``: the
    split of long reductions."""
    state = {"packed": [], "split": []}

    def pack(tensors):
        tensors, state["packed"] = pack_operands(tensors)
        return tensors

    def taps(tensors):
        tensors, state["split"], state["packed"] = split_taps(tensors, keep=state["packed"])
        return tensors

    def windows(tensors):
        tensors, wins, packed = window_operands(tensors, keep=state["packed"] + state["split"])
        found.materialize[:] = packed + wins
        found.windows[:] = wins
        return tensors

    def parts(tensors):
        remap = {}
        tensors, found.parts[:] = split_reductions(tensors, remap)
        # (the stages downstream of a split one are rebuilt: what the earlier
        # passes recorded follows them)
        found.materialize[:] = [remap.get(id(op), op) for op in found.materialize]
        found.windows[:] = [remap.get(id(op), op) for op in found.windows]
        return tensors

    passes = []
    if gemms:
        passes += [_named(pack, "pack_operands"), _named(taps, "split_taps"),
                   _named(windows, "window_operands")]
    if parallel:
        passes.append(_named(parts, "split_reductions"))
    return tuple(passes)


def rewrite(outputs, gemms=True, parallel=True):
    """``(tensors, Rewritten)``: the rewrites run over ``outputs`` (simplified Tensors)."""
    found = Rewritten()
    tensors = run_passes(list(outputs), rewrite_passes(found, gemms, parallel))
    return tensors, found
