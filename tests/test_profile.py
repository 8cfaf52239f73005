"""The profiler (issue 48, codegen.profile): ``kernel.profile(*arrays)`` gives one row
per unit with its lowering and what it computes, rows that add up to the calls'
wall time, GFLOP/s from the exact multiply-add count, the outputs of a plain
call; ``TEXPR_PROFILE=1`` records every call and prints the table at exit; a
kernel that is not profiled reads no clock.

One kernel for most tests: a dense layer's loss and weight gradients (two
GEMM stages, loop nests) and a skinny product (4 columns: a loop-nest
contraction)."""

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import texpr as te
from texpr import codegen
from texpr.codegen.backends.numba_cpu import native_call
from texpr.codegen import profile as prof
from texpr.errors import TexprError

N, D, H, S = 64, 96, 48, 4


def _graph():
    X = te.placeholder((N, D), name="X")
    W = te.placeholder((H, D), name="W")
    b = te.placeholder((H,), name="b")
    V = te.placeholder((S, D), name="V")
    lab = te.placeholder((N,), name="lab", dtype="int64")
    L = te.nn.cross_entropy(te.nn.relu(te.nn.dense(X, W, b)), lab)
    dW, db = te.differentiate(L, [W, b])
    skinny = te.nn.dense(X, V, name="skinny")
    return [L, dW, db, skinny], [X, W, b, V, lab]


@pytest.fixture(scope="module")
def kernel():
    outs, ins = _graph()
    return codegen.build(outs, ins)


@pytest.fixture(scope="module")
def arrays():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((N, D)).astype(np.float32),
            (0.1 * rng.standard_normal((H, D))).astype(np.float32),
            rng.standard_normal(H).astype(np.float32),
            rng.standard_normal((S, D)).astype(np.float32),
            rng.integers(0, H, N)]


@pytest.fixture(autouse=True)
def not_recording():
    """Every test starts and ends with no profile recording."""
    prof.disable()
    yield
    prof.disable()


def test_every_unit_has_a_row_with_its_lowering(kernel, arrays):
    p = kernel.profile(*arrays, repeat=3, print_table=False)
    units, extra = p.rows[:len(kernel.units)], p.rows[len(kernel.units):]
    assert [r.stage for r in units] == [u.stage for u in kernel.units]
    assert [r.stage for r in extra] == ["(driver)", "(call checks)"]
    kinds = {u.kind for u in kernel.units}
    assert {"blas", "numba"} <= kinds
    for u, r in zip(kernel.units, units):
        assert r.calls == 3
        if u.kind == "blas":
            assert r.lowering.startswith("GEMM ("), r
        else:
            assert r.lowering in ("loop nest, serial", "loop nest, parallel",
                                  "loop nest, chunked parallel"), r
    by = {r.stage: r for r in units}
    assert by["dense"].lowering == f"GEMM ({N}x{D} @ {D}x{H})"
    assert by["d_W__dense"].lowering == f"GEMM ({H}x{N} @ {N}x{D})"
    assert by["skinny"].lowering.startswith("loop nest")


def test_rows_say_what_each_stage_computes(kernel, arrays):
    p = kernel.profile(*arrays, print_table=False)
    by = {r.stage: r.computes for r in p.rows}
    assert by["dense"] == "forward of dense"
    assert by["cross_entropy_lse_max"] == "forward of cross_entropy"
    assert by["d_W__dense"] == "gradient of W through dense"
    assert by["d_b__dense_bias"] == "gradient of b through dense_bias"
    # the head behind the relu is stored by the materialisation policy (d_W's GEMM
    # re-reads it), so d_W reads a buffer: no packed operand is made for it
    assert by["d_dense_bias__relu"] == "gradient of dense_bias through relu"
    assert not [s for s in by if "_packed" in s]


def test_rows_add_up_to_the_wall_time_of_the_calls(kernel, arrays):
    kernel.profile(*arrays, print_table=False)  # (the counts are computed once)
    t0 = time.perf_counter()
    p = kernel.profile(*arrays, repeat=5, print_table=False)
    outside_ms = (time.perf_counter() - t0) * 1e3
    total = sum(r.total_ms for r in p.rows)
    assert total == pytest.approx(p.wall_ms, rel=0.02)
    assert sum(r.percent for r in p.rows) == pytest.approx(100.0, rel=0.02)
    assert 0 < p.wall_ms <= outside_ms
    assert all(r.total_ms >= 0 for r in p.rows)
    assert p.calls == 5
    assert p.rows[0].ms_per_call == pytest.approx(p.rows[0].total_ms / 5)


