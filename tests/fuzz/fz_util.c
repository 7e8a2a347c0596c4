/* fz_util.c — helpers of the libFuzzer harnesses (see fz_util.h). */
#include "tests/fuzz/fz_util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/support/tt_support.h"

void fz_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("fuzz harness: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

void fz_data_path(const char *rel, char *out, size_t cap)
{
    const char *d = getenv("TANGRAM_DATA");
    int w = snprintf(out, cap, "%s/%s", d && *d ? d : FZ_DATA_DIR, rel);
    if (w < 0 || (size_t)w >= cap)
        fz_fail("data path %s/%s is longer than %zu bytes",
                d && *d ? d : FZ_DATA_DIR, rel, cap - 1);
}

void fz_bin_path(const char *name, char *out, size_t cap)
{
    const char *d = getenv("TANGRAM_BIN");
    int w = snprintf(out, cap, "%s/%s", d && *d ? d : FZ_BIN_DIR, name);
    if (w < 0 || (size_t)w >= cap)
        fz_fail("program path %s/%s is longer than %zu bytes",
                d && *d ? d : FZ_BIN_DIR, name, cap - 1);
}

void fz_env_defaults(void)
{
    setenv("TANGRAM_DATA", FZ_DATA_DIR, 0);
    setenv("TANGRAM_BIN", FZ_BIN_DIR, 0);
}

void fz_memfile_open(struct fz_memfile *f, const void *data, size_t n)
{
    f->fd = memfd_create("fz", MFD_CLOEXEC);
    if (f->fd < 0)
        fz_fail("memfd_create: %s", strerror(errno));
    const char *p = data;
    while (n > 0) {
        ssize_t w = write(f->fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            fz_fail("write to memfd: %s", strerror(errno));
        p += w;
        n -= (size_t)w;
    }
    snprintf(f->path, sizeof(f->path), "/proc/self/fd/%d", f->fd);
}

void fz_memfile_close(struct fz_memfile *f)
{
    if (f->fd >= 0)
        close(f->fd);
    f->fd = -1;
}

void fz_write_file(const char *dir, const char *name, const void *data,
                   size_t n)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *fp = fopen(path, "wb");
    if (!fp || (n > 0 && fwrite(data, 1, n, fp) != n) || fclose(fp) != 0)
        fz_fail("cannot write %s: %s", path, strerror(errno));
}

static char scratch[8][256];
static int n_scratch;

static void remove_scratch(void)
{
    for (int i = 0; i < n_scratch; i++)
        tt_tmpdir_remove(scratch[i]);
}

void fz_scratch_dir(const char *prefix, char *out, size_t cap)
{
    if (n_scratch == (int)(sizeof(scratch) / sizeof(scratch[0])))
        fz_fail("too many scratch directories");
    struct stat st;
    char tmpl[256];
    snprintf(tmpl, sizeof(tmpl), "%s/%sXXXXXX",
             stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm"
                                                                : "/tmp",
             prefix);
    if (!mkdtemp(tmpl))
        fz_fail("mkdtemp %s: %s", tmpl, strerror(errno));
    snprintf(scratch[n_scratch], sizeof(scratch[0]), "%s", tmpl);
    if (n_scratch++ == 0)
        atexit(remove_scratch);
    snprintf(out, cap, "%s", tmpl);
}

size_t fz_split(const uint8_t *data, size_t n, uint8_t sep,
                struct fz_part *parts, size_t max)
{
    size_t k = 0;
    const uint8_t *p = data, *end = data + n;
    while (k + 1 < max) {
        const uint8_t *s = memchr(p, sep, (size_t)(end - p));
        if (!s)
            break;
        parts[k].p = p;
        parts[k].n = (size_t)(s - p);
        k++;
        p = s + 1;
    }
    parts[k].p = p;
    parts[k].n = (size_t)(end - p);
    return k + 1;
}

size_t fz_drain(int fd, int *eof)
{
    char buf[65536];
    size_t total = 0;
    for (;;) {
        ssize_t r = read(fd, buf, sizeof(buf));
        if (r > 0) {
            total += (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
            *eof = 1;
        return total;
    }
}

int fz_write_all(int fd, const void *data, size_t n, void (*pump)(void *),
                 void *ud)
{
    const char *p = data;
    int spins = 0;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            spins = 0;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            /* The server stopped reading (a paused connection) for good
             * if many rounds of its loop take nothing. */
            if (++spins > 100000)
                return -1;
            pump(ud);
            continue;
        }
        return -1;
    }
    return 0;
}
