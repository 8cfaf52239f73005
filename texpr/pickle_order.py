"""Pickling an object graph of any depth: an order of writing that keeps pickle shallow.

One job: :func:`flat` turns a value into a tuple that pickle writes without deep
recursion, and :func:`unflat` turns the loaded tuple back into the value.

Why: pickle recurses once per level of nesting (a C call for every container,
reduce argument and state it enters) and stops with ``RecursionError`` at
Python's recursion limit (1,000). In texpr's graphs the nesting follows the
data: an expression's arguments, a load's tensor, the tensor's operation, that
operation's body and ``simplify_record``, and so on through every stage, so the
gradients of GPT-8L (or of a chain of 40 elementwise stages) could not be
pickled, and the symbolic cache could not keep them. (:mod:`texpr.symcache`
pickles plainly first and arranges the value this way when that fails.)

How: the value's objects are found by an iterative walk (what pickle would
enter: containers' items, ``__reduce_ex__``'s arguments and state) and written
in three lists before the value itself, in one pickler (one memo):

1. *shells*: the plain objects (rebuilt by ``copyreg.__newobj__`` from their
   class alone, state set from ``__dict__``/slots, no ``__setstate__``:
   operations, tensors, records) written without their state (the pickler's
   ``reducer_override`` gives their reduction without it). Each is then in the memo,
   so a reference to it anywhere later is a memo lookup: a cycle (an
   operation's outputs are tensors whose ``op`` is the operation; a record
   holds the graph whose operations hold the record) costs no depth.
2. *built*: the other objects (expressions, rebuilt from their arguments: an
   acyclic graph), children first, so each is written when its arguments are
   already in the memo.
3. *states*: ``(shell, state)`` pairs, each state's values already in the memo.

Loading is a loop (pickle's unpickler does not recurse), then :func:`unflat` sets
every shell's state as pickle's ``BUILD`` would. The one difference to plain
pickling: an object rebuilt from arguments is built before the shells among its
arguments have their state (texpr's expressions, variables and combiners do
not look at them while they are built).

This was chosen over pickling on a thread with a large stack and a raised
recursion limit: the limit is process-wide, so other threads on ordinary stacks
could overflow the C stack (a crash, not an exception) while it is raised.
"""

import copyreg
import types

import numpy as np

__all__ = ["flat", "unflat", "is_flat", "FlatPickling"]

#: values pickle writes without entering anything that could be deep
_LEAVES = (type(None), bool, int, float, complex, str, bytes, bytearray, type, range,
           slice, types.FunctionType, types.BuiltinFunctionType, types.ModuleType,
           np.ndarray, np.generic, np.dtype)
_CONTAINERS = (tuple, list, set, frozenset, dict)
_NEWOBJ = (copyreg.__newobj__, copyreg.__newobj_ex__)
_TAG = "texpr flat pickle 1"
_DONE = object()


def _is_leaf(x):
    return isinstance(x, _LEAVES)


def _reduce(obj, protocol):
    r = obj.__reduce_ex__(protocol)
    if isinstance(r, str) or not isinstance(r, tuple):
        return None  # pickled by name
    return r + (None,) * (6 - len(r))


def _shell(r, obj):
    """Whether reduce tuple ``r`` of ``obj`` is a plain object's: class and leaf
    arguments, a state, nothing else, pickle's default ``BUILD``."""
    return (r[0] in _NEWOBJ and all(_is_leaf(a) for a in _leaves_of_args(r))
            and r[2] is not None and r[3] is None and r[4] is None and r[5] is None
            and not hasattr(obj, "__setstate__"))


def _leaves_of_args(r):
    args = r[1]
    if r[0] is copyreg.__newobj_ex__:  # (cls, args, kwargs)
        return (args[0],) + tuple(args[1]) + tuple(args[2].values())
    return args


