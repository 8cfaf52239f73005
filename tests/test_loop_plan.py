"""A loop-nest stage is planned before its text is written and written once
(codegen.loopnest.plan, issue 49): the chunked-or-parallel decision is read from
the planned statements and isl trees (plan.decide_chunks), so a stage whose nests
chunks cannot take is not lowered a second time with parallel loops, and the
stage's plan line (Kernel.source, kernel.explain()) says what its text does."""

import numpy as np

import texpr as te
from texpr import codegen
from texpr.codegen.loopnest import plan as P
from texpr.codegen.loopnest.emit import _Writer
from texpr.codegen.loopnest.lower import BufferInfo
from texpr.codegen.loopnest import stage as S


def _count(monkeypatch):
    """Spy on the stage lowering's planning step and plan.decide_chunks: the
    lists of the stages each ran for."""
    planned, decided = [], []
    orig_plan, orig_decide = S._StageLowering._plan, S.decide_chunks

    def plan(self, depth):
        planned.append(self.op.name)
        return orig_plan(self, depth)

    def decide(info, nests, lowering):
        out = orig_decide(info, nests, lowering)
        decided.append((lowering.op.name, out.chunked))
        return out

    monkeypatch.setattr(S._StageLowering, "_plan", plan)
    monkeypatch.setattr(S, "decide_chunks", decide)
    monkeypatch.setenv("TEXPR_SYMBOLIC_CACHE", "0")  # lower now, not from a cache
    return planned, decided


def _plan_line(kernel, name):
    return next(ln for ln in kernel.source.splitlines() if ln.startswith(f"#   {name}: "))


def test_a_stage_chunks_cannot_take_is_lowered_once_with_parallel_loops(monkeypatch):
    # a buffer-mode reduction (its reduction loop outside the spatial axis i)
    # parallel over its second axis: a chunk could not fill its own rows only
    A = te.placeholder((8, 96, 64), "A", "float64")
    k = te.reduce_axis(8, "k")
    Y = te.compute((96, 64), lambda i, j: te.sum(A[k, i, j], axis=k), name="Y")
    s = codegen.create_schedule([Y])
    i, j = Y.op.axis
    s[Y].reorder(j, k, i)
    s[Y].parallel(j)
    planned, decided = _count(monkeypatch)
    kernel = codegen.build([Y], [A], s)
    assert planned == ["Y"] and decided == [("Y", False)]
    assert "loop nest (prange)" in _plan_line(kernel, "Y")
    assert "prange(" in kernel.source.split("def unit0(")[1] and "part[" not in kernel.source
    a = np.random.default_rng(0).standard_normal(A.shape)
    np.testing.assert_allclose(kernel(a)[0], a.sum(axis=0), rtol=1e-12, atol=1e-12)


def test_a_chunked_stage_is_planned_once_and_its_plan_names_its_axis(monkeypatch):
    A = te.placeholder((512, 300), "A", "float64")
    k = te.reduce_axis(300, "k")
    Y = te.compute((512,), lambda i: te.sum(A[i, k] * A[i, k], axis=k), name="Y")
    s = codegen.create_schedule([Y])
    s[Y].parallel(Y.op.axis[0])
    planned, decided = _count(monkeypatch)
    seen = []
    orig = S._StageLowering._decide

    def decide(self):
        orig(self)
        seen.append(self.loop_plan)

    monkeypatch.setattr(S._StageLowering, "_decide", decide)
    kernel = codegen.build([Y], [A], s)
    assert planned == ["Y"] and decided == [("Y", True)]
    (loops,) = seen
    assert isinstance(loops, P.LoopPlan) and loops.execution == "chunked"
    assert loops.chunk_axis is Y.op.axis[0] and loops.parallel == (Y.op.axis[0],)
    assert "loop nest (chunked)" in _plan_line(kernel, "Y")
    assert kernel.units[0].chunks == 512
    a = np.random.default_rng(1).standard_normal(A.shape)
    np.testing.assert_allclose(kernel(a)[0], (a * a).sum(axis=1), rtol=1e-12, atol=1e-12)


def test_decide_chunks_reads_the_trees_without_writing():
    # a stage with no parallel loop: not chunked, nothing written by deciding
    A = te.placeholder((4, 5), "A", "float64")
    Y = te.compute((4, 5), lambda i, j: A[i, j] * 2.0, name="Y")
    s = codegen.create_schedule([Y])
    w = _Writer()
    buffers = {id(A): BufferInfo("b0", A, "input"),
               id(Y): BufferInfo("b1", Y, "output")}
    sl = S._StageLowering(0, Y.op, s[Y], buffers, set(), [], False, w)
    sl._plan(1)
    assert w.lines == [] and len(sl.items) == 1
    (nest,) = sl.items
    assert isinstance(nest, P.Nest) and nest.tree is not None and not nest.par_chunked
    assert not P.decide_chunks(P.StageChunks(Y.op, ok=True), sl.items, sl).chunked
