/*
 * verify.c — integrity of whole rows: the cubin container check (a whole 64-bit ELF for the
 * CUDA machine, nothing missing and nothing trailing), the full row check (stored checksum,
 * key recomputed from the key material, key format version, labels, cubin), and the streaming
 * scan that `kiln verify`, `kiln merge` and `kiln export` read rows with.
 */
#include "store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ELF64 constants (from the ELF specification; no <elf.h> needed). */
#define ELF_EHDR_SIZE    64
#define ELF_CLASS64      2
#define ELF_DATA_LSB     1
#define ELF_MACHINE_CUDA 190
#define ELF_SHT_NOBITS   8
#define ELF_SHDR_MIN     64
#define ELF_PHDR_MIN     56

/* The line the key material starts with (jit/key.c writes it). */
#define FORMAT_PREFIX "kiln-key-format: "

/* ---- the cubin container -------------------------------------------------------------------- */

static uint64_t le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* Grow *end to off + len; 0 when that leaves the file of `size` bytes. */
static int extent(uint64_t off, uint64_t len, size_t size, uint64_t *end)
{
    if (off > size || len > size - off) return 0;
    if (off + len > *end) *end = off + len;
    return 1;
}

int kiln__cubin_check(const void *cubin, size_t size, char *why, size_t cap)
{
    const unsigned char *b = cubin;
    if (!b || size < ELF_EHDR_SIZE) {
        snprintf(why, cap, "the cubin is %zu bytes, too short for an ELF header", size);
        return 1;
    }
    if (memcmp(b, "\177ELF", 4) != 0) {
        snprintf(why, cap, "the cubin does not start with the ELF magic (%02x %02x %02x %02x)",
                 b[0], b[1], b[2], b[3]);
        return 1;
    }
    if (b[4] != ELF_CLASS64 || b[5] != ELF_DATA_LSB || le(b + 18, 2) != ELF_MACHINE_CUDA) {
        snprintf(why, cap,
                 "the cubin is not a 64-bit little-endian CUDA ELF (class %d, data %d, "
                 "machine %d)",
                 b[4], b[5], (int)le(b + 18, 2));
        return 1;
    }
    uint64_t phoff = le(b + 32, 8), shoff = le(b + 40, 8);
    uint64_t phent = le(b + 54, 2), phnum = le(b + 56, 2);
    uint64_t shent = le(b + 58, 2), shnum = le(b + 60, 2);
    uint64_t end = ELF_EHDR_SIZE;
    int ok = (!phnum || phent >= ELF_PHDR_MIN) && (!shnum || shent >= ELF_SHDR_MIN) &&
             extent(phoff, phnum * phent, size, &end) && extent(shoff, shnum * shent, size, &end);
    for (uint64_t i = 0; ok && i < shnum; i++) {
        const unsigned char *sh = b + shoff + i * shent;
        if (le(sh + 4, 4) != ELF_SHT_NOBITS)
            ok = extent(le(sh + 24, 8), le(sh + 32, 8), size, &end);
    }
    for (uint64_t i = 0; ok && i < phnum; i++) {
        const unsigned char *ph = b + phoff + i * phent;
        ok = extent(le(ph + 8, 8), le(ph + 32, 8), size, &end);
    }
    if (!ok) {
        snprintf(why, cap, "the cubin is truncated: its ELF headers point past its %zu bytes",
                 size);
        return 1;
    }
    if (end != size) {
        snprintf(why, cap,
                 "the cubin's size does not match its ELF layout (%zu bytes stored, "
                 "%llu described)",
                 size, (unsigned long long)end);
        return 1;
    }
    return 0;
}

/* ---- the row checksum ----------------------------------------------------------------------- */

/* Append "<name> <length>:<bytes>\n" to s: length-prefixed, so no two rows serialise alike. */
static void seal_text(kiln__str *s, const char *name, const char *text)
{
    const char *t = text ? text : "";
    kiln__str_printf(s, "%s %zu:", name, strlen(t));
    kiln__str_puts(s, t);
    kiln__str_puts(s, "\n");
}

