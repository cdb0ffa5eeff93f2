"""fi_reference.py — the float64 attention reference of the FlashInfer-surface tests
(test_sparse, test_prefix, test_graph): softmax over an explicit visibility matrix, written
from the definition, with FlashInfer's base-2 LSE. Not a test module (unittest collects
test*.py only)."""

import math

from _reference import RUN_BATCH_GPU as RUN_GPU
from _reference import WHY_BATCH as WHY  # noqa: F401 (for the test files)
from _reference import FakeBuffer, HAVE_TORCH, kiln, set_up_module, torch  # noqa: F401


def use_temp_cache():
    """Kernels compile into $KILN_TEST_CACHE when set, else a fresh temporary cache (call from
    setUpModule, before the first default context); nothing without a GPU to run on."""
    if RUN_GPU:
        set_up_module("kiln-py-fi-")


def attend(q, k, v, visible, sm_scale=None, softcap=None):
    """q [L_Q, H, D], k, v [L_KV, H_KV, D] (any float dtype), visible bool [L_Q, L_KV] or
    [H, L_Q, L_KV]. Returns (o [L_Q, H, D] float64, lse [L_Q, H] float64, base 2); a row that
    sees no key has o = 0 and lse = -inf."""
    L_Q, H, D = q.shape
    H_KV = k.shape[1]
    G = H // H_KV
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    qd, kd, vd = q.double(), k.double(), v.double()
    kd = kd.repeat_interleave(G, dim=1)  # [L_KV, H, D]
    vd = vd.repeat_interleave(G, dim=1)
    s = torch.einsum("qhd,khd->hqk", qd, kd) * scale  # [H, L_Q, L_KV]
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    vis = visible.to(device=s.device, dtype=torch.bool)
    if vis.dim() == 2:
        vis = vis.unsqueeze(0).expand(H, -1, -1)
    s = s.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [H, L_Q], natural log
    p = torch.exp(s - lse.unsqueeze(-1).clamp(min=-1e300))
    p = torch.nan_to_num(p, nan=0.0)
    o = torch.einsum("hqk,khd->qhd", p, vd)
    return o, (lse / math.log(2.0)).transpose(0, 1)


def check_close(tc, got, want, atol, rtol, what):
    """atol + rtol * |want|, printing the first mismatches; infinities must match exactly."""
    g, w = got.double().cpu(), want.double().cpu()
    tc.assertEqual(tuple(g.shape), tuple(w.shape), f"{what}: shape")
    inf = torch.isinf(w)
    tc.assertTrue(torch.equal(torch.isinf(g), inf) and torch.equal(g[inf], w[inf]),
                  f"{what}: -inf rows differ")
    fin = ~inf
    bad = (g[fin] - w[fin]).abs() > atol + rtol * w[fin].abs()
    if bad.any() or torch.isnan(g[fin]).any():
        idx = torch.nonzero(fin, as_tuple=False)[bad.nonzero(as_tuple=True)[0][:5]]
        rows = [f"{tuple(i.tolist())}: {g[tuple(i)].item():.6g} vs {w[tuple(i)].item():.6g}"
                for i in idx]
        tc.fail(f"{what}: {int(bad.sum())} mismatches (atol {atol}, rtol {rtol}); first "
                + "; ".join(rows))


def paged_cache(lens, P, H_KV, D, dtype, layout, seed, spare=3):
    """A random page pool holding requests of `lens` tokens in shuffled pages. Returns (k_pool,
    v_pool, indptr, indices, last_page_len, tokens) with tokens[b] = (k [len, H_KV, D],
    v [len, H_KV, D]) gathered back for the reference."""
    import random as _random

    rng = _random.Random(seed)
    pages = [-(-n // P) for n in lens]
    total = sum(pages) + spare
    perm = list(range(total))
    rng.shuffle(perm)
    shape = (total, P, H_KV, D) if layout == "NHD" else (total, H_KV, P, D)
    k_pool = torch.randn(shape, dtype=dtype, device="cuda")
    v_pool = torch.randn(shape, dtype=dtype, device="cuda")
    indptr, indices, last, tokens = [0], [], [], []
    for n, p in zip(lens, pages):
        ids = perm[len(indices):len(indices) + p]
        indices += ids
        indptr.append(len(indices))
        last.append((n - 1) % P + 1 if n else 0)
        got = []
        for pool in (k_pool, v_pool):
            t = pool[ids] if layout == "NHD" else pool[ids].transpose(1, 2)
            got.append(t.reshape(-1, H_KV, D)[:n])
        tokens.append(tuple(got))
    as_int = lambda x: torch.tensor(x, dtype=torch.int32, device="cuda")  # noqa: E731
    return k_pool, v_pool, as_int(indptr), as_int(indices), as_int(last), tokens
