"""Simplify the bodies of scan stages.

A scan's body (:mod:`texpr.scan`) is a graph of its own: from the state
placeholders and the external inputs to the updates. The passes run on it as on
any graph, with every external input stood in for by a placeholder (so that the
outer graph's stages are neither rewritten nor copied in here), and without
the passes that turn stages into scatter-adds or scans (a body holds compute
stages only): the list it runs, :data:`texpr.simplify.pipeline.BODY_PIPELINE`,
is the pipeline's to give. The result must still be a valid scan body (the time index forms
``t - k``, guards); when a rewrite breaks that, the body is kept as it was:
slower, never wrong. After each round, the tests of the step alone that every
evaluated step ``L <= t < T`` passes or fails are folded to constants
(:mod:`texpr.simplify.step_tests`).
"""

import weakref

from texpr.errors import TexprError
from texpr.expr import Load
from texpr.scan import ScanOp
from texpr.tensor import ComputeOp, PlaceholderOp, topo_order
from texpr.visitor import substitute, transform

from .graph import is_elementwise, rebuild, remap_loads
from .materialize import is_cheap
from .runner import fingerprint, run_passes
from .step_tests import fold_body_step_tests


def _inline_cheap_externals(op, limit=8):
    """The scan ``op`` with the cheap elementwise stages it reads (the materialisation
    rule's cheap bodies: heads, indicators, re-indexings) inlined into its body, so
    that they need no buffer of their own."""
    for _ in range(limit):
        cheap = {id(t): t for t in op.externals
                 if is_elementwise(t.op) and is_cheap(t.op.body[0])}
        if not cheap:
            return op

        def fn(node):
            if isinstance(node, Load) and id(node.tensor) in cheap:
                src = node.tensor.op
                return substitute(src.body[0], dict(zip(src.axis, node.args)))
            return None

        local = {}
        for b in op.body_ops:
            body = tuple(transform(remap_loads(e, local), fn) for e in b.body)
            new = ComputeOp(b.name, b.axis, body, b.tag, b.attrs)
            for old, o in zip(b.outputs, new.outputs):
                local[id(old)] = o
        updates = [local[id(u)] for u in op.update]
        op = ScanOp(op.name, op.init, updates, op.state_placeholder, op.tag, op.attrs)
    return op


#: scan -> its simplified scan, so that simplifying a graph again (codegen.build after
#: te.differentiate) finds the very stage the gradient already reads
_DONE = weakref.WeakKeyDictionary()


def simplify_body(op, passes, rounds=4):
    """The scan ``op`` with its body simplified by ``passes`` (at most ``rounds``
    rounds; ``op`` itself if the result is no valid scan).

    Args:
        op: a ScanOp.
        passes: the pass list (always the pipeline's ``BODY_PIPELINE``: results
            are remembered per scan).
        rounds: the most rounds of ``passes``.
    Returns:
        a ScanOp (``body_simplified`` set).
    """
    done = _DONE.get(op)
    if done is not None:
        return done
    new = _simplify_body(op, passes, rounds)
    _DONE[op] = new
    return new


def _simplify_body(op, passes, rounds):
    proxies = {}
    for t in op.externals:
        proxies[id(t)] = PlaceholderOp(t.name, tuple(t.shape), t.dtype).output(0)
    back = {id(p): t for tid, p in proxies.items() for t in op.externals if id(t) == tid}
    # the updates, reading the proxies
    local = dict(proxies)
    for b in op.body_ops:
        body = tuple(remap_loads(e, local) for e in b.body)
        new = ComputeOp(b.name, b.axis, body, b.tag, b.attrs)
        for old, o in zip(b.outputs, new.outputs):
            local[id(old)] = o
    updates = [local[id(u)] for u in op.update]
    # the steps L <= t < T are the only ones the body is evaluated at: a test of the
    # step alone that every one of them passes is a constant (texpr.simplify.step_tests)
    L, T = op.init_extent, op.time_extent
    updates = fold_body_step_tests(updates, L, T)
    fp = fingerprint(updates)
    for _ in range(rounds):
        updates = fold_body_step_tests(run_passes(updates, passes), L, T)
        new_fp = fingerprint(updates)
        if new_fp == fp:
            break
        fp = new_fp

    def unproxy(new_op, _orig, _tmap):
        if not isinstance(new_op, ComputeOp):
            return None
        body = tuple(remap_loads(e, back) for e in new_op.body)
        if all(x is y for x, y in zip(body, new_op.body)):
            return None
        return ComputeOp(new_op.name, new_op.axis, body, new_op.tag, new_op.attrs).outputs

    updates = rebuild(updates, unproxy)
    try:
        new = ScanOp(op.name, op.init, updates, op.state_placeholder, op.tag, op.attrs)
    except TexprError:
        new = op
    new.body_simplified = True
    return new


def simplify_bodies(tensors, passes):
    """Every scan stage's body simplified by ``passes`` as a graph of its own (again
    only when the cheap stages it reads, inlined, changed it).

    Args:
        tensors: list of Tensors.
        passes: the pass list a body runs (the pipeline's ``BODY_PIPELINE``).
    Returns:
        list of Tensors, the same values.
    """
    if not any(isinstance(op, ScanOp) for op in topo_order(tensors)):
        return list(tensors)

    def fn(op, _orig, _tmap):
        if not isinstance(op, ScanOp):
            return None
        try:
            new = _inline_cheap_externals(op)
        except TexprError:
            new = op
        if new is op and op.body_simplified:
            return None
        return simplify_body(new, passes).outputs

    return rebuild(tensors, fn)
