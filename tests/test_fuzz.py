"""Fuzzed programs end to end: compiled kernel vs te.evaluate (forward and
gradients, NaN/inf patterns equal), raw vs simplified gradients, gradients vs
float64 finite differences, OutOfBoundsError on every path or none.

The CI profile runs ``CI_PROGRAMS`` programs from a fixed seed; kernels are
compiled for every ``CI_COMPILE_EVERY``-th program (several programs batched
into one kernel) to keep the profile within its time budget on a shared
2-core machine. The parallel profile compiles ``PARALLEL_PROGRAMS`` programs
with every stage a parallel loop nest, each kernel run again with its serial
twins. The threads profile runs ``THREADS_PROGRAMS`` programs' kernel from
several threads at once and re-entrantly; the extreme profile compiles
``EXTREME_PROGRAMS`` convolutions with empty and size-1 axes and strides,
paddings and dilations up to 10**6 (:func:`fuzz.make_extreme_program`).
Long runs: ``TEXPR_FUZZ=N`` runs N programs from a random first seed (printed;
replay with ``TEXPR_FUZZ_SEED=S``), every one compiled.
A finding prints its seed: ``fuzz.make_program(seed)`` rebuilds the program.
"""

import os
import random

import numpy as np
import pytest

import fuzz
import texpr as te

CI_SEED = 20261130
CI_PROGRAMS = 100
CI_COMPILE_EVERY = 10

#: seeds whose programs the fuzzer found wrong once, each re-run alone as a
#: regression test. Compiled (the kernel was wrong, failed or crashed):
#: single-point max/min/argmax, NaN in max, out-of-range gathers dropped by a
#: gradient scatter (issue 10), a multi-output elementwise consumer (a collapsed
#: tuple reduction) the inlining rule read as a reduction, out-of-range gathers
#: dropped by the raw adjoint (the kernel must raise too), a GEMM that dropped a
#: reduction axis neither operand reads, an argmax sentinel range-checked inside
#: the comparison that guards it, a NaN input times a select-zero factor (the
#: kernel is checked against the simplified graph it computes)
REGRESSIONS = (20261140, 20261160, 20261180, 20261210, 20261230, 20261280,
               20261242, 20261319, 20263039, 749189702348, 309414454992, 392882972644)
#: from long runs with today's generator (reshape loads, data-reading domains),
#: compiled: a constant stage read at an out-of-range data index, its load folded
#: to 0 by the zero-condition guard and by inlining (no OutOfBoundsError after
#: simplification); a stage inlined at a data index into a select chain numba
#: ran out of memory on; an empty min's +inf times a select zero in a forward
#: stage (symbolic zero, docs/conventions.md)
#: isl's exact division ``div`` in a residue class's loop bound, non-exact where the
#: class is empty (``-c0 / 2`` at ``c0 = 3``), read as floor division instead of C's
#: truncation: the loop ran outside the domain and read the head past its buffer
#: and two the oracle got wrong: an input near the largest float makes a sum's partial
#: sums overflow in the evaluator's order and not in the kernel's (a loop nest's, a
#: GEMM's): 1.6e38 against inf, -1.18e308 against -inf (fuzz.compare_orders)
#: (and two float64 ones, whose float64 twin overflows as well: 4.8e307 against inf);
#: and a gradient stage whose loop nest, from isl's default AST generator, left out
#: the k = 1 points of its domain (simplify.loop_ast.runs_exactly now checks every
#: loop nest isl generates); and a reduction whose residue split numbered its
#: classes by position, so an update piece ran with another class's init; and a
#: loop nest the validator first refused (two classes in one stride-2 loop)
#: and a gradient scatter whose condition loaded an argmin at j0 = 2 of its 2
#: columns before the test j0 <= 1 that guards it (OutOfBoundsError at build time
#: and in te.evaluate, for a valid gradient); and a GEMM operand whose affine mask
#: and data condition met as a broadcast mask (a raw numpy ValueError); and a
#: program refused twice, te.evaluate first by its integer arithmetic's wrap and
#: the build by a load it proves out of range (the harness took it for a finding);
#: and a small gradient unit that LLVM's SLP vectoriser, as codegen sets it, turned
#: into invalid IR ("Instruction does not dominate all uses!"; now compiled again
#: with numba's own settings); and a gradient scatter whose output index, fixed by
#: an argmin, tied the reduction axis in the conditions that guarded the argmin's
#: load (r_k0 = 1 read it at index 2 of its 2; tests/test_scatter_guards.py); and
#: an int64-limit program whose forward raises OutOfBoundsError and whose simplified
#: gradient te.evaluate refuses for integer wrap first (the harness let that escape);
#: and X near the largest float64 where d_X = sum(P * a + P * b), P = 0, became
#: P * (a + b) with a + b = -inf: NaN where the raw gradient is 0, the documented
#: reassociation (docs/conventions.md), not a finding; and an int64-limit program
#: te.evaluate refuses for an int32 product while the simplifier refuses its forward
#: for folding `3 * -2**62` (two refusals; the harness crashed on the second)
LONG_RUN_REGRESSIONS = (7000003194, 7000003318, 7000002969, 7000031103, 7000200107,
                        7000020211, 7000500074, 7000500215, 7000600314,
                        7000802849, 7000802803, 7009700500, 7013101768,
                        7013001999, 7015000583, 7016100758,
                        7019000429, 7020000198, 7019000666, 7022002120)
