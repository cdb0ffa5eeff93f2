/*
 * kt.c — the helpers the test files share (declared in kt.h): paths under the test's scratch
 * directory, whole-file reads and writes, child processes with captured output, the kiln
 * binary, contexts, SQLite access behind a cache's back, and cache rows made to order.
 * The runner itself (the table, filters, kt_tmpdir) is run.c.
 */
#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache.h"
#include "jit.h"
#include "kt.h"
#include "libclang.h"

/* Most arguments kt_kiln passes after the binary's name. */
#define KILN_ARGS_MAX 32

/* ---- libclang ------------------------------------------------------------------------------ */

int kt_need_clang(void)
{
    kiln__err e = {{0}};
    if (kiln__clang_get(&e)) return 1;
    kt_skip("%s", e.msg);
    return 0;
}

/* ---- paths ---------------------------------------------------------------------------------- */

const char *kt_join(const char *a, const char *b)
{
    static char bufs[256][1024];
    static int next;
    char tmp[sizeof bufs[0]];
    size_t na = strlen(a), nb = strlen(b);
    if (na + nb + 2 > sizeof tmp) return "/nonexistent/path-too-long";
    memcpy(tmp, a, na); /* a may be one of bufs: copy before writing */
    tmp[na] = '/';
    memcpy(tmp + na + 1, b, nb + 1);
    char *p = bufs[next++ % 256];
    memcpy(p, tmp, na + nb + 2);
    return p;
}

const char *kt_path(const char *name) { return kt_join(kt_tmpdir(), name); }

const char *kt_cache_dir(void)
{
    const char *shared = getenv("KILN_TEST_CACHE");
    return shared && *shared ? shared : kt_path("cache");
}

/* ---- files ---------------------------------------------------------------------------------- */

char *kt_slurp(const char *path, size_t *n)
{
    if (n) *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (cap - len - 1 == 0) {
            char *more = realloc(buf, cap * 2);
            if (!more) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = more;
            cap *= 2;
        }
    }
    fclose(f);
    if (!buf) return NULL;
    buf[len] = 0;
    if (n) *n = len;
    return buf;
}

int kt_write(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    int ok = f && (n == 0 || fwrite(data, 1, n, f) == n);
    if (f && fclose(f) != 0) ok = 0;
    if (!ok) printf("    kt_write: %s: cannot write\n", path);
    return ok ? 0 : -1;
}

int kt_write_text(const char *path, const char *text) { return kt_write(path, text, strlen(text)); }

int kt_exists(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0;
}

int kt_file_mode(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (int)(sb.st_mode & 07777) : -1;
}

void kt_setenv(const char *name, const char *value)
{
    if (value) setenv(name, value, 1);
    else unsetenv(name);
}

/* ---- child processes ------------------------------------------------------------------------ */

int kt_spawn(const char *in, const char *const *env, const char *const *argv, const char *out_path,
             const char *err_path)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int fi = open(in ? in : "/dev/null", O_RDONLY);
        int fo = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int fe = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fi < 0 || fo < 0 || fe < 0) _exit(126);
        dup2(fi, 0);
        dup2(fo, 1);
        dup2(fe, 2);
        for (int i = 0; env && env[i]; i++) putenv((char *)env[i]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

int kt_wait(int pid)
{
    int status = 0;
    if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status)) return WEXITSTATUS(status);
    return -1;
}

/* kt_slurp, or "" when the file cannot be read. */
static char *text_of(const char *path)
{
    char *s = kt_slurp(path, NULL);
    return s ? s : strdup("");
}

int kt_run(const char *in, const char *const *argv, char **out, char **err)
{
    char out_path[600], err_path[600];
    snprintf(out_path, sizeof out_path, "%s/kt-run-stdout.txt", kt_tmpdir());
    snprintf(err_path, sizeof err_path, "%s/kt-run-stderr.txt", kt_tmpdir());
    int code = kt_wait(kt_spawn(in, NULL, argv, out_path, err_path));
    *out = text_of(out_path);
    *err = text_of(err_path);
    unlink(out_path);
    unlink(err_path);
    return code;
}

