"""_wrapper.py — the machinery under the FlashInfer-shaped batch wrappers (batch.py): dtype
spellings, tensor checks, workspace claims, and _BatchWrapper, whose plan() and run() they
share.

The hot path, by design: plan() looks its scalar arguments up in a per-wrapper table of
_Config (the checked values, the variant, kernel, kiln.Plan and a kiln_batch_args with its
run-time parameters already set), so only the index arrays are checked per plan (builtins
over host lists, plan.host_array). run() reads each tensor's metadata (_meta: type, shape,
strides, dtype, device), finds the strides it checked under that config before, patches the
pointers (and strides only when they changed) into the config's kiln_batch_args, and calls
kiln_plan_run through a function bound once. It allocates only what the caller did not pass
and asked for: o, and the LSE when return_lse=True; a kernel that writes an LSE nobody asked
for writes it into one scratch buffer per wrapper, and no conversion runs on it.

torch is imported only inside the functions.
"""

import array
import ctypes
import math

from . import _check, _hot, _lib
from ._planvalue import _READBACK, _capturing, _copy_into, _effective, _PlanValue, _readback
from .attention import _stride, alibi_slopes, default_context, request_mask_bits
from .core import Context
from .errors import KilnWorkspaceError
from .plan import Plan, _count, _request_kv_lens, host_ints

# ---- dtypes, spelled without torch ---------------------------------------------------------------

# torch / FlashInfer spellings -> kiln's spec spelling.
_DTYPE_WORDS = {
    "float16": "f16", "half": "f16", "fp16": "f16", "f16": "f16",
    "bfloat16": "bf16", "bf16": "bf16",
    "float8_e4m3fn": "e4m3", "fp8_e4m3": "e4m3", "e4m3": "e4m3",
    "float8_e5m2": "e5m2", "fp8_e5m2": "e5m2", "e5m2": "e5m2",
}
FP8 = ("e4m3", "e5m2")


def dtype_word(dtype, what):
    """kiln's spelling ("f16", "bf16", "e4m3", "e5m2") of a torch dtype or a FlashInfer dtype
    string ("float16", "torch.bfloat16", "float8_e4m3fn", ...)."""
    if not isinstance(dtype, str) and type(dtype).__module__ != "torch":
        raise TypeError(f"{what} must be a torch dtype or its name (a str), not "
                        f"{type(dtype).__name__}")
    word = str(dtype)
    if word.startswith("torch."):
        word = word[len("torch."):]
    if word not in _DTYPE_WORDS:
        raise ValueError(
            f"{what}={dtype!r} is not supported: float16 or bfloat16 (and for kv_data_type also "
            "float8_e4m3fn or float8_e5m2)"
        )
    return _DTYPE_WORDS[word]


def _torch_dtype(torch, word):
    return {"f16": torch.float16, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn,
            "e5m2": torch.float8_e5m2}[word]


def _torch():
    from .attention import _torch as load

    return load()


def _layout(kv_layout):
    return _check.choice(kv_layout, "kv_layout", ("NHD", "HND"), fold="upper")


def _lse_base(base):
    return _check.choice(base, "lse_base", ("2", "e"))


def _positive_int(value, name):
    return _check.integer(value, name, 1, _check.INT_MAX)


# ---- tensor checks -----------------------------------------------------------------------------


def _check_tensor(torch, name, t, ndim, device, dtype=None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}; the plan's workspace is on {device}")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name} has dtype {t.dtype}; the plan says {dtype}")
    if t.numel() == 0:
        return
    if t.stride(-1) != 1 and t.size(-1) > 1:
        raise ValueError(f"{name}: the last (head_dim) dimension must be contiguous, "
                         f"got strides {t.stride()}")
    if t.data_ptr() % 16:
        raise ValueError(f"{name}: data must be 16-byte aligned (data_ptr 0x{t.data_ptr():x})")
    item = t.element_size()
    for d in range(ndim - 1):
        if t.size(d) > 1 and (t.stride(d) <= 0 or (t.stride(d) * item) % 16):
            raise ValueError(f"{name}: stride {t.stride(d)} of dim {d} must be positive and a "
                             f"multiple of 16 bytes (strides {t.stride()}); call .contiguous()")


def _unpack_paged(torch, paged_kv_cache, layout):
    """(k, v) page pools, 4-D, from FlashInfer's forms: a tuple of two [pages, P, H_KV, D]
    (NHD) / [pages, H_KV, P, D] (HND) tensors, or one [pages, 2, ...] tensor; 3-D / 4-D forms
    mean page_size 1."""
    page_dim = -3 if layout == "NHD" else -2
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise ValueError(f"paged_kv_cache as a tuple must be (k_cache, v_cache), got "
                             f"{len(paged_kv_cache)} items")
        k, v = paged_kv_cache
        out = []
        for name, t in (("k_cache", k), ("v_cache", v)):
            if not isinstance(t, torch.Tensor) or t.dim() not in (3, 4):
                raise ValueError(f"{name} must be a 4-D tensor (3-D for page_size 1), got "
                                 f"{getattr(t, 'shape', type(t).__name__)}")
            out.append(t if t.dim() == 4 else t.unsqueeze(page_dim))
        return out[0], out[1]
    if isinstance(paged_kv_cache, torch.Tensor):
        t = paged_kv_cache
        if t.dim() not in (4, 5) or t.size(1) != 2:
            raise ValueError(f"paged_kv_cache as one tensor must be [pages, 2, ...] with 5 dims "
                             f"(4 for page_size 1), got shape {tuple(t.shape)}")
        if t.dim() == 4:
            t = t.unsqueeze(page_dim)
        return t[:, 0], t[:, 1]
    raise TypeError(f"paged_kv_cache must be a tensor or a (k_cache, v_cache) tuple, not "
                    f"{type(paged_kv_cache).__name__}")