#: checked by long runs only (each builds for minutes): 7007100027, a chain of
#: selects lifted into a gradient scatter's where test, a 260 KB line before
#: codegen's shared bindings (its parallel build spent minutes in numba's parfor
#: fusion on a busy machine); 7007400007, a chain of selects behind a guarded gather
#: (430 KB, numba out of memory); 7007500472, a gradient's sum of 216 terms in one
#: line of 216 parentheses (tests/test_deep_text.py has its kind)
LONG_RUN_ONLY = (7007100027, 7007400007, 7007500472)
#: compiled in long runs only: its program's argmax unit inlines a cheap stage into
#: a 15 KB select chain whose hundreds of inlined check helpers take numba about
#: 90 s (a compile-time case for issue 11); CI runs its evaluator checks
SLOW_REGRESSIONS = (20261300,)
#: found by the evaluator checks alone (raw vs simplified gradients, a simplified
#: graph the evaluator rejects): not compiled, to keep CI's time for the rest --
#: a solved data-dependent equality whose load lost its guard, a custom reducer's
#: raw adjoint multiplying a NaN by select indicators, a NaN head times a sum of
#: indicator terms in a raw adjoint, a simplifier folding int64-limit constants into a
#: value outside int64 (refused, but without saying it would wrap around), an
#: adjoint element no path reaches (0) times a gathered -inf (raw NaN, simplified:
#: no term), tanh's ``1 - t*t`` distributed over an infinite adjoint (NaN), the
#: same symbolic zero times an empty max's -inf with finite inputs
REFERENCE_REGRESSIONS = (749189702389, 309414454917, 543264005676,
                         7000000475, 7000000987, 7000001231, 7000001881) + SLOW_REGRESSIONS
#: evaluator checks, today's generator: a conv -> activation -> conv program with an
#: input near the largest float whose raw and simplified gradients overflow a
#: partial sum in one form only, and a float64 one whose twin overflows too (the
#: order oracle, fuzz.compare_orders); and a program whose forward reads out of
#: range through an index tensor while its gradient is structurally zero (every
#: load of X outside its guard): the simplified gradient reads no index at all
#: and a forward that reads out of range while the simplified gradient is a
#: scatter under `if false` (structurally zero): it never reads its data index
REFERENCE_REGRESSIONS_NOW = (7000300083, 7000501004, 7000900345, 7009700507)


