/*
 * grid.c — the builtin variant grid shared by the compile test (test_core.c) and the GPU
 * tests (test_gpu.c). See grid.h.
 */
#include "grid.h"

int kt_builtin_grid(kiln_op op, kiln_variant *out)
{
    static const int dims[] = {64, 128, 256}, groups[] = {1, 4, 8};
    int n = 0;
    for (int di = 0; di < 3; di++)
        for (int gi = 0; gi < 3; gi++)
            for (int dt = 0; dt < 2; dt++)
                for (int mask = 0; mask < 2; mask++)
                    for (int win = 0; win < 2; win++)
                        for (int lg = 0; lg < 3; lg++, n++) {
                            kiln_variant *v = &out[n];
                            kiln_variant_default(v);
                            v->op = op;
                            v->head_dim = dims[di];
                            v->group = groups[gi];
                            v->q_dtype = v->kv_dtype = v->out_dtype =
                                dt ? KILN_DTYPE_BF16 : KILN_DTYPE_F16;
                            if (n % 5 == 3) v->out_dtype = dt ? KILN_DTYPE_F16 : KILN_DTYPE_BF16;
                            v->mask = mask ? KILN_MASK_CAUSAL : KILN_MASK_NONE;
                            v->window = win;
                            v->logits = (kiln_logits)lg;
                            v->layout = (n / 2) % 2 ? KILN_LAYOUT_HND : KILN_LAYOUT_NHD;
                            v->lse = n % 3 == 1;
                        }
    return n;
}
