"""The lowering of repeated layers (issue 50): the dead-assignment and CSE passes
run once per distinct unit text in a process (codegen.loopnest.lower._tidy), isl makes
one loop nest per distinct schedule map up to the names of its variables
(simplify.loop_ast.generate), and the text is the one made without remembering."""

import texpr as te
from texpr.codegen.loopnest import lower as lower_mod
from texpr.codegen.loopnest import source as source_mod
from texpr.codegen.loopnest.memo import TextMemo
from texpr.codegen.ir.schedule import create_schedule, default_materialized
from texpr.simplify import loop_ast


def _layers(n):
    """``n`` layers of the same shapes (tanh of a product, plus a repeated
    subexpression for the CSE), each materialised, and a sum."""
    X = te.placeholder((4, 6), "X", "float64")
    Ws = [te.placeholder((6, 6), f"W{k}", "float64") for k in range(n)]
    H = X
    for k, W in enumerate(Ws):
        r = te.reduce_axis(6, "r")
        P = te.compute((4, 6), lambda i, j, H=H, W=W, r=r: te.sum(H[i, r] * W[j, r], axis=r),
                       name=f"P{k}")
        H = te.compute((4, 6), lambda i, j, P=P: te.tanh(P[i, j] * 0.5 + 1.0)
                       * te.tanh(P[i, j] * 0.5 + 1.0) + P[i, j], name=f"H{k}")
    a, b = te.reduce_axis(4, "a"), te.reduce_axis(6, "b")
    L = te.compute((), lambda: te.sum(H[a, b], axis=[a, b]), name="L")
    return [L], [X] + Ws


def _lower(outs, ins):
    schedule = create_schedule(outs)
    mat, inl = default_materialized(schedule, None)
    mat |= {id(op) for op in schedule.ops if op.name.startswith(("P", "H"))}
    inl -= mat
    return lower_mod.lower(schedule, ins, mat, inl, parallel=False, contraction=None)


def test_repeated_layers_run_the_passes_once_per_distinct_text(monkeypatch):
    calls, nests = [], []
    real = source_mod.remove_dead_assignments
    real_node = loop_ast._ast_node

    def counting_node(umap, loop_vars, option=None):
        nests.append(str(umap))
        return real_node(umap, loop_vars, option)
    monkeypatch.setattr(loop_ast, "_ast_node", counting_node)
    monkeypatch.setattr(loop_ast, "_MADE", {})

    def counting(src, func="kernel"):
        calls.append(src)
        return real(src, func)
    monkeypatch.setattr(lower_mod, "remove_dead_assignments", counting)
    program = _lower(*_layers(4))
    texts = [u.module_source for u in program.units]
    assert len(texts) == 9 and len(set(texts)) == 3  # P, H, L
    assert len(calls) == len(set(calls)) == 3
    assert len(nests) == 3  # one isl loop nest per distinct stage, not per layer
    # the same text as the passes give on every unit (nothing remembered)
    monkeypatch.setattr(lower_mod, "_TIDIED", TextMemo(0))
    monkeypatch.setattr(loop_ast, "_MADE_KEEP", 0)
    monkeypatch.setattr(loop_ast, "_MADE", {})
    calls.clear()
    nests.clear()
    again = _lower(*_layers(4))
    assert len(calls) == 9 and len(nests) == 9
    assert [u.module_source for u in again.units] == texts
    assert again.source == program.source
    assert any("cse" in t for t in texts)  # the CSE pass ran on these texts


def test_the_memo_is_bounded_by_the_size_of_what_it_keeps():
    m = TextMemo(10)
    m.put("a", "A", 5)
    m.put("b", "B", 4)
    assert m.get("a") == "A"  # now the most recently used
    m.put("c", "C", 5)  # 14 > 10: the least recently used (b) goes, 10 are kept
    assert (m.get("a"), m.get("b"), m.get("c")) == ("A", None, "C") and len(m) == 2
    m.put("big", "X", 11)  # larger than the bound: nothing is kept
    assert len(m) == 0 and m.get("big") is None
    nothing = TextMemo(0)
    nothing.put("k", "v", 1)
    assert nothing.get("k") is None
