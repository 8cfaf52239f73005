"""The one hierarchy of errors texpr raises for user mistakes.

Every message names the tensor (when there is one), prints the offending
expression with :mod:`texpr.printer` and says what was expected. Code in
``simplify/`` and ``codegen/`` raises these too, so that a user never sees a
raw traceback from numpy, sympy, islpy or numba for a malformed program.
"""


class TexprError(Exception):
    """Base class of every error texpr raises for a malformed program or input."""


class ShapeError(TexprError):
    """A shape, extent or number of indices is not what was expected."""


class DTypeError(TexprError):
    """A dtype is not allowed here (e.g. a float used as an index)."""


class OutOfBoundsError(TexprError, IndexError):
    """An unguarded tensor load reads outside the tensor's shape."""


class AxisError(TexprError):
    """An index variable or reduction axis is used where it is not bound."""


class FeedError(TexprError):
    """A feed dict misses a placeholder or gives an array of the wrong shape/dtype."""


class NotDifferentiableError(TexprError):
    """A derivative was asked of something that has none (e.g. an int tensor)."""


class ScheduleError(TexprError):
    """A schedule primitive asks for something impossible."""


class ConcretizationError(TexprError, TypeError):
    """A texpr expression (or tensor) was used where Python needs a concrete value:
    ``float(e)`` / ``math.exp(e)``, ``int(e)``, ``range(e)``, ``list[e]``, ``if e:``,
    Python's ``max(a, b)``, or a numpy function applied to it. The message names
    the texpr spelling (``te.exp``, ``te.max``, ``te.if_then_else``, ...). It is a
    ``TypeError`` too, so code that probes for numbers keeps working."""


class TexprWarning(UserWarning):
    """Base class of texpr's warnings (e.g. ``codegen.CacheWarning``: the kernel
    cache was repaired or could not be used)."""


class ScanError(TexprError):
    """A ``te.scan`` is malformed (the subclasses say how)."""


class ScanShapeError(ScanError, ShapeError):
    """The shapes or dtypes of a scan's init, update and state placeholder disagree
    (or a stage of its body lacks the leading time axis)."""


class ScanDependenceError(ScanError):
    """A scan's body reads its state at step ``t`` or later, at a time index that is
    not ``t - k`` for a constant ``k``, or another body stage at a step other than ``t``."""


class ScanInitError(ScanError):
    """A scan's body reads its state at ``t - k`` where ``t - k`` can be negative:
    ``k`` is larger than the init's leading extent and no guard ``t >= k`` protects it."""


class ScanBodyInputError(ScanError, NotDifferentiableError):
    """A stage of a scan's body (its update among them) or its state placeholder was
    given to ``te.differentiate`` or ``te.jvp`` as an input: it has no value of its
    own outside the scan, so no derivative either."""


def in_stage(stage, exc):
    """``exc`` (a TexprError) as an error of the stage named ``stage``: the same
    class, its message starting ``stage NAME: `` as the evaluator's and the loop
    nest's do (unchanged when it already names a stage). Every lowering raises
    its run-time errors through it, so a user reads which stage failed whichever
    way it ran."""
    msg = str(exc)
    if msg.startswith("stage "):
        return exc
    try:
        return type(exc)(f"stage {stage}: {msg}")
    except Exception:  # noqa: BLE001 - a class that takes other arguments
        return TexprError(f"stage {stage}: {msg}")