int kiln__entry_seal(const kiln__entry *en, const char cubin_sum[33], char out[33])
{
    kiln__str s = {0};
    kiln__str_puts(&s, "kiln-row-seal 1\n");
    seal_text(&s, "key", en->key);
    seal_text(&s, "spec", en->spec);
    seal_text(&s, "arch", en->arch);
    seal_text(&s, "nvrtc", en->nvrtc);
    seal_text(&s, "key_material", en->key_material);
    seal_text(&s, "source", en->source);
    seal_text(&s, "log", en->log);
    seal_text(&s, "cubin", cubin_sum);
    /* %a: the exact bits of the double, as SQLite's REAL returns them */
    kiln__str_printf(&s, "numbers %d %d %d %d %a\n", en->registers, en->smem_bytes, en->spill_bytes,
                     en->stack_bytes, en->compile_ms);
    out[0] = 0;
    if (s.oom) {
        kiln__str_free(&s);
        return 0;
    }
    kiln__hash128(s.p, s.len, out);
    kiln__str_free(&s);
    return 1;
}

#define SEAL_COLS                                                                                  \
    "key, spec, arch, nvrtc, key_material, source, log, cubin, checksum, registers, smem_bytes, "  \
    "spill_bytes, stack_bytes, compile_ms"

int kiln__cache_seal_rows(kiln__cache *c)
{
    sqlite3_stmt *rd = NULL, *wr = NULL;
    int write_failed = 0;
    int rc =
        kiln__cache_prepare(c, "SELECT rowid, " SEAL_COLS " FROM kernels WHERE row_sum = ''", &rd);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(c->db, "UPDATE kernels SET row_sum = ?1 WHERE rowid = ?2", -1, &wr,
                                NULL);
    /* the update changes no column the read orders or filters by but row_sum, which takes
     * the row out of the read's WHERE: each row is visited once */
    while (rc == SQLITE_OK && (rc = kiln__cache_step(c, rd)) == SQLITE_ROW) {
        kiln__entry en;
        memset(&en, 0, sizeof en);
        const unsigned char *k = sqlite3_column_text(rd, 1);
        snprintf(en.key, sizeof en.key, "%s", k ? (const char *)k : "");
        en.spec = (char *)sqlite3_column_text(rd, 2);
        en.arch = (char *)sqlite3_column_text(rd, 3);
        en.nvrtc = (char *)sqlite3_column_text(rd, 4);
        en.key_material = (char *)sqlite3_column_text(rd, 5);
        en.source = (char *)sqlite3_column_text(rd, 6);
        en.log = (char *)sqlite3_column_text(rd, 7);
        const void *blob = sqlite3_column_blob(rd, 8);
        size_t n = (size_t)sqlite3_column_bytes(rd, 8);
        const unsigned char *stored = sqlite3_column_text(rd, 9);
        en.registers = sqlite3_column_int(rd, 10);
        en.smem_bytes = sqlite3_column_int(rd, 11);
        en.spill_bytes = sqlite3_column_int(rd, 12);
        en.stack_bytes = sqlite3_column_int(rd, 13);
        en.compile_ms = sqlite3_column_double(rd, 14);
        char sum[33], seal[33];
        kiln__hash128(blob, n, sum);
        rc = SQLITE_OK;
        /* a cubin that fails its checksum is not vouched for: it stays unsealed */
        if (!n || !stored || strcmp(sum, (const char *)stored) != 0) continue;
        if (!kiln__entry_seal(&en, sum, seal)) {
            rc = SQLITE_NOMEM;
            break;
        }
        sqlite3_reset(wr);
        rc = sqlite3_bind_text(wr, 1, seal, -1, SQLITE_TRANSIENT);
        if (rc == SQLITE_OK) rc = sqlite3_bind_int64(wr, 2, sqlite3_column_int64(rd, 0));
        if (rc == SQLITE_OK) rc = kiln__cache_step(c, wr);
        if (rc == SQLITE_DONE) rc = SQLITE_OK;
        else write_failed = 1;
    }
    if (rc == SQLITE_DONE) rc = SQLITE_OK;
    /* the statement that failed is finalised last: it leaves its message in the connection */
    sqlite3_finalize(write_failed ? rd : wr);
    sqlite3_finalize(write_failed ? wr : rd);
    return rc;
}

/* ---- the whole row -------------------------------------------------------------------------- */

/* The value of the material's line "<name>: <value>" into out[cap]; "" when absent. */
static void material_line(const char *m, const char *name, char *out, size_t cap)
{
    out[0] = 0;
    size_t n = strlen(name);
    for (const char *p = m; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, name, n) || p[n] != ':' || p[n + 1] != ' ') continue;
        size_t len = strcspn(p + n + 2, "\n");
        snprintf(out, cap, "%.*s", (int)len, p + n + 2);
        return;
    }
}

