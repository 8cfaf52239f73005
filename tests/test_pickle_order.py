"""texpr.pickle_order: a graph of plain objects of any depth, with cycles and
sharing, pickles and loads as pickle would write it if it could."""

import io
import pickle

import pytest

import texpr as te
from texpr.pickle_order import FlatPickling, flat, is_flat, unflat
from texpr.visitor import post_order


class _Node:
    def __init__(self, prev, items):
        self.prev, self.items, self.owner = prev, items, None


class _Slotted:
    __slots__ = ("node", "tag")


class _Pickler(FlatPickling, pickle.Pickler):
    pass


def _roundtrip(value):
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump_flat(value)
    got = pickle.loads(buf.getvalue())
    assert is_flat(got)
    return unflat(got)


def test_a_deep_chain_with_cycles_and_sharing_loads_as_it_was():
    shared = [1.5, "s"]
    node = None
    for k in range(3000):
        node = _Node(node, (k, shared))
        s = _Slotted()
        s.node, s.tag = node, k
        node.owner = s  # a cycle: node -> owner -> node
    with pytest.raises(RecursionError):
        pickle.dumps(node)
    got = _roundtrip(node)
    n, k = got, 2999
    while n is not None:
        assert n.items[0] == k and n.owner.node is n and n.owner.tag == k
        assert n.items[1] is got.items[1] == [1.5, "s"]  # one shared list, as pickled
        n, k = n.prev, k - 1
    assert k == -1


def test_deep_expressions_load_node_for_node():
    X = te.placeholder((2,), "X", "float64")
    e = X[0]
    for k in range(2000):
        e = e * 1.5 + X[1] if k % 2 else te.sin(e)
    with pytest.raises(RecursionError):
        pickle.dumps(e)
    got, X2 = _roundtrip((e, X))
    assert X2 is not X and X2.name == "X"  # a copy: X was not in a stop set

    def shape(root, tensor):
        return [(type(n).__name__, n.dtype, "X" if n.attr is tensor else repr(n.attr))
                for n in post_order(root)]
    assert shape(got, X2) == shape(e, X) and len(shape(e, X)) > 2000
    # nodes re-intern: the same expression over the same operands is the same node
    assert (got * 2.0) is (got * 2.0)


def test_stop_objects_are_not_entered():
    keep = _Node(None, ())
    f = flat([keep, _Node(keep, ())], stop={id(keep)})
    assert all(o is not keep for o in f[1] + f[2])
