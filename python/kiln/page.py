"""page.py — FlashInfer's paged-KV utilities, in plain torch: get_seq_lens,
get_batch_indices_positions, append_paged_kv_cache.

A paged KV cache is a page pool, [pages, page_size, H_KV, D] ("NHD") or [pages, H_KV,
page_size, D] ("HND") for k and for v, given as a (k_cache, v_cache) tuple or one
[pages, 2, ...] tensor; request b owns pages kv_indices[kv_indptr[b] .. kv_indptr[b + 1]), the
last holding kv_last_page_len[b] tokens. Appending tokens is: batch index and position of each
new token (get_batch_indices_positions, from the ragged append_indptr and the sequence lengths
after the append), then a scatter into the pages (append_paged_kv_cache).

These are torch operations on the tensors' device (a searchsorted, a gather and an index_put
per cache), not fused kernels; none synchronises with the host. _get_range_buf is FlashInfer's
cached int32 arange (vLLM imports it from flashinfer.decode). The module also holds
_torch(), the lazy torch import of the FlashInfer-surface modules (sparse, prefix, graph,
quantization).
"""

from . import _check
from ._wrapper import _unpack_paged


def _torch():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - exercised only without torch
        raise ImportError("kiln's FlashInfer utilities need torch") from exc
    return torch


_range_bufs = {}  # (power of two, device) -> int32 arange, shared by every caller


def _get_range_buf(seq_len, device):
    """FlashInfer's _get_range_buf (flashinfer.utils, re-exported by flashinfer.decode):
    torch.arange(seq_len, dtype=int32) on `device`, a view of one cached arange whose length
    is the next power of two (callers must not write it)."""
    seq_len = _check.integer(seq_len, "_get_range_buf: seq_len", 0, _check.INT_MAX)
    torch = _torch()
    n = 1 << max(seq_len - 1, 0).bit_length()
    key = (n, str(torch.device(device)))
    buf = _range_bufs.get(key)
    if buf is None:
        buf = _range_bufs[key] = torch.arange(n, dtype=torch.int32, device=device)
    return buf[:seq_len]


def _tensor(torch, t, name, ndim=1):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if ndim == 1 and (t.dtype.is_floating_point or t.dtype == torch.bool):
        raise TypeError(f"{name} must hold integers, got {t.dtype}")
    return t


def get_seq_lens(kv_indptr, kv_last_page_len, page_size):
    """FlashInfer's get_seq_lens: the keys of each request,
    max(kv_indptr[b + 1] - kv_indptr[b] - 1, 0) * page_size + kv_last_page_len[b] (so a request
    with no pages counts kv_last_page_len[b], as in FlashInfer). Tensors on one device; the
    result has their promoted dtype."""
    page_size = _check.integer(page_size, "page_size", 1, _check.INT_MAX)
    torch = _torch()
    _tensor(torch, kv_indptr, "kv_indptr")
    _tensor(torch, kv_last_page_len, "kv_last_page_len")
    if kv_last_page_len.numel() != kv_indptr.numel() - 1:
        raise ValueError(f"kv_last_page_len has {kv_last_page_len.numel()} entries; kv_indptr "
                         f"says batch {kv_indptr.numel() - 1}")
    pages = kv_indptr[1:] - kv_indptr[:-1]
    return torch.clamp(pages - 1, min=0) * page_size + kv_last_page_len


def get_batch_indices_positions(append_indptr, seq_lens, nnz):
    """FlashInfer's get_batch_indices_positions: for each of the nnz entries of a ragged append
    (request b owns entries append_indptr[b] .. append_indptr[b + 1]), its request and its
    position in the request's sequence after the append, seq_lens[b] - (append_indptr[b + 1] -
    i) for entry i. Returns (batch_indices, positions), int32 [nnz] on append_indptr's device.
    Entries at or past append_indptr[-1] (an nnz padded past the appended tokens) are -1 in
    both, which append_paged_kv_cache skips (FlashInfer leaves them uninitialised)."""
    nnz = _check.integer(nnz, "nnz", 0, _check.INT_MAX)
    torch = _torch()
    _tensor(torch, append_indptr, "append_indptr")
    _tensor(torch, seq_lens, "seq_lens")
    batch = append_indptr.numel() - 1
    if batch < 0 or seq_lens.numel() != batch:
        raise ValueError(f"seq_lens has {seq_lens.numel()} entries; append_indptr has "
                         f"{append_indptr.numel()}, so batch + 1 with batch {max(batch, 0)}")
    dev = append_indptr.device
    if batch == 0:
        none = torch.full((nnz,), -1, dtype=torch.int32, device=dev)
        return none, none.clone()
    ends = append_indptr[1:].to(torch.int64)
    i = torch.arange(nnz, dtype=torch.int64, device=dev)
    b = torch.searchsorted(ends, i, right=True)  # the request whose range holds entry i
    valid = b < batch
    bc = b.clamp(max=batch - 1)
    pos = i + seq_lens.to(device=dev, dtype=torch.int64)[bc] - ends[bc]
    neg = torch.full_like(i, -1)
    return (torch.where(valid, b, neg).to(torch.int32),
            torch.where(valid, pos, neg).to(torch.int32))


