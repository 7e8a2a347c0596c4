/*
 * fz_util.h — what the libFuzzer harnesses of tests/fuzz share: the
 * project data folder, inputs as in-memory files, splitting an input into
 * parts, and the client end of a socketpair that drives a server
 * connection (fuzz_http.c, fuzz_grpc.c).
 *
 * Fuzzing code only (built with -DTANGRAM_FUZZ=ON). A harness runs one
 * input at a time on one thread; nothing here is thread-safe. Failures of
 * the harness itself (not of the code under test) abort with a message,
 * so libFuzzer reports them as crashes rather than hiding them.
 */
#ifndef FZ_UTIL_H
#define FZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* The entry point libFuzzer calls once per input (each harness defines
 * it); returns 0. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Aborts the process after printing "fuzz harness: <msg>" (printf format)
 * on stderr: an invariant of the harness or of the code under test broke. */
void fz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* Writes $TANGRAM_DATA/<rel> (default: the data folder of the source
 * tree this harness was built from) into out (cap bytes). */
void fz_data_path(const char *rel, char *out, size_t cap);

/* Writes $TANGRAM_BIN/<name> (default: bin/ of the build tree this harness
 * was built in) into out (cap bytes). */
void fz_bin_path(const char *name, char *out, size_t cap);

/* Sets TANGRAM_DATA and TANGRAM_BIN to the defaults above when they are
 * unset, for the test helpers (tests/support) that read them. */
void fz_env_defaults(void);

/* An in-memory file holding bytes, reachable by path (memfd_create, named
 * /proc/self/fd/N), so a harness can feed file-based loaders without disk
 * I/O. */
struct fz_memfile {
    int fd;
    char path[64];
};

/* Creates *f with the n bytes of data. Aborts on failure. Close with
 * fz_memfile_close(). */
void fz_memfile_open(struct fz_memfile *f, const void *data, size_t n);

/* Closes the descriptor; safe twice. */
void fz_memfile_close(struct fz_memfile *f);

/* Writes n bytes to dir/name (created or truncated). Aborts on failure. */
void fz_write_file(const char *dir, const char *name, const void *data,
                   size_t n);

/* Creates a fresh scratch directory (under /dev/shm when it exists, else
 * /tmp) that is removed with its files at exit; writes its path to out. */
void fz_scratch_dir(const char *prefix, char *out, size_t cap);

/* One part of a split input. */
struct fz_part {
    const uint8_t *p;
    size_t n;
};

/* Splits data[0..n) at each byte `sep` into at most max parts (the last
 * part keeps any further separators) and returns the number of parts
 * (at least 1). */
size_t fz_split(const uint8_t *data, size_t n, uint8_t sep,
                struct fz_part *parts, size_t max);

/* Reads and discards what is readable on the non-blocking descriptor fd.
 * Returns the bytes read, and sets *eof when the peer closed (or the
 * socket failed). */
size_t fz_drain(int fd, int *eof);

/* Writes all n bytes to the non-blocking descriptor fd, calling
 * pump(ud) whenever the socket buffer is full (the server reads while
 * the harness waits). Returns 0, or -1 when the peer is gone (EPIPE,
 * ECONNRESET) before everything was written. */
int fz_write_all(int fd, const void *data, size_t n, void (*pump)(void *),
                 void *ud);

#endif /* FZ_UTIL_H */