void kt_out_free(kt_out *r)
{
    free(r->out);
    free(r->err);
    memset(r, 0, sizeof *r);
}

int kt__have_kiln(const char *file, int line)
{
    if (access(kt_kiln_bin(), X_OK) == 0) return 1;
    kt_fail(file, line, "%s is not an executable (build it, or pass --kiln PATH)", kt_kiln_bin());
    return 0;
}

int kt_kiln(kt_out *r, const char *in, const char *const *env, const char *const *args)
{
    const char *argv[KILN_ARGS_MAX + 2] = {kt_kiln_bin()};
    int argc = 1;
    for (int i = 0; args[i] && argc <= KILN_ARGS_MAX; i++) argv[argc++] = args[i];
    argv[argc] = NULL;
    if (!env) return r->code = kt_run(in, argv, &r->out, &r->err);
    char out_path[600], err_path[600];
    snprintf(out_path, sizeof out_path, "%s/kt-kiln-stdout.txt", kt_tmpdir());
    snprintf(err_path, sizeof err_path, "%s/kt-kiln-stderr.txt", kt_tmpdir());
    r->code = kt_wait(kt_spawn(in, env, argv, out_path, err_path));
    r->out = text_of(out_path);
    r->err = text_of(err_path);
    unlink(out_path);
    unlink(err_path);
    return r->code;
}

int kt_kiln_spawn(const char *tag, const char *const *env, const char *const *args)
{
    char out[700], err[700];
    snprintf(out, sizeof out, "%s/%s.out", kt_tmpdir(), tag);
    snprintf(err, sizeof err, "%s/%s.err", kt_tmpdir(), tag);
    const char *argv[KILN_ARGS_MAX + 2] = {kt_kiln_bin()};
    int argc = 1;
    for (int i = 0; args[i] && argc <= KILN_ARGS_MAX; i++) argv[argc++] = args[i];
    argv[argc] = NULL;
    return kt_spawn(NULL, env, argv, out, err);
}

int kt_kiln_reap(int pid, const char *tag, kt_out *r)
{
    char path[700];
    memset(r, 0, sizeof *r);
    r->code = kt_wait(pid);
    snprintf(path, sizeof path, "%s/%s.out", kt_tmpdir(), tag);
    r->out = text_of(path);
    snprintf(path, sizeof path, "%s/%s.err", kt_tmpdir(), tag);
    r->err = text_of(path);
    return r->code;
}

/* ---- contexts and compiles ------------------------------------------------------------------ */

const char *const kt_specs4[4] = {KT_SPEC_0, KT_SPEC_1, KT_SPEC_2, KT_SPEC_3};

kiln_ctx *kt__ctx(const char *file, int line, const char *dir, int device)
{
    kiln_ctx_opts o = {0};
    o.cache_dir = dir;
    o.no_cache = dir == NULL;
    o.no_device = !device;
    kiln_ctx *ctx = NULL;
    if (kiln_ctx_create(&o, &ctx) != KILN_STATUS_OK) {
        kt_fail(file, line, "kiln_ctx_create(cache %s, %s): %s", dir ? dir : "(none)",
                device ? "device" : "no device", kiln_errmsg());
        return NULL;
    }
    return ctx;
}

kiln_ctx *kt__ctx_policy(const char *file, int line, const char *dir, kiln_cache_mode mode,
                         const char *record, const char *base, int64_t max_bytes)
{
    kiln_ctx_opts o = {0};
    o.cache_dir = dir;
    o.no_cache = dir == NULL;
    o.no_device = 1;
    o.mode = mode;
    o.record_path = record;
    o.base_cache_dir = base;
    o.max_cache_bytes = max_bytes;
    kiln_ctx *ctx = NULL;
    if (kiln_ctx_create(&o, &ctx) != KILN_STATUS_OK) {
        kt_fail(file, line, "kiln_ctx_create(%s): %s", dir ? dir : "(none)", kiln_errmsg());
        return NULL;
    }
    return ctx;
}

