"""Simplify the bodies of scan stages.

A scan's body (:mod:`texpr.scan`) is a graph of its own: from the state
placeholders and the external inputs to the updates. The passes run on it as on
any graph, with every external input stood in for by a placeholder (so that the
outer graph's stages are neither rewritten nor copied in here), and without
the passes that turn stages into scatter-adds or scans (a body holds compute
stages only). The result must still be a valid scan body (the time index forms
``t - k``, guards); when a rewrite breaks that, the body is kept as it was:
slower, never wrong.
"""

import weakref

from texpr.errors import TexprError
from texpr.scan import ScanOp
from texpr.tensor import PlaceholderOp, topo_order

from .graph import rebuild, remap_loads
from .shared_heads import share_head_contractions


def _body_pipeline():
    from .pipeline import PIPELINE
    from .prefix_scan import prefix_sums_to_scans
    from .scatter import gathers_to_scatters
    from .support import restrict_to_support

    # (a shared core's stage need not have the body's leading time axis)
    skip = (gathers_to_scatters, restrict_to_support, simplify_scan_bodies,
            prefix_sums_to_scans, share_head_contractions)
    return tuple(p for p in PIPELINE if p not in skip)


def _inline_cheap_externals(op, limit=8):
    """The scan ``op`` with the cheap elementwise stages it reads (the materialisation
    rule's cheap bodies: heads, indicators, re-indexings) inlined into its body, so
    that they need no buffer of their own."""
    from texpr.expr import Load
    from texpr.tensor import ComputeOp
    from texpr.visitor import substitute, transform

    from .graph import is_elementwise
    from .materialize import is_cheap

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


def simplify_body(op, rounds=4):
    """The scan ``op`` with its body simplified (``op`` itself if that fails)."""
    done = _DONE.get(op)
    if done is not None:
        return done
    new = _simplify_body(op, rounds)
    _DONE[op] = new
    return new


def _simplify_body(op, rounds):
    from texpr.tensor import ComputeOp
    from .pipeline import _fingerprint, run_passes

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
    passes = _body_pipeline()
    fp = _fingerprint(updates)
    for _ in range(rounds):
        updates = run_passes(updates, passes)
        new_fp = _fingerprint(updates)
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


def simplify_scan_bodies(tensors):
    """Every scan stage's body simplified as a graph of its own (again only when the
    cheap stages it reads, inlined, changed it)."""
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
        return simplify_body(new).outputs

    return rebuild(tensors, fn)
