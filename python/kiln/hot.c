/*
 * hot.c — the batch wrappers' run() in C: the optional CPython extension _kiln_hot (stable ABI,
 * CPython 3.10 and later), built by `make` beside libkiln.so and loaded by kiln/_hot.py.
 *
 * A Runner is made once per plan() config (kiln/_hot.py: make_runner) and bound to each batch
 * plan() schedules under it (bind). Calling it,
 * runner(q, kv, out, lse, return_lse[, q_scale, k_scale, v_scale]), does what
 * _BatchWrapper._run does in Python for a run whose every check already passed once: it reads
 * each tensor's _meta key, finds the checked strides in the config's dicts (the same dicts the
 * Python path fills), allocates o (and lse) with torch.empty, sets the scales' parameters as
 * _Config.set_params does, patches the config's kiln_batch_args, holds the context as
 * Context._use does and calls kiln_plan_run with the GIL released. Whatever it does not find
 * there (a tensor seen for the first time, a misaligned pointer, a scale that is not a float
 * > 0, another current device) it leaves to the Python path: it returns NotImplemented before
 * any side effect but an allocation, and the Python path checks, raises or runs. So the two
 * paths cannot disagree on what is accepted: only the Python path ever accepts a new tensor.
 * plan() binds no Runner to a batch with nothing to attend to (the Python path writes o = 0).
 *
 * Why it exists: the Python layer of a decode run() was 8 µs of host time (tools/bench/
 * pyhost.py), against the 10 µs bar of the whole call (docs/perf.md, "Against the bar").
 */
/* CPython's slot tables hold functions as void *: this file builds without -Wpedantic. */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"

typedef kiln_status (*run_fn)(kiln_plan *, const kiln_batch_args *, void *);
typedef kiln_status (*schedule_fn)(kiln_plan *, const kiln_batch_shape *, kiln_devptr, size_t,
                                   kiln_devptr, size_t, void *);

typedef struct runner {
    PyObject ob_base;     /* PyObject_HEAD */
    PyObject *lock, *cv;  /* the context's _lock (an RLock) and _cv (a Condition on it) */
    PyObject *calls;      /* the context's _calls (a list: one entry a call in progress) */
    PyObject *ctx, *plan; /* kiln.Context (_handle, _closing), kiln.Plan (_handle) */
    PyObject *cfg;        /* the plan's _Config (scaled: the args hold a run's scales) */
    PyObject *seen_q, *seen_kv, *seen_out, *seen_lse, *out_info; /* cfg's checked tensors */
    PyObject *empty;                                             /* torch.empty */
    PyObject *empty_like; /* (torch.empty_like, torch.Tensor) where o's dtype is q's; else None */
    PyObject *o_kw, *lse_kw;                   /* torch.empty's keywords for o and for lse */
    PyObject *get_device, *get_stream, *index; /* torch's current device / raw stream */
    PyObject *fail;        /* fail(status, context handle): raises the status's KilnError */
    kiln_batch_args *args; /* the config's, which cfg keeps alive */
    run_fn fn;             /* kiln_plan_run */
    double sm_scale;       /* the config's (the scales multiply it) */
    long long total_qo;    /* the plan's query rows */
    long long total_kv;    /* ragged: the rows k and v need; paged: -1 */
    unsigned long long lse_scratch; /* where an LSE nobody asked for goes (0: lse=0 kernel) */
    int bound;                      /* bind() gave it a batch */
    int H, D, graph, has_lse, fp8;
    /* the decode plan()'s fast path (replan), set by arm() after a plan() of this config and
     * cleared by bind(): the plan's scalar arguments, its _State, what the index arrays must
     * be, the buffers the plan used (they must still hold the batch) and the schedule call */
    PyObject *scalars, *state;      /* the plan()'s scalar arguments (a tuple), its _State */
    PyObject *device, *cpu, *int32; /* the wrapper's torch.device, torch.device("cpu"), int32 */
    PyObject *tensor;               /* torch.Tensor */
    schedule_fn schedule;           /* kiln_plan_schedule_scratch */
    unsigned long long sched, sched_bytes, scratch, scratch_bytes;
    long long sched_batch, sched_qo, lse_cap; /* what the schedule buffer and LSE scratch hold */
    int prefill, paged;      /* the plan takes qo_indptr; page ids and last_page_len */
    int few_group, q_tokens; /* few_tokens' group (0: fixed by the caller) and its choice */
    int armed;
} runner;

static PyObject *s_shape, *s_stride, *s_dtype, *s_device, *s_data_ptr, *s_acquire, *s_release,
    *s_notify_all, *s_handle, *s_closing, *s_scaled, *s_is_cpu, *s_typecode, *s_buffer_info,
    *s_batch, *s_total_qo, *s_total_kv, *s_kv_indptr, *s_qo_indptr, *s_last, *s_indices,
    *s_forwarded;

/* ---- helpers --------------------------------------------------------------------------------- */

/* NULL with the error cleared when it says "not a tensor" (the Python path then names the
 * argument); NULL with the error kept otherwise. */
static int not_a_tensor(void)
{
    if (PyErr_ExceptionMatches(PyExc_AttributeError) || PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        return 1;
    }
    return 0;
}

