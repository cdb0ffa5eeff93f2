"""ops.py — kiln as torch.library custom operators (torch.ops.kiln.*), so torch.compile traces
through kiln (fullgraph=True) and mode="reduce-overhead" captures it in a CUDA graph.

    q, k, v ──► torch.ops.kiln.single_decode ──► o        (fake: o like q; lse [H] float32)
    plan() outside the graph ─► h = plan_handle(wrapper) ─► torch.ops.kiln.batch_decode_run(h, q,
    k_cache, v_cache) inside it

Every single-request function, every batch wrapper's run(), the cascade wrapper's run() and the
merges are an operator here, with a fake (meta) implementation that gives the output shapes,
dtypes and devices without running anything. The functions at the bottom take the arguments of
their kiln / FlashInfer namesakes and call the operators; under torch.compile call them (or
torch.ops.kiln.* directly) instead of the eager functions, whose ctypes calls dynamo cannot
trace.

Plans. A wrapper's plan() runs on the host and stays outside the graph, as in FlashInfer. The
operator takes the plan through an int: plan_handle(wrapper), called after plan(), records what
the graph may assume about the plan (the kind of wrapper, the output dtype, whether it has an
LSE) and returns the same int for the same wrapper and assumptions, so a re-plan with the same
shapes keeps the compiled graph (and a captured CUDA graph replays on the new plan, within what
the wrapper's use_cuda_graph mode allows). A run whose wrapper has since been planned with
other assumptions raises instead of returning a tensor the graph does not expect.

CUDA graphs. Inside a capture nothing here loads a module, synchronises or allocates outside
torch's allocator: kernels are loaded by plan() (batch wrappers) or by the first eager call of
a single-request function or merge for its variant. torch.compile's reduce-overhead mode always
runs a function eagerly once before it records it, which is that first call; a caller who
captures with torch.cuda.graph by hand warms up first (torch's rule anyway), or calls
prepare(op, *args) once. A first call inside a capture raises with that advice.

torch is imported by this module (kiln's other modules work without it); the package imports
it lazily (kiln.ops).
"""

import weakref

import torch

from . import attention, batch, cascade

_NS = "kiln"
_lib = torch.library.Library(_NS, "FRAGMENT")
Tensor = torch.Tensor

# ---- plan handles ------------------------------------------------------------------------------

_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}


class _Handle:
    """What a graph assumes about one wrapper's plan: kind ("decode" | "paged" | "ragged" |
    "cascade"), o_dtype and lse (the plan has an LSE output). ref: weak, to the wrapper."""

    __slots__ = ("ref", "kind", "o_dtype", "lse", "__weakref__")

    def __init__(self, ref, kind, o_dtype, lse):
        self.ref, self.kind, self.o_dtype, self.lse = ref, kind, o_dtype, lse


_handles = {}  # int -> _Handle
_handle_ids = {}  # (id(wrapper), kind, o_dtype, lse) -> int
_next_handle = [1]

_KINDS = (
    (batch.BatchDecodeWithPagedKVCacheWrapper, "decode"),
    (batch.BatchPrefillWithPagedKVCacheWrapper, "paged"),
    (batch.BatchPrefillWithRaggedKVCacheWrapper, "ragged"),
    (cascade.MultiLevelCascadeAttentionWrapper, "cascade"),
)


def _kind(wrapper):
    for cls, kind in _KINDS:
        if isinstance(wrapper, cls):
            return kind
    raise TypeError(f"plan_handle: {type(wrapper).__name__} is not a kiln batch or cascade "
                    "wrapper")


def _planned(wrapper, kind):
    """(o_dtype, lse) of the wrapper's current plan; RuntimeError before plan()."""
    inner = wrapper._batch_prefill_wrappers[-1] if kind == "cascade" else wrapper
    variant = inner.variant
    if variant is None:
        raise RuntimeError(f"{type(wrapper).__name__}: call plan() before plan_handle() / run")
    return _DTYPES[variant.out_dtype], bool(variant.lse)


def _forget(key, number):
    _handle_ids.pop(key, None)
    _handles.pop(number, None)


