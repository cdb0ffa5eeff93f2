/*
 * grid.h — the builtin variant grid the tests share: head dim {64,128,256} × group {1,4,8} ×
 * dtype {f16,bf16} × mask {none,causal} × window {0,1} × logits {none,softcap,alibi} for one op,
 * with layout, lse and a differing out dtype alternating through it (216 variants per op).
 */
#ifndef KILN_TEST_GRID_H
#define KILN_TEST_GRID_H

#include "kiln.h"

#define KT_GRID_MAX 216

/* Write the grid of `op` into out[KT_GRID_MAX]; returns the count. */
int kt_builtin_grid(kiln_op op, kiln_variant *out);

#endif /* KILN_TEST_GRID_H */