/* _wrapper._meta(t): (type(t), t.shape, t.stride(), t.dtype, t.device), a new reference. */
static PyObject *meta(PyObject *t)
{
    PyObject *type = PyObject_Type(t);
    PyObject *shape = PyObject_GetAttr(t, s_shape);
    PyObject *stride = shape ? PyObject_CallMethodObjArgs(t, s_stride, NULL) : NULL;
    PyObject *dtype = stride ? PyObject_GetAttr(t, s_dtype) : NULL;
    PyObject *device = dtype ? PyObject_GetAttr(t, s_device) : NULL;
    PyObject *key = device ? PyTuple_Pack(5, type, shape, stride, dtype, device) : NULL;
    Py_XDECREF(type);
    Py_XDECREF(shape);
    Py_XDECREF(stride);
    Py_XDECREF(dtype);
    Py_XDECREF(device);
    return key;
}

/* t.data_ptr() into *p: 1, or 0 with a Python error set. */
static int data_ptr(PyObject *t, unsigned long long *p)
{
    PyObject *r = PyObject_CallMethodObjArgs(t, s_data_ptr, NULL);
    if (!r) return 0;
    *p = PyLong_AsUnsignedLongLong(r);
    Py_DECREF(r);
    return !(*p == (unsigned long long)-1 && PyErr_Occurred());
}

/* seen[key], a new reference (the call holds it: torch.empty, the device queries and the
 * context's lock run Python code, which may empty a dict), or NULL, without an error when it
 * is missing. */
static PyObject *lookup(PyObject *seen, PyObject *key)
{
    PyObject *v = key ? PyDict_GetItemWithError(seen, key) : NULL;
    Py_XINCREF(v);
    return v;
}

/* seen[_meta(t)] into *info (a new reference): 1 found, 0 not (t is new, or not a tensor: the
 * Python path takes the call), -1 an error. */
static int seen_entry(PyObject *seen, PyObject *t, PyObject **info)
{
    PyObject *key = meta(t);
    if (!key) return not_a_tensor() ? 0 : -1;
    *info = lookup(seen, key);
    Py_DECREF(key);
    if (!*info) return PyErr_Occurred() ? -1 : 0;
    return 1;
}

static long long item(PyObject *tuple, Py_ssize_t i)
{
    return PyLong_AsLongLong(PyTuple_GetItem(tuple, i));
}

/* A count-out of the context's _calls (a pop) and, where close() has begun and no call is left,
 * close() woken under its condition's lock; keeping any error already set. */
static void count_out(runner *r)
{
    PyObject *exc_type, *exc, *tb;
    PyErr_Fetch(&exc_type, &exc, &tb);
    const Py_ssize_t n = PyList_Size(r->calls);
    if (n > 0 && PyList_SetSlice(r->calls, n - 1, n, NULL) == 0 && PyList_Size(r->calls) == 0) {
        PyObject *closing = PyObject_GetAttr(r->ctx, s_closing);
        if (closing && PyObject_IsTrue(closing) == 1) {
            PyObject *ok = PyObject_CallMethodObjArgs(r->lock, s_acquire, NULL);
            if (ok) {
                Py_DECREF(ok);
                Py_XDECREF(PyObject_CallMethodObjArgs(r->cv, s_notify_all, NULL));
                Py_XDECREF(PyObject_CallMethodObjArgs(r->lock, s_release, NULL));
            }
        }
        Py_XDECREF(closing);
    }
    PyErr_Clear(); /* a failure to count out is not the caller's error (there is none here) */
    PyErr_Restore(exc_type, exc, tb);
}

/* The hold of Context._use (core._Hold) without its per-thread count, which exists so that a
 * close() called from inside a call on the same thread raises: no Python code runs inside this
 * call. Counted in on the context's _calls list (an append, then _handle and _closing read:
 * core._Hold says why no lock is needed) under the GIL. 1: held; 0: the context is closed or
 * closing (counted out again; the Python path raises); -1: an error. */
static int hold(runner *r, PyObject **ctx_handle)
{
    if (PyList_Append(r->calls, Py_None)) return -1;
    PyObject *handle = PyObject_GetAttr(r->ctx, s_handle);
    PyObject *closing = handle ? PyObject_GetAttr(r->ctx, s_closing) : NULL;
    const int shut = !closing ? -1 : handle == Py_None ? 1 : PyObject_IsTrue(closing);
    Py_XDECREF(closing);
    if (shut == 0) {
        *ctx_handle = handle;
        return 1;
    }
    Py_XDECREF(handle);
    count_out(r);
    return shut > 0 ? 0 : -1;
}

/* The end of a hold. */
static void unhold(runner *r, PyObject *ctx_handle)
{
    Py_DECREF(ctx_handle);
    count_out(r);
}

/* fn(plan, a, stream) with the GIL released, as ctypes calls it. */
static kiln_status run_unlocked(run_fn fn, kiln_plan *plan, const kiln_batch_args *a, void *stream)
{
    PyThreadState *ts = PyEval_SaveThread();
    const kiln_status st = fn(plan, a, stream);
    PyEval_RestoreThread(ts);
    return st;
}

/* What a call of run() or replan() does before its C call: the stream torch says is current,
 * a hold on the context and the plan's handle. 1: *stream, *ctx_handle (for unhold) and *plan
 * set; 0: the context is closed or the plan destroyed (the Python path raises), nothing held;
 * -1: an error is set, nothing held. */