def plan_handle(wrapper):
    """The int that stands for `wrapper`'s current plan in torch.ops.kiln.*_run. Call it after
    plan(), outside torch.compile / graph capture; the same wrapper planned again with the same
    output dtype and LSE gives the same int (the compiled graph stays valid). The handle dies
    with the wrapper."""
    kind = _kind(wrapper)
    o_dtype, lse = _planned(wrapper, kind)
    key = (id(wrapper), kind, o_dtype, lse)
    number = _handle_ids.get(key)
    if number is not None and _handles[number].ref() is wrapper:
        return number
    number = _next_handle[0]
    _next_handle[0] += 1
    ref = weakref.ref(wrapper, lambda _r, key=key, number=number: _forget(key, number))
    _handles[number] = _Handle(ref, kind, o_dtype, lse)
    _handle_ids[key] = number
    return number


def _handle(number, kind, what):
    h = _handles.get(int(number))
    if h is None:
        raise ValueError(f"kiln.ops.{what}: {number} is not a live plan handle "
                         "(kiln.ops.plan_handle(wrapper) after plan(); the wrapper must be alive)")
    if h.kind != kind:
        raise ValueError(f"kiln.ops.{what}: handle {number} is a {h.kind} plan, not {kind}")
    return h


def _live_wrapper(number, kind, what):
    """The wrapper behind a handle, checked against what the graph assumed."""
    h = _handle(number, kind, what)
    wrapper = h.ref()
    if wrapper is None:
        raise ValueError(f"kiln.ops.{what}: the wrapper of handle {number} is gone")
    if _planned(wrapper, kind) != (h.o_dtype, h.lse):
        raise RuntimeError(
            f"kiln.ops.{what}: {type(wrapper).__name__} was planned again with another output "
            f"dtype or LSE setting than handle {number} assumes ({h.o_dtype}, lse={h.lse}); "
            "take a new kiln.ops.plan_handle(wrapper) (a compiled graph then recompiles)")
    return wrapper


# ---- eager calls ---------------------------------------------------------------------------


def _eager(what, fn, *args, **kwargs):
    """fn(*args, **kwargs); a failure inside a CUDA graph capture says what to do about it."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        if not torch.cuda.is_available() or not torch.cuda.is_current_stream_capturing():
            raise
        raise RuntimeError(
            f"kiln.ops.{what} failed inside a CUDA graph capture ({exc}). If this is the "
            "operator's first call for this variant, its kernel was loading inside the capture: "
            "run it once before capturing (kiln.ops.prepare(op, *args)), as torch.compile's "
            "reduce-overhead mode does") from exc


def prepare(op, *args, **kwargs):
    """Run `op` (a function of this module or a torch.ops.kiln operator) once, eagerly and
    outside any CUDA graph capture, so its kernel is loaded before a capture that calls it;
    returns op's result. Raises RuntimeError when called inside a capture."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("kiln.ops.prepare: called inside a CUDA graph capture; call it before")
    return op(*args, **kwargs)


# ---- the operators ---------------------------------------------------------------------------
# Each family is two operators: NAME returns o, NAME_lse returns (o, lse); the schemas share
# their arguments.

_DECODE_ARGS = ("Tensor q, Tensor k, Tensor v, str kv_layout, str pos_encoding_mode, "
                "int window_left, float? logits_soft_cap, float? sm_scale, float? q_scale, "
                "float? k_scale, float? v_scale, float? rope_scale, float? rope_theta, "
                "Tensor? alibi_slopes, str lse_base")
_PREFILL_ARGS = ("Tensor q, Tensor k, Tensor v, Tensor? custom_mask, "
                 "Tensor? packed_custom_mask, bool causal, str kv_layout, str pos_encoding_mode, "
                 "float? sm_scale, int window_left, float? logits_soft_cap, ScalarType? o_dtype, "
                 "float? rope_scale, float? rope_theta, Tensor? alibi_slopes, str lse_base")
_RUN_ARGS = ("int handle, Tensor q, Tensor k, Tensor? v, float? q_scale, float? k_scale, "
             "float? v_scale")


def _define(name, args, impl, fake, lse_variant=True):
    """Define kiln::name (-> Tensor) and, with lse_variant, kiln::name_lse (-> (Tensor, Tensor)).
    impl(return_lse, *args) runs on CUDA; fake(return_lse, *args) gives the meta outputs."""
    pairs = [(name, False)] + ([(name + "_lse", True)] if lse_variant else [])
    for op, lse in pairs:
        _lib.define(f"{op}({args}) -> {'(Tensor, Tensor)' if lse else 'Tensor'}")
        qualified = f"{_NS}::{op}"
        torch.library.register_kernel(qualified, "cuda", _bind(impl, lse), lib=_lib)
        torch.library.register_fake(qualified, _bind(fake, lse), lib=_lib)


