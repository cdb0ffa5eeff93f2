/*
 * cli_manifest.c — reading a manifest (the input of `kiln warm` and `kiln export --spec-file`)
 * into an ordered list of (spec, arch) pairs.
 *
 *   # comment                                  '#' to the end of the line is a comment
 *   op=decode dtype=bf16 head_dim=128 group=8  a spec: compiled for every arch of --arch
 *   op=decode head_dim={64,128} dtype={f16,bf16}   braces expand: 4 specs
 *   op=prefill head_dim=128 arch=sm_90a        arch= pins the line to its own archs
 *   op=prefill head_dim=64 arch={sm_80,sm_90a} (a list, braces or "all")
 *
 * Quoted values ("..." with \" and \\ escapes, as in logits_expr=) are opaque: '#', braces and
 * blanks inside them are theirs. Every line is checked before anything is compiled; a malformed line is CLI_USAGE naming
 * file:line, and so is input that is not a manifest: a NUL or other control byte (binary
 * input), a line over RAW_LINE_MAX bytes (reading stops there), or more than
 * MANIFEST_SPECS_MAX specs in all. The order of the pairs is the order of the lines, then of each line's archs, so
 * that `--shard I/N` cuts the same list on every host. Repeated (spec, arch) pairs are kept
 * once. docs/fleet.md is the user's description.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "jit.h"

_Static_assert(sizeof(((cli_mspec *)0)->spec) >= KILN__SPEC_MAX, "cli_mspec.spec holds a spec");

/* Most specs one manifest line may expand to. */
#define EXPAND_MAX 4096
/* Longest line after expansion. */
#define LINE_MAX_BYTES (KILN__SPEC_INPUT_MAX + 256)
/* Longest raw line, comment included (docs/fleet.md): a line is one spec, and the reader stops
 * at this many bytes instead of reading an endless line (/dev/zero, a missing newline) into
 * memory. */
#define RAW_LINE_MAX 16384
/* Most brace groups on one line (each is a level of expand's recursion). */
#define BRACES_MAX 32
/* Most specs a whole manifest may expand to, repeats included (docs/fleet.md): bounds the
 * time and memory of reading it before anything compiles. */
#define MANIFEST_SPECS_MAX 65536
/* Most (spec, arch) work items before repeats are dropped. */
#define MANIFEST_PAIRS_MAX (1 << 20)
/* Reading prints a progress line at every this many expanded specs. */
#define PROGRESS_SPECS 8192

/* ---- a small hash set of strings and of pairs ------------------------------------------------ */

/* FNV-1a of s (stable, no dependency). */
static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Grow the table (open addressing, slot -1 = empty) to twice the entries. 0 when out of
 * memory. key(i) gives the hash of entry i. */
static int table_grow(cli_manifest *m, int **slots, int *cap, int count,
                      uint64_t (*key)(const cli_manifest *, int))
{
    if (count * 2 < *cap) return 1;
    int ncap = *cap ? *cap * 2 : 256;
    int *ns = malloc((size_t)ncap * sizeof *ns);
    if (!ns) return 0;
    for (int i = 0; i < ncap; i++) ns[i] = -1;
    for (int i = 0; i < count; i++) {
        uint64_t h = key(m, i);
        size_t at = (size_t)(h % (uint64_t)ncap);
        while (ns[at] >= 0) at = (at + 1) % (size_t)ncap;
        ns[at] = i;
    }
    free(*slots);
    *slots = ns;
    *cap = ncap;
    return 1;
}

static uint64_t spec_key(const cli_manifest *m, int i) { return hash_str(m->specs[i].spec); }

static uint64_t pair_key(const cli_manifest *m, int i)
{
    return (uint64_t)m->pairs[i].spec * 1000003u + (uint64_t)m->pairs[i].arch;
}