static int enter(runner *r, void **stream, PyObject **ctx_handle, kiln_plan **plan)
{
    PyObject *s = PyObject_CallFunctionObjArgs(r->get_stream, r->index, NULL);
    if (!s) return -1;
    *stream = PyLong_AsVoidPtr(s);
    Py_DECREF(s);
    if (PyErr_Occurred()) return -1;
    const int held = hold(r, ctx_handle);
    if (held <= 0) return held;
    PyObject *ph = PyObject_GetAttr(r->plan, s_handle);
    const int live = ph && ph != Py_None;
    if (live) *plan = PyLong_AsVoidPtr(ph);
    Py_XDECREF(ph);
    if (live && !PyErr_Occurred()) return 1;
    unhold(r, *ctx_handle);
    *ctx_handle = NULL;
    return PyErr_Occurred() ? -1 : 0;
}

/* torch.empty(a, b[, c], **kw): the sizes as arguments of their own, which torch parses in
 * three quarters of the time of one shape tuple. */
static PyObject *empty(runner *r, PyObject *kw, long long a, long long b, long long c, int n)
{
    PyObject *sizes = n == 3 ? Py_BuildValue("(LLL)", a, b, c) : Py_BuildValue("(LL)", a, b);
    if (!sizes) return NULL;
    PyObject *t = PyObject_Call(r->empty, sizes, kw);
    Py_DECREF(sizes);
    return t;
}

/* ---- the call -------------------------------------------------------------------------------- */

#define FALL_BACK()                                                                                \
    do {                                                                                           \
        res = Py_NewRef(Py_NotImplemented);                                                        \
        goto done;                                                                                 \
    } while (0)

/* A lookup's result: on to the next step (1), to the Python path (0), or out with the error. */
#define FOUND(x)                                                                                   \
    do {                                                                                           \
        const int found_ = (x);                                                                    \
        if (found_ < 0) goto done;                                                                 \
        if (!found_) FALL_BACK();                                                                  \
    } while (0)

/* k, v pointers and the seen_kv entry of kv (a (k, v) tuple, or one paged tensor): 1 found,
 * 0 not (fall back), -1 an error. *info: a new reference when set, the caller's to release. */
static int kv_info(runner *r, PyObject *kv, unsigned long long *kp, unsigned long long *vp,
                   PyObject **info)
{
    PyObject *key = NULL;
    if (PyTuple_CheckExact(kv) && PyTuple_Size(kv) == 2) {
        PyObject *k = PyTuple_GetItem(kv, 0), *v = PyTuple_GetItem(kv, 1);
        PyObject *mk = meta(k), *mv = mk ? meta(v) : NULL;
        key = mv ? PyTuple_Pack(2, mk, mv) : NULL;
        Py_XDECREF(mk);
        Py_XDECREF(mv);
        if (key && (!data_ptr(k, kp) || !data_ptr(v, vp))) Py_CLEAR(key);
    } else {
        key = meta(kv);
        if (key && !data_ptr(kv, kp)) Py_CLEAR(key);
        *vp = *kp;
    }
    if (!key) return not_a_tensor() ? 0 : -1;
    *info = lookup(r->seen_kv, key);
    Py_DECREF(key);
    if (!*info) return PyErr_Occurred() ? -1 : 0;
    if (r->total_kv >= 0 && item(*info, 7) < r->total_kv) return 0; /* ragged rows short */
    PyObject *off = PyTuple_GetItem(*info, 6);
    if (off != Py_None) *vp = *kp + PyLong_AsUnsignedLongLong(off); /* one tensor: v at k + off */
    return PyErr_Occurred() ? -1 : 1;
}

/* A scale argument as _wrapper._float_scale reads it, for the floats it takes: None is 1; a
 * float > 0 and finite is itself. 0 for anything else (the Python path reads a tensor or an
 * int, and raises on the rest). */
static int scale_of(PyObject *x, double *v)
{
    if (x == Py_None) {
        *v = 1.0;
        return 1;
    }
    if (!PyFloat_CheckExact(x)) return 0;
    *v = PyFloat_AsDouble(x);
    return *v > 0 && *v < HUGE_VAL;
}