int kiln__cache_row_check(const kiln__entry *en, const kiln__row_rules *r, char *why, size_t cap)
{
    char sum[33], key[33], text[256];
    if (!en->cubin || !en->cubin_size) {
        snprintf(why, cap, "empty cubin");
        return 1;
    }
    kiln__hash128(en->cubin, en->cubin_size, sum);
    if (strcmp(sum, en->checksum) != 0) {
        snprintf(why, cap, "checksum mismatch: stored %.32s, computed %s", en->checksum, sum);
        return 1;
    }
    const char *m = en->key_material ? en->key_material : "";
    if (r && r->format_version > 0) {
        long v = strncmp(m, FORMAT_PREFIX, strlen(FORMAT_PREFIX))
                     ? -1
                     : strtol(m + strlen(FORMAT_PREFIX), NULL, 10);
        if (v != r->format_version) {
            snprintf(why, cap, "unknown key format version %ld (this kiln knows %d)", v,
                     r->format_version);
            return 1;
        }
    }
    if (r && r->key_fn) {
        r->key_fn(m, key);
        if (strcmp(key, en->key) != 0) {
            snprintf(why, cap, "the key does not match its key material (which hashes to %s)", key);
            return 1;
        }
    }
    material_line(m, "arch", text, sizeof text);
    if (strcmp(text, en->arch ? en->arch : "") != 0) {
        snprintf(why, cap, "its arch '%s' disagrees with its key material ('%s')", en->arch, text);
        return 1;
    }
    material_line(m, "spec", text, sizeof text);
    if (strcmp(text, en->spec ? en->spec : "") != 0) {
        snprintf(why, cap, "its spec disagrees with its key material ('%.100s')", text);
        return 1;
    }
    if (kiln__cubin_check(en->cubin, en->cubin_size, why, cap)) return 1;
    /* last: every check above names what is wrong; this one catches what they cannot see
     * (an edited source, log, nvrtc or number, a key and material changed together) */
    if (!en->unsealed) {
        char seal[33];
        if (!kiln__entry_seal(en, sum, seal)) {
            snprintf(why, cap, "out of memory computing the row checksum");
            return 1;
        }
        if (!en->row_sum[0]) {
            snprintf(why, cap,
                     "the row has no row checksum (its cubin failed its checksum when "
                     "the file was migrated, or the column was cleared)");
            return 1;
        }
        if (strcmp(seal, en->row_sum) != 0) {
            snprintf(why, cap,
                     "row checksum mismatch: a stored field (spec, arch, source, log, "
                     "key material, key, numbers) was changed: stored %.32s, computed %s",
                     en->row_sum, seal);
            return 1;
        }
    }
    return 0;
}

/* ---- scan ----------------------------------------------------------------------------------- */

/* The scan's columns; the row checksum is '' in a file that predates it (read as it is). */
#define SCAN_SQL(row_sum)                                                                          \
    "SELECT key, spec, arch, nvrtc, key_material, source, log, cubin, checksum, registers, "       \
    "smem_bytes, spill_bytes, stack_bytes, compile_ms, created, last_used, hits, " row_sum         \
    " FROM kernels ORDER BY key"

/* A malloc'd copy of text column i ("" for NULL). */
static char *col(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return kiln__strdup(t ? (const char *)t : "");
}

