/*
 * fuzz_cacherow.c — libFuzzer target: a cache file whose tables were edited behind kiln's back,
 * as a shipped base cache or a shard to merge may be. SQLite columns take any type, so a row
 * may hold a blob where kiln wrote text, text where it wrote a number, NULL, or a key that is
 * not 32 hex digits; the meta table may name any schema version and the stats table any
 * count. The input picks one edit of a valid cache (one sealed row, kiln__cache_put's); then
 * the cache is opened as `kiln ls`, `show`, `verify` and a lookup open it, and every reader
 * runs: get, resolve, stats, per-arch stats, each, the full scan with the row check, then
 * eviction and compaction. Each
 * answers with a status (a row that changed fails its checksum or its row check, with a
 * reason); none crashes, and a lookup that succeeds returns the key asked for with a cubin
 * that passes kiln__cubin_check.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#include "cache.h"
#include "jit.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static char base[400], tmpl[420], work[420], db[440];
static char key[33];

static const char *const COLS[] = {"key",          "spec",       "arch",       "nvrtc",
                                   "key_material", "source",     "log",        "cubin",
                                   "checksum",     "registers",  "smem_bytes", "spill_bytes",
                                   "stack_bytes",  "compile_ms", "created",    "last_used",
                                   "hits",         "row_sum"};
enum { NCOLS = sizeof COLS / sizeof COLS[0] };

static int copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = a ? fopen(to, "wb") : NULL;
    int ok = a && b;
    char buf[65536];
    for (size_t n; ok && (n = fread(buf, 1, sizeof buf, a)) > 0;) ok = fwrite(buf, 1, n, b) == n;
    if (a) fclose(a);
    if (b && fclose(b)) ok = 0;
    return ok;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    /* $KILN_FUZZ_TMP (fuzz.sh's build directory, the test suite's own), else /tmp */
    const char *tmp = getenv("KILN_FUZZ_TMP");
    snprintf(base, sizeof base, "%s/kiln-fuzz-cacherow-%d", tmp ? tmp : "/tmp", (int)getpid());
    snprintf(tmpl, sizeof tmpl, "%s/t", base);
    snprintf(work, sizeof work, "%s/w", base);
    snprintf(db, sizeof db, "%s/kernels.db", work);
    kiln__cache *c = NULL;
    kiln__err e = {{0}};
    /* the parent and the work directory; kiln__cache_open makes the template's own */
    if ((mkdir(base, 0700) && errno != EEXIST) || (mkdir(work, 0700) && errno != EEXIST) ||
        kiln__cache_open(tmpl, &c, &e)) {
        fprintf(stderr, "fuzz_cacherow: %s: %s\n", tmpl, e.msg);
        abort();
    }
    /* one row as kiln writes it (a minimal CUDA ELF header stands for the cubin) */
    kiln__entry en;
    memset(&en, 0, sizeof en);
    char material[256];
    snprintf(material, sizeof material,
             "kiln-key-format: %d\nspec: op=decode dtype=f16 head_dim=64\narch: sm_90a\n",
             KILN__FORMAT_VERSION);
    kiln__key_hash(material, en.key);
    memcpy(key, en.key, sizeof key);
    unsigned char cubin[64] = {0x7f, 'E', 'L', 'F', 2, 1, 1};
    cubin[18] = 190;
    cubin[52] = 64;
    en.spec = "op=decode dtype=f16 head_dim=64";
    en.arch = "sm_90a";
    en.nvrtc = "13.0";
    en.key_material = material;
    en.source = "__global__ void kiln_main(void) {}\n";
    en.log = "ptxas info    : Used 32 registers\n";
    en.cubin = cubin;
    en.cubin_size = sizeof cubin;
    en.registers = 32;
    if (kiln__cache_put(c, &en, &e)) {
        fprintf(stderr, "fuzz_cacherow: put: %s\n", e.msg);
        abort();
    }
    kiln__cache_close(c);
    return 0;
}

static int visit_count(const kiln__entry *en, void *user)
{
    (void)en;
    ++*(int *)user;
    return 0;
}

static int visit_check(const kiln__entry *en, void *user)
{
    (void)user;
    const kiln__row_rules rules = {kiln__key_hash, KILN__FORMAT_VERSION};
    char why[512];
    (void)kiln__cache_row_check(en, &rules, why, sizeof why);
    return 0;
}

