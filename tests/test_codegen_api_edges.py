"""Odd arguments to the codegen APIs of the pipeline layout: Options values out
of range, a lowering rule that raises or answers garbage, bad dialects, the
retired module constants, a kernel's options assigned, builds with other
Options in several threads at once. Each gives a clear TexprError or the right
values (checked against numpy)."""

import math
import pickle
import threading

import numpy as np
import pytest

import texpr as te
from texpr import codegen
from texpr.codegen import strategy
from texpr.codegen.loopnest import dialect
from texpr.codegen.options import Options
from texpr.errors import TexprError


def _dense():
    X = te.placeholder((64, 96), "X", "float64")
    W = te.placeholder((48, 96), "W", "float64")
    return X, W, te.nn.dense(X, W, name="Y")


@pytest.mark.parametrize("field, value", [
    ("split_reduction_parts", 0), ("unroll", 0), ("unroll", -8), ("unroll", 3), ("jam", 0),
    ("jam_unroll", -1), ("split_lanes", 0), ("buffer_tile", 0), ("text_max_height", 0),
    ("blas_max_pieces", -1), ("gemm_threads", -1), ("gemm_chunk_bytes", 0),
    ("gemm_chunk_min_bytes", -5), ("tap_split_min_density", math.nan),
    ("blas_min_efficiency", -0.5), ("blas_min_efficiency", math.inf),
    ("gemm_load_check_s", -1.0), ("rest_parallel_fraction", 2.0)])
def test_options_out_of_range_are_clear_errors(field, value):
    with pytest.raises(TexprError, match=field):
        Options().replace(**{field: value})
    with pytest.raises(TexprError, match=field):
        with codegen.options(**{field: value}):
            pass


def test_split_reduction_parts_zero_is_no_raw_zero_division():
    # found: a long sum into one value with split_reduction_parts=0 raised a raw
    # ZeroDivisionError from codegen.rewrite.split_reductions
    n = 1 << 20
    A = te.placeholder((n,), "A", "float64")
    k = te.reduce_axis((0, n), "k")
    C = te.compute((1,), lambda i: te.sum(te.exp(A[k]) * A[k], axis=k), name="C")
    with pytest.raises(TexprError, match="split_reduction_parts"):
        codegen.build([C], [A], blas=False, options={"split_reduction_parts": 0})
    a = np.random.default_rng(0).random(n)
    (c,) = codegen.build([C], [A], blas=False, options={"split_reduction_parts": 4})(a)
    np.testing.assert_allclose(c, [np.exp(a) @ a], rtol=1e-10)


def test_a_rule_that_raises_or_answers_garbage_is_a_clear_error():
    X = te.placeholder((8, 6), "X", "float64")
    Y = te.compute((8, 6), lambda i, j: X[i, j] * 3.0 + 1.0, name="Y")

    def raises(op, ctx):
        raise ValueError("boom")

    def a_string(op, ctx):
        return "garbage"

    def bad_kind(op, ctx):
        return strategy.StagePlan(op.name, True, "bogus")

    def gemm_without_plan(op, ctx):
        return strategy.StagePlan(op.name, True, "gemm")

    def other_stage(op, ctx):
        return strategy.StagePlan("other", True, "loopnest")

    for rule in (raises, a_string, bad_kind, gemm_without_plan, other_stage):
        strategy.RULES.insert(0, rule)
        try:
            with pytest.raises(TexprError, match=f"stage Y.*rule {rule.__name__}"):
                codegen.build([Y], [X])
        finally:
            strategy.RULES.remove(rule)
    x = np.random.default_rng(1).random((8, 6))
    np.testing.assert_allclose(codegen.build([Y], [X])(x)[0], x * 3.0 + 1.0)


def test_bad_dialect_names_and_objects_are_clear_errors():
    before = dialect.registered()
    with pytest.raises(TexprError, match="registered already"):
        dialect.register(before[0], dialect.Dialect())
    with pytest.raises(TexprError, match="must be a codegen.loopnest.dialect.Dialect"):
        dialect.register("x", object())
    with pytest.raises(TexprError, match="name"):
        dialect.register(5, dialect.Dialect())
    with pytest.raises(TexprError, match="no backend 'nope'"):
        with dialect.using("nope"):
            pass
    with pytest.raises(TexprError, match="Dialect"):
        with dialect.using(42):
            pass
    assert dialect.registered() == before