def _meta(t):
    """What the checks of a tensor argument depend on, its pointer's alignment apart: a dict
    key. The pointer itself is read on every call, never kept. AttributeError for what is not
    a tensor."""
    return (type(t), t.shape, t.stride(), t.dtype, t.device)


def _remember(seen, key, info):
    """seen[key] = info in one of a config's tensor caches, kept small (an engine that makes
    a new tensor shape each call only ever misses)."""
    if len(seen) >= 64:
        seen.clear()
    seen[key] = info
    return info


def _require_cuda(device, what):
    """The wrappers run on CUDA tensors (tools/bench/pyhost.py replaces this to time the Python
    layer on CPU tensors)."""
    if getattr(device, "type", None) != "cuda":
        raise ValueError(f"{what} must be a CUDA tensor, got one on {device}")


def _cuda_calls(torch):
    """(current device index (), current raw stream (device index) -> int) from torch: its
    private one-step calls where this torch has them, else the public ones."""
    c = torch._C
    get_device = getattr(c, "_cuda_getDevice", None) or torch.cuda.current_device
    get_stream = getattr(c, "_cuda_getCurrentRawStream", None)
    if get_stream is None:
        def get_stream(index):
            return torch.cuda.current_stream(index).cuda_stream
    return get_device, get_stream


def _float_scale(value, name):
    f = _check.real(value, name, none=True)  # a one-element tensor is read (a synchronisation)
    if f is None:
        return 1.0
    if not f > 0 or math.isinf(f):
        raise ValueError(f"{name}={value}: must be a finite value > 0")
    return f


# ---- the shared machinery ----------------------------------------------------------------------



# plan() scalar argument types a config may be looked up by (a tensor never is: its value may
# change under the same identity); torch.dtype joins once torch is loaded
_KEY_TYPES = {type(None), bool, int, float, str}


def _scalars_key(scalars):
    """(values, types) of a dict of plan() scalar arguments, in its order: a key equal only
    for the same values of the same types (1 and 1.0 and True differ); None when a value is
    not of _KEY_TYPES."""
    values = tuple(scalars.values())
    types = tuple(map(type, values))
    return (values, types) if _KEY_TYPES.issuperset(types) else None


_CPU = []  # torch.device("cpu"), once


def _cpu_device(torch):
    if not _CPU:
        _CPU.append(torch.device("cpu"))
    return _CPU[0]


class _Config:
    """What one set of plan() scalar arguments decides: checked values, the variant, and once
    a plan reaches the device its kernel, kiln.Plan, torch dtypes, ALiBi slopes and the
    kiln_batch_args every run fills (params set here; pointers patched per plan and per run),
    with the tensor checks already passed under it (seen_*: _meta key -> strides)."""

    __slots__ = ("variant", "H", "H_KV", "D", "page_size", "sm_scale", "softcap", "window_left",
                 "rope_scale", "rope_theta", "split", "no_split", "lse", "fp8", "plan",
                 "q_dtype", "kv_dtype", "o_dtype", "slopes", "args", "args_ref", "scaled",
                 "seen_q", "seen_kv", "seen_out", "seen_lse", "out_info", "readback", "hot")

    def set_params(self, qs=1.0, ks=1.0, vs=1.0):
        """The run-time parameters of args for these q / k / v scales (FlashInfer's meaning:
        q_scale and k_scale multiply sm_scale; with fp8 KV, k_scale and v_scale dequantise in
        the kernel; with 16-bit KV the kernel multiplies o by v_scale)."""
        p = self.args.params
        p.sm_scale = self.sm_scale * qs * (1.0 if self.fp8 else ks)
        p.k_scale = ks if self.fp8 else 0.0
        p.v_scale = vs
        self.scaled = (qs, ks, vs) != (1.0, 1.0, 1.0)


class _State:
    """What plan() decided and run() needs."""

    __slots__ = ("cfg", "plan", "batch", "total_qo", "total_kv", "indices", "mask_bits",
                 "lse_scratch", "no_launch", "scalars", "kv_indptr", "qo_indptr", "last", "hot",
                 "forwarded")


