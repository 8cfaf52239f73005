"""Higher-order property tests: simplified gradients differentiated again, to
second and third order, against nested float64 finite differences.

Each example draws a program (tests/ho_programs.py: gathers under affine,
modular and data-dependent ``where=``, gathered rows under sum/prod/max/min
and custom reducers, affine gathers, scatter-adds over ``[lo, hi)``, conv1d,
max/avg pooling), an order (2 or 3), ``simplify`` on or off at each level and
how each level is formed (``head=`` or the gradient of a dot product), then
compares every level with :func:`nested_fd.fd_level`.

Profiles:
* CI (default): a fixed seed (derandomized), ``SMALL_EXAMPLES`` programs, no
  compilation inside hypothesis; ``test_compiled_higher_order`` compiles a few
  fixed programs with ``texpr.codegen.build``.
* long: ``TEXPR_FUZZ=N`` runs N programs from the seed ``TEXPR_FUZZ_SEED``
  (random when unset; printed either way), one in ``COMPILE_EVERY`` of them
  also through a compiled kernel::

      TEXPR_FUZZ=3000 python -m pytest -q -s tests/test_fuzz_higher_order.py -k fuzz
"""

import contextlib
import os
import random
import signal
import sys
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, note, seed, settings
from hypothesis import strategies as st

import texpr as te
from texpr import codegen
from ho_programs import RngChooser, build_program
from nested_fd import assert_close, derivative_chain, fd_level

SMALL_EXAMPLES = 40
COMPILE_EVERY = 8
LONG = int(os.environ.get("TEXPR_FUZZ", "0") or 0)
FUZZ_SEED = int(os.environ.get("TEXPR_FUZZ_SEED") or (random.randrange(2 ** 32) if LONG
                                                       else 20261130))
RTOL, ATOL = 1e-5, 1e-6


def check_program(prog, order, simp, via_head, compiled=False, dir_seed=0):
    """Evaluate (and optionally compile) the symbolic levels ``1..order`` of
    ``prog`` and compare each with nested finite differences."""
    x, feed = prog.x, dict(prog.feed)
    rng = np.random.default_rng(dir_seed)
    dirs = []
    for n in range(order - 1):
        d = te.placeholder(x.shape, "VU"[n], "float64")
        feed[d] = rng.uniform(-0.5, 0.5, x.shape)
        dirs.append(d)
    levels = derivative_chain(prog.loss, x, dirs, simp, via_head)
    got = te.evaluate(levels, feed)
    for n, g in enumerate(got):
        want = fd_level(prog.loss, x, feed, [feed[d] for d in dirs[:n]])
        assert_close(g, want, f"level {n + 1} of {prog.text}; simplify={simp} "
                              f"via_head={via_head}", RTOL, ATOL)
        if compiled and n == len(got) - 1:
            inputs = [t for t in feed if isinstance(t.op, te.PlaceholderOp)
                      and _reads(levels, t)]
            out = codegen.build(levels, inputs)(*[feed[t] for t in inputs])
            for m, (k, w) in enumerate(zip(out, got)):
                assert_close(k, w, f"kernel level {m + 1} of {prog.text}", 1e-9, 1e-10)


def _reads(tensors, t):
    return any(op is t.op for op in te.topo_order(tensors))


def _draw_case(data):
    def ch(name, options):
        return data.draw(st.sampled_from(options), label=name)

    value_seed = data.draw(st.integers(0, 2 ** 16), label="value_seed")
    prog = build_program(ch, value_seed)
    order = data.draw(st.sampled_from([2, 3]), label="order")
    simp = tuple(data.draw(st.booleans(), label=f"simplify{n + 1}") for n in range(order))
    via_head = tuple(data.draw(st.booleans(), label=f"via_head{n + 2}")
                     for n in range(order - 1))
    return prog, order, simp, via_head, value_seed


def _finite(prog):
    with np.errstate(all="ignore"):
        return bool(np.isfinite(te.evaluate(prog.loss, prog.feed)))


_COUNT = {"programs": 0, "compiled": 0, "timeouts": 0}
#: long profile: a program taking more CPU seconds than this is reported and skipped
LONG_PROGRAM_CPU = 60
_TRACE = sys.stderr


class _Timeout(BaseException):
    """Not an Exception: codegen turns numba's exceptions into CompileError."""


@contextlib.contextmanager
def _cpu_limit(seconds):
    """Stop the block after ``seconds`` of process CPU time (SIGPROF); yields a
    function telling whether it was stopped."""
    hit = []

    def handler(_sig, _frame):
        raise _Timeout()

    old = signal.signal(signal.SIGPROF, handler)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield lambda: bool(hit)
    except _Timeout:
        hit.append(True)
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)