def test_reads_through_data_sees_gathers_and_scatters_only():
    X = te.placeholder((4,), "X", "float32")
    I = te.placeholder((3,), "I", "int64")
    G = te.compute((3,), lambda i: X[I[i]] * 2.0, name="G")
    S = te.scatter_add((4,), "float32", (3,), lambda k: I[k], lambda k: X[k], name="S")
    Z = te.compute((4,), lambda i: X[3 - i] + 0.0, name="Z")
    assert fuzz.reads_through_data([G]) and fuzz.reads_through_data([S])
    assert not fuzz.reads_through_data([Z])
    never = te.scatter_add((4,), "float32", (3,), lambda k: I[k], lambda k: X[k],
                           where=lambda k: te.const(False), name="Never")
    assert not fuzz.reads_through_data([never])


def _progress():
    """A log callback for long runs: prints progress and each new finding at once."""
    shown = [0]

    def log(msg, findings):
        print(msg, flush=True)
        for f in findings[shown[0]:]:
            print(f, flush=True)
        shown[0] = len(findings)
    return log


def _report(findings):
    return f"{len(findings)} finding(s):\n" + "\n\n".join(str(f) for f in findings)


def test_fuzz_ci_profile():
    seeds = range(CI_SEED, CI_SEED + CI_PROGRAMS)
    runs = (fuzz.NATIVE_RUNS[0], fuzz.TORCH_RUNS[0], fuzz.BLAS_UNITS[0],
            fuzz.SPLIT_BLAS_UNITS[0], fuzz.PACKED_STAGES[0], fuzz.CHUNKED_RUNS[0],
            fuzz.REASSOCIATED_SUMS[0], fuzz.UNROLLED_SUMS[0])
    findings = fuzz.check_programs(seeds, compile_every=CI_COMPILE_EVERY)
    assert not findings, _report(findings)
    # every path was exercised: the compiled driver, the PyTorch operator, GEMM
    # units in one call and split over worker threads
    assert fuzz.SPLIT_BLAS_UNITS[0] > runs[3]
    assert fuzz.NATIVE_RUNS[0] > runs[0]
    assert fuzz.TORCH_RUNS[0] > runs[1]
    assert fuzz.BLAS_UNITS[0] > runs[2]
    # (conv -> activation -> conv programs once packed their activations into stages of
    # their own here; the materialisation policy now stores an activation with float
    # work before the GEMM that re-reads it, so these draws pack none: packing is
    # covered by test_codegen_operands and test_codegen_tap_split)
    # GEMMs whose packing copies were made in chunks (the im2col of large inputs)
    assert fuzz.CHUNKED_RUNS[0] > runs[5]
    # float sums in "cse" mode: loops written once with _radd, and unrolled by copies
    assert fuzz.REASSOCIATED_SUMS[0] > runs[6]
    assert fuzz.UNROLLED_SUMS[0] > runs[7]


#: the conv profile: conv -> activation -> conv programs only, every contraction on
#: BLAS: the rewrites of convolutions' GEMMs (codegen.rewrite.tap_split, codegen.rewrite.windows)
#: and their shift units (codegen.analysis.shifts), which the CI profile's few conv
#: programs rarely reach
CONV_SEED = 20262500
CONV_PROGRAMS = 16


def test_fuzz_conv_profile():
    seeds = range(CONV_SEED, CONV_SEED + CONV_PROGRAMS)
    runs = (fuzz.WINDOW_STAGES[0], fuzz.TAP_SPLITS[0], fuzz.SHIFT_UNITS[0])
    findings = fuzz.check_programs(seeds, modes=("blas",), conv=True)
    assert not findings, _report(findings)
    assert fuzz.WINDOW_STAGES[0] > runs[0]
    assert fuzz.TAP_SPLITS[0] > runs[1]
    assert fuzz.SHIFT_UNITS[0] > runs[2]


#: the parallel profile: stages of a few points built as parallel loop nests
#: (the path of large stages, which fuzzed programs never reach), each kernel
#: also run with its units' serial twins (a forked child's path)
PARALLEL_SEED = 20262130
PARALLEL_PROGRAMS = 16