static PyObject *runner_call(PyObject *self, PyObject *argv, PyObject *kwargs)
{
    runner *r = (runner *)self;
    PyObject *q, *kv, *out, *lse, *return_lse, *q_scale = Py_None, *k_scale = Py_None,
                                               *v_scale = Py_None;
    if (kwargs || !PyArg_UnpackTuple(argv, "Runner", 5, 8, &q, &kv, &out, &lse, &return_lse,
                                     &q_scale, &k_scale, &v_scale)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError,
                            "Runner(q, kv, out, lse, return_lse[, q_scale, k_scale, v_scale])");
        return NULL;
    }
    PyObject *res = NULL, *made_out = NULL, *made_lse = NULL, *ctx_handle = NULL;
    PyObject *qi = NULL, *ki = NULL, *oi = NULL, *li = NULL; /* entries of the checked dicts */
    if (!r->bound) FALL_BACK();
    const int want_lse = return_lse == Py_True;
    if (!want_lse && return_lse != Py_False) FALL_BACK(); /* a flag to check */
    if (want_lse && !r->has_lse) FALL_BACK();             /* the Python path raises */
    double qs, ks, vs;
    if (!scale_of(q_scale, &qs) || !scale_of(k_scale, &ks) || !scale_of(v_scale, &vs)) FALL_BACK();
    PyObject *was = PyObject_GetAttr(r->cfg, s_scaled);
    if (!was) goto done;
    const int was_scaled = PyObject_IsTrue(was);
    Py_DECREF(was);
    if (was_scaled < 0) goto done;
    const int scaled = qs != 1.0 || ks != 1.0 || vs != 1.0;

    /* q */
    unsigned long long qp = 0, kp = 0, vp = 0, op = 0, lp = 0;
    FOUND(seen_entry(r->seen_q, q, &qi));
    if (!data_ptr(q, &qp)) goto done;
    const long long rows = item(qi, 0);
    if (rows != r->total_qo && (rows < r->total_qo || !r->graph)) FALL_BACK();

    /* k, v */
    FOUND(kv_info(r, kv, &kp, &vp, &ki));

    /* o */
    if (out == Py_None) {
        PyObject *n = PyLong_FromLongLong(rows);
        oi = n ? lookup(r->out_info, n) : NULL;
        Py_XDECREF(n);
        FOUND(oi ? 1 : PyErr_Occurred() ? -1 : 0);
        /* a dense q of o's dtype: torch.empty_like(q) is o, in half the time of torch.empty */
        const int like = r->empty_like != Py_None && item(qi, 1) == (long long)r->H * r->D &&
                         item(qi, 2) == r->D &&
                         (PyObject *)Py_TYPE(q) == PyTuple_GetItem(r->empty_like, 1);
        out = made_out =
            like ? PyObject_CallFunctionObjArgs(PyTuple_GetItem(r->empty_like, 0), q, NULL)
                 : empty(r, r->o_kw, rows, r->H, r->D, 3);
        if (!out) goto done;
    } else {
        FOUND(seen_entry(r->seen_out, out, &oi));
        if (item(oi, 0) != rows) FALL_BACK();
    }
    if (!data_ptr(out, &op)) goto done;

    /* lse */
    if (lse != Py_None) {
        FOUND(seen_entry(r->seen_lse, lse, &li));
        if (PyLong_AsLongLong(li) != rows) FALL_BACK();
        if (!data_ptr(lse, &lp)) goto done;
    } else if (want_lse) {
        lse = made_lse = empty(r, r->lse_kw, rows, r->H, 0, 2);
        if (!lse || !data_ptr(lse, &lp)) goto done;
    } else {
        lp = r->lse_scratch;
    }
    if ((qp | kp | vp | op) & 15) FALL_BACK(); /* the Python path names the tensor */

    /* the device and stream torch says are current */
    PyObject *dev = PyObject_CallNoArgs(r->get_device);
    if (!dev) goto done;
    const int same = PyObject_RichCompareBool(dev, r->index, Py_EQ);
    Py_DECREF(dev);
    if (same < 0) goto done;
    if (!same) FALL_BACK(); /* the Python path switches devices around the call */

    /* the call, inside a hold on the context */
    void *stream = NULL;
    kiln_plan *plan = NULL;
    FOUND(enter(r, &stream, &ctx_handle, &plan));
    kiln_batch_args *a = r->args;
    if (scaled || was_scaled) { /* _Config.set_params(qs, ks, vs) */
        a->params.sm_scale = (float)(r->sm_scale * qs * (r->fp8 ? 1.0 : ks));
        a->params.k_scale = r->fp8 ? (float)ks : 0.0f;
        a->params.v_scale = (float)vs; /* 16-bit KV: the kernel multiplies o by it */
        PyObject_SetAttr(r->cfg, s_scaled, scaled ? Py_True : Py_False);
    }
    a->q = qp;
    a->k = kp;
    a->v = vp;
    a->o = op;
    a->lse = lp;
    a->q_stride_n = item(qi, 1);
    a->q_stride_h = item(qi, 2);
    a->o_stride_n = item(oi, 1);
    a->o_stride_h = item(oi, 2);
    a->k_stride_page = item(ki, 0);
    a->k_stride_n = item(ki, 1);
    a->k_stride_h = item(ki, 2);
    a->v_stride_page = item(ki, 3);
    a->v_stride_n = item(ki, 4);
    a->v_stride_h = item(ki, 5);
    if (!PyErr_Occurred()) {
        const kiln_status st = run_unlocked(r->fn, plan, a, stream);
        if (st) { /* raised with the context still held, as Plan._call does */
            PyObject *ok = PyObject_CallFunction(r->fail, "iO", (int)st, ctx_handle);
            Py_XDECREF(ok);
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_RuntimeError, "kiln_plan_run failed with status %d", (int)st);
        }
    }
    unhold(r, ctx_handle);
    ctx_handle = NULL;
    if (PyErr_Occurred()) goto done;
    res = want_lse ? PyTuple_Pack(2, out, lse) : Py_NewRef(out);
done:
    Py_XDECREF(qi);
    Py_XDECREF(ki);
    Py_XDECREF(oi);
    Py_XDECREF(li);
    Py_XDECREF(made_out);
    Py_XDECREF(made_lse);
    return res;
}

/* ---- the decode plan()'s fast path ----------------------------------------------------------- */

/* Whether plan() scalar arguments a and b are the same values of the same types (the key
 * _wrapper._scalars_key makes: 1, 1.0 and True differ): each pair the same object, or equal
 * and of one exact type among None, bool, int, float and str. */
static int same_scalars(PyObject *a, PyObject *b)
{
    if (!PyTuple_CheckExact(a) || !PyTuple_CheckExact(b) || PyTuple_Size(a) != PyTuple_Size(b))
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_Size(a); i++) {
        PyObject *x = PyTuple_GetItem(a, i), *y = PyTuple_GetItem(b, i);
        if (x == y) continue;
        if (Py_TYPE(x) != Py_TYPE(y) ||
            !(PyLong_CheckExact(x) || PyFloat_CheckExact(x) || PyUnicode_CheckExact(x)))
            return 0;
        const int eq = PyObject_RichCompareBool(x, y, Py_EQ);
        if (eq < 0) PyErr_Clear();
        if (eq != 1) return 0;
    }
    return 1;
}