def flat(value, stop=frozenset(), protocol=5):
    """The tuple a :class:`FlatPickling` pickler writes for ``value`` without deep
    recursion (the module docstring says how).

    Args:
        value: any picklable value.
        stop: ids of objects the pickler names by ``persistent_id`` (not entered).
        protocol: the pickler's protocol.
    Returns:
        ``(tag, shells, built, states, value)``.
    Raises:
        Whatever ``__reduce_ex__`` raises for an object pickle cannot write.
    """
    return _arrange(value, stop, protocol)[0]


def _arrange(value, stop, protocol):
    """``(flat's tuple, {id(shell): its reduction without the state})``."""
    shells, built, states = [], [], []
    shell_reduce = {}
    seen = set()
    keep = []  # everything entered stays alive, so no id is reused while walking
    stack = [(value, None)]
    while stack:
        obj, it = stack[-1]
        if it is None:
            if _is_leaf(obj) or id(obj) in stop or id(obj) in seen:
                stack.pop()
                continue
            seen.add(id(obj))
            keep.append(obj)
            t = type(obj)
            if t is dict:
                kids = [x for kv in obj.items() for x in kv]
            elif t in _CONTAINERS:
                kids = list(obj)
            else:
                r = _reduce(obj, protocol)
                if r is None:
                    kids = []
                elif _shell(r, obj):
                    shells.append(obj)
                    shell_reduce[id(obj)] = r[:2]
                    states.append((obj, r[2]))
                    kids = [r[2]]
                else:  # arguments, state, list items, dict items (iterators: listed)
                    kids = [r[1]] + [x if i == 0 or isinstance(x, (list, dict, tuple))
                                     else list(x)
                                     for i, x in enumerate(r[2:5]) if x is not None]
            it = iter(kids)
            stack[-1] = (obj, it)
        child = next(it, _DONE)
        if child is _DONE:
            stack.pop()
            if type(obj) not in _CONTAINERS and id(obj) not in shell_reduce:
                built.append(obj)
            continue
        stack.append((child, None))
    return (_TAG, shells, built, states, value), shell_reduce


class FlatPickling:
    """A mixin for a ``pickle.Pickler`` subclass: :meth:`dump_flat` writes
    :func:`flat`'s tuple, the shells without their state."""

    _shell_reduce = {}

    def dump_flat(self, value, stop=frozenset(), protocol=5):
        """Write ``value`` as :func:`flat` arranges it (load it with :func:`unflat`).

        Args:
            value: any picklable value. stop: ids of the objects this pickler's
            ``persistent_id`` names. protocol: this pickler's protocol.
        Raises:
            What pickling ``value`` raises (an object pickle cannot write)."""
        items, self._shell_reduce = _arrange(value, stop, protocol)
        try:
            self.dump(items)
        finally:
            self._shell_reduce = {}

    def reducer_override(self, obj):
        """A shell's reduction without its state (written once: pickle looks in its
        memo first); ``NotImplemented`` (pickle's own way) for anything else."""
        r = self._shell_reduce.get(id(obj))
        return NotImplemented if r is None else r


def is_flat(loaded):
    """Whether an unpickled value is the tuple :meth:`FlatPickling.dump_flat` wrote."""
    return (type(loaded) is tuple and len(loaded) == 5 and loaded[0] == _TAG
            and isinstance(loaded[3], list))


def unflat(loaded):
    """The value :meth:`FlatPickling.dump_flat` wrote, from the unpickled tuple
    ``loaded``: every shell gets its state (pickle's ``BUILD``: the ``__dict__``
    part updated, the slots part set with ``setattr``).

    Raises:
        ValueError: ``loaded`` is not such a tuple.
    """
    if not is_flat(loaded):
        raise ValueError("it is not a flat pickle")
    for obj, state in loaded[3]:
        slots = None
        if isinstance(state, tuple) and len(state) == 2:
            state, slots = state
        if state:
            obj.__dict__.update(state)
        if slots:
            for k, v in slots.items():
                setattr(obj, k, v)
    return loaded[4]