def test_fuzz_parallel_profile():
    seeds = range(PARALLEL_SEED, PARALLEL_SEED + PARALLEL_PROGRAMS)
    units, twins = fuzz.PARALLEL_UNITS[0], fuzz.SERIAL_TWIN_RUNS[0]
    findings = fuzz.check_programs(seeds, modes=("parallel",))
    assert not findings, _report(findings)
    assert fuzz.PARALLEL_UNITS[0] > units
    assert fuzz.SERIAL_TWIN_RUNS[0] > twins


def test_the_order_oracle_accepts_only_a_partial_sum_overflow():
    big = float(np.finfo(np.float32).max)
    twin = np.array([1.6e38, 2.0, -3.0e38])
    want = np.array([np.inf, 2.0, -np.inf])  # the evaluator's order overflowed twice
    assert fuzz.compare_orders([1.6e38, 2.0, -3.0e38], want, twin, "float32", "x") is None
    assert fuzz.compare_orders([np.inf, 2.0, np.nan], [1.6e38, 2.0, -np.inf], twin,
                               "float32", "x") is None
    # a finite side that is not the float64 value, a wrong finite element, and a
    # non-finite twin are still findings
    assert fuzz.compare_orders([1.0e38, 2.0, -3.0e38], want, twin, "float32", "x")
    assert fuzz.compare_orders([1.6e38, 5.0e37, -3.0e38], want, twin, "float32", "x")
    assert fuzz.compare_orders([big, 2.0, -3.0e38], want, [np.nan, 2.0, -3.0e38],
                               "float32", "x")
    # float64: the twin overflowed too; a finite side near the top is accepted,
    # one far below it is not
    top = float(np.finfo(np.float64).max)
    assert fuzz.compare_orders([4.8e307], [np.inf], [np.inf], "float64", "x") is None
    assert fuzz.compare_orders([top / 1e6], [np.inf], [np.inf], "float64", "x")


#: programs with integer value arithmetic on data at the int64/int32 limits
#: (fuzz._Gen.with_int_value): te.evaluate refuses the first four ("would wrap
#: around" or "division by zero") and every kernel must raise too; the last two
#: run. Before the fix INT_MIN // -1 was 0 in a kernel and INT_MIN in te.evaluate
INT_VALUE_SEEDS = (20264001, 20264174, 20264267, 20264280, 20264003, 20264016)
#: a long run's: the forward refuses its integer arithmetic, the gradient an
#: out-of-range gather first (the kernel must refuse with either)
INT_VALUE_LONG_RUN = (7009300398,)


def test_fuzz_integer_value_arithmetic_raises_on_every_path_or_none():
    before = fuzz.INT_ERROR_KERNELS[0]
    programs = [fuzz.make_program(s) for s in INT_VALUE_SEEDS]
    assert all(p.int_arith for p in programs)
    findings = fuzz.check_programs(INT_VALUE_SEEDS + INT_VALUE_LONG_RUN, batch=2)
    assert not findings, _report(findings)
    assert fuzz.INT_ERROR_KERNELS[0] - before == 5


def test_fuzz_regression_seeds():
    # found before the generator drew reshape loads: their programs without them
    findings = fuzz.check_programs(REGRESSIONS, reshape=False)
    findings += fuzz.check_programs(LONG_RUN_REGRESSIONS, batch=1)
    findings += fuzz.check_programs(REFERENCE_REGRESSIONS, compile_every=0, reshape=False)
    findings += fuzz.check_programs(REFERENCE_REGRESSIONS_NOW, compile_every=0)
    assert not findings, _report(findings)