static PyObject *array_type; /* array.array */

/* Entries of an array.array("i") a, with *ptr its data (array.buffer_info()); -1 for another
 * typecode, with any error cleared. */
static Py_ssize_t int_array(PyObject *a, unsigned long long *ptr)
{
    Py_ssize_t n = -1;
    PyObject *code = PyObject_GetAttr(a, s_typecode);
    PyObject *info = code && PyUnicode_Check(code) && !PyUnicode_CompareWithASCIIString(code, "i")
                         ? PyObject_CallMethodObjArgs(a, s_buffer_info, NULL)
                         : NULL;
    if (info && PyTuple_Check(info) && PyTuple_Size(info) == 2) {
        *ptr = PyLong_AsUnsignedLongLong(PyTuple_GetItem(info, 0));
        const Py_ssize_t len = PyLong_AsSsize_t(PyTuple_GetItem(info, 1));
        if (!PyErr_Occurred() && len >= 0) n = len;
    }
    Py_XDECREF(code);
    Py_XDECREF(info);
    PyErr_Clear();
    return n;
}

/* Entries of a 1-D contiguous int32 tensor t (exactly torch.Tensor) on `where` (a torch.device;
 * NULL: the host, is_cpu): their count, with *ptr its data; -1 when t is not one (the Python
 * path takes it: it converts, checks and names the argument), with any error cleared. */
static Py_ssize_t int32_tensor(runner *r, PyObject *t, PyObject *where, unsigned long long *ptr)
{
    Py_ssize_t n = -1;
    if (!where && (PyObject *)Py_TYPE(t) == array_type) return int_array(t, ptr);
    if ((PyObject *)Py_TYPE(t) != r->tensor) return -1;
    PyObject *dtype = PyObject_GetAttr(t, s_dtype);
    PyObject *dev = dtype == r->int32 ? PyObject_GetAttr(t, where ? s_device : s_is_cpu) : NULL;
    const int on = !dev ? 0 : where ? PyObject_RichCompareBool(dev, where, Py_EQ) : dev == Py_True;
    PyObject *shape = on == 1 ? PyObject_GetAttr(t, s_shape) : NULL;
    PyObject *stride = shape ? PyObject_CallMethodObjArgs(t, s_stride, NULL) : NULL;
    if (stride && PyTuple_Check(shape) && PyTuple_Size(shape) == 1 && PyTuple_Check(stride) &&
        PyTuple_Size(stride) == 1) {
        const long long len = PyLong_AsLongLong(PyTuple_GetItem(shape, 0));
        const long long step = PyLong_AsLongLong(PyTuple_GetItem(stride, 0));
        if (len >= 0 && (step == 1 || len <= 1) && !PyErr_Occurred() && data_ptr(t, ptr))
            n = (Py_ssize_t)len;
    }
    Py_XDECREF(dtype);
    Py_XDECREF(dev);
    Py_XDECREF(shape);
    Py_XDECREF(stride);
    PyErr_Clear();
    return n;
}

/* A copy of n int32 at host address p, as bytes (the plan's arrays: read after the call, and
 * never from memory the caller may change or free while the GIL is released). */
static PyObject *int_bytes(unsigned long long p, Py_ssize_t n)
{
    return PyBytes_FromStringAndSize((const char *)(uintptr_t)p, n * (Py_ssize_t)sizeof(int));
}

/* The q_tokens batch.few_tokens (python/kiln/batch.py) picks for rows qo [B + 1] of a group
 * of G query heads per KV head, with no mask and outside CUDA-graph mode: the power of two at
 * or above the longest request when that is 1..FEW_TOKENS_MAX (16), else 0. */
static int few_tokens(const int *qo, Py_ssize_t B, int G)
{
    enum { FEW_TOKENS_MAX = 16 };
    if (G < 1 || 64 % G || B < 1) return 0;
    if ((long long)qo[B] - qo[0] > (long long)FEW_TOKENS_MAX * B) return 0;
    long long longest = 0;
    for (Py_ssize_t b = 0; b < B; b++)
        if ((long long)qo[b + 1] - qo[b] > longest) longest = (long long)qo[b + 1] - qo[b];
    if (longest < 1 || longest > FEW_TOKENS_MAX) return 0;
    int t = 1;
    while (t < longest) t *= 2;
    return t;
}

/* runner.replan(qo_indptr, kv_indptr, indices, last_page_len, scalars) -> bool: the plan() of
 * a batch under the scalar arguments of the plan() that armed the Runner, done here, or False
 * (nothing changed) where the Python path must do it. qo_indptr: None for a decode; indices
 * and last_page_len: None for a ragged prefill. False for other scalars, index arrays that are
 * not int32 (indptr arrays and last_page_len contiguous on the host, tensors or
 * array.array("i"); the page ids a contiguous tensor on the wrapper's device), an empty batch,
 * one with no key or no query row (o = 0 without a launch), one whose few-token choice is
 * another kernel's, buffers too small for it, a failed schedule (the Python path raises its
 * error). What it does is the Python path's for such arguments: kiln_plan_schedule_scratch into
 * the same buffers, then the _State updated in place (batch, rows, copies of the arrays, the
 * page ids, no forward memo) and the page ids' pointer patched into the config's
 * kiln_batch_args. The order of the arrays is kiln_plan_schedule's to check, as on the
 * Python path for int32 tensors. */