def test_retired_module_constants_refuse_assignment():
    import texpr.codegen.loopnest.stage as stage
    import texpr.codegen.stage as old_stage  # the old path: the same module
    from texpr.codegen import gemm
    assert old_stage is stage
    for module, name, field in [(stage, "UNROLL", "unroll"), (old_stage, "JAM", "jam"),
                                (gemm, "GEMM_THREADS", "gemm_threads")]:
        with pytest.raises(TexprError, match=f"Options.*{field}"):
            setattr(module, name, 1)
        assert not hasattr(module, name)
    stage._a_private_name_of_a_test = 1  # other attributes are still set as usual
    del stage._a_private_name_of_a_test


def test_kernel_options_assigned_are_checked_and_pickled():
    X, W, Y = _dense()
    k = codegen.build([Y], [X, W], options={"gemm_threads": 2, "blas_min_flop": 1 << 60})
    with pytest.raises(TexprError, match="Options"):
        k.options = 5
    k.options = {"gemm_threads": 1}  # a dict: fields replaced in the kernel's own
    assert k.options.changed() == {"gemm_threads": 1, "blas_min_flop": 1 << 60}
    k2 = pickle.loads(pickle.dumps(k))
    assert k2.options == k.options
    rng = np.random.default_rng(2)
    x, w = rng.random((64, 96)), rng.random((48, 96))
    np.testing.assert_allclose(k2(x, w)[0], x @ w.T, rtol=1e-10)
    assert [u.kind for u in k2.units] == ["numba"]


def test_builds_in_threads_keep_their_own_options():
    X, W, Y = _dense()
    rng = np.random.default_rng(3)
    x, w = rng.random((64, 96)), rng.random((48, 96))
    results, seen = {}, {}
    barrier = threading.Barrier(2)

    def work(name, opts):
        try:
            barrier.wait()
            with codegen.options(**opts):
                k = codegen.build([Y], [X, W])
                seen[name] = codegen.current_options().changed()
            results[name] = (k, k(x, w)[0])
        except BaseException as exc:  # (reported below)
            results[name] = exc

    with codegen.options(chunks=False):
        ts = [threading.Thread(target=work, args=("loops", {"blas_min_flop": 1 << 60})),
              threading.Thread(target=work, args=("blas", {"gemm_threads": 1}))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert codegen.current_options().changed() == {"chunks": False}
    assert codegen.current_options() == Options()
    for name in ("loops", "blas"):
        assert not isinstance(results[name], BaseException), results[name]
    (kl, yl), (kb, yb) = results["loops"], results["blas"]
    assert seen == {"loops": {"blas_min_flop": 1 << 60}, "blas": {"gemm_threads": 1}}
    assert kl.options.changed() == {"blas_min_flop": 1 << 60}
    assert kb.options.changed() == {"gemm_threads": 1}
    assert [u.kind for u in kl.units] == ["numba"] and [u.kind for u in kb.units] == ["blas"]
    np.testing.assert_allclose(yl, x @ w.T, rtol=1e-10)
    np.testing.assert_allclose(yb, x @ w.T, rtol=1e-10)


def test_an_unpickled_options_is_checked_like_a_new_one():
    # a pickle from another version (a field that is gone, a value out of range
    # now) was restored as it was, past the checks of Options.__init__
    o = Options(unroll=4, gemm_threads=2)
    assert pickle.loads(pickle.dumps(o)) == o
    old = Options(unroll=4)
    object.__setattr__(old, "a_field_that_is_gone", 1)
    with pytest.raises(TexprError, match="no field a_field_that_is_gone"):
        pickle.loads(pickle.dumps(old))
    bad = Options()
    object.__setattr__(bad, "split_reduction_parts", 0)
    with pytest.raises(TexprError, match="split_reduction_parts"):
        pickle.loads(pickle.dumps(bad))