def _bind(fn, return_lse):
    def bound(*args):
        return fn(return_lse, *args)

    return bound


def _outputs(return_lse, o_shape, o_dtype, device):
    """Fake outputs: o, and with return_lse an lse of o_shape[:-1], float32."""
    o = torch.empty(o_shape, dtype=o_dtype, device=device)
    if not return_lse:
        return o
    return o, torch.empty(o_shape[:-1], dtype=torch.float32, device=device)


def _check_dims(what, t, ndim, doc):
    if t.dim() != ndim:
        raise ValueError(f"kiln.ops.{what}: q must be {doc}, got shape {tuple(t.shape)}")


def _decode_impl(return_lse, q, k, v, kv_layout, pos_encoding_mode, window_left,
                 logits_soft_cap, sm_scale, q_scale, k_scale, v_scale, rope_scale, rope_theta,
                 alibi_slopes, lse_base):
    return _eager("single_decode", attention.single_decode_with_kv_cache, q, k, v,
                  kv_layout=kv_layout, pos_encoding_mode=pos_encoding_mode, q_scale=q_scale,
                  k_scale=k_scale, v_scale=v_scale, window_left=window_left,
                  logits_soft_cap=logits_soft_cap, sm_scale=sm_scale, rope_scale=rope_scale,
                  rope_theta=rope_theta, return_lse=return_lse, alibi_slopes=alibi_slopes,
                  lse_base=lse_base)


def _decode_fake(return_lse, q, *rest):
    _check_dims("single_decode", q, 2, "[H, D]")
    return _outputs(return_lse, q.shape, q.dtype, q.device)


def _prefill_impl(return_lse, q, k, v, custom_mask, packed_custom_mask, causal, kv_layout,
                  pos_encoding_mode, sm_scale, window_left, logits_soft_cap, o_dtype,
                  rope_scale, rope_theta, alibi_slopes, lse_base):
    return _eager("single_prefill", attention.single_prefill_with_kv_cache, q, k, v,
                  o_dtype=o_dtype, custom_mask=custom_mask,
                  packed_custom_mask=packed_custom_mask, causal=causal, kv_layout=kv_layout,
                  pos_encoding_mode=pos_encoding_mode, sm_scale=sm_scale,
                  window_left=window_left, logits_soft_cap=logits_soft_cap,
                  rope_scale=rope_scale, rope_theta=rope_theta, return_lse=return_lse,
                  alibi_slopes=alibi_slopes, lse_base=lse_base)


def _prefill_fake(return_lse, q, k, v, custom_mask, packed_custom_mask, causal, kv_layout,
                  pos_encoding_mode, sm_scale, window_left, logits_soft_cap, o_dtype, *rest):
    _check_dims("single_prefill", q, 3, "[L_Q, H, D]")
    return _outputs(return_lse, q.shape, o_dtype or q.dtype, q.device)


def _run_impl(kind, what):
    def impl(return_lse, handle, q, k, v, q_scale, k_scale, v_scale):
        wrapper = _live_wrapper(handle, kind, what)
        if kind == "ragged":
            return _eager(what, wrapper.run, q, k, v, q_scale=q_scale, k_scale=k_scale,
                          v_scale=v_scale, return_lse=return_lse)
        kv = k if v is None else (k, v)
        return _eager(what, wrapper.run, q, kv, q_scale=q_scale, k_scale=k_scale,
                      v_scale=v_scale, return_lse=return_lse)

    return impl


def _run_fake(kind, what):
    def fake(return_lse, handle, q, *rest):
        h = _handle(handle, kind, what)
        _check_dims(what, q, 3, "[rows, H, D]")
        if return_lse and not h.lse:
            raise ValueError(f"kiln.ops.{what}: return_lse, but the plan has lse=False")
        return _outputs(return_lse, q.shape, h.o_dtype, q.device)

    return fake


_define("single_decode", _DECODE_ARGS, _decode_impl, _decode_fake)
_define("single_prefill", _PREFILL_ARGS, _prefill_impl, _prefill_fake)
for _kind_name, _op in (("decode", "batch_decode_run"), ("paged", "batch_prefill_paged_run"),
                        ("ragged", "batch_prefill_ragged_run")):
    _define(_op, _RUN_ARGS, _run_impl(_kind_name, _op), _run_fake(_kind_name, _op))


def _cascade_impl(return_lse, handle, q, k, v):
    wrapper = _live_wrapper(handle, "cascade", "cascade_run")
    return _eager("cascade_run", wrapper.run, q, k if v is None else (k, v))