/* The index of spec in m (added when new); -1 when out of memory. */
static int spec_index(cli_manifest *m, const kiln_variant *v, const char *spec, int line)
{
    uint64_t h = hash_str(spec);
    if (m->spec_slots) {
        size_t at = (size_t)(h % (uint64_t)m->spec_cap_slots);
        for (; m->spec_slots[at] >= 0; at = (at + 1) % (size_t)m->spec_cap_slots)
            if (!strcmp(m->specs[m->spec_slots[at]].spec, spec)) return m->spec_slots[at];
    }
    if (m->nspecs == m->specs_cap) {
        int cap = m->specs_cap ? 2 * m->specs_cap : 64;
        cli_mspec *s = realloc(m->specs, (size_t)cap * sizeof *s);
        if (!s) return -1;
        m->specs = s;
        m->specs_cap = cap;
    }
    cli_mspec *s = &m->specs[m->nspecs];
    s->v = *v;
    snprintf(s->spec, sizeof s->spec, "%s", spec);
    s->line = line;
    m->nspecs++;
    if (!table_grow(m, &m->spec_slots, &m->spec_cap_slots, m->nspecs, spec_key)) return -1;
    size_t at = (size_t)(h % (uint64_t)m->spec_cap_slots);
    while (m->spec_slots[at] >= 0 && m->spec_slots[at] != m->nspecs - 1)
        at = (at + 1) % (size_t)m->spec_cap_slots;
    m->spec_slots[at] = m->nspecs - 1;
    return m->nspecs - 1;
}

/* Rebuild the pair set from scratch over m->pairs[0..n), dropping repeats (keeps order).
 * 0 when out of memory. */
static int pairs_dedupe(cli_manifest *m)
{
    free(m->pair_slots);
    m->pair_slots = NULL;
    m->pair_cap_slots = 0;
    int n = m->npairs, kept = 0;
    m->npairs = 0;
    for (int i = 0; i < n; i++) {
        cli_pair p = m->pairs[i];
        m->pairs[kept] = p;
        uint64_t h = pair_key(m, kept);
        int dup = 0;
        if (m->pair_slots) {
            size_t at = (size_t)(h % (uint64_t)m->pair_cap_slots);
            for (; m->pair_slots[at] >= 0 && !dup; at = (at + 1) % (size_t)m->pair_cap_slots) {
                const cli_pair *q = &m->pairs[m->pair_slots[at]];
                dup = q->spec == p.spec && q->arch == p.arch;
            }
        }
        if (dup) {
            m->duplicates++;
            continue;
        }
        m->npairs = ++kept;
        if (!table_grow(m, &m->pair_slots, &m->pair_cap_slots, kept, pair_key)) return 0;
        size_t at = (size_t)(h % (uint64_t)m->pair_cap_slots);
        while (m->pair_slots[at] >= 0 && m->pair_slots[at] != kept - 1)
            at = (at + 1) % (size_t)m->pair_cap_slots;
        m->pair_slots[at] = kept - 1;
    }
    return 1;
}

static int pair_add(cli_manifest *m, int spec, int arch)
{
    if (m->npairs == m->pairs_cap) {
        int cap = m->pairs_cap ? 2 * m->pairs_cap : 64;
        cli_pair *p = realloc(m->pairs, (size_t)cap * sizeof *p);
        if (!p) return 0;
        m->pairs = p;
        m->pairs_cap = cap;
    }
    m->pairs[m->npairs++] = (cli_pair){spec, arch};
    return 1;
}

/* ---- quotes and braces ----------------------------------------------------------------------- */

/* The first of the characters `set` in s outside double quotes; NULL when none. */
static char *find_unquoted(const char *s, const char *set)
{
    for (const char *p = s; *p; p++) {
        if (*p == '"') {
            for (p++; *p && *p != '"'; p++)
                if (*p == '\\' && p[1]) p++;
            if (!*p) return NULL;
            continue;
        }
        if (strchr(set, *p)) return (char *)p;
    }
    return NULL;
}

