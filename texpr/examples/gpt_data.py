"""The text of the GPT example: Python's own standard library, read offline.

Every Python installation carries its standard library's ``.py`` sources, so
the text needs no download. :data:`TRAIN_FILES` and :data:`HELD_OUT_FILES` are a
fixed selection of long-lived modules that exist in Python 3.11, 3.12 and 3.13
alike (their contents differ a little between versions, so the figures do too):

* training text: the 16 files of :data:`TRAIN_FILES`, read in that order and
  joined with one newline (about 1.01 MB in 3.11, 1.05 MB in 3.13);
* held-out text: the whole files of :data:`HELD_OUT_FILES` (``difflib.py`` and
  ``textwrap.py``, about 103 KB, 9% of the characters): modules the model never
  saw, not the tail of a file it trained on.

The vocabulary is the 64 most frequent characters of the training text (ties by
code point) plus one id, 64, for every other character (:data:`OTHER`): 65 ids.
The 64 cover 99.2% of the training characters and 98.8% of the held-out ones;
the rest are rare punctuation, most capitals' rare cousins and the digits 3-9.

A training example is a window of ``T + 1`` consecutive characters: ``idx`` the
first ``T``, ``targets`` the last ``T`` (the next character at each position).
"""

import collections
import os
import sysconfig

import numpy as np

from ..errors import TexprError

#: modules of the training text, in reading order (paths under the stdlib directory)
TRAIN_FILES = (
    "argparse.py", "inspect.py", "subprocess.py", "tarfile.py", "dataclasses.py",
    "collections/__init__.py", "shutil.py", "threading.py", "functools.py", "enum.py",
    "logging/__init__.py", "heapq.py", "random.py", "string.py", "os.py", "pickle.py",
)
#: held-out modules: the validation text
HELD_OUT_FILES = ("difflib.py", "textwrap.py")
#: the vocabulary's size: 64 characters and "other"
VOCAB = 65
#: the id of every character outside the 64
OTHER = VOCAB - 1


class TextDataError(TexprError):
    """The example's text cannot be read or is too small for the request."""


def stdlib_dir():
    """The standard library's source directory of this Python (``sysconfig``'s ``stdlib``)."""
    return sysconfig.get_paths()["stdlib"]


def read_files(names, root=None):
    """The files ``names`` (paths relative to ``root``, default :func:`stdlib_dir`) read
    as UTF-8 and joined with one newline, in the order given.

    Raises:
        TextDataError: some files are missing or unreadable (all of them are named,
            with the directory looked in).
    """
    root = stdlib_dir() if root is None else root
    missing = [n for n in names if not os.path.isfile(os.path.join(root, n))]
    if missing:
        raise TextDataError(
            f"gpt data: the standard-library sources {', '.join(missing)} are not in {root} "
            f"(the example reads {len(names)} modules that Python 3.11-3.13 ship; an "
            f"installation without its .py sources, or another version, lacks them)")
    texts = []
    for n in names:
        with open(os.path.join(root, n), encoding="utf-8") as f:
            texts.append(f.read())
    return "\n".join(texts)


class Vocabulary:
    """The ``size - 1`` most frequent characters of a text (ties broken by code point),
    in that order as ids ``0 .. size - 2``, and id ``size - 1`` for any other character.

    Args:
        text: the text whose characters are counted (the training text).
        size: ids in all, ``OTHER`` included (default :data:`VOCAB`).
    Raises:
        TextDataError: ``size`` < 2.
    """

    def __init__(self, text, size=VOCAB):
        if size < 2:
            raise TextDataError(f"gpt data: a vocabulary needs at least 2 ids, got {size}")
        counts = collections.Counter(text)
        self.chars = sorted(counts, key=lambda c: (-counts[c], c))[:size - 1]
        self.size = size
        self.other = size - 1
        self._ids = {c: i for i, c in enumerate(self.chars)}
        self._table = np.full(128, self.other, dtype=np.int64)
        for c, i in self._ids.items():
            if ord(c) < 128:
                self._table[ord(c)] = i

    def encode(self, text):
        """``text`` as an int64 array of ids (``other`` for characters outside the vocabulary)."""
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        ids = self._table[np.minimum(codes, 127)]
        wide = codes >= 127
        if wide.any():  # the few non-ASCII characters (and DEL) one by one
            ids[wide] = [self._ids.get(chr(c), self.other) for c in codes[wide]]
        return ids

    def decode(self, ids):
        """Ids as text; ``other`` reads as U+FFFD (the replacement character)."""
        return "".join(self.chars[i] if i < len(self.chars) else "\ufffd" for i in ids)


class TextData:
    """Training and held-out ids of two texts, with the vocabulary of the first.

    Args:
        train_text, val_text: the two texts.
        vocab_size: ids in all (default :data:`VOCAB`).
    Attributes:
        vocab (:class:`Vocabulary`), train and val (int64 id arrays), n_train_chars,
        n_val_chars.
    """

    def __init__(self, train_text, val_text, vocab_size=VOCAB):
        self.vocab = Vocabulary(train_text, vocab_size)
        self.train = self.vocab.encode(train_text)
        self.val = self.vocab.encode(val_text)
        self.n_train_chars, self.n_val_chars = len(train_text), len(val_text)

    @classmethod
    def from_stdlib(cls, root=None, limit=0, vocab_size=VOCAB):
        """The example's text: :data:`TRAIN_FILES` and :data:`HELD_OUT_FILES` under ``root``
        (default this Python's stdlib). ``limit`` > 0 keeps the first ``limit`` characters
        of each part (quick runs, tests).

        Raises:
            TextDataError: a file is missing (:func:`read_files`).
        """
        train, val = read_files(TRAIN_FILES, root), read_files(HELD_OUT_FILES, root)
        if limit:
            train, val = train[:limit], val[:limit]
        return cls(train, val, vocab_size)


def random_windows(ids, batch, seq, rng):
    """``batch`` windows of ``seq + 1`` ids at uniformly random starts:
    ``(idx, targets)``, both int64 ``(batch, seq)``, ``targets[b, t] = idx[b, t + 1]``
    (the window shifted by one).

    Raises:
        TextDataError: the text is shorter than one window.
    """
    if len(ids) < seq + 1:
        raise TextDataError(f"gpt data: a text of {len(ids)} characters holds no window of "
                            f"{seq + 1} (seq {seq} + 1)")
    starts = rng.integers(0, len(ids) - seq, size=batch)
    win = ids[starts[:, None] + np.arange(seq + 1)]
    return win[:, :-1], win[:, 1:]


def eval_windows(ids, batch, seq, max_batches=0):
    """The held-out windows, fixed: non-overlapping windows of ``seq + 1`` ids at starts
    ``0, seq, 2 seq, ...`` (each character after the first is a target exactly once),
    as whole batches ``(idx, targets)`` of shape ``(batch, seq)``; the windows that do
    not fill a last batch are left out, and at most ``max_batches`` (> 0) are kept.

    Raises:
        TextDataError: the text holds fewer than ``batch`` windows.
    """
    n = (len(ids) - 1) // seq
    n_batches = n // batch
    if max_batches:
        n_batches = min(n_batches, max_batches)
    if n_batches == 0:
        raise TextDataError(f"gpt data: a held-out text of {len(ids)} characters holds {n} "
                            f"windows of {seq + 1}, fewer than one batch of {batch}")
    starts = (np.arange(n_batches * batch) * seq).reshape(n_batches, batch)
    win = ids[starts[..., None] + np.arange(seq + 1)]
    return [(w[:, :-1], w[:, 1:]) for w in win]