int kt_compile(kiln_ctx *ctx, const char *spec, const char *arch)
{
    kiln_variant v;
    if (kiln_variant_parse(spec, &v) != KILN_STATUS_OK) return -1;
    kiln_kernel *k = NULL;
    kiln_kernel_info ki;
    if (kiln_kernel_compile(ctx, &v, arch, &k) != KILN_STATUS_OK) return -1;
    kiln_kernel_describe(k, &ki);
    return ki.from_cache;
}

void kt_key_of(const char *spec, const char *arch, char key[33])
{
    kiln_variant v;
    kiln__config cfg;
    kiln__err e = {{0}};
    char *mat = NULL;
    key[0] = 0;
    if (kiln__spec_parse(spec, &v, &e) || kiln__config_pick(&v, kiln__arch_sm(arch), &cfg, &e) ||
        kiln__key_material(&v, &cfg, arch, &mat, &e)) {
        kt_fail(__FILE__, __LINE__, "key of %s: %s", spec, e.msg);
        return;
    }
    kiln__key_hash(mat, key);
    free(mat);
}

char *kt_capture_stderr(int (*fn)(kiln_ctx *, const char *, const char *), kiln_ctx *ctx,
                        const char *spec, const char *arch, int *result)
{
    /* an anonymous file: the read-only checks run as nobody, who may have no writable
     * directory at all (a /tmp of mode 0755 is enough for that) */
    fflush(stderr);
    int saved = dup(2), fd = memfd_create("kiln-stderr", 0);
    if (fd >= 0) dup2(fd, 2);
    *result = fn(ctx, spec, arch);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char *text = NULL;
    off_t n = fd >= 0 ? lseek(fd, 0, SEEK_END) : -1;
    if (n >= 0 && (text = malloc((size_t)n + 1))) {
        ssize_t got = pread(fd, text, (size_t)n, 0);
        text[got > 0 ? got : 0] = '\0';
    }
    if (fd >= 0) close(fd);
    return text ? text : strdup("");
}

/* ---- SQLite --------------------------------------------------------------------------------- */

char *kt_sql_text(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    char *out = NULL;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK) {
        sqlite3_busy_timeout(db, 10000);
        sqlite3_stmt *st = NULL;
        int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
        if (rc == SQLITE_OK) rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            const unsigned char *t = sqlite3_column_text(st, 0);
            out = strdup(t ? (const char *)t : "");
        } else if (rc == SQLITE_DONE) {
            out = strdup("");
        }
        sqlite3_finalize(st);
    }
    if (!out) {
        char msg[600];
        snprintf(msg, sizeof msg, "(error: %s)", db ? sqlite3_errmsg(db) : "open");
        out = strdup(msg);
    }
    sqlite3_close(db);
    return out;
}

long kt_sql_long(const char *path, const char *sql)
{
    char *t = kt_sql_text(path, sql);
    long v = t && t[0] != '(' ? atol(t) : -1;
    free(t);
    return v;
}

int kt_sql_exec(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    int ok = sqlite3_open(path, &db) == SQLITE_OK;
    if (ok) {
        sqlite3_busy_timeout(db, 10000);
        char *err = NULL;
        ok = sqlite3_exec(db, sql, NULL, NULL, &err) == SQLITE_OK;
        if (!ok) printf("    kt_sql_exec: %s: %s\n", path, err ? err : "?");
        sqlite3_free(err);
    }
    sqlite3_close(db);
    return ok;
}

