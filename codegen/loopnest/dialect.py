"""The target dialect: how the loop-nest lowering spells what its target decides.

One job: the interface between the target-neutral lowering (:mod:`codegen.loopnest`:
statements, loop nests, reductions, checks, written as Python-syntax text) and
the backend that compiles that text. The lowering never names a compiler; it
asks the active :class:`Dialect` for

* the module text every unit starts with (:meth:`Dialect.prelude`: imports and
  the runtime helpers' import line) and the line that makes a function a
  compiled unit (:meth:`Dialect.decorator`);
* the spelling of a parallel loop (:attr:`Dialect.parallel_range`);
* the names of the runtime helpers (:attr:`Dialect.helper_names`: pure ones may
  be dropped with a dead assignment; :attr:`Dialect.check_names`: calls that
  check a value at run time and set the error flag);
* whether a loop vectorises as written (:meth:`Dialect.unit_stride_loop`), and
  whether a parallel stage must be lowered serially after all
  (:meth:`Dialect.serial_instead`: a target's known miscompilation).

A backend defines a subclass and registers its instance with :func:`register`;
the build activates one with :func:`using` (the default is the first
registered). docs/extending.md, "A backend", walks through one.
"""

import contextlib
import contextvars

from texpr.errors import TexprError

__all__ = ["Dialect", "register", "registered", "current", "using"]


class Dialect:
    """The interface a loop-nest backend implements (see the module docstring)."""

    #: the name it is registered under (set by :func:`register`)
    name = None
    #: the ``kind`` of the unit descriptions this dialect's text makes
    unit_kind = None
    #: the name of a parallel ``range`` in the unit text
    parallel_range = "range"
    #: runtime helper functions with no side effect (a dead call may be dropped)
    helper_names = frozenset()
    #: runtime helpers that check a value and set the unit's error flag
    check_names = ()

    def prelude(self):
        """The text every unit module starts with (imports, helpers)."""
        raise NotImplementedError

    def decorator(self, parallel):
        """The line before ``def unit(...)``: a compiled function, with parallel
        loops when ``parallel``."""
        raise NotImplementedError

    def unit_stride_loop(self, text):
        """Whether the loop ``text`` (one ``for`` loop, dedented) vectorises as
        written on this target (then a reduction over it keeps one accumulator)."""
        return False

    def serial_instead(self, lowering):
        """Whether the stage ``lowering`` (with parallel loops) must be lowered
        serially on this target."""
        return False


_REGISTERED = {}
_ACTIVE = contextvars.ContextVar("texpr_codegen_dialect", default=None)


def register(name, dialect):
    """Register ``dialect`` (a :class:`Dialect`) under ``name``; the first one
    registered is the default.

    Raises:
        TexprError: a name that is no non-empty str, an object that is no
        Dialect, or a name another dialect is registered under."""
    if not isinstance(name, str) or not name:
        raise TexprError(f"codegen: a dialect's name must be a non-empty str, got {name!r}")
    if not isinstance(dialect, Dialect):
        raise TexprError(f"codegen: dialect {name!r} must be a codegen.loopnest.dialect.Dialect, "
                         f"got {type(dialect).__name__}")
    if name in _REGISTERED and _REGISTERED[name] is not dialect:
        raise TexprError(f"codegen: a dialect named {name!r} is registered already")
    dialect.name = name
    _REGISTERED[name] = dialect


def registered():
    """The registered dialects' names, default first."""
    return list(_REGISTERED)


def current():
    """The active dialect (the default when none was activated)."""
    d = _ACTIVE.get()
    if d is None:
        if not _REGISTERED:
            raise TexprError("codegen: no loop-nest backend is registered "
                             "(import texpr.codegen registers the default one)")
        d = next(iter(_REGISTERED.values()))
    return d


@contextlib.contextmanager
def using(dialect):
    """Activate ``dialect`` (a Dialect or a registered name) inside the block."""
    if isinstance(dialect, str):
        if dialect not in _REGISTERED:
            raise TexprError(f"codegen: no backend {dialect!r} is registered "
                             f"(registered: {', '.join(_REGISTERED) or 'none'})")
        dialect = _REGISTERED[dialect]
    elif not isinstance(dialect, Dialect):
        raise TexprError(f"codegen: using() takes a codegen.loopnest.dialect.Dialect or a "
                         f"registered name, got {type(dialect).__name__}")
    token = _ACTIVE.set(dialect)
    try:
        yield dialect
    finally:
        _ACTIVE.reset(token)
