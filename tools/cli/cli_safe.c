/*
 * cli_safe.c — what the `kiln` commands write and print, made safe for the user: an output
 * file is never the cache being read (its database, -wal, -shm, -journal or hit log, by device
 * and inode, not by name) and never an existing file (the CLI has no --force: a file the user
 * owns is not overwritten), and text read from a cache row is escaped before it reaches a
 * terminal, so that a tampered row cannot move the cursor, retitle the window or hide lines.
 * docs/cache.md ("What the CLI prints and writes") is the user's description.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

/* The files SQLite and the hit log (cache/hits.c) keep beside a database: suffixes of its
 * name. */
static const char *const side_suffix[] = {"", "-wal", "-shm", "-journal", "-hits", "-hits-fold"};

/* Split path into its directory dir[cap] ("." when it has none) and its last component. */
static const char *split_path(const char *path, char *dir, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(dir, cap, ".");
        return path;
    }
    snprintf(dir, cap, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    return slash + 1;
}

/* 1 when a and b are the same directory entry's target: same device and inode. */
static int same_inode(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

int cli_path_is_cache(const char *path, const kiln__cache *c, char *what, size_t cap)
{
    const char *db = kiln__cache_path(c);
    char pdir[4096], cdir[4096];
    const char *pbase = split_path(path, pdir, sizeof pdir);
    const char *cbase = split_path(db, cdir, sizeof cdir);
    struct stat ps, pd, cd;
    int exists = stat(path, &ps) == 0;
    int dirs_same = stat(pdir, &pd) == 0 && stat(cdir, &cd) == 0 && same_inode(&pd, &cd);
    for (size_t i = 0; i < sizeof side_suffix / sizeof side_suffix[0]; i++) {
        char side[4200];
        struct stat ss;
        snprintf(side, sizeof side, "%s%s", db, side_suffix[i]);
        /* an existing file: by inode (hard links, symlinks, other spellings); a file not
         * there yet: by its directory's inode and its name (SQLite may create it later) */
        int hit = exists ? stat(side, &ss) == 0 && same_inode(&ps, &ss)
                         : dirs_same && strncmp(pbase, cbase, strlen(cbase)) == 0 &&
                               !strcmp(pbase + strlen(cbase), side_suffix[i]);
        if (hit) {
            snprintf(what, cap, "%s", side);
            return 1;
        }
    }
    return 0;
}

int cli_output_open(const char *cmd, const char *path, const kiln__cache *c, int *fd)
{
    char what[4200];
    *fd = -1;
    if (!*path) return cli_fail(cmd, CLI_USAGE, "the output file name is empty");
    if (c && cli_path_is_cache(path, c, what, sizeof what))
        return cli_fail(cmd, CLI_USAGE,
                        "%s is the cache being read (%s); refusing to write over it", path, what);
    /* O_EXCL: an existing file (or a symlink, even a dangling one) is refused atomically */
    *fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (*fd >= 0) return CLI_OK;
    if (errno == EEXIST)
        return cli_fail(cmd, CLI_USAGE,
                        "%s already exists; refusing to overwrite it (remove it or name a new "
                        "file)",
                        path);
    return cli_fail(cmd, CLI_FAIL, "cannot create %s: %s", path, strerror(errno));
}

/* Bytes a terminal may act on: C0 controls (but \n and \t where allowed), DEL. */
static int is_control(unsigned char ch, int keep_lines)
{
    if (keep_lines && (ch == '\n' || ch == '\t')) return 0;
    return ch < 0x20 || ch == 0x7f;
}

/* The escaped form of the character at p into out[12]; returns how many bytes of p it took
 * (0 when p[0] needs no escape). */
static int escape_one(const unsigned char *p, int keep_lines, char out[12])
{
    if (is_control(p[0], keep_lines)) {
        snprintf(out, 12, "\\x%02x", p[0]);
        return 1;
    }
    if (p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) {
        /* a C1 control in UTF-8 (U+0080..U+009F; U+009B is a CSI on some terminals) */
        snprintf(out, 12, "\\u%04x", p[1]);
        return 2;
    }
    return 0;
}

void cli_put_safe(FILE *f, const char *s, int keep_lines)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    char esc[12];
    while (*p) {
        int n = escape_one(p, keep_lines, esc);
        if (n) fputs(esc, f);
        else fputc(*p, f);
        p += n ? n : 1;
    }
}

const char *cli_safe(const char *s, char *buf, size_t cap)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    size_t len = 0;
    char esc[12];
    while (*p) {
        int n = escape_one(p, 0, esc);
        const char *piece = n ? esc : (const char *)p;
        size_t plen = n ? strlen(esc) : 1;
        if (len + plen + 4 > cap) { /* room for "..." and the NUL */
            snprintf(buf + len, cap - len, "...");
            return buf;
        }
        memcpy(buf + len, piece, plen);
        len += plen;
        p += n ? n : 1;
    }
    buf[len] = 0;
    return buf;
}

void cli_put_text(FILE *f, const char *s)
{
    if (isatty(fileno(f))) cli_put_safe(f, s, 1);
    else fputs(s ? s : "", f);
}