class _BatchWrapper:
    """plan/run over a kiln_plan; the three public wrappers fill in the shapes.

    plan() is three steps: the scalar arguments to a _Config (looked up by their values and
    types; built and checked once), the index arrays to the host (plan.host_array, checked
    with builtins), then _plan_batch (kiln_plan_schedule). run() reads each tensor's _meta, finds
    its checked strides in the config, patches the config's kiln_batch_args and launches."""

    _op = None  # "decode" | "prefill"
    _kv = None  # "paged" | "ragged"
    _q_doc = "[total_qo, H, D]"
    # FlashInfer's CUDA-graph buffer attributes a graph-mode plan() copies (kv indptr, qo
    # indptr, last_page_len; None: the wrapper has none) and whether plan() copies them
    # (fast_decode_plan does not)
    _graph_bufs = (None, None, None)
    _copy_buffers = True
    _pos_encoding_mode = _PlanValue()
    _window_left = _PlanValue()
    _logits_soft_cap = _PlanValue()
    _sm_scale = _PlanValue()
    _rope_scale = _PlanValue()
    _rope_theta = _PlanValue()

    def __init__(self, float_workspace_buffer, kv_layout, use_cuda_graph, indices_buf,
                 max_batch, max_qo_tokens, context, lse_base):
        self._kv_layout = _layout(kv_layout)
        self._lse_base = _lse_base(lse_base)
        self._use_cuda_graph = _check.flag(use_cuda_graph, "use_cuda_graph")
        self._context_arg = _check.instance(context, "context", Context, none=True)
        if self._kv == "paged":  # FlashInfer's name: engines read and write the page ids there
            self._paged_kv_indices_buf = indices_buf
        self._max_batch = max(int(max_batch or 0), 0)  # a buffer's length, not an argument
        self._fixed_batch_size = self._max_batch if self._use_cuda_graph else 0  # FlashInfer's
        self._planned = {}  # the read-back values of the last plan (_PlanValue)
        self._max_qo_tokens = _check.integer(max_qo_tokens, "max_qo_tokens", 0, _check.INT_MAX,
                                             none=True) or 0
        self._kernels = {}  # Variant -> kiln.Kernel (compiled once per spec)
        self._plans = {}  # (Variant, kiln_plan_opts fields) -> kiln.Plan
        self._slopes = {}  # H -> ALiBi slopes, float32 [H]
        self._configs = {}  # plan() scalar arguments (values, types) -> _Config
        self._lse_scratch = None  # float32: the LSE a kernel with lse=1 writes when not asked
        self._retired = []  # LSE scratch buffers replaced by reset_workspace_buffer
        # Plan -> [uint8 device tensor, batch, total_qo]: the plan's own schedule workspace
        # (kiln_plan_schedule_scratch), sized for at least that batch; the float workspace holds
        # only the partial states, so wrappers may share it as FlashInfer's do
        self._schedules = {}
        self._indices_ok = None  # _meta of page ids last used as they are
        self._torch = None  # the torch module, once a plan reached the device
        self._cuda = None  # _cuda_calls(torch)
        self._state = None
        self._set_workspace(float_workspace_buffer)
        if self._use_cuda_graph and self._max_batch < 1:
            raise ValueError(
                f"{type(self).__name__}: use_cuda_graph=True needs the fixed-size index buffers "
                "(their lengths bound the batch of every later plan)"
            )

    def _set_workspace(self, buf):
        if buf is None or not hasattr(buf, "data_ptr"):
            raise TypeError("float_workspace_buffer must be a CUDA tensor (torch.uint8 is usual), "
                            f"not {type(buf).__name__}")
        self._float_workspace_buffer = buf
        self._workspace_bytes = int(buf.numel()) * int(buf.element_size())
        self._workspace_ptr = buf.data_ptr()
        self.device = getattr(buf, "device", None)
        self._device_index = getattr(self.device, "index", None)

    @property
    def is_cuda_graph_enabled(self):
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None,
                               *args, **kwargs):
        """Use another float workspace (int_workspace_buffer is accepted and ignored: each of
        kiln's plans keeps its schedule in a small buffer of its own). The next run needs a new
        plan()."""
        self._set_workspace(float_workspace_buffer)
        # the schedule buffers (kept in _schedules by their Plan) and the LSE scratch stay
        # alive: a graph captured before the reset still reads and writes them
        self._plans.clear()
        self._configs.clear()
        if self._lse_scratch is not None:
            self._retired.append(self._lse_scratch)
        self._lse_scratch = None
        self._torch = None  # the next plan checks the new buffer
        self._state = None

    def end_forward(self):
        """Nothing to release (FlashInfer's old API)."""

    @property
    def context(self):
        """The kiln.Context kernels come from: the one given, else the default context of the
        workspace's device."""
        if self._context_arg is not None:
            return self._context_arg
        return default_context(self.device)

    @property
    def variant(self):
        """The kiln.Variant of the last plan() (None before one)."""
        return self._state.cfg.variant if self._state else None

    @property
    def plan_info(self):
        """kiln.PlanInfo of the last plan() (kiln_plan_describe)."""
        if self._state is None:
            raise RuntimeError(f"{type(self).__name__}: call plan() first")
        return self._state.plan.info

    def _kernel(self, variant):
        k = self._kernels.get(variant)
        if k is None:
            k = self.context.kernel(variant)
            self._kernels[variant] = k
        return k

    # ---- plan ----

    def _config(self, scalars):
        """The _Config of these plan() scalar arguments (a dict, in a fixed order): found by
        their values and types, or built by the wrapper's _make_config (which checks them)."""
        self._state = None  # a failed plan leaves nothing to run
        key = _scalars_key(scalars)
        cfg = self._configs.get(key) if key is not None else None
        if cfg is None:
            cfg = self._make_config(**scalars)
            cfg.readback = _readback(scalars)
            if key is not None:
                if len(self._configs) >= 32:
                    self._configs.clear()
                self._configs[key] = cfg
        return cfg

    def _new_config(self, *, variant, H, H_KV, D, page_size, sm_scale, logits_soft_cap,
                    window_left, rope_scale, rope_theta, fixed_split_size, disable_split_kv,
                    masked=False):
        """The checks of the scalar arguments the wrappers share (no torch needed), into a
        _Config whose device half _ready() fills on the first plan."""
        if masked and self._use_cuda_graph:
            raise NotImplementedError("custom masks in CUDA-graph mode: the mask buffer's address "
                                      "would change with every plan")
        sm_scale = _check.real(sm_scale, "sm_scale", none=True)
        rope_scale = _check.real(rope_scale, "rope_scale", none=True)
        rope_theta = _check.real(rope_theta, "rope_theta", none=True)
        fixed_split_size = _check.integer(fixed_split_size, "fixed_split_size", none=True)
        window_left = _check.integer(window_left, "window_left", none=True)
        disable_split_kv = _check.flag(disable_split_kv, "disable_split_kv")
        scale = (1.0 / math.sqrt(D)) if sm_scale is None else sm_scale
        if not scale > 0 or math.isinf(scale):
            raise ValueError(f"sm_scale={sm_scale}: must be a finite value > 0")
        split = 0
        if fixed_split_size is not None and fixed_split_size > 0:
            split = fixed_split_size * (page_size if self._kv == "paged" else 1)
            if split > _check.INT_MAX:
                raise ValueError(f"fixed_split_size={fixed_split_size} pages of {page_size} "
                                 f"tokens is past kiln's bound ({_check.INT_MAX} tokens)")
        c = _Config()
        c.variant, c.H, c.H_KV, c.D, c.page_size = variant, H, H_KV, D, page_size
        c.sm_scale = scale
        c.softcap = float(logits_soft_cap or 0.0)  # checked by batch_variant
        c.window_left = window_left if window_left is not None and window_left >= 0 else -1
        rope = variant.rope
        c.rope_scale = rope_scale if rope and rope_scale is not None else 0.0
        c.rope_theta = rope_theta if rope and rope_theta is not None else 0.0
        c.split, c.no_split = split, disable_split_kv
        c.lse = variant.lse
        c.fp8 = variant.kv_dtype in FP8
        c.plan = None
        return c

    def _ready(self, torch, c):
        """The device half of a config, once: torch dtypes, ALiBi slopes, the args template."""
        if c.plan is not None:
            return
        v = c.variant
        c.q_dtype = _torch_dtype(torch, v.q_dtype)
        c.kv_dtype = _torch_dtype(torch, v.kv_dtype)
        c.o_dtype = _torch_dtype(torch, v.out_dtype)
        c.slopes = None
        if v.logits in ("alibi", "softcap_alibi"):  # one per H: captured runs keep its address
            c.slopes = self._slopes.get(c.H)
            if c.slopes is None:
                c.slopes = self._slopes[c.H] = alibi_slopes(c.H, self.device)
        a = c.args = _lib.kiln_batch_args()
        c.args_ref = ctypes.byref(a)
        p = a.params
        p.softcap = c.softcap
        p.window_left = max(c.window_left, 0)
        p.alibi_slopes = c.slopes.data_ptr() if c.slopes is not None else 0
        p.rope_scale, p.rope_theta = c.rope_scale, c.rope_theta
        p.lse_base2 = int(self._lse_base == "2")  # the kernel writes the LSE in this base
        c.set_params()
        c.seen_q, c.seen_kv, c.seen_out, c.seen_lse, c.out_info = {}, {}, {}, {}, {}
        c.hot = None  # the C Runner (_hot.make_runner), made by the first plan()
        opts = dict(num_qo_heads=c.H, page_size=c.page_size if self._kv == "paged" else 0,
                    max_batch=self._max_batch if self._use_cuda_graph else 0,
                    max_qo_tokens=self._max_qo_tokens if self._use_cuda_graph else 0,
                    fixed_split=c.split, no_split=c.no_split)
        key = (v,) + tuple(sorted(opts.items()))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = Plan(self._kernel(v), **opts)
        c.plan = plan

    def _plan_batch(self, cfg, scalars, *, kv, qo, last, indices, total_kv, custom_mask=None,
                    packed_custom_mask=None, mask_bits=None):
        """Everything after the host checks: the device half of the config, the workspace
        check, the page ids on the device, the custom mask packed into kiln's bitmask (or
        mask_bits already packed), kiln_plan_schedule. kv / qo / last: (list, host_array source)
        or None."""
        self._state = None
        kv_indptr = kv[0]
        qo_indptr = qo[0] if qo is not None else None
        last_page_len = last[0] if last is not None else None
        if self._kv == "paged" and indices is None:
            raise ValueError("the page ids (indices) are missing")
        batch = len(kv_indptr) - 1
        total_qo = batch if qo_indptr is None else qo_indptr[-1]
        if self._use_cuda_graph:
            self._check_bounds(batch, total_qo)
        torch = self._torch or self._take_torch()
        self._ready(torch, cfg)
        plan = cfg.plan
        dev_indices = None
        if self._kv == "paged":
            dev_indices = self._device_indices(torch, indices, kv_indptr[-1])
        if mask_bits is None and (custom_mask is not None or packed_custom_mask is not None):
            # FlashInfer's custom_mask: the requests' bool [qo_len, kv_len] masks flattened
            # back to back, which is kiln's per-request bitmask layout once packed; its
            # packed_custom_mask: each request packed on its own from a byte boundary
            kv_lens = _request_kv_lens(kv_indptr, last_page_len, cfg.page_size)
            sizes = [(qo_indptr[b + 1] - qo_indptr[b]) * kv_lens[b] for b in range(batch)]
            mask_bits = request_mask_bits(torch, custom_mask, packed_custom_mask, sizes,
                                          self.device)
        stream = self._cuda[1](self._device_index)
        sched = self._schedule(torch, plan, batch, total_qo)
        plan._plan_sources(batch, qo[1] if qo is not None else None, kv[1],
                           last[1] if last is not None else None, sched[0], sched[1], stream,
                           self._workspace_ptr, self._workspace_bytes)
        st = _State()
        st.cfg, st.plan, st.scalars = cfg, plan, scalars
        st.batch, st.total_qo, st.total_kv = batch, total_qo, total_kv
        st.kv_indptr, st.qo_indptr, st.last = kv_indptr, qo_indptr, last_page_len
        st.indices, st.mask_bits = dev_indices, mask_bits
        # no key at all (or no row): kiln would refuse the null page ids / k, v; the answer is
        # known (o = 0, lse = -inf). Not in CUDA-graph mode: a replay after a later plan with
        # keys must run the kernel.
        st.no_launch = not self._use_cuda_graph and (total_qo == 0 or kv_indptr[-1] == 0)
        st.lse_scratch = self._scratch_lse(torch, cfg, total_qo) if cfg.lse else None
        a = cfg.args
        a.workspace, a.workspace_bytes = sched
        a.kv_indices = dev_indices.data_ptr() if dev_indices is not None else 0
        a.mask_bits = mask_bits.data_ptr() if mask_bits is not None else 0
        if cfg.hot is None:  # run() in C, where the extension is built (False: it is not)
            cfg.hot = _hot.make_runner(self, cfg) or False
        st.forwarded = None  # the (values, types) of the last forward()'s arguments on it
        st.hot = None  # no_launch: the Python path writes o = 0, lse = -inf
        if cfg.hot and not st.no_launch:
            st.hot = cfg.hot.bind(total_qo, -1 if total_kv is None else total_kv,
                                  st.lse_scratch.data_ptr() if cfg.lse else 0)
        self._state = st
        self._planned = cfg.readback

    def _planned_in_c(self, qo, kv, indices, last, given):
        """Whether the C Runner of the last plan made this plan() (kiln/hot.c's replan, armed
        by _arm; False: nothing changed, the Python path plans)."""
        st = self._state
        return st is not None and bool(st.hot) and st.hot.replan(qo, kv, indices, last, given)

    def _arm(self, given, prefill_scalars, q_tokens=None):
        """Let the C Runner of the plan just made do the next plan() of these scalar arguments
        (`given`, a tuple of plan()'s arguments but the arrays; kiln/hot.c's replan, which
        plan() tries first): the buffers it plans into, the _State it updates and, for a
        prefill (prefill_scalars: _prefill_scalars' dict, None for decode), the few-token
        choice it must find again when q_tokens was left to it. Not in CUDA-graph mode (plan()
        also fills the graph buffers there), with a custom mask, nor without a Runner (no
        extension, or a batch with nothing to run)."""
        st = self._state
        if (st is None or not st.hot or self._use_cuda_graph
                or (prefill_scalars is not None and prefill_scalars["masked"])):
            return
        plan = st.plan
        fn = plan._schedule_address()
        if not fn:
            return  # a schedule call that is not C's (pyhost.py's stubs)
        buf, sched_batch, sched_qo, (sched, sched_bytes) = self._schedules[plan]
        torch = self._torch
        lse = self._lse_scratch
        few_group = 0
        if prefill_scalars is not None and q_tokens is None:  # few_tokens chose the kernel
            few_group = prefill_scalars["num_qo_heads"] // prefill_scalars["num_kv_heads"]
        st.hot.arm(given, st, self.device, _cpu_device(torch), torch.int32, torch.Tensor, fn,
                   sched, sched_bytes, sched_batch, sched_qo, self._workspace_ptr,
                   self._workspace_bytes, lse.numel() if lse is not None and st.cfg.lse else 0,
                   prefill_scalars is not None, self._kv == "paged", few_group,
                   st.cfg.variant.q_tokens)

    def _schedule(self, torch, plan, batch, total_qo):
        """(pointer, bytes) of plan's own schedule workspace, grown for this batch (never
        shrunk: its size only grows with batch and total_qo). In CUDA-graph mode kiln lays the
        schedule out for the plan's bounds, so the first size serves every later plan and a
        captured run keeps reading the same address."""
        have = self._schedules.get(plan)
        if have is not None and batch <= have[1] and total_qo <= have[2]:
            return have[3]
        b = max(batch, have[1]) if have is not None else batch
        q = max(total_qo, have[2]) if have is not None else total_qo
        need = max(plan.workspace_sizes(b, q)[0], 256)
        buf = have[0] if have is not None and have[0].numel() >= need else None
        if buf is None:
            buf = torch.empty(need, dtype=torch.uint8, device=self.device)
        self._schedules[plan] = have = [buf, b, q, (buf.data_ptr(), int(buf.numel()))]
        return have[3]

    def _fill_graph_buffers(self, kv_indptr, qo_indptr, last_page_len):
        """What FlashInfer's graph-mode plan() does with its fixed buffers: the plan's indptr
        (and qo indptr, last_page_len) copied into their first entries (the page ids are
        copied by _device_indices). kiln's kernels read only the page ids and the workspace;
        the copies are for engines that read the buffers back."""
        for attr, values in zip(self._graph_bufs, (kv_indptr, qo_indptr, last_page_len)):
            buf = getattr(self, attr) if attr is not None else None
            if buf is not None and values is not None:
                _copy_into(self._torch, buf, values, attr[1:-4])

    def _check_bounds(self, batch, total_qo):
        """A CUDA-graph plan stays within the constructor's buffers (and prefill within the
        first plan's rows, or max_qo_tokens)."""
        if batch > self._max_batch:
            raise ValueError(f"batch {batch} exceeds {self._max_batch}, the bound the CUDA-"
                             "graph buffers given to the constructor set")
        if self._op == "prefill" and not self._max_qo_tokens:
            self._max_qo_tokens = max(total_qo, 1)  # FlashInfer: the first plan bounds it
        if self._op == "prefill" and total_qo > self._max_qo_tokens:
            raise ValueError(f"{total_qo} query rows exceed {self._max_qo_tokens}, the bound "
                             "of CUDA-graph mode (the first plan's, or max_qo_tokens=)")

    def _take_torch(self):
        """torch and its CUDA calls for this wrapper, once its workspace proves a CUDA
        tensor."""
        torch = _torch()
        buf = self._float_workspace_buffer
        if not isinstance(buf, torch.Tensor):
            raise ValueError(f"float_workspace_buffer must be a CUDA tensor, got "
                             f"{type(buf).__name__}")
        _require_cuda(self.device, "float_workspace_buffer")
        self._torch, self._cuda = torch, _cuda_calls(torch)
        _KEY_TYPES.add(torch.dtype)
        if self._device_index is None:
            self._device_index = self._cuda[0]()
        return torch

    def _scratch_lse(self, torch, cfg, total_qo):
        """Where a kernel with lse=1 writes the LSE no run asked for: one float32 buffer per
        wrapper, grown (eager mode) or sized to the CUDA-graph bound once, so captured runs
        keep its address."""
        rows = total_qo
        if self._use_cuda_graph:
            rows = self._max_batch if self._op == "decode" else self._max_qo_tokens
        need = max(rows * cfg.H, 1)
        buf = self._lse_scratch
        if buf is None or buf.numel() < need:
            buf = self._lse_scratch = torch.empty(need, dtype=torch.float32, device=self.device)
        return buf

    def _device_indices(self, torch, indices, used):
        """The page ids as an int32 device tensor at a fixed address in CUDA-graph mode (copied
        into the constructor's buffer), else the caller's tensor (converted once if needed)."""
        try:
            key = _meta(indices)
        except AttributeError:
            key = None
        if key is not None and key == self._indices_ok:  # an int32 1-D contiguous device tensor
            t = indices
            if used > key[1][0]:
                raise ValueError(f"the indptr says {used} page ids, the indices hold {key[1][0]}")
        elif used > _count(indices):
            raise ValueError(f"the indptr says {used} page ids, the indices hold {_count(indices)}")
        elif isinstance(indices, torch.Tensor):
            t = indices.reshape(-1)
            if t.dtype != torch.int32 or t.device != self.device or not t.is_contiguous():
                t = t.to(device=self.device, dtype=torch.int32).contiguous()
            elif indices.dim() == 1:  # used as it is: the same checks pass next time
                self._indices_ok = key
        else:
            t = torch.tensor(host_ints(indices, "indices"), dtype=torch.int32, device=self.device)
        if not self._use_cuda_graph:
            return t
        buf = self._paged_kv_indices_buf
        if used > buf.numel():
            raise ValueError(f"{used} page ids exceed the {buf.numel()} of the CUDA-graph "
                             "indices buffer")
        if used and buf.data_ptr() != t.data_ptr():
            buf[:used].copy_(t[:used], non_blocking=True)
        return buf

    def _replan(self, **changes):
        """Plan the last plan()'s batch again with some attention arguments changed (forward());
        nothing happens when their effective values (_effective) are the planned ones. A
        re-plan while the current stream captures a CUDA graph raises RuntimeError."""
        st = self._require_plan()
        scalars = dict(st.scalars, **changes)
        if _effective(scalars, st.cfg.D) == _effective(st.scalars, st.cfg.D):
            return st
        if _capturing(self._torch):
            raise RuntimeError(
                f"{type(self).__name__}.forward(): its attention arguments differ from the "
                "plan's, so the batch must be planned again, and a plan cannot run inside a "
                "CUDA-graph capture (it copies to the host): plan() with these arguments before "
                "capturing, and call run()")
        cfg = self._config(scalars)
        kv, qo, last = (None if x is None else (array.array("i", x),) * 2
                        for x in (st.kv_indptr, st.qo_indptr, st.last))
        self._plan_batch(cfg, scalars, kv=kv, qo=qo, last=last, indices=st.indices,
                         total_kv=st.total_kv, mask_bits=st.mask_bits)
        return self._state

    # ---- run ----

    def _require_plan(self):
        if self._state is None:
            raise RuntimeError(f"{type(self).__name__}: call plan() before run()")
        return self._state

    def _q_info(self, cfg, q):
        """(rows, q_stride_n, q_stride_h) of a q that passes the checks (raises otherwise)."""
        torch = self._torch
        _check_tensor(torch, "q", q, 3, self.device, cfg.q_dtype)
        if tuple(q.shape[1:]) != (cfg.H, cfg.D):
            raise ValueError(f"q must be {self._q_doc}, [*, {cfg.H}, {cfg.D}], got "
                             f"{tuple(q.shape)}")
        return (q.size(0), _stride(q, 0), _stride(q, 1))

    def _out_info(self, cfg, out, rows):
        _check_tensor(self._torch, "out", out, 3, self.device, cfg.o_dtype)
        if tuple(out.shape) != (rows, cfg.H, cfg.D):
            raise ValueError(f"out must be {(rows, cfg.H, cfg.D)}, got {tuple(out.shape)}")
        return (rows, _stride(out, 0), _stride(out, 1))

    def _given_out(self, cfg, out, rows):
        """The strides of a caller's out (checked once per metadata)."""
        try:
            key = _meta(out)
        except AttributeError:
            key = None
        info = cfg.seen_out.get(key)
        if info is None or info[0] != rows:
            info = _remember(cfg.seen_out, key, self._out_info(cfg, out, rows))
        return info

    def _given_lse(self, cfg, lse, rows):
        """The pointer of a caller's lse (checked once per metadata)."""
        try:
            key = _meta(lse)
        except AttributeError:
            key = None
        if cfg.seen_lse.get(key) != rows:
            _remember(cfg.seen_lse, key, self._lse_ok(cfg, lse, rows))
        return lse.data_ptr()

    def _lse_ok(self, cfg, lse, rows):
        torch = self._torch
        if (not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (rows, cfg.H)
                or lse.dtype != torch.float32 or lse.device != self.device
                or not lse.is_contiguous()):
            raise ValueError(f"lse must be a contiguous float32 tensor {(rows, cfg.H)} on "
                             f"{self.device}, got {getattr(lse, 'shape', lse)}")
        return rows

    def _run(self, st, q, kp, vp, kv, *, out, lse, return_lse, q_scale, k_scale, v_scale,
             window_left):
        """The launch the wrappers share: q [rows, H, D] against the planned batch; kp, vp the
        key and value pointers with kv their checked strides (k page, n, h, v page, n, h)."""
        cfg = st.cfg
        if window_left is not None:
            self._check_window(cfg, window_left)
        if return_lse is not False and return_lse is not True:
            return_lse = _check.flag(return_lse, "run: return_lse")
        torch = self._torch
        try:
            key = _meta(q)
            qp = q.data_ptr()
        except AttributeError:
            key = qp = None
        info = cfg.seen_q.get(key)
        if info is None:
            info = _remember(cfg.seen_q, key, self._q_info(cfg, q))
        rows = info[0]
        if rows != st.total_qo and (rows < st.total_qo or not self._use_cuda_graph):
            raise ValueError(f"q has {rows} rows; the plan has {st.total_qo}")
        if out is None:
            out = torch.empty(rows, cfg.H, cfg.D, dtype=cfg.o_dtype, device=self.device)
            o_info = cfg.out_info.get(rows)
            if o_info is None:
                o_info = _remember(cfg.out_info, rows, self._out_info(cfg, out, rows))
        else:
            o_info = self._given_out(cfg, out, rows)
        op = out.data_ptr()
        if return_lse and not cfg.lse:
            raise ValueError("return_lse=True, but plan() was called with lse=False")
        if lse is not None:
            lp = self._given_lse(cfg, lse, rows)
        elif return_lse:
            lse = torch.empty((rows, cfg.H), dtype=torch.float32, device=self.device)
            lp = lse.data_ptr()
        else:
            lp = st.lse_scratch.data_ptr() if cfg.lse else 0
        if st.no_launch:  # nothing to attend to: o = 0, lse = -inf
            out.zero_()
            if lse is not None:
                lse.fill_(-math.inf)
            return (out, lse) if return_lse else out
        if (qp | kp | vp | op) & 15:  # pointers are never cached: the checks name the tensor
            self._q_info(cfg, q)
            self._out_info(cfg, out, rows)
            raise ValueError("k / v: data must be 16-byte aligned (data_ptr "
                             f"0x{kp:x} / 0x{vp:x})")
        if q_scale is not None or k_scale is not None or v_scale is not None:
            cfg.set_params(_float_scale(q_scale, "q_scale"), _float_scale(k_scale, "k_scale"),
                           _float_scale(v_scale, "v_scale"))
        elif cfg.scaled:
            cfg.set_params()
        a = cfg.args  # every field each call: the C Runner (_hot.py) writes them too
        a.q, a.k, a.v, a.o, a.lse = qp, kp, vp, op, lp
        a.q_stride_n, a.q_stride_h = info[1], info[2]
        a.o_stride_n, a.o_stride_h = o_info[1], o_info[2]
        (a.k_stride_page, a.k_stride_n, a.k_stride_h, a.v_stride_page, a.v_stride_n,
         a.v_stride_h) = kv[:6]
        get_device, get_stream = self._cuda
        index = self._device_index
        stream = get_stream(index)
        if get_device() == index:
            st.plan._call(st.plan._fn_run, cfg.args_ref, stream)
        else:
            with torch.cuda.device(index):
                st.plan._call(st.plan._fn_run, cfg.args_ref, stream)
        return (out, lse) if return_lse else out

    def _check_window(self, cfg, window_left):
        window_left = _check.integer(window_left, "run: window_left")
        if window_left != cfg.window_left and not (window_left < 0 and cfg.window_left < 0):
            raise ValueError(f"run(window_left={window_left}) differs from plan(window_left="
                             f"{cfg.window_left}): the window is part of the planned kernel")

    def _paged_kv(self, st, paged_kv_cache):
        """(k pointer, v pointer, strides) of a paged KV cache in any of FlashInfer's forms,
        checked once per _meta under the plan's config."""
        cfg = st.cfg
        try:
            if type(paged_kv_cache) is tuple and len(paged_kv_cache) == 2:
                k, v = paged_kv_cache
                key = (_meta(k), _meta(v))
                kp, vp = k.data_ptr(), v.data_ptr()
            else:
                key = _meta(paged_kv_cache)
                kp = vp = paged_kv_cache.data_ptr()
        except AttributeError:
            key = None
        info = cfg.seen_kv.get(key)
        if info is None:
            info = self._paged_info(cfg, paged_kv_cache)
            if key is None:  # not a form _meta reads: the checks raised, or a list of two
                k, v = _unpack_paged(self._torch, paged_kv_cache, self._kv_layout)
                return k.data_ptr(), v.data_ptr(), info
            _remember(cfg.seen_kv, key, info)
        if info[6] is not None:  # one tensor: v sits at a fixed offset from k
            vp = kp + info[6]
        return kp, vp, info

    def _paged_info(self, cfg, paged_kv_cache):
        torch = self._torch
        k, v = _unpack_paged(torch, paged_kv_cache, self._kv_layout)
        nhd = self._kv_layout == "NHD"
        want = (cfg.page_size, cfg.H_KV, cfg.D) if nhd else (cfg.H_KV, cfg.page_size, cfg.D)
        doc = "[pages, page_size, H_KV, D]" if nhd else "[pages, H_KV, page_size, D]"
        for name, t in (("k_cache", k), ("v_cache", v)):
            _check_tensor(torch, name, t, 4, self.device, cfg.kv_dtype)
            if tuple(t.shape[1:]) != want:
                raise ValueError(f"{name} must be {doc} = [*, {', '.join(map(str, want))}] "
                                 f"({self._kv_layout}), got {tuple(t.shape)}")
        n_dim, h_dim = (1, 2) if nhd else (2, 1)
        offset = None
        if isinstance(paged_kv_cache, torch.Tensor):
            offset = v.data_ptr() - k.data_ptr()
        return (_stride(k, 0), _stride(k, n_dim), _stride(k, h_dim), _stride(v, 0),
                _stride(v, n_dim), _stride(v, h_dim), offset)

    def _forward(self, run, changes, *args, **kwargs):
        """FlashInfer's deprecated forward(): its attention arguments replace the plan's (and
        stay for later runs, as in FlashInfer), re-planning the batch when they change what
        was planned; then run()."""
        st = self._state
        key = _scalars_key(changes)
        if st is not None and key is not None and key == st.forwarded:
            return run(*args, **kwargs)  # as the last forward() on this plan: all done already
        self._replan(**changes)
        planned = dict(self._planned)  # FlashInfer's forward() keeps the values as given
        planned.update((k, v) for k, v in changes.items() if k in _READBACK)
        self._planned = planned
        self._state.forwarded = key  # the plan these arguments mean, read back as given
        return run(*args, **kwargs)
