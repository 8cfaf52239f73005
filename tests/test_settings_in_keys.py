"""A tuning constant changed at run time changes the symbolic cache's keys.

The "lower" entry of the symbolic cache was keyed by the graph and schedule
only: a process that set ``contraction.BLAS_MIN_FLOP = 1 << 60`` on a cache
holding the default's lowered program still got BLAS units (issue 49, finding
1). Every key now holds the tuning constants of texpr's loaded modules that
differ from their source's values (``symcache.settings_changed``)."""

import numpy as np

import texpr as te
from texpr import codegen, symcache
from texpr.codegen.analysis import contraction
from texpr.codegen.loopnest import lower
from texpr.codegen.loopnest import stage


def _dense():
    X = te.placeholder((64, 96), name="X")
    W = te.placeholder((48, 96), name="W")
    Y = te.nn.dense(X, W, name="Y")
    return X, W, Y


def test_a_changed_constant_is_in_the_key_and_the_program_follows_it(monkeypatch, tmp_path):
    monkeypatch.setenv("TEXPR_CACHE_DIR", str(tmp_path))
    X, W, Y = _dense()
    k1 = codegen.build([Y], [X, W])
    assert [u.kind for u in k1.units] == ["blas"]
    assert symcache.settings_changed() == []
    monkeypatch.setattr(contraction, "BLAS_MIN_FLOP", 1 << 60)
    assert symcache.settings_changed() == [
        ("texpr.codegen.analysis.contraction", "BLAS_MIN_FLOP", repr(1 << 60))]
    k2 = codegen.build([Y], [X, W])
    assert [u.kind for u in k2.units] == ["numba"]
    x = np.random.default_rng(0).normal(size=(64, 96)).astype("float32")
    w = np.random.default_rng(1).normal(size=(48, 96)).astype("float32")
    np.testing.assert_allclose(k2(x, w)[0], x @ w.T, rtol=1e-4, atol=1e-4)
    monkeypatch.undo()


def test_state_that_is_no_setting_is_not_in_the_key(monkeypatch):
    from texpr.codegen import profile
    monkeypatch.setattr(profile, "ACTIVE", object())
    assert symcache.settings_changed() == []


def test_lower_forwards_the_constants_it_used_to_copy():
    # setting lower.UNROLL sets codegen.loopnest.stage's, where it is read
    old = stage.UNROLL
    try:
        lower.UNROLL = 1
        assert stage.UNROLL == 1 and lower.UNROLL == 1
        assert "UNROLL" not in vars(lower)
    finally:
        lower.UNROLL = old
    assert stage.UNROLL == old
