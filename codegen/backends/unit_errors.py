"""The exception a unit's failed run-time check becomes, for every backend and driver.

One job: map a unit's error flag (code, offending value) to the TexprError that
names the stage and the expression (the kernel's Python driver,
:mod:`codegen.build`, and the bridges' compiled one,
the bridges' compiled driver (:mod:`codegen.backends`), raise it).
"""

from texpr.errors import OutOfBoundsError, TexprError

__all__ = ["unit_error"]


def unit_error(unit, code, value):
    """The exception for ``unit``'s failed check ``code`` (1-based, into
    ``unit.errors``) with offending ``value``: its message names the stage and
    the expression, and an index or value gets the offending value. Code -1:
    the unit raised inside compiled code; -2 (``unit`` None): the kernel's
    temporaries could not be allocated."""
    if code == -2:
        return MemoryError("texpr kernel: its temporary buffers could not be allocated")
    if code == -1:
        where = "the kernel's driver" if unit is None else f"stage {unit.stage}"
        return TexprError(f"{where}: the compiled code raised")
    msg = unit.errors[code - 1]
    if "division by zero" in msg:
        return TexprError(msg)
    if "would wrap around" in msg:
        return TexprError(f"{msg} (its first operand: {value})")
    return OutOfBoundsError(f"{msg} (index value {value})")