def _cascade_fake(return_lse, handle, q, k, v):
    return _run_fake("cascade", "cascade_run")(False, handle, q)


_define("cascade_run", "int handle, Tensor q, Tensor k, Tensor? v", _cascade_impl,
        _cascade_fake, lse_variant=False)


def _merge_state_impl(return_lse, v_a, s_a, v_b, s_b, lse_base):
    return _eager("merge_state", cascade.merge_state, v_a, s_a, v_b, s_b, lse_base=lse_base)


def _merge_state_fake(return_lse, v_a, s_a, v_b, s_b, lse_base):
    return _outputs(True, v_a.shape, v_a.dtype, v_a.device)


def _merge_states_impl(return_lse, v, s, lse_base):
    return _eager("merge_states", cascade.merge_states, v, s, lse_base=lse_base)


def _merge_states_fake(return_lse, v, s, lse_base):
    if v.dim() != 4:
        raise ValueError(f"kiln.ops.merge_states: v must be [n, S, H, D], got {tuple(v.shape)}")
    return _outputs(True, (v.shape[0], v.shape[2], v.shape[3]), v.dtype, v.device)


for _op, _args, _impl, _fake in (
        ("merge_state", "Tensor v_a, Tensor s_a, Tensor v_b, Tensor s_b, str lse_base",
         _merge_state_impl, _merge_state_fake),
        ("merge_states", "Tensor v, Tensor s, str lse_base", _merge_states_impl,
         _merge_states_fake)):
    _lib.define(f"{_op}({_args}) -> (Tensor, Tensor)")
    torch.library.register_kernel(f"{_NS}::{_op}", "cuda", _bind(_impl, True), lib=_lib)
    torch.library.register_fake(f"{_NS}::{_op}", _bind(_fake, True), lib=_lib)

_lib.define("merge_state_in_place(Tensor(a!) v, Tensor(b!) s, Tensor v_other, Tensor s_other, "
            "Tensor? mask, str lse_base) -> ()")


@torch.library.register_kernel(f"{_NS}::merge_state_in_place", "cuda", lib=_lib)
def _merge_in_place_impl(v, s, v_other, s_other, mask, lse_base):
    _eager("merge_state_in_place", cascade.merge_state_in_place, v, s, v_other, s_other, mask,
           lse_base=lse_base)


@torch.library.register_fake(f"{_NS}::merge_state_in_place", lib=_lib)
def _merge_in_place_fake(v, s, v_other, s_other, mask, lse_base):
    return None


# ---- FlashInfer-shaped entry points over the operators ---------------------------------------


def _scalar(value, name):
    """A scale argument as a float (None stays None): operators take no tensor scales."""
    if value is None or isinstance(value, (int, float)):
        return value
    raise TypeError(f"kiln.ops: {name} must be a float or None here (a tensor scale would be "
                    "read on the host, a synchronisation inside the graph)")


def _op(name, return_lse):
    return getattr(torch.ops.kiln, name + "_lse" if return_lse else name)


def single_decode_with_kv_cache(q, k, v, kv_layout="NHD", pos_encoding_mode="NONE",
                                use_tensor_cores=False, q_scale=None, k_scale=None,
                                v_scale=None, window_left=-1, logits_soft_cap=None,
                                sm_scale=None, rope_scale=None, rope_theta=None,
                                return_lse=False, *, alibi_slopes=None, lse_base="2"):
    """kiln.single_decode_with_kv_cache through torch.ops.kiln.single_decode(_lse): the same
    arguments (scales as floats); use_tensor_cores is ignored."""
    return _op("single_decode", return_lse)(
        q, k, v, kv_layout, pos_encoding_mode, window_left, _scalar(logits_soft_cap, "cap"),
        _scalar(sm_scale, "sm_scale"), _scalar(q_scale, "q_scale"), _scalar(k_scale, "k_scale"),
        _scalar(v_scale, "v_scale"), rope_scale, rope_theta, alibi_slopes, lse_base)