def test_a_check_that_raises_is_a_finding_not_the_end_of_the_run(monkeypatch):
    # a harness gap (seed 7022002120 crashed _check_kernel_int_error and took the
    # rest of its chunk of 100 with it) is reported for its program, and the run
    # goes on to the next one
    seen = []

    def broken(q, findings):
        seen.append(q.p.seed)
        if len(seen) == 1:
            raise KeyError("planted")
    monkeypatch.setattr(fuzz, "_check_reference", broken)
    findings = fuzz.check_programs([7000000001, 7000000002], compile_every=0, fd=False)
    assert seen == [7000000001, 7000000002]
    assert [(f.seed, f.kind) for f in findings] == [(7000000001, "check-error")]
    assert "KeyError: 'planted'" in findings[0].message


def test_fuzz_tie_order_of_a_residue_class_reduction():
    # the long run on 20e33cb: a tuple argmax over a residue-class domain, split
    # into classes by an index's (k0 + 2) // 3, visited k0 = 2 before k0 = 0 and
    # kept index 2 at a tie (tests/test_reduction_order.py has its variants)
    findings = fuzz.check_programs([7000400025], batch=1)
    assert not findings, _report(findings)


def test_fuzz_isl_guard_with_an_integer_operand_builds():
    # the long run on ddbcc45: isl guarded a loop of a gradient stage with
    # ``4 * c0 + c1 <= 5 || 1 || 1`` and the kernel failed to build (a DTypeError
    # from the converter); tests/test_codegen_loop_ast.py has its variants
    findings = fuzz.check_programs([7002200745], batch=1)
    assert not findings, _report(findings)


@pytest.mark.skipif(not os.environ.get("TEXPR_FUZZ"), reason="long run: set TEXPR_FUZZ=N")
def test_fuzz_long_run():
    n = int(os.environ["TEXPR_FUZZ"])
    first = int(os.environ.get("TEXPR_FUZZ_SEED") or random.SystemRandom().randrange(2**40))
    print(f"\nTEXPR_FUZZ={n}: replay with TEXPR_FUZZ_SEED={first}")
    findings = fuzz.check_programs(SLOW_REGRESSIONS, log=_progress(), reshape=False)
    findings += fuzz.check_programs(LONG_RUN_ONLY, batch=1, log=_progress())
    findings += fuzz.check_programs(range(first, first + n), log=_progress())
    assert not findings, f"TEXPR_FUZZ_SEED={first}: " + _report(findings)


def test_fuzz_a_parallel_stage_whose_where_is_a_chain_of_flag_blocks():
    # the long run on 2b0e500 (the same on 509b385): a gradient stage's where=,
    # written as flag blocks that bind a value in one block and read it in the next,
    # gave wrong sums as a prange loop nest (numba's parfor pass took the value for
    # one carried across iterations) and right ones as its serial twin; such a
    # stage now runs serially
    findings = fuzz.check_programs([7017100416], batch=1, modes=("parallel",))
    assert not findings, _report(findings)


def test_fuzz_a_chain_of_inlined_stages_stays_small():
    # the long run on a394431: three cheap stages, each reading its producer a few
    # times, inlined into a gradient as one 143 KB statement that numba compiled
    # for over 10 minutes in 10 GB (tests/test_inline_growth.py has its variants)
    findings = fuzz.check_programs([7003600271], batch=1, modes=("cse",))
    assert not findings, _report(findings)


def test_a_kernel_text_above_the_bound_is_a_code_size_finding(monkeypatch):
    monkeypatch.setattr(fuzz, "MAX_LINE_CHARS", 40)
    findings = fuzz.check_programs([7003600262], batch=1, modes=("default",), fd=False)
    assert [f.kind for f in findings] == ["code-size"], _report(findings)


def test_fuzz_a_computed_index_out_of_range_raises_on_every_path():
    # the generator's computed indices (int64(floor(v * s + c)), v * w + c) found, on
    # the code before their adjoint became a checked scatter, a forward raising
    # OutOfBoundsError while the raw gradient returned values
    # (tests/test_computed_index_adjoint.py has its variants)
    findings = fuzz.check_programs([7004400151], batch=1)
    assert not findings, _report(findings)


