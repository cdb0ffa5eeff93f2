"""_reference.py — what the torch GPU tests (test_torch.py, test_batch_torch.py) share: the
import set-up, the module set-up (a cache of their own), the float64 attention reference with
its pieces (RoPE, page gathering, mask packing), the tolerances, and a TestCase base with fresh
seeded inputs, NaN poison and a tolerance check that prints the first mismatches.

Not a test module (no test_ prefix: `python3 -m unittest discover` does not collect it); the
test files import it by name, from their own directory. Imports without torch (HAVE_TORCH is
then False and the test files skip).

Shapes: L_Q query rows, L_KV keys, H query heads, H_KV kv heads, G = H / H_KV, D head dim.
"""

import math
import os
import random
import sys
import tempfile
import unittest

_SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
if os.environ.get("KILN_TEST_INSTALLED") != "1" and os.path.isdir(os.path.join(_SRC, "kiln")):
    sys.path.insert(0, _SRC)

import kiln  # noqa: E402  (the package under test: the tree's, or the installed one)

try:
    import torch
except ImportError:  # the test files skip
    torch = None

HAVE_TORCH = torch is not None
HAVE_GPU = HAVE_TORCH and torch.cuda.is_available()
# Test tables name dtypes by their spec spelling, so the test files import without torch.
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16} if HAVE_TORCH else {}

_tmp_cache = None


def have_batch_api():
    """Whether the loaded libkiln.so has the batch API (plans, batch runs, merges)."""
    try:
        return kiln._lib.has("kiln_plan_run")
    except kiln.KilnLibraryError:
        return False


RUN_BATCH_GPU = HAVE_GPU and have_batch_api()
WHY_BATCH = "needs torch, a CUDA GPU and a libkiln.so with the batch API"


class FakeBuffer:
    """What the wrappers read of a workspace before they need torch or a GPU."""

    device = None

    def __init__(self, nbytes=1 << 20):
        self.nbytes = nbytes

    def data_ptr(self):
        return 0x10000

    def numel(self):
        return self.nbytes

    def element_size(self):
        return 1


def set_up_module(prefix):
    """Kernels compile into $KILN_TEST_CACHE when set (reused across runs, like the C GPU
    tests), else into a fresh temporary cache named prefix...: never the user's default cache.
    The wrappers' default context reads KILN_CACHE_DIR when it is created (on the first call).
    The reference runs in float64, so TF32 matmuls are turned off all the same."""
    global _tmp_cache
    cache = os.environ.get("KILN_TEST_CACHE")
    if not cache:
        _tmp_cache = tempfile.TemporaryDirectory(prefix=prefix)
        cache = _tmp_cache.name
    os.environ["KILN_CACHE_DIR"] = cache
    torch.backends.cuda.matmul.allow_tf32 = False


def tear_down_module():
    """Remove the temporary cache set_up_module made (none when $KILN_TEST_CACHE was set)."""
    global _tmp_cache
    if _tmp_cache is not None:
        _tmp_cache.cleanup()
        _tmp_cache = None


# ---- the reference -------------------------------------------------------------------------