@seed(FUZZ_SEED)
@settings(max_examples=LONG or SMALL_EXAMPLES, deadline=None, derandomize=not LONG,
          database=None, print_blob=True, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_fuzz_higher_order(data):
    if _COUNT["programs"] == 0:
        print(f"\ntest_fuzz_higher_order: seed {FUZZ_SEED}, "
              f"{LONG or SMALL_EXAMPLES} examples")
    prog, order, simp, via_head, value_seed = _draw_case(data)
    note(prog.text)
    assume(_finite(prog))
    _COUNT["programs"] += 1
    # (a third-order kernel of ~20 stages can take numba minutes: second order only)
    compiled = bool(LONG) and order == 2 and _COUNT["programs"] % COMPILE_EVERY == 0
    _COUNT["compiled"] += compiled
    start = time.process_time()
    if LONG:
        print(f"  #{_COUNT['programs']}: order {order} simplify={simp} via_head={via_head} "
              f"{prog.text}", file=_TRACE, flush=True)
        with _cpu_limit(LONG_PROGRAM_CPU) as timed_out:
            check_program(prog, order, simp, via_head, compiled, dir_seed=value_seed)
        if timed_out():
            _COUNT["timeouts"] += 1
            print(f"  TIMEOUT (> {LONG_PROGRAM_CPU} s cpu): order {order} simplify={simp} "
                  f"via_head={via_head} {prog.text}", flush=True)
    else:
        check_program(prog, order, simp, via_head, compiled, dir_seed=value_seed)
    spent = time.process_time() - start
    if LONG and spent > 10:
        print(f"  slow ({spent:.0f} s cpu): order {order} simplify={simp} {prog.text}",
              flush=True)
    if LONG and _COUNT["programs"] % 25 == 0:
        print(f"test_fuzz_higher_order: {_COUNT['programs']} programs checked "
              f"({_COUNT['compiled']} compiled, {_COUNT['timeouts']} over the time limit), "
              f"seed {FUZZ_SEED}", flush=True)


# a few fixed programs through compiled kernels (each one kernel for all levels)
_COMPILED_CASES = [
    # (family choices, order, simplify per level, via_head per level)
    ({"family": "gather", "cond": "modular", "lo": 1, "f": "sin"}, 3, (True, True, True),
     (True, False)),
    ({"family": "row", "reducer": "prod", "cond": "coupled"}, 2, (True, False), (True,)),
    ({"family": "scatter", "lo": 2, "target": "data", "where": "p%2==0"}, 3,
     (True, False, True), (False, True)),
    ({"family": "pool", "pool": "max", "padding": 1}, 2, (True, True), (True,)),
]


class _Fixed(RngChooser):
    """Random choices except the ones listed."""

    def __init__(self, fixed, seed_):
        super().__init__(seed_)
        self.fixed = fixed

    def __call__(self, name, options):
        if name in self.fixed and self.fixed[name] in options:
            return self.fixed[name]
        return super().__call__(name, options)


@pytest.mark.parametrize("case", range(len(_COMPILED_CASES)))
def test_compiled_higher_order(case):
    fixed, order, simp, via_head = _COMPILED_CASES[case]
    prog = build_program(_Fixed(fixed, 100 + case), 100 + case)
    assert prog.text.startswith(fixed["family"] if fixed["family"] != "pool"
                                else fixed["pool"])
    assert _finite(prog)
    check_program(prog, order, simp, via_head, compiled=True, dir_seed=case)


def test_fd_oracle_is_exact_enough():
    # the oracle itself: third derivative of sum(sin(X) * X^2) along (V, U, e_j)
    x = te.placeholder((3,), "X", "float64")
    k = te.reduce_axis(3, "k")
    loss = te.compute((), lambda: te.sum(te.sin(x[k]) * x[k] * x[k], axis=k), name="L")
    xv = np.array([0.3, -0.7, 1.1])
    v, u = np.array([0.2, -0.4, 0.1]), np.array([0.5, 0.3, -0.2])
    f3 = -np.cos(xv) * xv ** 2 - 6 * np.sin(xv) * xv + 6 * np.cos(xv)  # d^3/dx^3
    got = fd_level(loss, x, {x: xv}, [v, u])
    np.testing.assert_allclose(got, f3 * v * u, rtol=1e-6, atol=1e-7)  # 10x the fuzz tolerance