def test_fuzz_argmin_broadcast_over_an_axis_builds():
    # the long run on 29c8435: an argmin over 5 x 5 points that does not depend on
    # its stage's second output axis; LLVM's loop vectoriser went exponential on
    # its unrolled select chain and the build ran for more than 20 minutes
    # (tests/test_codegen_vectorize.py has its variants)
    with fuzz.build_time_bounded("seed 7004500389", 600):
        findings = fuzz.check_programs([7004500389], batch=1, modes=("cse",))
    assert not findings, _report(findings)


def test_a_build_above_the_time_bound_ends_the_process_with_a_finding(tmp_path):
    import subprocess
    import sys

    code = ("import sys, time; sys.path.insert(0, %r); import fuzz\n"
            "with fuzz.build_time_bounded('seeds [1, 2] in mode \"cse\"', 0.5):\n"
            "    time.sleep(30)\n"
            "print('not reached')\n") % os.path.dirname(fuzz.__file__)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == fuzz.BUILD_TIME_EXIT
    assert "fuzz finding (build-time): seeds [1, 2] in mode \"cse\"" in r.stderr
    assert "not reached" not in r.stdout
    # inside the bound, nothing happens
    with fuzz.build_time_bounded("nothing", 30):
        pass


def test_fuzz_a_build_that_proves_a_load_out_of_range_is_an_error_on_that_path():
    # the long run on 5ae8116: the forward reads a'b2[ax0 * k0 - 1] (-1 at ax0 =
    # 0) and raises OutOfBoundsError in te.evaluate; the gradient's stage of the
    # custom argmax reads a'b2[-1] at a constant index, and the build raises
    # OutOfBoundsError before any run: an error on that path too, not a finding
    findings = fuzz.check_programs([7005300018], batch=1, modes=("default",))
    assert not findings, _report(findings)


def test_a_build_proving_an_out_of_range_load_raises_out_of_bounds():
    # its variants: a custom reducer's gradient over a load whose index is
    # constant and out of range in the stages differentiation adds; the forward
    # kernel raises at run time, the gradient's build or run raises, every path
    # an OutOfBoundsError
    from texpr import codegen

    X = te.placeholder((2,), "X", "float32")
    for shift in (-1, 2):
        k = te.reduce_axis((0, 2), "k")
        Y = te.compute((4, 2), lambda a, b: fuzz.ARGMAX(
            (te.tanh(X[a * k + shift]), k), axis=k)[0], name="Y")
        s0, s1 = te.reduce_axis((0, 4), "s0"), te.reduce_axis((0, 2), "s1")
        L = te.compute((), lambda: te.sum(Y[s0, s1], axis=[s0, s1]), name="L")
        (dX,) = te.differentiate(L, [X])
        x = np.array([0.5, -0.25], "float32")
        with pytest.raises(te.OutOfBoundsError):
            te.evaluate([L, dX], {X: x})
        with pytest.raises(te.OutOfBoundsError):
            codegen.build([L, dX], [X])(x)


def test_fuzz_a_constant_stage_read_at_an_out_of_range_computed_index_raises():
    # the long run on 0e829d7: an empty min read at int64(floor(k1 * 0.6 - 1)) was
    # inlined as +inf with its bounds check (tests/test_computed_index_adjoint.py
    # has its variants)
    findings = fuzz.check_programs([7005700007], batch=1, modes=("default",))
    assert not findings, _report(findings)


THREADS_SEED = 20261207
THREADS_PROGRAMS = 4


def test_fuzz_threads_profile():
    # drawn programs' kernels run from several threads at once and re-entrantly (a
    # call nested in every unit of an outer call, on other values), against a plain
    # call (issue 52)
    before = fuzz.THREADED_RUNS[0], fuzz.REENTRANT_RUNS[0]
    seeds = range(THREADS_SEED, THREADS_SEED + THREADS_PROGRAMS)
    findings = fuzz.check_programs(seeds, batch=THREADS_PROGRAMS, modes=("threads",), fd=False)
    assert not findings, "\n\n".join(str(f) for f in findings)
    assert fuzz.THREADED_RUNS[0] > before[0] and fuzz.REENTRANT_RUNS[0] > before[1]