static PyObject *runner_replan(PyObject *self, PyObject *argv)
{
    runner *r = (runner *)self;
    PyObject *qo_in, *kv_in, *indices, *last_in, *scalars;
    if (!PyArg_UnpackTuple(argv, "replan", 5, 5, &qo_in, &kv_in, &indices, &last_in, &scalars))
        return NULL;
    if (!r->armed || (qo_in != Py_None) != r->prefill || (indices != Py_None) != r->paged ||
        !same_scalars(r->scalars, scalars))
        Py_RETURN_FALSE;
    unsigned long long kvp, qop = 0, lastp = 0, idxp = 0;
    const Py_ssize_t nkv = int32_tensor(r, kv_in, NULL, &kvp);
    const Py_ssize_t B = nkv - 1;
    if (B < 1 || (r->prefill && int32_tensor(r, qo_in, NULL, &qop) != nkv) ||
        (r->paged && int32_tensor(r, last_in, NULL, &lastp) != B) || B > r->sched_batch)
        Py_RETURN_FALSE;
    PyObject *res = NULL, *ctx_handle = NULL;
    PyObject *kv_b = int_bytes(kvp, nkv);
    PyObject *qo_b = kv_b && r->prefill ? int_bytes(qop, nkv) : NULL;
    PyObject *last_b = kv_b && r->paged ? int_bytes(lastp, B) : NULL;
    PyObject *batch = NULL, *rows = NULL, *keys = NULL;
    if (!kv_b || (r->prefill && !qo_b) || (r->paged && !last_b)) goto done;
    const int *kv = (const int *)PyBytes_AsString(kv_b);
    const int *qo = qo_b ? (const int *)PyBytes_AsString(qo_b) : NULL;
    const long long total_qo = qo ? qo[B] : B, used = kv[B];
    if (kv[0] != 0 || (qo && qo[0] != 0) || used <= 0 || total_qo <= 0 || total_qo > r->sched_qo ||
        (r->has_lse && total_qo * r->H > r->lse_cap) ||
        (r->few_group && few_tokens(qo, B, r->few_group) != r->q_tokens) ||
        (r->paged && int32_tensor(r, indices, r->device, &idxp) < used)) {
        res = Py_NewRef(Py_False);
        goto done;
    }
    if (!(batch = PyLong_FromSsize_t(B)) || !(rows = PyLong_FromLongLong(total_qo)) ||
        !(keys = PyLong_FromLongLong(used)))
        goto done;
    void *stream = NULL;
    kiln_plan *plan = NULL;
    const int in = enter(r, &stream, &ctx_handle, &plan);
    if (in <= 0) {
        if (!in) res = Py_NewRef(Py_False); /* closed, or destroyed: the Python path raises */
        goto done;
    }
    const kiln_batch_shape shape = {(int)B, qo, kv,
                                    last_b ? (const int *)PyBytes_AsString(last_b) : NULL};
    PyThreadState *ts = PyEval_SaveThread();
    const kiln_status st =
        r->schedule(plan, &shape, r->sched, r->sched_bytes, r->scratch, r->scratch_bytes, stream);
    PyEval_RestoreThread(ts);
    if (st) { /* the Python path plans it again and raises the status's error */
        res = Py_NewRef(Py_False);
        goto done;
    }
    /* the schedule is made: the state follows it (slots of a _State: these cannot fail but for
     * memory, and then no run may use the state: the Runner is unbound) */
    PyObject *st_obj = r->state;
    if (PyObject_SetAttr(st_obj, s_batch, batch) || PyObject_SetAttr(st_obj, s_total_qo, rows) ||
        PyObject_SetAttr(st_obj, s_kv_indptr, kv_b) ||
        (qo_b && PyObject_SetAttr(st_obj, s_qo_indptr, qo_b)) ||
        (last_b && (PyObject_SetAttr(st_obj, s_last, last_b) ||
                    PyObject_SetAttr(st_obj, s_indices, indices))) ||
        (!r->paged && PyObject_SetAttr(st_obj, s_total_kv, keys)) ||
        PyObject_SetAttr(st_obj, s_forwarded, Py_None)) {
        r->bound = r->armed = 0;
        goto done;
    }
    if (r->paged) r->args->kv_indices = idxp;
    r->total_qo = total_qo;
    r->total_kv = r->paged ? -1 : used;
    res = Py_NewRef(Py_True);
done:
    if (ctx_handle) unhold(r, ctx_handle);
    Py_XDECREF(batch);
    Py_XDECREF(rows);
    Py_XDECREF(keys);
    Py_XDECREF(kv_b);
    Py_XDECREF(qo_b);
    Py_XDECREF(last_b);
    return res;
}

/* runner.arm(scalars, state, device, cpu, int32, tensor, schedule, sched, sched_bytes,
 * sched_batch, sched_qo, scratch, scratch_bytes, lse_cap, prefill, paged, few_group, q_tokens)
 * -> None: replan() may plan the next batch under these scalar arguments (a tuple) into these
 * buffers (the plan's schedule buffer, which holds sched_batch requests and sched_qo rows; the
 * float workspace; lse_cap floats of LSE scratch) and update state. prefill: the plan takes
 * qo_indptr; paged: page ids and last_page_len; few_group: the group few_tokens' choice is
 * made for (0: the plan()'s q_tokens argument fixed it), which must be q_tokens again. The
 * wrappers' plan() arms the Runner after each plan it made on the Python path; bind() (any
 * plan) disarms it. */