/* A list of expanded lines. */
typedef struct lines {
    char **v;
    int n;
} lines;

static void lines_free(lines *l)
{
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

/* Expand the first {a,b,...} of text, recursively, appending the results to out. Returns 0,
 * or writes why[cap] and returns -1. */
static int expand(const char *text, lines *out, char *why, size_t cap)
{
    const char *open = find_unquoted(text, "{"), *close = find_unquoted(text, "}");
    if (!open && !close) {
        if (out->n >= EXPAND_MAX) {
            snprintf(why, cap, "the line expands to more than %d specs", EXPAND_MAX);
            return -1;
        }
        char **v = realloc(out->v, (size_t)(out->n + 1) * sizeof *v);
        char *copy = v ? strdup(text) : NULL;
        if (v) out->v = v;
        if (!copy) {
            snprintf(why, cap, "out of memory");
            return -1;
        }
        out->v[out->n++] = copy;
        return 0;
    }
    if (!open || !close || close < open) {
        snprintf(why, cap, "unbalanced braces: expected {a,b,...}");
        return -1;
    }
    if (memchr(open + 1, '{', (size_t)(close - open - 1)) ||
        memchr(open + 1, '"', (size_t)(close - open - 1))) {
        snprintf(why, cap, "nested braces and quotes inside braces are not supported");
        return -1;
    }
    size_t pre = (size_t)(open - text);
    for (const char *alt = open + 1;;) {
        size_t n = strcspn(alt, ",}");
        char buf[LINE_MAX_BYTES];
        int len = snprintf(buf, sizeof buf, "%.*s%.*s%s", (int)pre, text, (int)n, alt, close + 1);
        if (len < 0 || (size_t)len >= sizeof buf) {
            snprintf(why, cap, "the expanded line is longer than %d bytes", LINE_MAX_BYTES - 1);
            return -1;
        }
        if (n == 0 || isspace((unsigned char)alt[0])) {
            snprintf(why, cap, "empty alternative in braces");
            return -1;
        }
        if (expand(buf, out, why, cap)) return -1;
        if (alt[n] == '}') break;
        alt += n + 1;
    }
    return 0;
}

/* ---- lines ----------------------------------------------------------------------------------- */

/* Move the token "arch=..." out of text (blanked in place) into value[LINE_MAX_BYTES] ("" when
 * there is none). -1 with why when arch= appears twice. */
static int take_arch(char *text, char *value, char *why, size_t cap)
{
    value[0] = 0;
    for (char *p = text; *p;) {
        while (isspace((unsigned char)*p)) p++;
        char *tok = p;
        char *blank = find_unquoted(p, " \t\r\n\v\f");
        p = blank ? blank : p + strlen(p);
        if (strncmp(tok, "arch=", 5) != 0) continue;
        if (value[0]) {
            snprintf(why, cap, "arch= given twice");
            return -1;
        }
        size_t n = (size_t)(p - tok);
        snprintf(value, LINE_MAX_BYTES, "%.*s", (int)(n - 5), tok + 5);
        if (!value[0]) {
            snprintf(why, cap, "arch= needs a value");
            return -1;
        }
        memset(tok, ' ', n);
    }
    return 0;
}

/* Add one expanded line: its spec for its archs (or the defaults). */
static int add_line(const char *cmd, const char *name, int ln, char *text, cli_manifest *m)
{
    char why[1024], archs[LINE_MAX_BYTES];
    if (take_arch(text, archs, why, sizeof why))
        return cli_fail(cmd, CLI_USAGE, "%s:%d: %s", name, ln, why);
    kiln_variant v;
    char spec[KILN__SPEC_MAX];
    kiln__err e = {{0}};
    if (kiln__spec_parse(text, &v, &e) || kiln__variant_check(&v, &e) ||
        !kiln__spec_format(&v, spec, sizeof spec, &e))
        return cli_fail(cmd, CLI_USAGE, "%s:%d: %s", name, ln, e.msg);
    if (!archs[0] && !m->ndefault)
        return cli_fail(cmd, CLI_USAGE, "%s:%d: no arch= on the line and no --arch given", name,
                        ln);
    int idx[CLI_ARCH_MAX], nidx = m->ndefault;
    for (int i = 0; i < m->ndefault; i++) idx[i] = i;
    if (archs[0]) {
        int rc = cli_archs_add(archs, &m->archs, idx, &nidx, why, sizeof why);
        if (rc) return cli_fail(cmd, rc, "%s:%d: %s", name, ln, why);
    }
    int s = spec_index(m, &v, spec, ln);
    if (s < 0) return cli_fail(cmd, CLI_FAIL, "out of memory reading %s", name);
    for (int i = 0; i < nidx; i++)
        if (!pair_add(m, s, idx[i]))
            return cli_fail(cmd, CLI_FAIL, "out of memory reading %s", name);
    return 0;
}

/* One raw line: strip the comment and blanks, expand braces, add each result. */
static int manifest_line(const char *cmd, const char *name, int ln, char *text, cli_manifest *m)
{
    char *hash = find_unquoted(text, "#");
    if (hash) *hash = 0;
    while (isspace((unsigned char)*text)) text++;
    size_t n = strlen(text);
    while (n && isspace((unsigned char)text[n - 1])) text[--n] = 0;
    if (!n) return 0;
    if (n >= LINE_MAX_BYTES)
        return cli_fail(cmd, CLI_USAGE, "%s:%d: line longer than %d bytes", name, ln,
                        LINE_MAX_BYTES - 1);
    int braces = 0;
    for (char *p = text; (p = find_unquoted(p, "{")); p++) braces++;
    if (braces > BRACES_MAX)
        return cli_fail(cmd, CLI_USAGE, "%s:%d: %d brace groups on one line; at most %d", name, ln,
                        braces, BRACES_MAX);
    lines l = {0};
    char why[256];
    if (expand(text, &l, why, sizeof why)) {
        lines_free(&l);
        return cli_fail(cmd, CLI_USAGE, "%s:%d: %s", name, ln, why);
    }
    if (m->expanded + l.n > MANIFEST_SPECS_MAX) {
        int here = l.n;
        lines_free(&l);
        return cli_fail(cmd, CLI_USAGE,
                        "%s:%d: the manifest expands to more than %d specs (%d before this line, "
                        "%d on it); split it",
                        name, ln, MANIFEST_SPECS_MAX, m->expanded, here);
    }
    int rc = 0, before = m->expanded;
    for (int i = 0; i < l.n && !rc; i++) rc = add_line(cmd, name, ln, l.v[i], m);
    m->expanded += l.n;
    lines_free(&l);
    if (!rc && m->npairs > MANIFEST_PAIRS_MAX)
        return cli_fail(cmd, CLI_USAGE, "%s:%d: the manifest has more than %d (spec, arch) pairs",
                        name, ln, MANIFEST_PAIRS_MAX);
    if (!rc && m->expanded / PROGRESS_SPECS != before / PROGRESS_SPECS)
        fprintf(stderr, "kiln %s: reading %s: line %d, %d specs so far\n", cmd, name, ln,
                m->expanded);
    return rc;
}

/* Read one line of f (without its newline) into line[RAW_LINE_MAX + 1]. Returns 1 for a line,
 * 0 at the end of the input, or the exit status after printing why: a NUL byte or another
 * control character (binary input), a line longer than RAW_LINE_MAX, a read error. */
static int read_line(const char *cmd, const char *name, int ln, FILE *f, char *line)
{
    size_t n = 0;
    int ch;
    while ((ch = getc(f)) != EOF && ch != '\n') {
        if (ch == 0 || (ch < 0x20 && !strchr("\t\r\v\f", ch)) || ch == 0x7f)
            return cli_fail(cmd, CLI_USAGE,
                            "%s:%d: byte 0x%02x at column %zu: a manifest is text (is this a "
                            "binary file?)",
                            name, ln, ch, n + 1);
        if (n == RAW_LINE_MAX)
            return cli_fail(cmd, CLI_USAGE,
                            "%s:%d: line longer than %d bytes (a manifest line is one spec); "
                            "stopped reading",
                            name, ln, RAW_LINE_MAX);
        line[n++] = (char)ch;
    }
    line[n] = 0;
    if (ferror(f)) return cli_fail(cmd, CLI_FAIL, "cannot read %s: %s", name, strerror(errno));
    return ch == EOF && n == 0 ? 0 : 1;
}

int cli_manifest_read(const char *cmd, const char *path, const cli_archs *deflt, cli_manifest *m)
{
    memset(m, 0, sizeof *m);
    m->archs = *deflt;
    m->ndefault = deflt->n;
    int use_stdin = !strcmp(path, "-");
    const char *name = use_stdin ? "<stdin>" : path;
    FILE *f = use_stdin ? stdin : fopen(path, "r");
    if (!f) return cli_fail(cmd, CLI_USAGE, "cannot open manifest %s: %s", path, strerror(errno));
    char *line = malloc(RAW_LINE_MAX + 1);
    int ln = 0, rc = line ? 0 : cli_fail(cmd, CLI_FAIL, "out of memory reading %s", name);
    while (!rc) {
        int got = read_line(cmd, name, ++ln, f, line);
        if (got != 1) {
            rc = got;
            break;
        }
        rc = manifest_line(cmd, name, ln, line, m);
    }
    if (!rc && m->expanded >= PROGRESS_SPECS)
        fprintf(stderr, "kiln %s: read %s: %d lines, %d specs (%d distinct)\n", cmd, name, ln - 1,
                m->expanded, m->nspecs);
    free(line);
    if (!use_stdin) fclose(f);
    if (!rc && !pairs_dedupe(m)) rc = cli_fail(cmd, CLI_FAIL, "out of memory reading %s", name);
    return rc;
}

int cli_manifest_needs_native(const cli_manifest *m)
{
    for (int i = 0; i < m->npairs; i++)
        if (!m->archs.a[m->pairs[i].arch][0]) return 1;
    /* an empty manifest still asked for the GPU's arch: say there is none */
    for (int i = 0; !m->npairs && i < m->ndefault; i++)
        if (!m->archs.a[i][0]) return 1;
    return 0;
}

int cli_manifest_resolve(const char *cmd, kiln_ctx *ctx, cli_manifest *m)
{
    if (!cli_manifest_needs_native(m)) return 0;
    if (!ctx) return cli_fail(cmd, CLI_USAGE, "%s", CLI_NO_GPU_MSG);
    kiln_device_info di;
    if (kiln_ctx_device(ctx, &di) || !di.present || !di.arch[0])
        return cli_fail(cmd, CLI_USAGE, "%s", CLI_NO_GPU_MSG);
    cli_archs old = m->archs;
    int map[CLI_ARCH_MAX];
    char msg[256];
    memset(&m->archs, 0, sizeof m->archs);
    for (int i = 0; i < old.n; i++) {
        int one = 0, n = 0;
        if (cli_archs_add(old.a[i][0] ? old.a[i] : di.arch, &m->archs, &one, &n, msg, sizeof msg))
            return cli_fail(cmd, CLI_FAIL, "%s", msg);
        map[i] = one;
    }
    for (int i = 0; i < m->npairs; i++) m->pairs[i].arch = map[m->pairs[i].arch];
    if (!pairs_dedupe(m)) return cli_fail(cmd, CLI_FAIL, "out of memory");
    return 0;
}

void cli_manifest_free(cli_manifest *m)
{
    free(m->specs);
    free(m->pairs);
    free(m->spec_slots);
    free(m->pair_slots);
    memset(m, 0, sizeof *m);
}
