/*
 * nvrtc.c — compiles one generated source to a cubin with NVRTC for a named arch, capturing
 * the NVRTC log (which carries ptxas' -v resource report) and parsing registers, shared
 * memory, spills and stack of the main entry out of it. It owns the option list (which the key
 * material repeats, jit/key.c), NVRTC's version and arch list with their memo file, and loads
 * the library with dlopen. kiln_version (the library's own version) lives here too.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jit.h"

/* NVRTC is dlopen'ed on first use: linking it costs every process ~12 ms of start-up (its
 * static initialisers), which a cache hit must not pay. The library path: $KILN_NVRTC, else
 * the toolkit kiln was built against (KILN_NVRTC_DEFAULT, from the Makefile), else the
 * loader's search for libnvrtc.so.13. */
#ifndef KILN_NVRTC_DEFAULT
#define KILN_NVRTC_DEFAULT "/usr/local/cuda/lib64/libnvrtc.so.13"
#endif
#define NVRTC_SONAME "libnvrtc.so.13"

/* one entry a line */
/* clang-format off */
#define NVRTC_FUNCS(X)           \
    X(nvrtcVersion)              \
    X(nvrtcCreateProgram)        \
    X(nvrtcCompileProgram)       \
    X(nvrtcGetProgramLogSize)    \
    X(nvrtcGetProgramLog)        \
    X(nvrtcGetCUBINSize)         \
    X(nvrtcGetCUBIN)             \
    X(nvrtcDestroyProgram)       \
    X(nvrtcGetErrorString)       \
    X(nvrtcGetNumSupportedArchs) \
    X(nvrtcGetSupportedArchs)
/* clang-format on */

static struct {
#define NVRTC_MEMBER(name) __typeof__(&name) name;
    NVRTC_FUNCS(NVRTC_MEMBER)
#undef NVRTC_MEMBER
} api;
static kiln_status api_status = KILN_STATUS_NVRTC;
static kiln__err api_err;
static pthread_once_t api_once = PTHREAD_ONCE_INIT;

/* The file kiln loads NVRTC from (static storage). */
static const char *library_path(void)
{
    const char *env = getenv("KILN_NVRTC");
    if (env && *env) return env;
    if (access(KILN_NVRTC_DEFAULT, R_OK) == 0) return KILN_NVRTC_DEFAULT;
    return NVRTC_SONAME;
}

static void api_load(void)
{
    const char *path = library_path();
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        kiln__fail(&api_err, KILN_STATUS_NVRTC,
                   "nvrtc: cannot load %s: %s (install the CUDA toolkit or set KILN_NVRTC)", path,
                   dlerror());
        return;
    }