int kt_damage_cubin(const char *path, const char *key, kt_damage how)
{
    sqlite3 *db = NULL;
    if (sqlite3_open(path, &db) != SQLITE_OK) {
        printf("    kt_damage_cubin: %s: cannot open\n", path);
        sqlite3_close(db);
        return 0;
    }
    sqlite3_busy_timeout(db, 10000);
    sqlite3_stmt *st = NULL;
    unsigned char *blob = NULL;
    int n = 0, ok = 0;
    if (sqlite3_prepare_v2(db, "SELECT cubin FROM kernels WHERE key = ?1", -1, &st, NULL) ==
            SQLITE_OK &&
        sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW) {
        n = sqlite3_column_bytes(st, 0);
        blob = malloc((size_t)n);
        if (blob) memcpy(blob, sqlite3_column_blob(st, 0), (size_t)n);
    }
    sqlite3_finalize(st);
    st = NULL;
    if (blob && n > 100) {
        if (how == KT_FLIP)
            for (int i = n / 2; i < n / 2 + 4; i++) blob[i] ^= 0x5a;
        else n /= 2;
        char sum[33];
        kiln__hash128(blob, (size_t)n, sum);
        const char *sql = how == KT_TRUNCATE_RESUMMED
                              ? "UPDATE kernels SET cubin = ?2, checksum = ?3 WHERE key = ?1"
                              : "UPDATE kernels SET cubin = ?2 WHERE key = ?1 AND ?3 IS NOT NULL";
        ok = sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK &&
             sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC) == SQLITE_OK &&
             sqlite3_bind_blob(st, 2, blob, n, SQLITE_STATIC) == SQLITE_OK &&
             sqlite3_bind_text(st, 3, sum, -1, SQLITE_STATIC) == SQLITE_OK &&
             sqlite3_step(st) == SQLITE_DONE;
        sqlite3_finalize(st);
    }
    if (!ok) printf("    kt_damage_cubin: %s: row %s: %s\n", path, key, sqlite3_errmsg(db));
    free(blob);
    sqlite3_close(db);
    return ok;
}

/* ---- cache rows ----------------------------------------------------------------------------- */

void kt_entry(kiln__entry *en, int i, size_t size)
{
    char buf[128];
    memset(en, 0, sizeof *en);
    snprintf(buf, sizeof buf, "key-%d", i);
    kiln__hash128(buf, strlen(buf), en->key);
    snprintf(buf, sizeof buf, "op=prefill dtype=bf16 head_dim=%d group=%d", 64 + i, 1 + i % 8);
    en->spec = strdup(buf);
    en->arch = strdup(i % 2 ? "sm_80" : "sm_90a");
    en->nvrtc = strdup("13.0");
    snprintf(buf, sizeof buf, "format 1\nspec %d\nnvrtc 13.0\n", i);
    en->key_material = strdup(buf);
    en->source = strdup("/* generated — do not edit */\n__global__ void k(void) {}\n");
    en->log = strdup("ptxas info    : Used 40 registers, 1024 bytes smem");
    en->cubin = malloc(size);
    uint32_t x = 2463534242u + (uint32_t)i; /* xorshift32 */
    for (size_t b = 0; b < size; b++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        ((unsigned char *)en->cubin)[b] = b % 7 == 0 ? 0 : (unsigned char)x;
    }
    en->cubin_size = size;
    en->registers = 40 + i;
    en->smem_bytes = 1024 * (i + 1);
    en->spill_bytes = i;
    en->stack_bytes = 8;
    en->compile_ms = 123.25 + i;
}

void kt_cubin(unsigned char out[64], int tag)
{
    memset(out, 0, 64);
    memcpy(out, "\177ELF", 4);
    out[4] = 2;                  /* ELFCLASS64 */
    out[5] = 1;                  /* little-endian */
    out[6] = 1;                  /* version */
    out[9] = (unsigned char)tag; /* EI_PAD */
    out[18] = 190;               /* e_machine: CUDA */
    out[52] = 64;                /* e_ehsize */
}

static uint64_t kt_le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