def test_the_outputs_are_a_plain_calls(kernel, arrays):
    p = kernel.profile(*arrays, repeat=2, warmup=1, print_table=False)
    plain = kernel(*arrays)
    assert len(p.outputs) == len(plain) == 4
    for a, b in zip(p.outputs, plain):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    # by name too
    named = kernel.profile(X=arrays[0], W=arrays[1], b=arrays[2], V=arrays[3], lab=arrays[4],
                           print_table=False)
    np.testing.assert_array_equal(named.outputs[1], plain[1])


def test_gflops_of_a_gemm_row_come_from_its_exact_multiply_adds(kernel, arrays):
    p = kernel.profile(*arrays, repeat=2, print_table=False)
    by = {r.stage: r for r in p.rows}
    for stage in ("dense", "d_W__dense"):
        r = by[stage]
        assert r.macs == N * D * H  # (the plan's GEMM does exactly the domain's)
        assert r.gbps is None
        assert r.gflops == pytest.approx(2 * r.macs * r.calls / (r.total_ms / 1e3) / 1e9)
    # a loop nest that contracts (4 columns: no GEMM) has its GFLOP/s too
    assert by["skinny"].macs == N * S * D and by["skinny"].gflops > 0
    # the max over the classes moves as many elements as it visits: GB/s, of its buffers
    lse = by["cross_entropy_lse_max"]
    assert lse.macs is None and lse.gflops is None and lse.gbps > 0
    u = kernel.units[kernel.stages.index("cross_entropy_lse_max")]
    bufs = kernel._program.buffers
    assert lse.bytes == sum(bufs[a].size * np.dtype(bufs[a].dtype).itemsize for a in u.args)
    assert by["(driver)"].gflops is None and by["(driver)"].gbps is None


def test_the_table_is_printed_when_asked(kernel, arrays, capsys):
    p = kernel.profile(*arrays, repeat=2)
    out = capsys.readouterr().out
    assert out.strip() == str(p)
    lines = out.splitlines()
    assert lines[0].startswith("Kernel(X, W, b, V, lab -> cross_entropy, d_W__dense")
    assert "2 calls" in lines[0]
    row = next(ln for ln in lines if ln.startswith("d_W__dense "))
    assert "gradient of W through dense" in row and "GEMM" in row and "GFLOP/s" in row
    assert lines[-1].split()[0] == "total" and "100.0" in lines[-1]
    kernel.profile(*arrays, print_table=False)
    assert capsys.readouterr().out == ""
    assert p.table(sort_by="total_ms").splitlines()[-1] == lines[-1]


def test_bad_repeat_is_an_error(kernel, arrays):
    for bad in (0, -1, 1.5, True):
        with pytest.raises(TexprError, match="repeat must be an int"):
            kernel.profile(*arrays, repeat=bad)
    with pytest.raises(TexprError, match="warmup must be an int"):
        kernel.profile(*arrays, warmup=-1)


def test_a_call_that_is_not_profiled_reads_no_clock(kernel, arrays, monkeypatch):
    def no_clock():
        raise AssertionError("a clock read outside a profile")

    monkeypatch.setattr(prof, "_clock", no_clock)
    assert prof.ACTIVE is None
    kernel(*arrays)  # would raise if the driver timed anything


