/*
 * merge.c — the public softmax-state merges (kiln_merge_state, kiln_merge_state_in_place,
 * kiln_merge_states) of an op=merge kernel: argument checks, the merge parameter block and one
 * cuLaunchKernel on the caller's stream (grid rows x heads, D threads). The batch planner's
 * own split merge is launched by kiln_plan_run (batch.c), not here.
 *
 * A state is (v [n, H, D], lse [n, H] float): merge_state writes the merge of a and b into
 * out; merge_state_in_place merges b into a where mask (or every row) says; merge_states
 * merges the S states of v_all [n, S, H, D], lse_all [n, S, H] into out.
 */
#include <string.h>

#include "params.h"
#include "runtime.h"

static kiln_status merge_launch(kiln_kernel *k, const kiln_merge_args *a, int which, void *stream)
{
    static const char *const names[3] = {"merge_state", "merge_state_in_place", "merge_states"};
    const char *what = names[which];
    kiln__err e = {{0}};
    if (!k || !a)
        return kiln__fail(kiln__tls_err(), KILN_STATUS_INVALID_ARGUMENT, "%s: NULL kernel or args",
                          what);
    if (k->v.op != KILN_OP_MERGE || !k->loaded)
        return kiln__ctx_error(k->ctx,
                               kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT,
                                          "%s: kernel %s must be a loaded op=merge kernel", what,
                                          k->spec),
                               &e);
    const int D = k->v.head_dim;
    if (a->rows < 0 || a->num_heads < 1 || (which == 2 && a->num_states < 1))
        return kiln__ctx_error(k->ctx,
                               kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT,
                                          "%s %s: rows=%d must be >= 0, num_heads=%d >= 1%s", what,
                                          k->spec, a->rows, a->num_heads,
                                          which == 2 ? ", num_states >= 1" : ""),
                               &e);
    int missing;
    if (which == 0) missing = !a->v_a || !a->lse_a || !a->v_b || !a->lse_b || !a->v_out;
    else if (which == 1) missing = !a->v_a || !a->lse_a || !a->v_b || !a->lse_b;
    else missing = !a->v_all || !a->lse_all || !a->v_out;
    if (missing)
        return kiln__ctx_error(k->ctx,
                               kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT,
                                          "%s %s: %s must be non-zero", what, k->spec,
                                          which == 0   ? "v_a, lse_a, v_b, lse_b, v_out"
                                          : which == 1 ? "v_a, lse_a, v_b, lse_b"
                                                       : "v_all, lse_all, v_out"),
                               &e);
    if ((a->v_a | a->v_b | a->v_out | a->v_all) % 2 ||
        (a->lse_a | a->lse_b | a->lse_out | a->lse_all) % 4)
        return kiln__ctx_error(k->ctx,
                               kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT,
                                          "%s %s: v tensors must be 2-byte and lse 4-byte aligned",
                                          what, k->spec),
                               &e);
    if (a->rows == 0) return KILN_STATUS_OK;
    kiln_merge_params p;
    memset(&p, 0, sizeof p);
    p.v_a = a->v_a;
    p.lse_a = a->lse_a;
    p.v_b = a->v_b;
    p.lse_b = a->lse_b;
    p.v_out = a->v_out;
    p.lse_out = a->lse_out;
    p.mask = which == 1 ? a->mask : 0;
    p.v_all = a->v_all;
    p.lse_all = a->lse_all;
    p.v_stride_h = a->v_stride_h ? a->v_stride_h : D;
    p.v_stride_n = a->v_stride_n ? a->v_stride_n : (int64_t)a->num_heads * D;
    p.num_states = a->num_states;
    p.rows = a->rows;
    p.num_heads = a->num_heads;
    CUfunction fn = which == 0 ? k->fn_main : which == 1 ? k->fn_merge : k->fn_aux;
    void *args[] = {&p};
    kiln_status st = kiln__ctx_bind(k->ctx, &e);
    if (st) return kiln__ctx_error(k->ctx, st, &e);
    CUresult r = k->ctx->cu->cuLaunchKernel(fn, (unsigned)a->rows, (unsigned)a->num_heads, 1,
                                            (unsigned)D, 1, 1, 0, (CUstream)stream, args, NULL);
    if (r != CUDA_SUCCESS)
        return kiln__ctx_error(k->ctx, kiln__cu_fail(&e, r, "%s %s: launch", what, k->spec), &e);
    return KILN_STATUS_OK;
}

kiln_status kiln_merge_state(kiln_kernel *k, const kiln_merge_args *a, void *stream)
{
    return merge_launch(k, a, 0, stream);
}

kiln_status kiln_merge_state_in_place(kiln_kernel *k, const kiln_merge_args *a, void *stream)
{
    return merge_launch(k, a, 1, stream);
}

kiln_status kiln_merge_states(kiln_kernel *k, const kiln_merge_args *a, void *stream)
{
    return merge_launch(k, a, 2, stream);
}