int kt_wgmma_serialized(const kiln_kernel *k)
{
    size_t n = 0;
    const unsigned char *b = kiln_kernel_cubin(k, &n);
    if (!b || n < 64 || memcmp(b, "\177ELF", 4) || b[4] != 2 || b[5] != 1) {
        fprintf(stderr, "kt_wgmma_serialized: the cubin (%zu bytes) is not ELF64 little-endian\n",
                n);
        return -1;
    }
    const uint64_t shoff = kt_le(b + 0x28, 8), shentsize = kt_le(b + 0x3A, 2),
                   shnum = kt_le(b + 0x3C, 2);
    if (shentsize < 0x28 || shoff > n || shnum > (n - shoff) / shentsize) {
        fprintf(stderr, "kt_wgmma_serialized: section headers past the cubin's %zu bytes\n", n);
        return -1;
    }
    long syncs = 0, hgmma = 0;
    for (uint64_t i = 0; i < shnum; i++) {
        const unsigned char *sh = b + shoff + i * shentsize;
        const uint64_t flags = kt_le(sh + 0x08, 8), off = kt_le(sh + 0x18, 8),
                       size = kt_le(sh + 0x20, 8);
        if (!(flags & 0x4) || off > n || size > n - off) continue; /* SHF_EXECINSTR, in bounds */
        for (uint64_t at = off; at + 16 <= off + size; at += 16) {
            const unsigned op = (unsigned)(kt_le(b + at, 8) & 0xfff);
            syncs += op == 0x9c5;
            hgmma += op == 0xdf0 || op == 0x9f0;
        }
    }
    return hgmma > 0 && syncs >= hgmma;
}

void kt_entry_valid(kiln__entry *en, const char *spec, const char *arch, int tag)
{
    char material[1024];
    memset(en, 0, sizeof *en);
    snprintf(material, sizeof material, "kiln-key-format: %d\nspec: %s\nconfig: tag=%d\narch: %s\n",
             KILN__FORMAT_VERSION, spec, tag, arch);
    kiln__key_hash(material, en->key);
    en->spec = strdup(spec);
    en->arch = strdup(arch);
    en->nvrtc = strdup("13.0");
    en->key_material = strdup(material);
    en->source = strdup("/* generated - do not edit */\n__global__ void kiln_main(void) {}\n");
    en->log = strdup("ptxas info    : Used 32 registers\n");
    en->cubin = malloc(64);
    if (en->cubin) kt_cubin(en->cubin, tag);
    en->cubin_size = 64;
    en->registers = 32;
    en->smem_bytes = 4096;
    en->compile_ms = 12.5;
}

int kt_cache_fill(const char *dir, const char *const *specs, int n, char (*keys)[33])
{
    kiln__cache *c = NULL;
    kiln__err e = {{0}};
    if (kiln__cache_open(dir, &c, &e)) {
        printf("    kt_cache_fill: %s\n", e.msg);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        kiln__entry en;
        kt_entry_valid(&en, specs[i], "sm_80", i);
        if (kiln__cache_put(c, &en, &e)) {
            printf("    kt_cache_fill: %s\n", e.msg);
            rc = -1;
        }
        if (keys) memcpy(keys[i], en.key, 33);
        kiln__entry_free(&en);
    }
    kiln__cache_close(c);
    return rc;
}

int64_t kt_cache_rows(kiln__cache *c)
{
    kiln__cache_stats s;
    kiln__err e = {{0}};
    if (kiln__cache_stats_get(c, &s, &e) == KILN_STATUS_OK) return s.entries;
    printf("    kt_cache_rows: %s\n", e.msg);
    return -1;
}

kiln__cache *kt__cache_open(const char *file, int line, const char *dir)
{
    kiln__cache *c = NULL;
    kiln__err e = {{0}};
    kiln_status s = kiln__cache_open(dir, &c, &e);
    if (s != KILN_STATUS_OK) {
        kt_fail(file, line, "kiln__cache_open(%s) -> %s: %s", dir, kiln_status_str(s), e.msg);
        return NULL;
    }
    return c;
}