EXTREME_SEED = 20261208
EXTREME_PROGRAMS = 8


def test_fuzz_extreme_extents_profile():
    # convolutions with batches or channels of 0 and 1, 1-pixel inputs, strides,
    # paddings and dilations up to 10**6: loop nests, every contraction on BLAS
    # (a padded copy beyond its bound keeps its loop nest), threads and re-entrancy
    seeds = range(EXTREME_SEED, EXTREME_SEED + EXTREME_PROGRAMS)
    progs = [fuzz.make_extreme_program(s) for s in seeds]
    assert any(0 in p.inputs[0].shape for p in progs)
    assert any(max(p.params["padding"]) >= 10**5 for p in progs)
    findings = fuzz.check_extreme_programs(seeds, modes=("default", "blas", "threads"),
                                           batch=3)
    assert not findings, "\n\n".join(str(f) for f in findings)


def test_the_threads_check_finds_temporaries_shared_with_a_nested_call():
    # the kernel as it was before issue 52's kind 1: the temporaries of a call are
    # the thread's, and a call nested in it takes the same ones (a dict whose pop
    # leaves the entry in place); the re-entrant run must report it
    import types

    from texpr import codegen

    X = te.placeholder((64,), "X", "float64")
    A = te.compute((64,), lambda i: te.exp(X[i]) * 2.0, name="A")
    r = te.reduce_axis(64, "r")
    B = te.compute((64,), lambda i: te.sum(A[r] * X[i], axis=r), name="B")
    s = codegen.create_schedule([B])
    s[A].compute_root()
    kernel = codegen.build([B], [X], s, parallel=False, blas=False)
    assert len(kernel.units) == 2
    x = np.linspace(-1.0, 1.0, 64)
    (got,) = kernel(x)
    prog = types.SimpleNamespace(seed=0, dtype="float64", text="A, B", conv=False)
    findings = []
    fuzz._check_concurrent(prog, kernel, [x], (got,), findings)
    assert findings == []

    class KeepOnPop(dict):
        def pop(self, key, default=None):
            return self.get(key, default)

    class Slot:
        pass

    shared = Slot()
    shared.__dict__ = KeepOnPop()
    kernel._spare = shared
    kernel(x)
    fuzz._check_concurrent(prog, kernel, [x], (got,), findings)
    assert any(f.kind == "kernel-reentrant" or f.kind == "kernel-threads" for f in findings)


#: the hoist profile: texpr.simplify.hoist at tiny thresholds, so that drawn programs'
#: stage bodies (tens of nodes, far below the 2,000 of a real oversized body) get their
#: shared invariant subexpressions stored in stages of their own; raw vs simplified
#: gradients, finite differences and kernels are checked as in the CI profile (issue 51)
HOIST_SEED = 20262700
HOIST_PROGRAMS = 40


def test_fuzz_hoist_profile(monkeypatch):
    from texpr.simplify import hoist

    stored = [0]
    real = hoist.hoisted_body

    def counted(op):
        body = real(op)
        if body is not op.body[0]:
            stored[0] += 1
        return body

    monkeypatch.setattr(hoist, "hoisted_body", counted)
    # (simplified graphs computed, not loaded: a symbolic cache filled by an earlier
    # run serves these programs without running the pass, and nothing is counted)
    monkeypatch.setenv("TEXPR_SYMBOLIC_CACHE", "0")
    monkeypatch.setattr(hoist, "HOIST_TREE_NODES", 12)
    monkeypatch.setattr(hoist, "HOIST_MIN_NODES", 3)
    seeds = range(HOIST_SEED, HOIST_SEED + HOIST_PROGRAMS)
    findings = fuzz.check_programs(seeds, compile_every=5, modes=("default", "cse"))
    assert not findings, _report(findings)
    assert stored[0] >= 5  # the pass fired on many of the drawn programs
