"""utils.py — flashinfer.utils's import path: the names engines import from it that kiln has
(re-exports only; the code lives in page.py)."""

from .page import _get_range_buf

__all__ = ["_get_range_buf"]
