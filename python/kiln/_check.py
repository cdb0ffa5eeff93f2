"""_check.py — the argument checks every public entry point makes before a value reaches ctypes.

ctypes converts without a word: it cuts a char * at the first NUL, wraps an integer to the C
field's width (2**32 + 128 becomes 128), and stores the truth value of anything in an int flag
(the string "0" is true). Each helper here takes one argument and the name the caller knows it
by, and returns the value ready for the C side, or raises TypeError (the wrong kind of value)
or ValueError (the right kind, out of bounds) naming the argument. The rules, also in
docs/python.md ("Argument rules"):

  text    a str (never bytes: decode them yourself, so no encoding is guessed), without NUL,
          UTF-8-encodable, at most max_bytes bytes once encoded; returned as UTF-8 bytes
  path    a str or an os.PathLike whose path is a str, without NUL; returned as bytes in the
          file-system encoding (what os.fsencode gives)
  integer an int or an integer type with __index__ (numpy, a 0-dim torch tensor), never a bool
          or a float, within [lo, hi] (default: the range of a C int)
  flag    a bool, or the int 0 or 1 (never a str or None); returned as bool
  real    an int, a float or anything with __float__ (a one-element tensor), never a bool or a
          str; NaN refused unless nan=True
  choice  a str among the options (case-folded first when fold is given)

CheckedStruct applies integer / real to the fields of the public struct mirrors (kiln.AttnArgs,
kiln.Params, kiln.BatchArgs, kiln.MergeArgs) as they are set from Python.
"""

import ctypes
import operator
import os

INT_MIN, INT_MAX = -(2**31), 2**31 - 1  # C int (every int field of kiln.h)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # int64_t
UINT64_MAX = 2**64 - 1  # uint64_t, size_t, kiln_devptr, CUstream


def _kind(value):
    return type(value).__name__


def text(value, name, *, max_bytes=None, none=False):
    """A str for a char * or char[] field: UTF-8 bytes; None stays None when none=True."""
    if value is None and none:
        return None
    if isinstance(value, (bytes, bytearray)):
        raise TypeError(f"{name} must be a str, not {_kind(value)} (decode it first)")
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {_kind(value)}")
    if "\0" in value:
        raise ValueError(f"{name} contains a NUL character at index {value.index(chr(0))}")
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{name} is not encodable as UTF-8 ({exc.reason} at index "
                         f"{exc.start})") from None
    if max_bytes is not None and len(raw) > max_bytes:
        raise ValueError(f"{name} is {len(raw)} bytes in UTF-8; at most {max_bytes}")
    return raw


def path(value, name, *, none=True):
    """A file-system path for a const char * option: bytes; None stays None when none=True."""
    if value is None and none:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, (bytes, bytearray)):
        raise TypeError(f"{name} must be a str or os.PathLike path, not {_kind(value)} "
                        "(decode it first, e.g. os.fsdecode)")
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str or os.PathLike path, not {_kind(value)}")
    if "\0" in value:
        raise ValueError(f"{name} contains a NUL character at index {value.index(chr(0))}")
    if not value:
        raise ValueError(f"{name} is an empty path (None means the default)")
    return os.fsencode(value)


def integer(value, name, lo=INT_MIN, hi=INT_MAX, *, none=False):
    """An integer within [lo, hi], as int; None stays None when none=True."""
    if value is None and none:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not bool")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, not {_kind(value)}") from None
    if not lo <= v <= hi:
        raise ValueError(f"{name}={v} is out of range: {lo}..{hi}")
    return v


def flag(value, name):
    """A yes/no option: bool, or the int 0 or 1."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (str, bytes, bytearray)) or value is None:
        raise TypeError(f"{name} must be a bool, not {_kind(value)}")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be a bool, not {_kind(value)}") from None
    if v not in (0, 1):
        raise ValueError(f"{name}={v}: a flag is True / False (or 1 / 0)")
    return bool(v)


def real(value, name, *, none=False, nan=False):
    """A real number as float; None stays None when none=True."""
    if value is None and none:
        return None
    if isinstance(value, (bool, str, bytes, bytearray)) or not (
            hasattr(type(value), "__float__") or hasattr(type(value), "__index__")):
        raise TypeError(f"{name} must be a number, not {_kind(value)}")
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"{name} must be a number ({exc})") from None
    if f != f and not nan:
        raise ValueError(f"{name} is NaN")
    return f


def choice(value, name, options, *, fold=None):
    """One of `options` (str; a dict's keys). fold "upper" / "lower" case-folds first."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str (one of {', '.join(map(repr, options))}), "
                        f"not {_kind(value)}")
    key = value.upper() if fold == "upper" else value.lower() if fold == "lower" else value
    if key not in options:
        raise ValueError(f"{name}={value!r}: must be one of {', '.join(map(repr, options))}")
    return key


def instance(value, name, cls, *, none=False):
    """An instance of cls (a class or tuple); None passes when none=True."""
    if value is None and none:
        return None
    if not isinstance(value, cls):
        want = cls.__name__ if isinstance(cls, type) else " or ".join(c.__name__ for c in cls)
        raise TypeError(f"{name} must be a {want}, not {_kind(value)}")
    return value


def stream(value, name="stream"):
    """A CUstream: None (the legacy default stream), an int handle, or an object with
    .cuda_stream (torch.cuda.Stream, cupy's); returned as an int or None."""
    if value is None:
        return None
    handle = getattr(value, "cuda_stream", value)
    h = integer(handle, name, 0, UINT64_MAX)
    return h or None


# ---- struct fields ---------------------------------------------------------------------------

_INT_RANGES = {}
for _t in (ctypes.c_int8, ctypes.c_int16, ctypes.c_int32, ctypes.c_int64):
    _bits = 8 * ctypes.sizeof(_t)
    _INT_RANGES[_t] = (-(2 ** (_bits - 1)), 2 ** (_bits - 1) - 1)
for _t in (ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_size_t):
    _INT_RANGES[_t] = (0, 2 ** (8 * ctypes.sizeof(_t)) - 1)
_REALS = (ctypes.c_float, ctypes.c_double)
_FIELDS = {}  # struct class -> {field name: ctypes type}


def _field_types(cls):
    types = _FIELDS.get(cls)
    if types is None:
        types = {}
        for klass in reversed(cls.__mro__):
            for field in klass.__dict__.get("_fields_", ()):
                types[field[0]] = field[1]
        _FIELDS[cls] = types
    return types


class CheckedStruct:
    """Mixin for a ctypes.Structure subclass: a scalar field set from Python (by attribute or
    by constructor keyword) is checked against its C type first (integer within the type's
    range, real for float / double), so 2**32 + 1 in an int field raises instead of becoming 1.
    Nested structs and arrays are ctypes' own (a field of args.params is not checked)."""

    __slots__ = ()

    def __setattr__(self, name, value):
        ctype = _field_types(type(self)).get(name)
        if ctype is not None:
            what = f"{type(self).__name__}.{name}"
            if ctype in _REALS:
                value = real(value, what)
            elif ctype in _INT_RANGES:
                value = integer(value, what, *_INT_RANGES[ctype])
        super().__setattr__(name, value)