def single_prefill_with_kv_cache(q, k, v, scale_q=None, scale_k=None, scale_v=None,
                                 o_dtype=None, custom_mask=None, packed_custom_mask=None,
                                 causal=False, kv_layout="NHD", pos_encoding_mode="NONE",
                                 use_fp16_qk_reduction=False, sm_scale=None, window_left=-1,
                                 logits_soft_cap=None, rope_scale=None, rope_theta=None,
                                 backend="auto", return_lse=False, *, alibi_slopes=None,
                                 lse_base="2"):
    """kiln.single_prefill_with_kv_cache through torch.ops.kiln.single_prefill(_lse).
    use_fp16_qk_reduction and backend are ignored; fp8 scale_q / scale_k / scale_v raise
    NotImplementedError as the eager function does."""
    if scale_q is not None or scale_k is not None or scale_v is not None:
        raise NotImplementedError("kiln has no fp8 inputs yet (scale_q / scale_k / scale_v)")
    return _op("single_prefill", return_lse)(
        q, k, v, custom_mask, packed_custom_mask, causal, kv_layout, pos_encoding_mode,
        _scalar(sm_scale, "sm_scale"), window_left, _scalar(logits_soft_cap, "cap"), o_dtype,
        rope_scale, rope_theta, alibi_slopes, lse_base)


def single_prefill_with_kv_cache_return_lse(*args, **kwargs):
    """single_prefill_with_kv_cache(..., return_lse=True)."""
    kwargs["return_lse"] = True
    return single_prefill_with_kv_cache(*args, **kwargs)


def _number(handle, what):
    if isinstance(handle, int):
        return handle
    if torch.compiler.is_compiling():
        raise TypeError(f"kiln.ops.{what}: inside torch.compile pass an int handle "
                        "(kiln.ops.plan_handle(wrapper), taken after plan()), not the wrapper")
    return plan_handle(handle)


def _kv_pair(paged_kv_cache):
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise ValueError("paged_kv_cache as a tuple must be (k_cache, v_cache)")
        return paged_kv_cache[0], paged_kv_cache[1]
    return paged_kv_cache, None


def batch_decode_run(handle, q, paged_kv_cache, *, q_scale=None, k_scale=None, v_scale=None,
                     return_lse=False):
    """BatchDecodeWithPagedKVCacheWrapper.run through torch.ops.kiln.batch_decode_run(_lse).
    handle: plan_handle(wrapper) (a wrapper is accepted outside torch.compile)."""
    k, v = _kv_pair(paged_kv_cache)
    return _op("batch_decode_run", return_lse)(
        _number(handle, "batch_decode_run"), q, k, v, _scalar(q_scale, "q_scale"),
        _scalar(k_scale, "k_scale"), _scalar(v_scale, "v_scale"))


def batch_prefill_paged_run(handle, q, paged_kv_cache, *, q_scale=None, k_scale=None,
                            v_scale=None, return_lse=False):
    """BatchPrefillWithPagedKVCacheWrapper.run through torch.ops.kiln.batch_prefill_paged_run."""
    k, v = _kv_pair(paged_kv_cache)
    return _op("batch_prefill_paged_run", return_lse)(
        _number(handle, "batch_prefill_paged_run"), q, k, v, _scalar(q_scale, "q_scale"),
        _scalar(k_scale, "k_scale"), _scalar(v_scale, "v_scale"))


def batch_prefill_ragged_run(handle, q, k, v, *, q_scale=None, k_scale=None, v_scale=None,
                             return_lse=False):
    """BatchPrefillWithRaggedKVCacheWrapper.run through torch.ops.kiln.batch_prefill_ragged_run."""
    return _op("batch_prefill_ragged_run", return_lse)(
        _number(handle, "batch_prefill_ragged_run"), q, k, v, _scalar(q_scale, "q_scale"),
        _scalar(k_scale, "k_scale"), _scalar(v_scale, "v_scale"))


def cascade_run(handle, q, paged_kv_cache):
    """MultiLevelCascadeAttentionWrapper.run through torch.ops.kiln.cascade_run."""
    k, v = _kv_pair(paged_kv_cache)
    return torch.ops.kiln.cascade_run(_number(handle, "cascade_run"), q, k, v)


def merge_state(v_a, s_a, v_b, s_b, *, lse_base="2"):
    """kiln.merge_state through torch.ops.kiln.merge_state (default context)."""
    return torch.ops.kiln.merge_state(v_a, s_a, v_b, s_b, lse_base)


def merge_state_in_place(v, s, v_other, s_other, mask=None, *, lse_base="2"):
    """kiln.merge_state_in_place through torch.ops.kiln.merge_state_in_place (mutates v, s)."""
    torch.ops.kiln.merge_state_in_place(v, s, v_other, s_other, mask, lse_base)


def merge_states(v, s, *, lse_base="2"):
    """kiln.merge_states through torch.ops.kiln.merge_states (default context)."""
    return torch.ops.kiln.merge_states(v, s, lse_base)