static PyObject *runner_arm(PyObject *self, PyObject *argv)
{
    runner *r = (runner *)self;
    PyObject *o[6];
    unsigned long long fn, sched, sched_bytes, scratch, scratch_bytes;
    long long sched_batch, sched_qo, lse_cap;
    int prefill, paged, few_group, q_tokens;
    if (!PyArg_ParseTuple(argv, "O!OOOOOKKKLLKKLpiii:arm", &PyTuple_Type, &o[0], &o[1], &o[2],
                          &o[3], &o[4], &o[5], &fn, &sched, &sched_bytes, &sched_batch, &sched_qo,
                          &scratch, &scratch_bytes, &lse_cap, &prefill, &paged, &few_group,
                          &q_tokens))
        return NULL;
    if (!fn) {
        PyErr_SetString(PyExc_ValueError, "arm: a NULL kiln_plan_schedule_scratch");
        return NULL;
    }
    PyObject **dst[6] = {&r->scalars, &r->state, &r->device, &r->cpu, &r->int32, &r->tensor};
    for (int i = 0; i < 6; i++) {
        PyObject *was = *dst[i];
        *dst[i] = Py_NewRef(o[i]);
        Py_XDECREF(was);
    }
    r->schedule = (schedule_fn)(uintptr_t)fn;
    r->sched = sched;
    r->sched_bytes = sched_bytes;
    r->sched_batch = sched_batch;
    r->sched_qo = sched_qo;
    r->scratch = scratch;
    r->scratch_bytes = scratch_bytes;
    r->lse_cap = lse_cap;
    r->prefill = prefill;
    r->paged = paged ? 1 : 0;
    r->few_group = few_group;
    r->q_tokens = q_tokens;
    r->armed = r->bound && !r->graph;
    Py_RETURN_NONE;
}

/* ---- the type -------------------------------------------------------------------------------- */

/* The object fields of a runner, for the collector. */
static const size_t object_fields[] = {
    offsetof(runner, lock),       offsetof(runner, cv),         offsetof(runner, calls),
    offsetof(runner, ctx),        offsetof(runner, plan),       offsetof(runner, cfg),
    offsetof(runner, seen_q),     offsetof(runner, seen_kv),    offsetof(runner, seen_out),
    offsetof(runner, seen_lse),   offsetof(runner, out_info),   offsetof(runner, empty),
    offsetof(runner, empty_like), offsetof(runner, o_kw),       offsetof(runner, lse_kw),
    offsetof(runner, get_device), offsetof(runner, get_stream), offsetof(runner, index),
    offsetof(runner, fail),       offsetof(runner, scalars),    offsetof(runner, state),
    offsetof(runner, device),     offsetof(runner, cpu),        offsetof(runner, int32),
    offsetof(runner, tensor),
};

static PyObject **field(PyObject *self, size_t i)
{
    return (PyObject **)((char *)self + object_fields[i]);
}

static int runner_traverse(PyObject *self, visitproc visit, void *arg)
{
    for (size_t i = 0; i < sizeof object_fields / sizeof object_fields[0]; i++)
        Py_VISIT(*field(self, i));
    Py_VISIT(Py_TYPE(self)); /* a heap type */
    return 0;
}

static int runner_clear(PyObject *self)
{
    for (size_t i = 0; i < sizeof object_fields / sizeof object_fields[0]; i++)
        Py_CLEAR(*field(self, i));
    return 0;
}

static void runner_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    runner_clear(self);
    PyObject_GC_Del(self);
    Py_DECREF(type);
}

/* Runner(ctx, plan, cfg, seen_q, seen_kv, seen_out, seen_lse, out_info, empty, empty_like,
 *        o_kw, lse_kw, get_device, get_stream, index, fail, args_address, run_address,
 *        sm_scale, H, D, graph, has_lse, fp8): kiln/_hot.py's make_runner, once per config. It runs
 *        nothing until bind() gives it a plan's batch. */
static PyObject *runner_new(PyTypeObject *type, PyObject *argv, PyObject *kwargs)
{
    PyObject *o[16];
    unsigned long long args_addr, run_addr;
    double sm_scale;
    int H, D, graph, has_lse, fp8;
    if (kwargs && PyObject_Length(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, "Runner() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(argv, "OOOO!O!O!O!O!OOO!O!OOOOKKdiiiii:Runner", &o[0], &o[1], &o[2],
                          &PyDict_Type, &o[3], &PyDict_Type, &o[4], &PyDict_Type, &o[5],
                          &PyDict_Type, &o[6], &PyDict_Type, &o[7], &o[8], &o[9], &PyDict_Type,
                          &o[10], &PyDict_Type, &o[11], &o[12], &o[13], &o[14], &o[15], &args_addr,
                          &run_addr, &sm_scale, &H, &D, &graph, &has_lse, &fp8))
        return NULL;
    if (!args_addr || !run_addr) {
        PyErr_SetString(PyExc_ValueError, "Runner: a NULL kiln_batch_args or kiln_plan_run");
        return NULL;
    }
    PyObject *lock = PyObject_GetAttrString(o[0], "_lock");
    PyObject *cv = lock ? PyObject_GetAttrString(o[0], "_cv") : NULL;
    PyObject *calls = cv ? PyObject_GetAttrString(o[0], "_calls") : NULL;
    if (calls && !PyList_CheckExact(calls))
        PyErr_SetString(PyExc_TypeError, "Runner: the context's _calls is not a list");
    runner *r = PyErr_Occurred() ? NULL : (runner *)PyType_GenericAlloc(type, 0);
    if (!r) {
        Py_XDECREF(lock);
        Py_XDECREF(cv);
        Py_XDECREF(calls);
        return NULL;
    }
    r->lock = lock;
    r->cv = cv;
    r->calls = calls;
    PyObject **dst[16] = {&r->ctx,        &r->plan,       &r->cfg,      &r->seen_q,
                          &r->seen_kv,    &r->seen_out,   &r->seen_lse, &r->out_info,
                          &r->empty,      &r->empty_like, &r->o_kw,     &r->lse_kw,
                          &r->get_device, &r->get_stream, &r->index,    &r->fail};
    for (int i = 0; i < 16; i++) *dst[i] = Py_NewRef(o[i]);
    r->args = (kiln_batch_args *)(uintptr_t)args_addr;
    r->fn = (run_fn)(uintptr_t)run_addr;
    r->bound = 0;
    r->sm_scale = sm_scale;
    r->fp8 = fp8;
    r->H = H;
    r->D = D;
    r->graph = graph;
    r->has_lse = has_lse;
    return (PyObject *)r;
}