def rope(x, pos, scale=1.0, theta=1e4):
    """Llama RoPE of x [L, H, D] at positions pos [L], in x's dtype (float32 or float64): pairs
    (d, d + D/2), angle pos / scale * theta^(-2d/D)."""
    D = x.shape[-1]
    half = D // 2
    freq = theta ** (-2.0 * torch.arange(half, device=x.device, dtype=x.dtype) / D)
    ang = (pos.to(x.dtype) / scale)[:, None] * freq[None, :]  # [L, D/2]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def attention(q, k, v, *, layout="NHD", causal=False, window_left=-1, softcap=None, slopes=None,
              sm_scale=None, mask=None, rope_args=None):
    """Softmax attention of one request in float64, written out in torch: kiln's definition
    (docs/api.md), positions aligned bottom-right.

    q [L_Q, H, D]; k, v [L_KV, H_KV, D] (NHD) or [H_KV, L_KV, D] (HND), any dtype (upcast; fp8
    callers pass dequantised values). causal / window_left: key j is visible from row i when
    j <= i + L_KV - L_Q / j >= i + L_KV - L_Q - window_left. softcap: s = c * tanh(s / c).
    slopes [H]: ALiBi; with softcap too, s = c * tanh(s / c + ALiBi bias) (FlashInfer's order). mask [L_Q, L_KV] bool, True: visible. rope_args (scale, theta): llama
    RoPE on q and k first. Returns o [L_Q, H, D] and the natural-log lse [L_Q, H] (float64);
    a row that sees no key gives o = 0, lse = -inf."""
    if layout == "HND":
        k, v = k.transpose(0, 1), v.transpose(0, 1)
    L_Q, H, D = q.shape
    L_KV, H_KV = k.shape[0], k.shape[1]
    qf, kf, vf = q.double(), k.double(), v.double()
    off = L_KV - L_Q
    if rope_args is not None:
        qf = rope(qf, torch.arange(L_Q, device=q.device) + off, *rope_args)
        kf = rope(kf, torch.arange(L_KV, device=q.device), *rope_args)
    G = H // H_KV
    kf, vf = kf.repeat_interleave(G, dim=1), vf.repeat_interleave(G, dim=1)  # head h: kv h // G
    scale = (1.0 / math.sqrt(D)) if sm_scale is None else sm_scale
    s = torch.einsum("qhd,khd->hqk", qf, kf) * scale
    i = torch.arange(L_Q, device=q.device)[:, None]
    j = torch.arange(L_KV, device=q.device)[None, :]
    bias = None if slopes is None else slopes.double()[:, None, None] * (j - (i + off)).double()[None]
    if softcap and bias is not None:  # FlashInfer's order: the ALiBi bias inside the tanh
        s = softcap * torch.tanh(s / softcap + bias)
    elif softcap:
        s = softcap * torch.tanh(s / softcap)
    elif bias is not None:
        s = s + bias
    visible = torch.ones(L_Q, L_KV, dtype=torch.bool, device=q.device)
    if causal:
        visible &= j <= i + off
    if window_left is not None and window_left >= 0:
        visible &= j >= i + off - window_left
    if mask is not None:
        visible &= mask
    if L_KV == 0:
        return (torch.zeros(L_Q, H, D, dtype=torch.float64, device=q.device),
                torch.full((L_Q, H), float("-inf"), dtype=torch.float64, device=q.device))
    s = s.masked_fill(~visible[None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [H, L_Q]
    p = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)
    o = torch.einsum("hqk,khd->qhd", p, vf)
    return o, lse.transpose(0, 1).contiguous()


def reference_args(kw, H, device):
    """The attention() keywords that match the single-request wrappers' keywords kw (window_left,
    logits_soft_cap, sm_scale, alibi_slopes or pos_encoding_mode="ALIBI" with H heads)."""
    ref_kw = {}
    if kw.get("window_left", -1) >= 0:
        ref_kw["window_left"] = kw["window_left"]
    if kw.get("logits_soft_cap"):
        ref_kw["softcap"] = kw["logits_soft_cap"]
    if kw.get("sm_scale") is not None:
        ref_kw["sm_scale"] = kw["sm_scale"]
    if kw.get("alibi_slopes") is not None:
        ref_kw["slopes"] = kw["alibi_slopes"]
    elif kw.get("pos_encoding_mode") == "ALIBI":
        ref_kw["slopes"] = kiln.alibi_slopes(H, device)
    return ref_kw


def gather(pool, page_ids, last_len, layout):
    """The keys of one request from a page pool [pages, P, H_KV, D] (NHD) or
    [pages, H_KV, P, D] (HND): its pages in order, the last cut to last_len tokens."""
    if not page_ids:
        shape = pool.shape
        H_KV, D = (shape[2], shape[3]) if layout == "NHD" else (shape[1], shape[3])
        return pool.new_zeros((0, H_KV, D))
    pages = pool[torch.tensor(page_ids, device=pool.device, dtype=torch.long)]
    if layout == "HND":
        pages = pages.transpose(1, 2)  # [n, P, H_KV, D]
    flat = pages.reshape(-1, pages.shape[2], pages.shape[3])
    P = pages.shape[1]
    return flat[: (len(page_ids) - 1) * P + last_len]


def packbits_little(bits):
    """numpy.packbits(bits, bitorder="little") on bits' device: FlashInfer's packbits."""
    n = bits.numel()
    b = torch.cat([bits.reshape(-1).bool(), bits.new_zeros((-n) % 8, dtype=torch.bool)])
    w = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.int32, device=b.device)
    return (b.view(-1, 8).to(torch.int32) * w).sum(dim=1).to(torch.uint8)


def tolerance(dtype):
    """(atol, rtol) for outputs in dtype, as the C check harness has them, a little looser for
    normal-distributed inputs."""
    return (1.5e-2, 2e-2) if dtype == "bf16" else (2e-3, 5e-3)


# ---- the test case base --------------------------------------------------------------------


class GpuCase(unittest.TestCase):
    """Fresh random inputs per test (the seed, drawn from the system, is in every failure
    message), NaN poison for outputs, and assertClose."""

    def setUp(self):
        self.seed = random.SystemRandom().randrange(1 << 31)
        torch.manual_seed(self.seed)
        random.seed(self.seed)

    def rand(self, *shape, dtype="bf16"):
        """Standard normal values on the GPU, rounded to dtype ("f16" or "bf16")."""
        return torch.randn(*shape, device="cuda", dtype=torch.float32).to(DTYPES[dtype])

    def poison(self, *shape, dtype="bf16"):
        """Fill a block the caching allocator will likely hand to the next output with NaN."""
        t = torch.full(shape, float("nan"), device="cuda", dtype=DTYPES[dtype])
        del t

    def assertClose(self, got, ref, atol, rtol, what):
        """|got - ref| <= atol + rtol * |ref| everywhere (compared in float64), infinities of
        one sign agreeing; otherwise fail with the count, the largest error and the first five
        mismatches."""
        got, ref = got.double(), ref.double()
        self.assertEqual(tuple(got.shape), tuple(ref.shape), what)
        both_inf = torch.isinf(got) & torch.isinf(ref) & (torch.sign(got) == torch.sign(ref))
        err = (got - ref).abs()
        ok = (err <= atol + rtol * ref.abs()) | both_inf
        if bool(ok.all()):
            return
        bad = (~ok).nonzero()
        lines = [
            f"{what}: {bad.shape[0]} of {got.numel()} elements out of tolerance "
            f"(atol {atol}, rtol {rtol}, seed {self.seed}); "
            f"max err {torch.nan_to_num(err, nan=float('inf')).max().item():.4g}"
        ]
        for idx in bad[:5].tolist():
            t = tuple(idx)
            lines.append(f"  {what}{list(t)} = {got[t].item():.6g}, ref {ref[t].item():.6g}")
        self.fail("\n".join(lines))
