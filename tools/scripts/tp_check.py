"""tp_check.py — kiln under tensor parallelism on one host (issue 19): N processes, one per GPU,
started together against one kiln cache, each running the batch wrappers on its slice of the
heads; the slices gathered with NCCL must equal a one-GPU run of all heads, bit for bit.

    python3 tools/scripts/tp_check.py --nproc N [--cache DIR] [--strict] [--out FILE.json]

What each rank r of N does (torch.multiprocessing, one process per GPU, as torchrun starts an
engine's workers): binds GPU r, joins an NCCL group, draws the same batch from one seed (on the
CPU, so every rank sees the same numbers), and runs
  - a paged batch decode (B requests of odd lengths, page 16) with fixed_split_size, the
    batch-invariant split, and
  - a paged causal batch prefill (a few query rows a request over the same pages)
on its heads: query heads [r H / N, (r + 1) H / N) and KV heads [r H_KV / N, (r + 1) H_KV / N)
(a GQA group never straddles ranks). The outputs are all-gathered along the head axis. Rank 0
then runs both on all heads alone and compares: bitwise equal, or the check fails.

Compile counting: every rank counts the kernels it loaded that it compiled itself
(Kernel.info.from_cache == 0). With an empty cache the N ranks together must compile each
kernel exactly once (single flight across processes: the others wait and load it); with
--strict (KILN_STRICT=1: a cache miss is an error) a warm cache must serve every kernel. The
script prints one JSON line per run: ranks, kernels, compiles per rank, the time from process
start to the first output (cold or warm), and whether the gathered outputs matched.

NCCL's NVLink multicast stays as the machine sets it (KINDS.md of the device tool); nothing
here sets NCCL variables. Needs torch with CUDA and at least N GPUs; --nproc 1 runs the same
code on one GPU (the one-GPU half only).
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

H, H_KV, D, PAGE = 32, 8, 128, 16
LENS = [1, 17, 300, 4097, 0, 2500, 77, 1000]  # keys per request; one empty
QO = [1, 5, 3, 16, 0, 7, 1, 2]  # prefill rows per request (0 with no keys)
SPLIT_PAGES = 32  # fixed_split_size: the batch-invariant split, in pages


def batch(torch, seed):
    """The batch every rank draws: page pool, page ids, indptr, last_page_len, q (decode and
    prefill), on the CPU."""
    g = torch.Generator().manual_seed(seed)
    pages = [-(-n // PAGE) for n in LENS]
    total = sum(pages) + 3
    perm = torch.randperm(total, generator=g).tolist()
    indptr, ids, last = [0], [], []
    for n, p in zip(LENS, pages):
        ids += perm[len(ids):len(ids) + p]
        indptr.append(len(ids))
        last.append((n - 1) % PAGE + 1 if n else 0)
    k = torch.randn(total, PAGE, H_KV, D, generator=g).to(torch.bfloat16)
    v = torch.randn(total, PAGE, H_KV, D, generator=g).to(torch.bfloat16)
    q_dec = torch.randn(len(LENS), H, D, generator=g).to(torch.bfloat16)
    qo = [0]
    for n in QO:
        qo.append(qo[-1] + n)
    q_pre = torch.randn(qo[-1], H, D, generator=g).to(torch.bfloat16)
    return dict(k=k, v=v, ids=ids, indptr=indptr, last=last, qo=qo, q_dec=q_dec, q_pre=q_pre)


def run_heads(kiln, torch, b, device, h0, h1, kv0, kv1):
    """Decode and prefill on query heads [h0, h1) and KV heads [kv0, kv1) on `device`; returns
    (decode o, prefill o, the kernels the wrappers loaded)."""
    dev = torch.device("cuda", device)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=dev)  # one workspace, shared
    k = b["k"][:, :, kv0:kv1].contiguous().to(dev)
    v = b["v"][:, :, kv0:kv1].contiguous().to(dev)
    ids = torch.tensor(b["ids"], dtype=torch.int32, device=dev)
    hq, hkv = h1 - h0, kv1 - kv0
    dec = kiln.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    dec.plan(b["indptr"], ids, b["last"], hq, hkv, D, PAGE, q_data_type=torch.bfloat16,
             fixed_split_size=SPLIT_PAGES)
    o_dec = dec.run(b["q_dec"][:, h0:h1].contiguous().to(dev), (k, v))
    pre = kiln.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    pre.plan(b["qo"], b["indptr"], ids, b["last"], hq, hkv, D, PAGE, causal=True,
             q_data_type=torch.bfloat16, fixed_split_size=SPLIT_PAGES)
    o_pre = pre.run(b["q_pre"][:, h0:h1].contiguous().to(dev), (k, v))
    torch.cuda.synchronize(dev)
    kernels = list(dec._kernels.values()) + list(pre._kernels.values())
    return o_dec, o_pre, kernels


def worker(rank, nproc, args, t_start, port, queue):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    import torch
    import torch.distributed as dist

    import kiln

    torch.cuda.set_device(rank)
    if nproc > 1:
        dist.init_process_group("nccl", rank=rank, world_size=nproc,
                                device_id=torch.device("cuda", rank))
    b = batch(torch, args.seed)
    hq, hkv = H // nproc, H_KV // nproc
    o_dec, o_pre, kernels = run_heads(kiln, torch, b, rank, rank * hq, (rank + 1) * hq,
                                      rank * hkv, (rank + 1) * hkv)
    first_output_s = time.time() - t_start
    compiled = sum(1 for k in kernels if not k.info.from_cache)
    if nproc > 1:
        parts_dec = [torch.empty_like(o_dec) for _ in range(nproc)]
        parts_pre = [torch.empty_like(o_pre) for _ in range(nproc)]
        dist.all_gather(parts_dec, o_dec)
        dist.all_gather(parts_pre, o_pre)
        o_dec, o_pre = torch.cat(parts_dec, dim=1), torch.cat(parts_pre, dim=1)
    result = dict(rank=rank, device=torch.cuda.get_device_name(rank), kernels=len(kernels),
                  compiled=compiled, first_output_s=round(first_output_s, 3))
    if rank == 0:
        ref_dec, ref_pre, _ = run_heads(kiln, torch, b, 0, 0, H, 0, H_KV)
        result["decode_bitwise"] = bool(torch.equal(o_dec, ref_dec))
        result["prefill_bitwise"] = bool(torch.equal(o_pre, ref_pre))
        result["decode_max_diff"] = float((o_dec.float() - ref_dec.float()).abs().max())
        result["prefill_max_diff"] = float((o_pre.float() - ref_pre.float()).abs().max())
    queue.put(result)
    if nproc > 1:
        dist.barrier()
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, required=True, help="processes, one per GPU")
    ap.add_argument("--cache", help="KILN_CACHE_DIR for every rank (default: as set)")
    ap.add_argument("--strict", action="store_true", help="KILN_STRICT=1: a miss is an error")
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--out", help="append the JSON line here too")
    args = ap.parse_args()
    if H % args.nproc or H_KV % args.nproc:
        ap.error(f"--nproc {args.nproc} must divide H={H} and H_KV={H_KV}")
    if args.cache:
        os.environ["KILN_CACHE_DIR"] = args.cache
    if args.strict:
        os.environ["KILN_STRICT"] = "1"
    import torch
    import torch.multiprocessing as mp

    if torch.cuda.device_count() < args.nproc:
        print(f"tp_check: {args.nproc} processes need {args.nproc} GPUs; "
              f"{torch.cuda.device_count()} visible", file=sys.stderr)
        sys.exit(2)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    t_start = time.time()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=worker, args=(r, args.nproc, args, t_start, port, queue))
             for r in range(args.nproc)]
    for p in procs:
        p.start()
    results = []
    for _ in procs:
        results.append(queue.get(timeout=600))
    for p in procs:
        p.join(timeout=60)
    failed = [p.exitcode for p in procs if p.exitcode != 0]
    results.sort(key=lambda r: r["rank"])
    r0 = results[0]
    summary = dict(nproc=args.nproc, strict=args.strict, cache=os.environ.get("KILN_CACHE_DIR"),
                   kernels=r0["kernels"], compiles_per_rank=[r["compiled"] for r in results],
                   compiles=sum(r["compiled"] for r in results),
                   first_output_s=max(r["first_output_s"] for r in results),
                   decode_bitwise=r0["decode_bitwise"], prefill_bitwise=r0["prefill_bitwise"],
                   decode_max_diff=r0["decode_max_diff"],
                   prefill_max_diff=r0["prefill_max_diff"], exit_codes=[p.exitcode for p in procs],
                   devices=[r["device"] for r in results])
    line = json.dumps(summary)
    print(line)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")
    ok = not failed and summary["decode_bitwise"] and summary["prefill_bitwise"]
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