/* runner.bind(total_qo, total_kv, lse_scratch) -> runner: the batch of the plan just made
 * (total_kv: the rows a ragged k and v need, -1 paged; lse_scratch: where the LSE nobody asked
 * for goes, 0 for a kernel without one). */
static PyObject *runner_bind(PyObject *self, PyObject *argv)
{
    runner *r = (runner *)self;
    long long total_qo, total_kv;
    unsigned long long scratch;
    if (!PyArg_ParseTuple(argv, "LLK:bind", &total_qo, &total_kv, &scratch)) return NULL;
    r->total_qo = total_qo;
    r->total_kv = total_kv;
    r->lse_scratch = scratch;
    r->bound = 1;
    r->armed = 0; /* a plan made elsewhere: replan() waits for the next arm() */
    Py_CLEAR(r->state);
    return Py_NewRef(self);
}

static PyMethodDef runner_methods[] = {
    {"bind", runner_bind, METH_VARARGS, "bind(total_qo, total_kv, lse_scratch) -> self"},
    {"arm", runner_arm, METH_VARARGS,
     "arm(scalars, state, device, cpu, int32, tensor, schedule, sched, sched_bytes, "
     "sched_batch, sched_qo, scratch, scratch_bytes, lse_cap, prefill, paged, few_group, "
     "q_tokens) -> None"},
    {"replan", runner_replan, METH_VARARGS,
     "replan(qo_indptr, kv_indptr, indices, last_page_len, scalars) -> bool"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot runner_slots[] = {
    {Py_tp_new, runner_new},
    {Py_tp_methods, runner_methods},
    {Py_tp_call, runner_call},
    {Py_tp_traverse, runner_traverse},
    {Py_tp_clear, runner_clear},
    {Py_tp_dealloc, runner_dealloc},
    {Py_tp_doc, "A batch wrapper's run() for one plan (kiln/_hot.py)."},
    {0, NULL},
};

static PyType_Spec runner_spec = {
    .name = "_kiln_hot.Runner",
    .basicsize = sizeof(runner),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = runner_slots,
};

static int hot_exec(PyObject *m)
{
    struct {
        PyObject **slot;
        const char *name;
    } names[] = {{&s_shape, "shape"},         {&s_stride, "stride"},
                 {&s_dtype, "dtype"},         {&s_device, "device"},
                 {&s_data_ptr, "data_ptr"},   {&s_acquire, "acquire"},
                 {&s_release, "release"},     {&s_notify_all, "notify_all"},
                 {&s_handle, "_handle"},      {&s_closing, "_closing"},
                 {&s_scaled, "scaled"},       {&s_is_cpu, "is_cpu"},
                 {&s_typecode, "typecode"},   {&s_buffer_info, "buffer_info"},
                 {&s_batch, "batch"},         {&s_total_qo, "total_qo"},
                 {&s_total_kv, "total_kv"},   {&s_kv_indptr, "kv_indptr"},
                 {&s_qo_indptr, "qo_indptr"}, {&s_last, "last"},
                 {&s_indices, "indices"},     {&s_forwarded, "forwarded"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!*names[i].slot && !(*names[i].slot = PyUnicode_InternFromString(names[i].name)))
            return -1;
    if (!array_type) {
        PyObject *mod = PyImport_ImportModule("array");
        array_type = mod ? PyObject_GetAttrString(mod, "array") : NULL;
        Py_XDECREF(mod);
        if (!array_type) return -1;
    }
    PyObject *type = PyType_FromSpec(&runner_spec);
    if (!type) return -1;
    if (PyModule_AddObject(m, "Runner", type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return PyModule_AddIntConstant(m, "ARGS_BYTES", (long)sizeof(kiln_batch_args));
}

static PyModuleDef_Slot hot_slots[] = {{Py_mod_exec, hot_exec}, {0, NULL}};

static struct PyModuleDef hot_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_kiln_hot",
    .m_doc = "kiln's batch run() in C (optional; kiln/_hot.py loads it)",
    .m_size = 0,
    .m_slots = hot_slots,
};

PyMODINIT_FUNC PyInit__kiln_hot(void);
PyMODINIT_FUNC PyInit__kiln_hot(void) { return PyModuleDef_Init(&hot_module); }
