"""What the tests that fork on purpose share.

``FORKS_WITHOUT_JAX`` marks a test that forks (``os.fork``, a ``fork``
multiprocessing context) and whose children never use JAX. Once a JAX test of
the same run has started JAX's backend, JAX warns at every fork of the process
that "os.fork() was called ... this will likely lead to a deadlock": a deadlock
of JAX's own threads, which these children never touch (they run texpr kernels
on numpy and numba, the point of the tests being what a fork does to *those*).
The mark ignores that one warning in those tests only; any other fork still
shows it.
"""

import pytest

FORKS_WITHOUT_JAX = pytest.mark.filterwarnings(
    r"ignore:os\.fork\(\) was called\. os\.fork\(\) is incompatible with multithreaded "
    r"code, and JAX is multithreaded:RuntimeWarning")
