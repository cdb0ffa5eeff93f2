"""_hot.py — the batch wrappers' run() in C, where the extension is built (kiln/hot.c).

`make` builds _kiln_hot.abi3.so (CPython's stable ABI, 3.10 and later) beside libkiln.so, and
a wheel carries it beside the package's libkiln.so. plan() makes a Runner for each config
(the kernel and scalars a plan() chose) and binds it to each batch planned, and run() calls
it first: it runs the call when every tensor was checked before (by the Python path, into the
config's dicts) and returns NotImplemented otherwise, leaving the call to the Python path.
Without the extension the Python (ctypes) path does every call.

$KILN_HOT: unset, the extension is used where it is found and loads; "0", never (the ctypes
path only); "1", required: plan() raises KilnLibraryError when it is missing or does not
load. status() says which path runs and why.
"""

import ctypes
import importlib.machinery
import importlib.util
import os

from . import _lib
from .errors import KilnLibraryError, check

NAME = "_kiln_hot.abi3.so"

_state = None  # (module or None, why): loaded once


def _candidates():
    """Where the extension is looked for: beside the loaded libkiln.so, then in the package."""
    here = os.path.dirname(os.path.abspath(__file__))
    paths = []
    lib = _lib.lib_path()
    if os.sep in lib:
        paths.append(os.path.join(os.path.dirname(os.path.abspath(lib)), NAME))
    own = os.path.join(here, NAME)
    if own not in paths:
        paths.append(own)
    return paths


def _load():
    mode = os.environ.get("KILN_HOT", "")
    if mode not in ("", "0", "1"):
        raise KilnLibraryError(None, f"KILN_HOT={mode!r}: must be unset, 0 or 1")
    if mode == "0":
        return None, "off (KILN_HOT=0): the ctypes path runs every call"
    tried = []
    for path in _candidates():
        if not os.path.exists(path):
            tried.append(f"{path} (not built)")
            continue
        try:
            loader = importlib.machinery.ExtensionFileLoader("kiln._kiln_hot", path)
            spec = importlib.util.spec_from_loader("kiln._kiln_hot", loader)
            mod = importlib.util.module_from_spec(spec)
            loader.exec_module(mod)
        except ImportError as e:
            tried.append(f"{path} ({e})")
            continue
        want = ctypes.sizeof(_lib.kiln_batch_args)
        if mod.ARGS_BYTES != want:
            tried.append(f"{path} (built against another kiln.h: kiln_batch_args of "
                         f"{mod.ARGS_BYTES} bytes, {want} here)")
            continue
        return mod, f"on: {path}"
    why = "; ".join(tried)
    if mode == "1":
        raise KilnLibraryError(None, f"KILN_HOT=1 but no usable {NAME}: {why} (`make` builds "
                               "it where Python's headers are installed)")
    return None, f"off: {why}; the ctypes path runs every call"


def module():
    """The loaded extension, or None (see status())."""
    global _state
    if _state is None:
        _state = _load()
    return _state[0]


def status():
    """A line saying whether run() goes through the extension, and where it came from or why
    not."""
    module()
    return _state[1]


def _fail(status_code, ctx_handle):
    """What the Runner calls when kiln_plan_run fails, the context still held: the error
    Plan._call raises."""
    check(status_code, ctx_handle)


def make_runner(wrapper, cfg):
    """The Runner of a batch wrapper's plan config (_wrapper._Config, its plan made), to
    bind() to each batch planned under it; None without the extension (or when the plan's run
    is not a ctypes function)."""
    mod = module()
    if mod is None:
        return None
    fn = cfg.plan._fn_run
    if not isinstance(fn, ctypes._CFuncPtr):
        return None
    torch = wrapper._torch
    get_device, get_stream = wrapper._cuda
    return mod.Runner(
        cfg.plan.kernel.context, cfg.plan, cfg, cfg.seen_q, cfg.seen_kv, cfg.seen_out,
        cfg.seen_lse, cfg.out_info, torch.empty,
        (torch.empty_like, torch.Tensor) if cfg.o_dtype == cfg.q_dtype else None,
        {"dtype": cfg.o_dtype, "device": wrapper.device},
        {"dtype": torch.float32, "device": wrapper.device},
        get_device, get_stream, wrapper._device_index, _fail,
        ctypes.addressof(cfg.args), ctypes.cast(fn, ctypes.c_void_p).value, float(cfg.sm_scale),
        cfg.H, cfg.D, int(bool(wrapper._use_cuda_graph)), int(bool(cfg.lse)),
        int(bool(cfg.fp8)))
