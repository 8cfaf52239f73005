"""A process-wide memo of text transformations, bounded by the size of what it keeps.

One job: :class:`TextMemo` remembers ``key -> value`` for the lowering's passes
over unit texts (repeated layers give the same text, :mod:`codegen.loopnest.lower` and
:mod:`codegen.loopnest.source`), forgetting the least recently used entries when the
texts it holds exceed a number of characters (a unit of a long scan's adjoint
can be a megabyte of text: a count alone would not bound the memory).
Thread-safe: kernels are built from several threads.
"""

import threading
from collections import OrderedDict

__all__ = ["TextMemo"]


class TextMemo:
    """``get(key)`` / ``put(key, value, size)`` with least-recently-used eviction.

    Args:
        max_chars: the most characters (the sum of the ``size`` given to
            :meth:`put`) kept; 0 keeps nothing.
    """

    def __init__(self, max_chars):
        self.max_chars = max_chars
        self._items = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def get(self, key):
        """The value put for ``key`` (now the most recently used), or None."""
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return None
            self._items.move_to_end(key)
            return hit[0]

    def put(self, key, value, size):
        """Remember ``value`` for ``key``, counted as ``size`` characters; the least
        recently used entries go while the total exceeds ``max_chars``."""
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._chars -= old[1]
            self._items[key] = (value, size)
            self._chars += size
            while self._items and self._chars > self.max_chars:
                _, (_, s) = self._items.popitem(last=False)
                self._chars -= s

    def __len__(self):
        return len(self._items)

    def clear(self):
        """Forget everything."""
        with self._lock:
            self._items.clear()
            self._chars = 0
