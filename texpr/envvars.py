"""One parser for the numbers texpr reads from the environment.

Every numeric ``TEXPR_*`` setting (``TEXPR_CACHE_SIZE_LIMIT``,
``TEXPR_COMPILE_WORKERS``, ``TEXPR_COMPILE_TIMEOUT``) is read by
:func:`env_number`: an unset or empty variable gives the documented default,
and so does a value that is not a finite number at least the setting's
minimum (text, ``inf``, ``nan``, ``1e400``, a negative count, a fraction where a
count is meant, a size beyond int64), with one :class:`SettingWarning` per
variable and value in a process. A setting never raises.
"""

import math
import os
import warnings

from .errors import TexprWarning

__all__ = ["env_number", "SettingWarning", "SIZE_SUFFIXES"]

#: the suffixes of a byte size (case-insensitive; ``MB``, ``MiB`` and ``M`` are all 1024**2)
SIZE_SUFFIXES = {"": 1, "B": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}
_INT_MAX = 2 ** 63 - 1
_WARNED = set()


class SettingWarning(TexprWarning):
    """An environment setting had a value texpr cannot use; the default was used."""


def env_number(name, default, *, integer=False, minimum=0, sizes=False, expected=None):
    """The value of the environment variable ``name`` as a number.

    Args:
        name: the variable (``"TEXPR_COMPILE_TIMEOUT"``).
        default: what an unset, empty or unusable value gives (any object: the
            caller's documented default, e.g. None).
        integer: the value is a count (an int; ``"2.0"`` is 2, ``"2.5"`` unusable).
        minimum: the smallest usable value.
        sizes: the value is a byte size: a suffix of :data:`SIZE_SUFFIXES`
            (``10K``, ``1.5G``, ``500MB``, ``2GiB``) multiplies it; the result is
            an int.
        expected: what a usable value is, for the warning (default: derived).
    Returns:
        The number (an int when ``integer`` or ``sizes``, else a float), or
        ``default``.
    Warns:
        SettingWarning (once per variable and value in a process) when the value
        is set but unusable: it names the variable, the value and the default used.
    """
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    value = _parse(raw.strip(), integer or sizes, sizes)
    if value is not None and value >= minimum:
        return value
    if (name, raw) not in _WARNED:
        _WARNED.add((name, raw))
        what = expected or (f"{'a byte size' if sizes else 'an integer' if integer else 'a number'}"
                            f" >= {minimum}" + (" (suffixes K, M, G, T)" if sizes else ""))
        warnings.warn(f"texpr: ${name}={raw!r} is not {what}; using the default "
                      f"({'none' if default is None else default})", SettingWarning, stacklevel=3)
    return default


def _parse(text, integer, sizes):
    """The finite number ``text`` stands for, or None."""
    unit = 1
    if sizes:
        text = text.upper()
        if text.endswith("IB"):
            text = text[:-2]
        elif text.endswith("B") and len(text) > 1 and text[-2] in SIZE_SUFFIXES:
            text = text[:-1]
        if text and text[-1] in SIZE_SUFFIXES and not text[-1].isdigit():
            unit = SIZE_SUFFIXES[text[-1]]
            text = text[:-1]
    try:
        value = float(text)
    except ValueError:
        return None
    value *= unit
    if not math.isfinite(value):
        return None
    if not integer:
        return value
    if sizes:
        value = math.floor(value)
    elif value != int(value):
        return None
    if abs(value) > _INT_MAX:
        return None
    return int(value)