/* Bind the input's value to parameter 1 as the type it picks. */
static void bind_value(sqlite3_stmt *st, unsigned type, const uint8_t *v, size_t n)
{
    int64_t x = 0;
    memcpy(&x, v, n < sizeof x ? n : sizeof x);
    switch (type % 6) {
        case 0:
            sqlite3_bind_null(st, 1);
            break;
        case 1:
            sqlite3_bind_int64(st, 1, x);
            break;
        case 2:
            sqlite3_bind_double(st, 1, (double)x / 7.0);
            break;
        case 3:
            sqlite3_bind_text(st, 1, (const char *)v, (int)n, SQLITE_TRANSIENT);
            break;
        case 4:
            sqlite3_bind_blob(st, 1, v, (int)n, SQLITE_TRANSIENT);
            break;
        default:
            sqlite3_bind_zeroblob(st, 1, (int)(x & 0xfffff));
            break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3) return 0;
    char path[480];
    static const char *const files[] = {"", "-wal", "-shm", "-hits"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s%s", db, files[i]);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/kernels.db", tmpl);
    if (!copy_file(path, db)) abort();
    /* the edit */
    sqlite3 *s = NULL;
    if (sqlite3_open_v2(db, &s, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK) {
        char sql[200];
        const unsigned what = data[0] % 4, type = data[1];
        switch (what) {
            case 0:
                snprintf(sql, sizeof sql, "UPDATE kernels SET %s = ?1", COLS[data[2] % NCOLS]);
                break;
            case 1:
                snprintf(sql, sizeof sql, "UPDATE meta SET v = ?1 WHERE k = 'schema_version'");
                break;
            case 2:
                snprintf(sql, sizeof sql, "UPDATE stats SET v = ?1 WHERE k = '%s'",
                         data[2] & 1 ? "hits" : "misses");
                break;
            default:
                snprintf(sql, sizeof sql,
                         "INSERT INTO kernels SELECT ?1, spec, arch, nvrtc, key_material, source, "
                         "log, cubin, "
                         "checksum, registers, smem_bytes, spill_bytes, stack_bytes, compile_ms, "
                         "created, "
                         "last_used, hits, row_sum FROM kernels");
                break;
        }
        sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(s, sql, -1, &st, NULL) == SQLITE_OK) {
            bind_value(st, type, data + 3, size - 3);
            (void)sqlite3_step(st);
        }
        sqlite3_finalize(st);
    }
    sqlite3_close(s);
    /* every reader */
    kiln__cache *c = NULL;
    kiln__err e = {{0}};
    if (kiln__cache_open_ex(work, KILN__CACHE_EXISTING, &c, &e) == KILN_STATUS_OK) {
        kiln__entry en;
        memset(&en, 0, sizeof en);
        if (kiln__cache_get(c, key, 1, &en, &e) == KILN_STATUS_OK) {
            char why[256];
            if (strcmp(en.key, key) ||
                kiln__cubin_check(en.cubin, en.cubin_size, why, sizeof why)) {
                fprintf(stderr, "fuzz_cacherow: a lookup returned key %s, cubin: %s\n", en.key,
                        why);
                abort();
            }
            kiln__entry_free(&en);
        }
        char k[33];
        (void)kiln__cache_resolve(c, "0", k, &e);
        (void)kiln__cache_resolve(c, key, k, &e);
        kiln__cache_stats cs;
        (void)kiln__cache_stats_get(c, &cs, &e);
        kiln__arch_stats as[8];
        int n = 0;
        int64_t zeroed = 0;
        (void)kiln__cache_arch_stats(c, as, 8, &n, &zeroed, &e);
        int rows = 0;
        (void)kiln__cache_each(c, visit_count, &rows, &e);
        (void)kiln__cache_scan(c, visit_check, NULL, &e);
        /* and the writers that tidy a cache: eviction (to nothing or to 1 MiB), then compaction */
        int removed = 0;
        int64_t freed = 0;
        (void)kiln__cache_evict(c, data[1] & 1 ? 0 : 1 << 20, NULL, &removed, &freed, &e);
        (void)kiln__cache_compact(c, data[1] & 2, &e);
        kiln__cache_close(c);
    }
    return 0;
}