def test_recording_in_process_and_the_report(kernel, arrays, capsys):
    prof.enable()
    assert prof.enabled()
    # the bridges' compiled driver times nothing: they take the Python driver meanwhile
    assert native_call.describe(kernel) is None
    for _ in range(3):
        kernel(*arrays)
    kernel.run_exact(arrays)  # (the bridges' entry)
    rep = codegen.profile_report(print_table=False)
    assert len(rep.profiles) == 1
    p = rep.profiles[0]
    assert p.calls == 4 and p.outputs is None
    assert [r.stage for r in p.rows] == kernel.stages + ["(driver)"]
    assert sum(r.total_ms for r in p.rows) == pytest.approx(p.wall_ms, rel=0.02)
    # a profile() while recording counts there too, and reset starts again
    kernel.profile(*arrays, repeat=2, print_table=False)
    assert codegen.profile_report(print_table=False, reset=True).profiles[0].calls == 6
    assert codegen.profile_report(print_table=False).profiles == []
    codegen.profile_report()
    assert "no kernel call was recorded" in capsys.readouterr().out
    prof.disable()
    assert codegen.profile_report(print_table=False).profiles == []


_PROGRAM = textwrap.dedent("""
    import numpy as np
    import texpr as te
    from texpr import codegen

    X = te.placeholder((8, 5), name="X")
    Y = te.compute((8, 5), lambda i, j: te.exp(X[i, j]) * 2.0, name="Y")
    k = codegen.build([Y], [X])
    for _ in range(3):
        k(np.ones((8, 5), "float32"))
    print("done")
""")


def test_texpr_profile_prints_the_table_at_exit(tmp_path):
    env = dict(os.environ, TEXPR_PROFILE="1")
    out = subprocess.run([sys.executable, "-c", _PROGRAM], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "done"  # (the table goes to stderr)
    lines = out.stderr.splitlines()
    head = next(k for k, ln in enumerate(lines) if ln.startswith("Kernel(X -> Y): 3 calls"))
    row = next(ln for ln in lines[head:] if ln.startswith("Y "))
    assert "forward" in row and "loop nest" in row and "GB/s" in row
    assert any(ln.startswith("(driver)") for ln in lines[head:])
    env["TEXPR_PROFILE"] = "0"
    quiet = subprocess.run([sys.executable, "-c", _PROGRAM], env=env, capture_output=True,
                           text=True, timeout=300)
    assert quiet.returncode == 0 and "Kernel(" not in quiet.stderr


def test_gradient_scatters_are_named_from_the_adjoint_convention():
    # the adjoint of a gather is a scatter-add stage: no attributes, its name says it
    E = te.placeholder((10, 4), name="E")
    idx = te.placeholder((6,), name="idx", dtype="int64")
    G = te.compute((6, 4), lambda i, j: E[idx[i], j] * 2.0, name="G")
    r, c = te.reduce_axis(6, "r"), te.reduce_axis(4, "c")
    L = te.compute((), lambda: te.sum(G[r, c] * G[r, c], axis=[r, c]), name="L")
    (dE,) = te.differentiate(L, [E])
    ops = te.tensor.topo_order([dE])
    scatters = [op for op in ops if isinstance(op, te.tensor.ScatterAddOp)]
    assert scatters
    for op in scatters:
        assert prof.computes(op, {o.name for o in ops}) == "gradient of E through G", op.name
    assert prof._adjoint_name("d_a__b__c", {"a__b"}) == ("a__b", "c")
    assert prof._adjoint_name("d_a__b__c", {"a"}) == ("a", "b__c")
    assert prof._adjoint_name("d_x__y_g1", {}) == ("x", "y")
    assert prof._adjoint_name("d_E__dense", set()) == ("E", "dense")
    assert prof._adjoint_name("d_E__dense_g0", {"E", "dense"}) == ("E", "dense")
    assert prof._adjoint_name("dense", {}) is None


def test_a_torch_bridge_call_is_recorded():
    # the bridge's compiled driver times nothing: while recording it takes the
    # Python driver, so its calls have rows too
    torch = pytest.importorskip("torch")
    from texpr import torch as tt

    X = te.placeholder((8, 5), name="X")
    Y = te.compute((8, 5), lambda i, j: te.exp(X[i, j]) + 1.0, name="Ybridge")
    f = tt.op(Y, [X])
    prof.enable()
    x = torch.ones(8, 5)
    for _ in range(2):
        y = f(x)
    assert torch.allclose(y, torch.exp(x) + 1.0)
    (p,) = [q for q in codegen.profile_report(print_table=False).profiles
            if q.kernel == "Kernel(X -> Ybridge)"]
    assert p.calls == 2 and [r.stage for r in p.rows] == ["Ybridge", "(driver)"]
