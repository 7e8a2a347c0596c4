/* tt_support.c — shared helpers of the C tests (see tt_support.h). */
#include "tests/support/tt_support.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/pf_profile.h"

int tt_tmpdir_make(const char *prefix, char *out, size_t cap)
{
    const char *base = getenv("TMPDIR");
    int n = snprintf(out, cap, "%s/%sXXXXXX", base && base[0] ? base : "/tmp", prefix);
    if (n < 0 || (size_t)n >= cap)
        return -1;
    return mkdtemp(out) != NULL ? 0 : -1;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int tt_tmpdir_remove(const char *dir)
{
    if (dir == NULL || dir[0] == '\0')
        return 0;
    return nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS) == 0 ? 0 : -1;
}

int tt_program(const char *name, char *out, size_t cap)
{
    const char *bin = getenv("TANGRAM_BIN");
    if (bin != NULL && bin[0] != '\0') {
        snprintf(out, cap, "%s/%s", bin, name);
    } else {
        const char *src = getenv("TANGRAM_SOURCE");
        snprintf(out, cap, "%s/build/bin/%s", src && src[0] ? src : ".", name);
    }
    return access(out, X_OK) == 0;
}

void tt_shared_path(const char *rel, char *out, size_t cap)
{
    const char *sh = getenv("TANGRAM_SHARED");
    snprintf(out, cap, "%s/%s", sh && sh[0] ? sh : "../shared", rel);
}

int tt_make_model(const char *out_dir, const char *const *args)
{
    char prog[4096], tok[4096];
    if (!tt_program("tangram-make-model", prog, sizeof(prog)))
        return 77;
    tt_shared_path("data/tokenizers/qwen3", tok, sizeof(tok));
    const char *argv[64];
    int n = 0, has_tok = 0;
    argv[n++] = prog;
    for (int i = 0; args != NULL && args[i] != NULL && n < 58; i++) {
        if (strcmp(args[i], "--tokenizer") == 0)
            has_tok = 1;
        argv[n++] = args[i];
    }
    if (!has_tok) {
        argv[n++] = "--tokenizer";
        argv[n++] = tok;
    }
    argv[n++] = "-o";
    argv[n++] = out_dir;
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        if (freopen("/dev/null", "w", stdout) == NULL)
            _exit(127);
        execv(prog, (char *const *)argv);
        _exit(127);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

int tt_write_profile(const char *path, const char *arch, int L, int H, int d,
                     int hp, const double *budget, const int *groups,
                     double target_ratio)
{
    char err[512];
    struct pf_profile p;
    if (pf_profile_init(&p, arch, "snapkv", L, H, d, hp, err, sizeof(err)) != 0) {
        fprintf(stderr, "profile: %s\n", err);
        return -1;
    }
    for (int i = 0; i < L * H; i++) {
        p.budget[i] = budget[i];
        p.mean[i] = budget[i];
        if (groups != NULL)
            p.groups[i] = groups[i];
    }
    p.samples = 1;
    p.target_ratio = target_ratio;
    int rc = pf_profile_finish(&p, err, sizeof(err));
    if (rc == 0)
        rc = pf_profile_save(&p, path, err, sizeof(err));
    pf_profile_free(&p);
    if (rc != 0)
        fprintf(stderr, "profile: %s\n", err);
    return rc == 0 ? 0 : -1;
}