/* Fill en from the current row of SCAN_SQL. 0 when out of memory. */
static int read_row(sqlite3_stmt *st, kiln__entry *en)
{
    memset(en, 0, sizeof *en);
    const unsigned char *k = sqlite3_column_text(st, 0);
    snprintf(en->key, sizeof en->key, "%s", k ? (const char *)k : "");
    en->spec = col(st, 1);
    en->arch = col(st, 2);
    en->nvrtc = col(st, 3);
    en->key_material = col(st, 4);
    en->source = col(st, 5);
    en->log = col(st, 6);
    size_t n = (size_t)sqlite3_column_bytes(st, 7);
    const void *blob = sqlite3_column_blob(st, 7);
    if (n && blob) {
        en->cubin = kiln__fault("malloc") ? NULL : malloc(n);
        if (!en->cubin) return 0;
        memcpy(en->cubin, blob, n);
        en->cubin_size = n;
    }
    const unsigned char *sum = sqlite3_column_text(st, 8);
    snprintf(en->checksum, sizeof en->checksum, "%s", sum ? (const char *)sum : "");
    en->registers = sqlite3_column_int(st, 9);
    en->smem_bytes = sqlite3_column_int(st, 10);
    en->spill_bytes = sqlite3_column_int(st, 11);
    en->stack_bytes = sqlite3_column_int(st, 12);
    en->compile_ms = sqlite3_column_double(st, 13);
    en->created = sqlite3_column_int64(st, 14);
    en->last_used = sqlite3_column_int64(st, 15);
    en->hits = sqlite3_column_int64(st, 16);
    const unsigned char *seal = sqlite3_column_text(st, 17);
    snprintf(en->row_sum, sizeof en->row_sum, "%s", seal ? (const char *)seal : "");
    return en->spec && en->arch && en->nvrtc && en->key_material && en->source && en->log;
}

kiln_status kiln__cache_scan(kiln__cache *c, kiln__cache_visit fn, void *user, kiln__err *e)
{
    if (!c || !fn)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "cache: scan needs a cache and a function");
    kiln_status s = KILN_STATUS_OK;
    pthread_mutex_lock(&c->lock);
    kiln__hits_fold_locked(c, KILN__HITS_APPLY, -1); /* a copy made from the scan has them */
    sqlite3_stmt *st = NULL;
    int rc = kiln__cache_prepare(c, c->sealed ? SCAN_SQL("row_sum") : SCAN_SQL("''"), &st);
    while (rc == SQLITE_OK && (rc = kiln__cache_step(c, st)) == SQLITE_ROW) {
        kiln__entry en;
        int ok = read_row(st, &en);
        en.unsealed = !c->sealed;
        int stop = ok ? fn(&en, user) : 0;
        kiln__entry_free(&en);
        if (!ok) {
            s = kiln__fail(e, KILN_STATUS_NO_MEMORY, "cache %s: scan: out of memory", c->path);
            break;
        }
        rc = stop ? SQLITE_DONE : SQLITE_OK;
        if (stop) break;
    }
    if (!s && rc != SQLITE_DONE) s = kiln__cache_fail(c, e, "scanning the rows");
    sqlite3_finalize(st);
    pthread_mutex_unlock(&c->lock);
    return s;
}

kiln_status kiln__cache_checksum(kiln__cache *c, const char *key, char sum[33], kiln__err *e)
{
    if (sum) sum[0] = 0;
    if (!c || !key || !sum)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "cache: checksum needs a cache and a key");
    pthread_mutex_lock(&c->lock);
    sqlite3_stmt *st = NULL;
    kiln_status s = KILN_STATUS_OK;
    int rc = kiln__cache_prepare(c, "SELECT checksum FROM kernels WHERE key = ?1", &st);
    if (rc == SQLITE_OK) rc = sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK) rc = kiln__cache_step(c, st);
    if (rc == SQLITE_ROW) {
        const unsigned char *t = sqlite3_column_text(st, 0);
        snprintf(sum, 33, "%s", t ? (const char *)t : "");
    } else if (rc == SQLITE_DONE) {
        s = kiln__fail(e, KILN_STATUS_NOT_FOUND, "cache %s: no entry %s", c->path, key);
    } else {
        s = kiln__cache_fail(c, e, "reading the checksum of %s", key);
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&c->lock);
    return s;
}

kiln_status kiln__cache_integrity(kiln__cache *c, kiln__err *e)
{
    if (!c) return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "cache: integrity needs a cache");
    pthread_mutex_lock(&c->lock);
    sqlite3_stmt *st = NULL;
    kiln_status s = KILN_STATUS_OK;
    int rc = kiln__cache_prepare(c, "PRAGMA integrity_check", &st);
    if (rc == SQLITE_OK) rc = kiln__cache_step(c, st);
    if (rc == SQLITE_ROW) {
        const unsigned char *t = sqlite3_column_text(st, 0);
        if (!t || strcmp((const char *)t, "ok") != 0)
            s = kiln__fail(e, KILN_STATUS_CACHE, "cache %s: integrity check failed: %.300s",
                           c->path, t ? (const char *)t : "(no answer)");
    } else {
        s = kiln__cache_fail(c, e, "integrity check");
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&c->lock);
    return s;
}
