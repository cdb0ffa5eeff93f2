/*
 * nvrtc.c — compiles one generated source to a cubin with NVRTC for a named arch, capturing
 * the NVRTC log (which carries ptxas' -v resource report) and parsing registers, shared
 * memory, spills and stack of the main entry out of it.
 */
#include <nvrtc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit.h"

static char nvrtc_version[16];
static pthread_once_t version_once = PTHREAD_ONCE_INIT;

static void read_version(void)
{
    int major = 0, minor = 0;
    if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) major = minor = 0;
    snprintf(nvrtc_version, sizeof nvrtc_version, "%d.%d", major, minor);
}

const char *kiln_nvrtc_version(void)
{
    pthread_once(&version_once, read_version);
    return nvrtc_version;
}

const char *kiln_version(void) { return KILN_VERSION_STRING; }

void kiln__ptxas_parse(const char *log, const char *func, int *registers, int *smem,
                       int *spill_bytes, int *stack_bytes)
{
    *registers = -1;
    *smem = 0;
    *spill_bytes = 0;
    *stack_bytes = 0;
    if (!log) return;
    char needle[128];
    snprintf(needle, sizeof needle, "Function properties for %s\n", func);
    const char *p = strstr(log, needle);
    if (!p) return;
    p += strlen(needle);
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

kiln_status kiln__nvrtc_compile(const char *source, const char *arch, const char *name,
                                kiln__compiled *out, kiln__err *e)
{
    memset(out, 0, sizeof *out);
    if (kiln__fault("nvrtc"))
        return kiln__fail(e, KILN_STATUS_NVRTC, "nvrtc: %s for %s failed: injected fault", name, arch);
    int nopt = 0;
    const char *const *base = kiln__nvrtc_options(arch, &nopt);
    const char *opts[32];
    char archopt[48];
    snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", arch);
    opts[0] = archopt;
    for (int i = 0; i < nopt && i < 30; i++) opts[i + 1] = base[i];

    uint64_t t0 = kiln__now_ns();
    nvrtcProgram prog = NULL;
    nvrtcResult r = nvrtcCreateProgram(&prog, source, name, 0, NULL, NULL);
    if (r != NVRTC_SUCCESS)
        return kiln__fail(e, KILN_STATUS_NVRTC, "nvrtc: create program %s failed: %s", name,
                          nvrtcGetErrorString(r));
    nvrtcResult cr = nvrtcCompileProgram(prog, nopt + 1, opts);
    out->compile_ms = (double)(kiln__now_ns() - t0) / 1e6;

    size_t logsz = 0;
    nvrtcGetProgramLogSize(prog, &logsz);
    out->log = calloc(1, logsz + 1);
    if (!out->log) {
        nvrtcDestroyProgram(&prog);
        return kiln__fail(e, KILN_STATUS_NO_MEMORY, "nvrtc: out of memory for the log of %s", name);
    }
    if (logsz) nvrtcGetProgramLog(prog, out->log);

    if (cr != NVRTC_SUCCESS) {
        /* First error line of the log, for the one-line message; the full log stays in out. */
        const char *first = strstr(out->log, "error");
        const char *line = first ? first : out->log;
        while (line > out->log && line[-1] != '\n') line--;
        const char *eol = strchr(line, '\n');
        int n = eol ? (int)(eol - line) : (int)strlen(line);
        if (n > 600) n = 600;
        nvrtcDestroyProgram(&prog);
        return kiln__fail(e, KILN_STATUS_NVRTC, "nvrtc: %s for %s failed: %s: %.*s", name, arch,
                          nvrtcGetErrorString(cr), n, line);
    }
    size_t n = 0;
    r = nvrtcGetCUBINSize(prog, &n);
    if (r != NVRTC_SUCCESS || n == 0) {
        nvrtcDestroyProgram(&prog);
        return kiln__fail(e, KILN_STATUS_NVRTC, "nvrtc: %s for %s produced no cubin: %s", name, arch,
                          nvrtcGetErrorString(r));
    }
    out->cubin = malloc(n);
    if (!out->cubin) {
        nvrtcDestroyProgram(&prog);
        kiln__compiled_free(out);
        return kiln__fail(e, KILN_STATUS_NO_MEMORY, "nvrtc: out of memory for a %zu-byte cubin", n);
    }
    nvrtcGetCUBIN(prog, out->cubin);
    out->cubin_size = n;
    nvrtcDestroyProgram(&prog);
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
