"""errors.py — kiln's exceptions: one KilnError subclass per kiln_status.

Every failing C call becomes `raise error_for(status, message)`, where the message is kiln's own
last-error text (kiln_errmsg(), which context calls also fill): what failed, on what, and why.
Catch KilnError for any kiln failure, or a subclass for one status. Statuses that mean "bad
input" also derive from ValueError, and KilnNoMemoryError from MemoryError, so code that
catches the built-in kinds keeps working.
"""

from . import _lib


class KilnError(Exception):
    """A kiln call failed.

    status: the kiln_status value (int; None for KilnLibraryError);
    status_name: its enum name ("NVRTC", "PARSE", ...);
    message: kiln's message (what failed, on what, why).
    """

    status = None

    def __init__(self, status, message):
        self.status = status
        self.message = message
        super().__init__(status, message)

    @property
    def status_name(self):
        if self.status is None or not 0 <= self.status < len(_lib.STATUS_NAMES):
            return None
        return _lib.STATUS_NAMES[self.status]

    def __str__(self):
        name = self.status_name
        return f"{self.message} [{name}]" if name else self.message


class KilnLibraryError(KilnError):
    """libkiln.so could not be found or loaded (status is None)."""


class KilnInvalidArgumentError(KilnError, ValueError):
    """KILN_STATUS_INVALID_ARGUMENT: a bad argument, alignment, stride or option."""


class KilnParseError(KilnError, ValueError):
    """KILN_STATUS_PARSE: a spec that does not parse; the message quotes the token."""


class KilnUnsupportedError(KilnError):
    """KILN_STATUS_UNSUPPORTED: a variant, shape or arch kiln cannot generate."""


class KilnNoDeviceError(KilnError):
    """KILN_STATUS_NO_DEVICE: no usable GPU or CUDA driver where one is needed."""


class KilnCudaError(KilnError):
    """KILN_STATUS_CUDA: a CUDA driver call failed (module load, launch)."""


class KilnCompileError(KilnError):
    """KILN_STATUS_NVRTC: NVRTC failed to compile the generated source."""


class KilnCacheError(KilnError):
    """KILN_STATUS_CACHE: the SQLite kernel cache failed or is not a kiln cache."""


class KilnCacheMiss(KilnError):
    """KILN_STATUS_CACHE_MISS: strict mode and the kernel is not in the cache."""


class KilnNotFoundError(KilnError):
    """KILN_STATUS_NOT_FOUND."""


class KilnNoMemoryError(KilnError, MemoryError):
    """KILN_STATUS_NO_MEMORY: host allocation failed."""


class KilnWorkspaceError(KilnError):
    """KILN_STATUS_WORKSPACE: decode workspace missing or too small."""


class KilnIOError(KilnError):
    """KILN_STATUS_IO: cache directory or file problem."""


class KilnMismatchError(KilnError):
    """KILN_STATUS_MISMATCH: a result out of tolerance (the check harness)."""


# kiln_status value -> class; a status this table lacks (a newer library) maps to KilnError.
_BY_STATUS = {
    _lib.STATUS["INVALID_ARGUMENT"]: KilnInvalidArgumentError,
    _lib.STATUS["PARSE"]: KilnParseError,
    _lib.STATUS["UNSUPPORTED"]: KilnUnsupportedError,
    _lib.STATUS["NO_DEVICE"]: KilnNoDeviceError,
    _lib.STATUS["CUDA"]: KilnCudaError,
    _lib.STATUS["NVRTC"]: KilnCompileError,
    _lib.STATUS["CACHE"]: KilnCacheError,
    _lib.STATUS["CACHE_MISS"]: KilnCacheMiss,
    _lib.STATUS["NOT_FOUND"]: KilnNotFoundError,
    _lib.STATUS["NO_MEMORY"]: KilnNoMemoryError,
    _lib.STATUS["WORKSPACE"]: KilnWorkspaceError,
    _lib.STATUS["IO"]: KilnIOError,
    _lib.STATUS["MISMATCH"]: KilnMismatchError,
}


def error_for(status, message):
    """The exception for a kiln_status and message (not raised)."""
    return _BY_STATUS.get(status, KilnError)(status, message)


def check(status, ctx_handle=None):
    """Raise the exception for a failed kiln call; return None for KILN_STATUS_OK.

    The message is the calling thread's kiln_errmsg() (context calls copy theirs there), else
    kiln_ctx_errmsg(ctx_handle), else the status' own text.
    """
    if status == 0:
        return
    lib = _lib.lib()
    msg = _lib.text(lib.kiln_errmsg())
    if not msg and ctx_handle:
        msg = _lib.text(lib.kiln_ctx_errmsg(ctx_handle))
    if not msg:
        msg = _lib.text(lib.kiln_status_str(status))
    raise error_for(status, msg)