def _layout(kv_layout):
    return _check.choice(kv_layout, "kv_layout", ("NHD", "HND"), fold="upper")


def _scatter(torch, cache, layout, page, slot, src, valid, j0):
    """cache[page[i], slot[i]] = src[i] for the valid rows. Invalid rows repeat row j0's write
    (the first valid row: the same index and the same value, so the result is the same in any
    order) or, when no row is valid, write back what row j0's slot already holds."""
    tokens = cache if layout == "NHD" else cache.permute(0, 2, 1, 3)  # [pages, P, H_KV, D]
    p0, s0 = page[j0], slot[j0]
    fill = torch.where(valid[j0], src[j0], tokens[p0, s0])
    rows = valid[:, None, None]
    tokens.index_put_((torch.where(valid, page, p0), torch.where(valid, slot, s0)),
                      torch.where(rows, src, fill))


def append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache,
                          kv_indices, kv_indptr, kv_last_page_len, kv_layout="NHD"):
    """FlashInfer's append_paged_kv_cache: write append_key[i] / append_value[i] ([nnz, H_KV, D],
    the cache's dtype) at position positions[i] of request batch_indices[i]: page
    kv_indices[kv_indptr[b] + pos // page_size], slot pos % page_size. The pages must already
    be allocated (kv_indices, kv_indptr and kv_last_page_len include the new tokens).
    paged_kv_cache as FlashInfer's: a (k_cache, v_cache) tuple or one [pages, 2, ...] tensor,
    layout kv_layout. kv_last_page_len is checked for shape and otherwise unused (as in
    FlashInfer's kernel). Rows with a negative batch index are skipped. In place; no
    synchronisation."""
    layout = _layout(kv_layout)
    torch = _torch()
    k_cache, v_cache = _unpack_paged(torch, paged_kv_cache, layout)
    _tensor(torch, append_key, "append_key", 3)
    _tensor(torch, append_value, "append_value", 3)
    for name, t in (("batch_indices", batch_indices), ("positions", positions),
                    ("kv_indices", kv_indices), ("kv_indptr", kv_indptr),
                    ("kv_last_page_len", kv_last_page_len)):
        _tensor(torch, t, name)
    nnz = append_key.size(0)
    h_dim = 2 if layout == "NHD" else 1
    heads, D = k_cache.size(h_dim), k_cache.size(3)
    for name, t, cache in (("append_key", append_key, k_cache),
                           ("append_value", append_value, v_cache)):
        if tuple(t.shape) != (nnz, heads, D):
            raise ValueError(f"{name} must be [nnz, H_KV, D] = [{nnz}, {heads}, {D}] (the "
                             f"cache's heads and head dim), got {tuple(t.shape)}")
        if t.dtype != cache.dtype or t.device != cache.device:
            raise ValueError(f"{name} is {t.dtype} on {t.device}; the cache is {cache.dtype} on "
                             f"{cache.device} (convert it first: kiln does not cast)")
    if batch_indices.numel() != nnz or positions.numel() != nnz:
        raise ValueError(f"batch_indices and positions need nnz = {nnz} entries (one per "
                         f"appended row), got {batch_indices.numel()} and {positions.numel()}")
    batch = kv_indptr.numel() - 1
    if kv_last_page_len.numel() != batch:
        raise ValueError(f"kv_last_page_len has {kv_last_page_len.numel()} entries; kv_indptr "
                         f"says batch {batch}")
    if nnz == 0:
        return
    if batch < 1 or kv_indices.numel() == 0:
        raise ValueError(f"{nnz} rows to append, but the cache table has no pages (batch "
                         f"{max(batch, 0)}, {kv_indices.numel()} page ids)")
    dev = k_cache.device
    page_size = k_cache.size(1 if layout == "NHD" else 2)
    b = batch_indices.to(device=dev, dtype=torch.int64)
    pos = positions.to(device=dev, dtype=torch.int64)
    valid = b >= 0
    j0 = torch.argmax(valid.to(torch.uint8))  # the first valid row (0 when there is none)
    indptr = kv_indptr.to(device=dev, dtype=torch.int64)
    at = indptr[b.clamp(0, batch - 1)] + pos.clamp(min=0) // page_size
    page = kv_indices.to(device=dev, dtype=torch.int64)[at.clamp(0, kv_indices.numel() - 1)]
    slot = pos.clamp(min=0) % page_size
    _scatter(torch, k_cache, layout, page, slot, append_key, valid, j0)
    _scatter(torch, v_cache, layout, page, slot, append_value, valid, j0)
