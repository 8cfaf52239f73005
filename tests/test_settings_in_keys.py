"""A tuning setting changed at run time changes the symbolic cache's keys.

The "lower" entry of the symbolic cache was keyed by the graph and schedule
only: a process that set ``contraction.BLAS_MIN_FLOP = 1 << 60`` on a cache
holding the default's lowered program still got BLAS units (issue 49, finding
1). codegen's knobs are now the fields of ``codegen.Options``, whose
fingerprint is in the "lower" key; the tuning constants left in texpr's other
modules (the simplifier's) that differ from their source's values are in every
key (``symcache.settings_changed``)."""

import numpy as np

import texpr as te
from texpr import codegen, symcache
from texpr.codegen.loopnest import lower
from texpr.codegen.loopnest import stage


def _dense():
    X = te.placeholder((64, 96), name="X")
    W = te.placeholder((48, 96), name="W")
    Y = te.nn.dense(X, W, name="Y")
    return X, W, Y


def test_a_changed_option_is_in_the_key_and_the_program_follows_it(monkeypatch, tmp_path):
    monkeypatch.setenv("TEXPR_CACHE_DIR", str(tmp_path))
    X, W, Y = _dense()
    k1 = codegen.build([Y], [X, W])
    assert [u.kind for u in k1.units] == ["blas"]
    stored = symcache.stats["store"]
    k2 = codegen.build([Y], [X, W], options={"blas_min_flop": 1 << 60})
    assert [u.kind for u in k2.units] == ["numba"]
    assert symcache.stats["store"] == stored + 1  # a key of its own, not the default's entry
    assert symcache.settings_changed() == []  # (no knob is a module constant)
    x = np.random.default_rng(0).normal(size=(64, 96)).astype("float32")
    w = np.random.default_rng(1).normal(size=(48, 96)).astype("float32")
    np.testing.assert_allclose(k2(x, w)[0], x @ w.T, rtol=1e-4, atol=1e-4)
    # and back: the default's entry again
    assert [u.kind for u in codegen.build([Y], [X, W]).units] == ["blas"]


def test_a_changed_simplifier_constant_is_in_every_key(monkeypatch):
    from texpr.simplify import materialize
    assert symcache.settings_changed() == []
    monkeypatch.setattr(materialize, "CHEAP_TREE_NODES", 10 ** 9)
    assert symcache.settings_changed() == [
        ("texpr.simplify.materialize", "CHEAP_TREE_NODES", repr(10 ** 9))]


def test_state_that_is_no_setting_is_not_in_the_key(monkeypatch):
    from texpr.codegen import profile
    monkeypatch.setattr(profile, "ACTIVE", object())
    assert symcache.settings_changed() == []


def test_no_knob_is_left_as_a_module_constant():
    # lower.py once re-exported stage's constants as dead copies (finding 2), and
    # then forwarded them; now neither module holds one: the Options do
    for name in ("UNROLL", "JAM", "PARALLEL_MIN_POINTS", "SPLIT_LANES", "CHUNKS"):
        assert not hasattr(lower, name) and not hasattr(stage, name), name
    assert codegen.Options().unroll == 8 and codegen.Options().jam == 4