#define NVRTC_RESOLVE(name)                                                                        \
    {                                                                                              \
        void *fn = dlsym(lib, #name);                                                              \
        if (!fn) {                                                                                 \
            kiln__fail(&api_err, KILN_STATUS_NVRTC, "nvrtc: %s lacks %s", path, #name);            \
            return;                                                                                \
        }                                                                                          \
        memcpy(&api.name, &fn, sizeof fn);                                                         \
    }
    NVRTC_FUNCS(NVRTC_RESOLVE)
#undef NVRTC_RESOLVE
    api_status = KILN_STATUS_OK;
}

static kiln_status nvrtc_api(kiln__err *e)
{
    pthread_once(&api_once, api_load);
    if (api_status && e) *e = api_err;
    return api_status;
}

/* ---- options ----------------------------------------------------------------------------- */

/* Passed to every compile after the arch option. --prec-div=false: a float division (a
 * snippet's `logits / cap`) compiles to a reciprocal and a multiply, not the IEEE sequence;
 * attention's own divisions (1 / l) need no more. --ftz=true: f32 denormals flush to zero
 * (attention's values never need them: a P that small adds nothing), so that such a
 * division needs no range scaling either: the reciprocal of a snippet parameter is taken
 * once, outside the tile loop (a snippet soft-cap `cap * tanhf(logits / cap)`: 959 -> 817
 * FMULs in the sm_90a kernel, two predicated scalings an element fewer). */
static const char *const base_options[] = {"-std=c++17",  "-minimal",         "--ptxas-options=-v",
                                           "--fmad=true", "--prec-div=false", "--ftz=true",
                                           NULL};

/* With NVRTC 12.4 or newer, -split-compile=2: the optimizer works on two functions at once (a
 * batch kernel's main and merge entries). The same SASS, instruction for instruction, for the
 * seven sm_90a kernels compared (wgmma prefill, packed tensor-core and CUDA-core decode, fp8);
 * cold compiles on the 2-core box: batch prefill 1.52 -> 1.24 s, 1.56 -> 1.29, packed fp8 decode
 * 1.10 -> 0.92, single decode with its merge 1.03 -> 0.84; one-entry kernels unchanged. */
static int nvrtc_splits(void)
{
    int major = 0, minor = 0;
    return sscanf(kiln_nvrtc_version(), "%d.%d", &major, &minor) == 2 &&
           (major > 12 || (major == 12 && minor >= 4));
}

void kiln__nvrtc_options(const char *arch, kiln__nvrtc_opts *out)
{
    snprintf(out->arch, sizeof out->arch, "--gpu-architecture=%s", arch);
    out->n = 0;
    out->v[out->n++] = out->arch;
    for (int i = 0; base_options[i] && out->n < KILN__NVRTC_OPTS_MAX; i++)
        out->v[out->n++] = base_options[i];
    if (nvrtc_splits() && out->n < KILN__NVRTC_OPTS_MAX) out->v[out->n++] = "-split-compile=2";
}

/* ---- version and archs ----------------------------------------------------------------------
 * The version is part of every key, so a cache hit needs it, and the list of archs NVRTC
 * compiles for decides whether an --arch is valid input; asking NVRTC means loading it. A small
 * memo file maps the library's identity (path, device, inode, size, mtime) to the version and
 * the arch list NVRTC reported for it ("ID\tVERSION\tSM,SM,...\n"; lines without the list,
 * from before it was kept, still give the version); any change to the file (a toolkit upgrade)
 * changes the identity and NVRTC is asked again. Without a usable memo NVRTC is simply loaded. */

#define MEMO_SMS_MAX 128

static char nvrtc_version[32];
static int memo_sms[MEMO_SMS_MAX], memo_nsms = -1; /* -1: the memo had no arch list */
static pthread_once_t version_once = PTHREAD_ONCE_INIT;

/* The memo sits in the default cache directory ($KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln,
 * else ~/.cache/kiln), created (0700) when missing. */
static void memo_path(char *out, size_t cap)
{
    const char *k = getenv("KILN_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    char dir[900];
    if (k && *k) snprintf(dir, sizeof dir, "%s", k);
    else if (x && x[0] == '/') snprintf(dir, sizeof dir, "%s/kiln", x);
    else if (h && *h) snprintf(dir, sizeof dir, "%s/.cache/kiln", h);
    else {
        out[0] = 0;
        return;
    }
    for (char *p = dir + 1; *p; p++) { /* mkdir -p, best effort */
        if (*p != '/') continue;
        *p = 0;
        mkdir(dir, 0700);
        *p = '/';
    }
    mkdir(dir, 0700);
    snprintf(out, cap, "%s/nvrtc-version", dir);
}

/* "80,86,90" into memo_sms; 0 when the text is such a list. */
static int parse_sms(const char *t)
{
    int n = 0;
    while (*t && n < MEMO_SMS_MAX) {
        char *end;
        long v = strtol(t, &end, 10);
        if (end == t || v < 10 || v > 9999) return -1;
        memo_sms[n++] = (int)v;
        t = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    if (n == 0 || *t) return -1;
    memo_nsms = n;
    return 0;
}

/* The version (and the arch list) of the memo line for `id`; 1 when both were found. */
static int memo_read(const char *memo, const char *id)
{
    FILE *f = fopen(memo, "r");
    if (!f) return 0;
    char line[2048];
    int done = 0;
    while (!done && fgets(line, sizeof line, f)) {
        char *tab = strchr(line, '\t');
        if (!tab) continue;
        *tab = 0;
        if (strcmp(line, id)) continue;
        char *v = tab + 1, *list = strchr(v, '\t');
        v[strcspn(v, "\t\n")] = 0;
        if (!*v || strlen(v) >= sizeof nvrtc_version) continue;
        snprintf(nvrtc_version, sizeof nvrtc_version, "%s", v);
        if (list) {
            list++;
            list[strcspn(list, "\n")] = 0;
            done = parse_sms(list) == 0;
        }
    }
    fclose(f);
    return done;
}

static void read_version(void)
{
    char id[1200] = "", memo[1024];
    const char *path = library_path();
    struct stat st;
    if (strchr(path, '/') && stat(path, &st) == 0)
        snprintf(id, sizeof id, "%s %llu %llu %lld %lld.%09ld", path, (unsigned long long)st.st_dev,
                 (unsigned long long)st.st_ino, (long long)st.st_size, (long long)st.st_mtim.tv_sec,
                 st.st_mtim.tv_nsec);
    memo_path(memo, sizeof memo);
    if (id[0] && memo[0] && memo_read(memo, id)) return;
    nvrtc_version[0] = 0;
    memo_nsms = -1;
    int major = 0, minor = 0, n = 0;
    if (nvrtc_api(NULL) || api.nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) {
        snprintf(nvrtc_version, sizeof nvrtc_version, "unavailable");
        return;
    }
    snprintf(nvrtc_version, sizeof nvrtc_version, "%d.%d", major, minor);
    if (api.nvrtcGetNumSupportedArchs(&n) == NVRTC_SUCCESS && n > 0 && n <= MEMO_SMS_MAX &&
        api.nvrtcGetSupportedArchs(memo_sms) == NVRTC_SUCCESS)
        memo_nsms = n;
    if (id[0] && memo[0] && memo_nsms > 0) {
        /* Best effort, appended atomically (O_APPEND, one write). */
        char line[2048];
        int at = snprintf(line, sizeof line, "%s\t%s\t", id, nvrtc_version);
        for (int i = 0; i < memo_nsms && at < (int)sizeof line - 8; i++)
            at += snprintf(line + at, sizeof line - (size_t)at, "%s%d", i ? "," : "", memo_sms[i]);
        at += snprintf(line + at, sizeof line - (size_t)at, "\n");
        int fd = open(memo, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
        if (fd >= 0 && at < (int)sizeof line) {
            if (write(fd, line, (size_t)at) != at) (void)0;
        }
        if (fd >= 0) close(fd);
    }
}

const char *kiln_nvrtc_version(void)
{
    pthread_once(&version_once, read_version);
    return nvrtc_version;
}

kiln_status kiln__nvrtc_archs(int *sms, int cap, int *count, kiln__err *e)
{
    *count = 0;
    pthread_once(&version_once, read_version); /* the memo's list, when it has one */
    if (memo_nsms > 0) {
        if (memo_nsms > cap)
            return kiln__fail(e, KILN_STATUS_NVRTC, "nvrtc: cannot list supported archs");
        memcpy(sms, memo_sms, sizeof(int) * (size_t)memo_nsms);
        *count = memo_nsms;
        return KILN_STATUS_OK;
    }
    kiln_status st = nvrtc_api(e);
    if (st) return st;
    int n = 0;
    if (api.nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0 || n > cap)
        return kiln__fail(e, KILN_STATUS_NVRTC, "nvrtc: cannot list supported archs");
    if (api.nvrtcGetSupportedArchs(sms) != NVRTC_SUCCESS)
        return kiln__fail(e, KILN_STATUS_NVRTC, "nvrtc: cannot list supported archs");
    *count = n;
    return KILN_STATUS_OK;
}

const char *kiln_version(void) { return KILN_VERSION_STRING; }

/* The report of the entry whose "Function properties for" block starts at p (just after the
 * name's line): registers (-1 when absent), shared memory, spill and stack bytes. */
static void ptxas_block(const char *p, int *registers, int *smem, int *spill_bytes,
                        int *stack_bytes)
{
    *registers = -1;
    *smem = 0;
    *spill_bytes = 0;
    *stack_bytes = 0;
    int stack = 0, st = 0, ld = 0;
    const char *frame = strstr(p, "bytes stack frame");
    while (frame && frame > p && frame[-1] != '\n' && frame[-1] != '.') frame--;
    if (frame && sscanf(frame, " %d bytes stack frame, %d bytes spill stores, %d bytes spill loads",
                        &stack, &st, &ld) == 3) {
        *stack_bytes = stack;
        *spill_bytes = st + ld;
    }
    const char *u = strstr(p, "Used ");
    if (u) {
        int regs = 0;
        if (sscanf(u, "Used %d registers", &regs) == 1) *registers = regs;
        const char *eol = strchr(u, '\n');
        const char *sm = strstr(u, "bytes smem");
        if (sm && (!eol || sm < eol)) {
            const char *b = sm;
            while (b > u && b[-1] == ' ') b--;
            while (b > u && b[-1] >= '0' && b[-1] <= '9') b--;
            *smem = atoi(b);
        }
    }
}

void kiln__ptxas_parse(const char *log, const char *func, int *registers, int *smem,
                       int *spill_bytes, int *stack_bytes)
{
    static const char props[] = "Function properties for ";
    *registers = -1;
    *smem = *spill_bytes = *stack_bytes = 0;
    if (!log) return;
    char needle[128];
    snprintf(needle, sizeof needle, "%s%s\n", props, func);
    const char *p = strstr(log, needle);
    if (p) {
        ptxas_block(p + strlen(needle), registers, smem, spill_bytes, stack_bytes);
        return;
    }
    /* A family without that entry (the merge kernels: kiln_merge_state, _in_place, _states)
     * reports the most any of its entries uses. */
    for (p = strstr(log, props); p; p = strstr(p + 1, props)) {
        const char *eol = strchr(p, '\n');
        if (!eol) break;
        int r, m, sp, st;
        ptxas_block(eol + 1, &r, &m, &sp, &st);
        if (r > *registers) *registers = r;
        if (m > *smem) *smem = m;
        if (sp > *spill_bytes) *spill_bytes = sp;
        if (st > *stack_bytes) *stack_bytes = st;
    }
}

kiln_status kiln__nvrtc_compile(const char *source, const char *arch, const char *name,
                                kiln__compiled *out, kiln__err *e)
{
    memset(out, 0, sizeof *out);
    if (kiln__fault("nvrtc"))
        return kiln__fail(e, KILN_STATUS_NVRTC, "nvrtc: %s for %s failed: injected fault", name,
                          arch);
    kiln_status lst = nvrtc_api(e);
    if (lst) return lst;
    kiln__nvrtc_opts opts;
    kiln__nvrtc_options(arch, &opts);

    uint64_t t0 = kiln__now_ns();
    nvrtcProgram prog = NULL;
    nvrtcResult r = api.nvrtcCreateProgram(&prog, source, name, 0, NULL, NULL);
    if (r != NVRTC_SUCCESS)
        return kiln__fail(e, KILN_STATUS_NVRTC, "nvrtc: create program %s failed: %s", name,
                          api.nvrtcGetErrorString(r));
    nvrtcResult cr = api.nvrtcCompileProgram(prog, opts.n, opts.v);
    out->compile_ms = (double)(kiln__now_ns() - t0) / 1e6;

    size_t logsz = 0;
    api.nvrtcGetProgramLogSize(prog, &logsz);
    out->log = calloc(1, logsz + 1);
    if (!out->log) {
        api.nvrtcDestroyProgram(&prog);
        return kiln__fail(e, KILN_STATUS_NO_MEMORY, "nvrtc: out of memory for the log of %s", name);
    }
    if (logsz) api.nvrtcGetProgramLog(prog, out->log);

    if (cr != NVRTC_SUCCESS) {
        /* First error line of the log, for the one-line message; the full log stays in out. */
        const char *first = strstr(out->log, "error");
        const char *line = first ? first : out->log;
        while (line > out->log && line[-1] != '\n') line--;
        const char *eol = strchr(line, '\n');
        int n = eol ? (int)(eol - line) : (int)strlen(line);
        if (n > 600) n = 600;
        api.nvrtcDestroyProgram(&prog);
        return kiln__fail(e, KILN_STATUS_NVRTC, "nvrtc: %s for %s failed: %s: %.*s", name, arch,
                          api.nvrtcGetErrorString(cr), n, line);
    }
    size_t n = 0;
    r = api.nvrtcGetCUBINSize(prog, &n);
    if (r != NVRTC_SUCCESS || n == 0) {
        api.nvrtcDestroyProgram(&prog);
        return kiln__fail(e, KILN_STATUS_NVRTC, "nvrtc: %s for %s produced no cubin: %s", name,
                          arch, api.nvrtcGetErrorString(r));
    }
    out->cubin = malloc(n);
    if (!out->cubin) {
        api.nvrtcDestroyProgram(&prog);
        kiln__compiled_free(out);
        return kiln__fail(e, KILN_STATUS_NO_MEMORY, "nvrtc: out of memory for a %zu-byte cubin", n);
    }
    api.nvrtcGetCUBIN(prog, out->cubin);
    out->cubin_size = n;
    api.nvrtcDestroyProgram(&prog);
    kiln__ptxas_parse(out->log, KILN__ENTRY_MAIN, &out->registers, &out->smem_static,
                      &out->spill_bytes, &out->stack_bytes);
    return KILN_STATUS_OK;
}

void kiln__compiled_free(kiln__compiled *c)
{
    if (!c) return;
    free(c->cubin);
    free(c->log);
    memset(c, 0, sizeof *c);
}
