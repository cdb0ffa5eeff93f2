/*
 * check_stubs.c — TEMPORARY fallbacks for the batch entry points declared in kiln.h while the
 * runtime that implements them is not on main yet. Built into $(BUILD)/lib/libkiln_stubs.a and
 * linked AFTER libkiln.a, so a real definition in the library always wins (the archive member
 * is only pulled for a symbol still undefined, and these are weak). Each returns
 * KILN_STATUS_UNSUPPORTED. Delete this file and its Makefile lines once the runtime lands.
 */
#include "kiln.h"
__attribute__((weak)) kiln_status kiln_plan_create(kiln_kernel *k, const kiln_plan_opts *o, kiln_plan **out) {
    (void)k;
    (void)o;
    *out = 0;
    return KILN_STATUS_UNSUPPORTED;
}
__attribute__((weak)) void kiln_plan_destroy(kiln_plan *p) { (void)p; }
__attribute__((weak)) kiln_status kiln_plan_workspace_size(const kiln_plan *p, int b, int q, size_t *n) {
    (void)p;
    (void)b;
    (void)q;
    *n = 0;
    return KILN_STATUS_UNSUPPORTED;
}
__attribute__((weak)) kiln_status kiln_batch_plan(kiln_plan *p, const kiln_batch_shape *s, kiln_devptr w,
                                                  size_t n, void *st) {
    (void)p;
    (void)s;
    (void)w;
    (void)n;
    (void)st;
    return KILN_STATUS_UNSUPPORTED;
}
__attribute__((weak)) kiln_status kiln_plan_describe(const kiln_plan *p, kiln_plan_info *o) {
    (void)p;
    (void)o;
    return KILN_STATUS_UNSUPPORTED;
}
__attribute__((weak)) kiln_status kiln_batch_run(kiln_plan *p, const kiln_batch_args *a, void *s) {
    (void)p;
    (void)a;
    (void)s;
    return KILN_STATUS_UNSUPPORTED;
}
__attribute__((weak)) kiln_status kiln_merge_state(kiln_kernel *k, const kiln_merge_args *a, void *s) {
    (void)k;
    (void)a;
    (void)s;
    return KILN_STATUS_UNSUPPORTED;
}
__attribute__((weak)) kiln_status kiln_merge_state_in_place(kiln_kernel *k, const kiln_merge_args *a,
                                                            void *s) {
    (void)k;
    (void)a;
    (void)s;
    return KILN_STATUS_UNSUPPORTED;
}
__attribute__((weak)) kiln_status kiln_merge_states(kiln_kernel *k, const kiln_merge_args *a, void *s) {
    (void)k;
    (void)a;
    (void)s;
    return KILN_STATUS_UNSUPPORTED;
}
