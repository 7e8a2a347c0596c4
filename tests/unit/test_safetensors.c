/* test_safetensors.c — the safetensors reader, model directories, the
 * writer and the scalar conversions (common/model/st_safetensors.h,
 * common/model/st_writer.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/model/st_safetensors.h"
#include "common/model/st_writer.h"
#include "common/base/tg_err.h"
#include "tests/support/tt_support.h"

static char tmpdir[256];
static char errbuf[512];

static int setup(void **state)
{
    (void)state;
    return tt_tmpdir_make("tg_st_test.", tmpdir, sizeof tmpdir);
}

static int teardown(void **state)
{
    (void)state;
    return tt_tmpdir_remove(tmpdir);
}

static const char *tpath(const char *name)
{
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    return p;
}

static void write_bytes(const char *path, const void *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n > 0)
        assert_int_equal(fwrite(buf, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* Writes a file with header length `hlen` (UINT64_MAX: the real length),
 * header text `hdr` and `ndata` data bytes (value i & 0xff). */
static void write_st(const char *path, uint64_t hlen, const char *hdr,
                     size_t ndata)
{
    size_t hl = strlen(hdr);
    if (hlen == UINT64_MAX)
        hlen = hl;
    size_t n = 8 + hl + ndata;
    uint8_t *buf = malloc(n);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(buf + 8, hdr, hl);
    for (size_t i = 0; i < ndata; i++)
        buf[8 + hl + i] = (uint8_t)i;
    write_bytes(path, buf, n);
    free(buf);
}

static int open_rc(const char *path)
{
    struct st_file f;
    errbuf[0] = '\0';
    int rc = st_file_open(&f, path, errbuf, sizeof errbuf);
    if (rc == 0) {
        st_file_close(&f);
    } else {
        /* A failed open leaves a closed (zeroed) file and a message. */
        assert_null(f.map);
        assert_null(f.tensors);
        assert_true(errbuf[0] != '\0');
    }
    return rc;
}

/* ---- the format's own sample files ---------------------------------------- */

/* Every sample holds the six values {-3,-2,-1,0,1,2} in its dtype
 * (unsigned ones wrap: 253, 254, 255 / 65533 ... ), per the generator
 * script the samples' ReadMe.md names. */
static void check_sample_tensor(const struct st_tensor *t)
{
    assert_int_equal(t->rank, 1);
    assert_int_equal(t->shape[0], 6);
    assert_int_equal(t->numel, 6);
    assert_int_equal(t->nbytes, 6 * st_dtype_size(t->dtype));
    const uint8_t *p = t->data;
    for (int i = 0; i < 6; i++) {
        double want = i - 3;
        double got = 0;
        switch (t->dtype) {
        case ST_DTYPE_U8: got = p[i]; want = (i < 3) ? 256 + want : want; break;
        case ST_DTYPE_I8: got = (int8_t)p[i]; break;
        case ST_DTYPE_U16: {
            uint16_t v; memcpy(&v, p + 2 * i, 2); got = v;
            want = (i < 3) ? 65536 + want : want; break;
        }
        case ST_DTYPE_I16: { int16_t v; memcpy(&v, p + 2 * i, 2); got = v; break; }
        case ST_DTYPE_U32: {
            uint32_t v; memcpy(&v, p + 4 * i, 4); got = v;
            want = (i < 3) ? 4294967296.0 + want : want; break;
        }
        case ST_DTYPE_I32: { int32_t v; memcpy(&v, p + 4 * i, 4); got = v; break; }
        case ST_DTYPE_F16:
        case ST_DTYPE_F32:
        case ST_DTYPE_F64: {
            float out[6];
            assert_int_equal(st_tensor_read_f32(t, 0, 6, out, errbuf,
                                                sizeof errbuf), 0);
            got = out[i];
            break;
        }
        default:
            fail_msg("unexpected dtype %s in sample", st_dtype_name(t->dtype));
        }
        if (got != want)
            fail_msg("%s[%d] = %g, want %g", t->name, i, got, want);
    }
}

static void test_samples(void **state)
{
    (void)state;
    char dir[512];
    tt_data_path("safetensors_samples", dir, sizeof dir);
    DIR *d = opendir(dir);
    if (d == NULL)
        fail_msg("project data folder missing: %s", dir);
    int files = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n < 12 || strcmp(e->d_name + n - 12, ".safetensors") != 0)
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct st_file f;
        int rc = st_file_open(&f, path, errbuf, sizeof errbuf);
        if (rc != 0)
            fail_msg("%s: %s", path, errbuf);
        assert_string_equal(st_file_metadata(&f, "test"), "a");
        assert_null(st_file_metadata(&f, "nope"));
        if (strcmp(e->d_name, "overall.safetensors") == 0) {
            /* All nine dtypes in one file, back to back. */
            static const char *names[] = {"B", "H", "I", "b", "d",
                                          "e", "f", "h", "i"};
            assert_int_equal(f.n_tensors, 9);
            uint64_t end = 0;
            for (int i = 0; i < 9; i++) {
                const struct st_tensor *t = st_file_find(&f, names[i]);
                assert_non_null(t);
                assert_ptr_equal(t, &f.tensors[i]); /* sorted by name */
                check_sample_tensor(t);
                end = t->offset + t->nbytes > end ? t->offset + t->nbytes : end;
            }
            assert_int_equal(end, f.data_len);
        } else {
            /* One tensor named after the file. */
            char name[8] = {e->d_name[0], 0};
            assert_int_equal(f.n_tensors, 1);
            const struct st_tensor *t = st_file_find(&f, name);
            assert_non_null(t);
            check_sample_tensor(t);
            assert_int_equal(t->offset, 0);
            assert_int_equal(t->nbytes, f.data_len);
        }
        assert_null(st_file_find(&f, "missing"));
        st_file_close(&f);
        st_file_close(&f); /* idempotent */
        files++;
    }
    closedir(d);
    assert_int_equal(files, 10);
}

/* ---- malformed files ------------------------------------------------------ */

#define T1(dt, shape, offs)                                                  \
    "{\"t\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" offs \
    "}}"

static void test_malformed(void **state)
{
    (void)state;
    const char *p = tpath("bad.safetensors");
    static const struct {
        const char *what;
        uint64_t hlen;
        const char *hdr;
        size_t ndata;
        int want;
    } cases[] = {
        {"valid control", UINT64_MAX, T1("F32", "[2,2]", "[0,16]"), 16, 0},
        {"valid with trailing spaces", UINT64_MAX,
         T1("F32", "[2]", "[0,8]") "      ", 8, 0},
        {"huge header length", (uint64_t)1 << 40, "{}", 0, TG_ETOOBIG},
        {"header just over the limit", ST_MAX_HEADER + 1, "{}", 0, TG_ETOOBIG},
        {"header length past end of file", 1000, T1("F32", "[1]", "[0,4]"), 4,
         TG_EFORMAT},
        {"zero header length", 0, "", 0, TG_EFORMAT},
        {"bad JSON", UINT64_MAX, "{\"t\":{\"dtype\":", 0, TG_EFORMAT},
        {"JSON array header", UINT64_MAX, "[1,2,3]", 0, TG_EFORMAT},
        {"header not starting with {", UINT64_MAX, " {}", 0, TG_EFORMAT},
        {"offsets past end", UINT64_MAX, T1("F32", "[4]", "[0,16]"), 12,
         TG_EFORMAT},
        {"wrong size for shape", UINT64_MAX, T1("F32", "[3]", "[0,8]"), 8,
         TG_EFORMAT},
        {"unknown dtype", UINT64_MAX, T1("F128", "[1]", "[0,16]"), 16,
         TG_EUNSUPPORTED},
        {"lower-case dtype", UINT64_MAX, T1("f32", "[1]", "[0,4]"), 4,
         TG_EUNSUPPORTED},
        {"begin > end", UINT64_MAX, T1("U8", "[0]", "[4,2]"), 8, TG_EFORMAT},
        {"negative offset", UINT64_MAX, T1("U8", "[2]", "[-2,0]"), 8,
         TG_EFORMAT},
        {"three offsets", UINT64_MAX, T1("U8", "[2]", "[0,2,4]"), 8,
         TG_EFORMAT},
        {"string offsets", UINT64_MAX, T1("U8", "[2]", "[\"0\",\"2\"]"), 8,
         TG_EFORMAT},
        {"negative dim", UINT64_MAX, T1("U8", "[-2]", "[0,2]"), 8, TG_EFORMAT},
        {"fractional dim", UINT64_MAX, T1("U8", "[2.5]", "[0,2]"), 8,
         TG_EFORMAT},
        {"rank 9", UINT64_MAX, T1("U8", "[1,1,1,1,1,1,1,1,1]", "[0,1]"), 8,
         TG_EFORMAT},
        {"numel overflow", UINT64_MAX,
         T1("U8", "[4294967296,4294967296,4294967296]", "[0,1]"), 8,
         TG_EFORMAT},
        {"byte count overflow", UINT64_MAX,
         T1("F64", "[4611686018427387904]", "[0,1]"), 8, TG_EFORMAT},
        {"shape not an array", UINT64_MAX, T1("U8", "7", "[0,7]"), 8,
         TG_EFORMAT},
        {"missing dtype", UINT64_MAX,
         "{\"t\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 8, TG_EFORMAT},
        {"tensor not an object", UINT64_MAX, "{\"t\":[1,2]}", 8, TG_EFORMAT},
        {"overlapping offsets", UINT64_MAX,
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         12, TG_EFORMAT},
        {"identical offsets", UINT64_MAX,
         "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
         4, TG_EFORMAT},
        {"duplicate names", UINT64_MAX,
         "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}",
         8, TG_EFORMAT},
        {"metadata not an object", UINT64_MAX, "{\"__metadata__\":[1]}", 0,
         TG_EFORMAT},
        {"metadata value not a string", UINT64_MAX,
         "{\"__metadata__\":{\"n\":1}}", 0, TG_EFORMAT},
        {"trailing garbage", UINT64_MAX, T1("U8", "[1]", "[0,1]") "x", 1,
         TG_EFORMAT},
        {"empty tensor name", UINT64_MAX,
         "{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
         1, TG_EFORMAT},
        {"zero-size and scalar tensors", UINT64_MAX,
         "{\"z\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[0,0]},"
         "\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]},"
         "\"y\":{\"dtype\":\"BOOL\",\"shape\":[3,0],\"data_offsets\":[8,8]}}",
         8, 0},
        {"empty header object", UINT64_MAX, "{}", 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_st(p, cases[i].hlen, cases[i].hdr, cases[i].ndata);
        int rc = open_rc(p);
        if (rc != cases[i].want)
            fail_msg("case '%s': got %s (%s), want %s", cases[i].what,
                     tg_err_name(rc), errbuf, tg_err_name(cases[i].want));
    }
    /* The messages name the offending tensor. */
    write_st(p, UINT64_MAX, T1("F32", "[3]", "[0,8]"), 8);
    assert_int_equal(open_rc(p), TG_EFORMAT);
    assert_non_null(strstr(errbuf, "'t'"));
    write_st(p, UINT64_MAX,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
             12);
    assert_int_equal(open_rc(p), TG_EFORMAT);
    assert_non_null(strstr(errbuf, "overlap"));

    /* Files shorter than the length prefix. */
    write_bytes(p, "", 0);
    assert_int_equal(open_rc(p), TG_EFORMAT);
    write_bytes(p, "\x02\0\0\0", 4);
    assert_int_equal(open_rc(p), TG_EFORMAT);
    /* Not there / not a file. */
    assert_int_equal(open_rc(tpath("does-not-exist")), TG_ENOENT);
    assert_int_equal(open_rc(tmpdir), TG_EIO);
}

/* A tensor name containing an escaped NUL would alias a shorter name. */
static void test_nul_in_name(void **state)
{
    (void)state;
    const char *p = tpath("nul.safetensors");
    write_st(p, UINT64_MAX,
             "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
             "\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],"
             "\"data_offsets\":[1,2]}}", 2);
    int rc = open_rc(p);
    /* jansson may refuse the key outright or we reject the alias. */
    assert_int_equal(rc, TG_EFORMAT);
}

/* Every truncation and many corruptions of a valid file: an error code or
 * success, never a crash (run under ASan in CI). */
static void test_truncations_and_corruption(void **state)
{
    (void)state;
    const char *src = tpath("good.safetensors");
    const char *p = tpath("cut.safetensors");
    const char *hdr =
        "{\"__metadata__\":{\"k\":\"v\"},"
        "\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
        "\"b\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[12,20]}}";
    write_st(src, UINT64_MAX, hdr, 20);
    assert_int_equal(open_rc(src), 0);
    FILE *f = fopen(src, "rb");
    assert_non_null(f);
    uint8_t buf[512];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    for (size_t len = 0; len < n; len++) {
        write_bytes(p, buf, len);
        int rc = open_rc(p);
        assert_true(rc == TG_EFORMAT || rc == TG_ETOOBIG);
    }
    uint64_t rng = 12345;
    int ok = 0, bad = 0;
    for (int it = 0; it < 800; it++) {
        uint8_t c[512];
        memcpy(c, buf, n);
        int flips = 1 + it % 3;
        for (int k = 0; k < flips; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            size_t pos = (size_t)(rng >> 33) % (n - 20); /* header + length */
            c[pos] = (uint8_t)(rng >> 17);
        }
        write_bytes(p, c, n);
        int rc = open_rc(p);
        assert_true(rc == 0 || rc == TG_EFORMAT || rc == TG_ETOOBIG ||
                    rc == TG_EUNSUPPORTED);
        if (rc == 0)
            ok++;
        else
            bad++;
    }
    assert_true(bad > 0);
    (void)ok;
}

/* ---- conversions ---------------------------------------------------------- */

static uint32_t bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static void test_conversions(void **state)
{
    (void)state;
    /* Every non-NaN half and bfloat16 survives a round trip exactly. */
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t x = (uint16_t)h;
        float f = st_f16_to_f32(x);
        if (isnan(f)) {
            assert_true(isnan(st_bf16_to_f32(st_f32_to_bf16(f))));
            assert_true((st_f32_to_f16(f) & 0x7c00u) == 0x7c00u &&
                        (st_f32_to_f16(f) & 0x3ffu) != 0);
        } else {
            assert_int_equal(st_f32_to_f16(f), x);
        }
        float b = st_bf16_to_f32(x);
        if (!isnan(b))
            assert_int_equal(st_f32_to_bf16(b), x);
        else
            assert_true(isnan(st_bf16_to_f32(st_f32_to_bf16(b))));
    }
    /* Known values. */
    assert_true(st_f16_to_f32(0x3c00) == 1.0f);
    assert_true(st_f16_to_f32(0xc000) == -2.0f);
    assert_true(st_f16_to_f32(0x7bff) == 65504.0f);
    assert_true(st_f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(isinf(st_f16_to_f32(0xfc00)) && st_f16_to_f32(0xfc00) < 0);
    assert_true(st_bf16_to_f32(0x3f80) == 1.0f);
    /* bf16 ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7. */
    assert_int_equal(st_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    assert_int_equal(st_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    assert_int_equal(st_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    assert_int_equal(st_f32_to_bf16(from_bits(0x7f7fffff)), 0x7f80); /* inf */
    assert_int_equal(st_f32_to_bf16(-0.0f), 0x8000);
    /* f16: overflow, the largest finite, subnormal ties, underflow. */
    assert_int_equal(st_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(st_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(st_f32_to_f16(-1e10f), 0xfc00);
    assert_int_equal(st_f32_to_f16(0x1p-25f), 0x0000);        /* tie -> 0 */
    assert_int_equal(st_f32_to_f16(0x1p-25f * 1.0001f), 0x0001);
    assert_int_equal(st_f32_to_f16(3 * 0x1p-25f), 0x0002);    /* tie -> 2 */
    assert_int_equal(st_f32_to_f16(1.0f + 0x1p-11f), 0x3c00); /* tie, even */
    assert_int_equal(st_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
    assert_int_equal(st_f32_to_f16(-0x1p-30f), 0x8000);
    assert_int_equal(st_f32_to_f16(0x1p-14f - 0x1p-26f), 0x0400); /* rounds up
                                                                     to normal */
#if defined(__FLT16_MAX__) && defined(__x86_64__)
    /* The compiler's own conversion as an independent reference. */
    uint64_t rng = 99;
    for (int i = 0; i < 1000000; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t u = (uint32_t)(rng >> 32);
        /* Bias towards the half range so most samples matter. */
        if (i & 1)
            u = (u & 0x80000000u) | (0x33000000u + (u % 0x14800000u));
        float x = from_bits(u);
        if (isnan(x))
            continue;
        _Float16 r = (_Float16)x;
        uint16_t want;
        memcpy(&want, &r, 2);
        if (st_f32_to_f16(x) != want)
            fail_msg("f16(%a = 0x%08x): got 0x%04x want 0x%04x", (double)x,
                     bits(x), st_f32_to_f16(x), want);
    }
#endif
    (void)bits;
    /* Array conversions, from unaligned bytes: bf16 keeps its bits (a
     * signalling NaN's too), the others round through float32. */
    {
        uint8_t raw[1 + 4 * 4];
        float fin[4] = {1.0f + 0x1p-8f, -2.5f, 65504.0f, 0x1p-20f};
        memcpy(raw + 1, fin, sizeof(fin));
        uint16_t b16[4];
        float f32[4];
        assert_int_equal(st_convert_bf16(ST_DTYPE_F32, raw + 1, 4, b16), 0);
        assert_int_equal(st_convert_f32(ST_DTYPE_F32, raw + 1, 4, f32), 0);
        for (int i = 0; i < 4; i++) {
            assert_int_equal(b16[i], st_f32_to_bf16(fin[i]));
            assert_true(f32[i] == fin[i]);
        }
        uint16_t hin[3] = {0x7f81, 0x3f80, 0xc000}; /* sNaN, 1, -2 */
        memcpy(raw + 1, hin, sizeof(hin));
        assert_int_equal(st_convert_bf16(ST_DTYPE_BF16, raw + 1, 3, b16), 0);
        assert_memory_equal(b16, hin, sizeof(hin));
        assert_int_equal(st_convert_f32(ST_DTYPE_BF16, raw + 1, 3, f32), 0);
        assert_true(isnan(f32[0]) && f32[1] == 1.0f && f32[2] == -2.0f);
        assert_int_equal(st_convert_bf16(ST_DTYPE_F16, raw + 1, 3, b16), 0);
        for (int i = 0; i < 3; i++)
            assert_int_equal(b16[i], st_f32_to_bf16(st_f16_to_f32(hin[i])));
        double din[2] = {0.1, -3e38};
        memcpy(raw + 1, din, sizeof(din));
        assert_int_equal(st_convert_f32(ST_DTYPE_F64, raw + 1, 2, f32), 0);
        assert_true(f32[0] == (float)0.1 && f32[1] == (float)-3e38);
        assert_int_equal(st_convert_f32(ST_DTYPE_I32, raw, 1, f32), TG_EUNSUPPORTED);
        assert_int_equal(st_convert_bf16(ST_DTYPE_U8, raw, 1, b16), TG_EUNSUPPORTED);
    }
    /* dtype table. */
    enum st_dtype dt;
    assert_int_equal(st_dtype_parse("BF16", &dt), 0);
    assert_int_equal(dt, ST_DTYPE_BF16);
    assert_int_equal(st_dtype_parse("F8_E4M3", &dt), 0);
    assert_int_equal(st_dtype_size(dt), 1);
    assert_int_equal(st_dtype_parse("bf16", &dt), TG_EUNSUPPORTED);
    assert_int_equal(st_dtype_size(ST_DTYPE_U64), 8);
    assert_string_equal(st_dtype_name(ST_DTYPE_COUNT), "?");
    for (int i = 0; i < ST_DTYPE_COUNT; i++) {
        assert_int_equal(st_dtype_parse(st_dtype_name((enum st_dtype)i), &dt),
                         0);
        assert_int_equal(dt, i);
    }
}

/* ---- writer --------------------------------------------------------------- */

struct ramp {
    int calls;
    uint64_t next_off;
    int fail_at; /* call number that fails, -1 never */
};

/* Fills float32 element i with (float)i; checks offsets are sequential. */
static int ramp_fill(void *ctx, uint64_t off, void *dst, size_t n)
{
    struct ramp *r = ctx;
    if (r->calls++ == r->fail_at)
        return TG_EIO;
    assert_int_equal(off, r->next_off);
    assert_int_equal(off % 4, 0);
    r->next_off += n;
    for (size_t k = 0; k < n / 4; k++) {
        float v = (float)(off / 4 + k);
        memcpy((uint8_t *)dst + 4 * k, &v, 4);
    }
    return 0;
}

static void test_writer_roundtrip(void **state)
{
    (void)state;
    char p[512], p2[512];
    snprintf(p, sizeof p, "%s", tpath("w.safetensors"));
    snprintf(p2, sizeof p2, "%s", tpath("w2.safetensors"));
    struct st_writer w;
    st_writer_init(&w);
    const float a[6] = {1.5f, -2.0f, 3.25f, 0.0f, -0.5f, 1e-3f};
    uint16_t hb[6], hh[6];
    for (int i = 0; i < 6; i++) {
        hb[i] = st_f32_to_bf16(a[i]);
        hh[i] = st_f32_to_f16(a[i]);
    }
    const int64_t s23[2] = {2, 3}, s6[1] = {6}, s0[2] = {0, 7};
    const int64_t big[2] = {600, 1000}; /* 2.4 MB: several fill chunks */
    const double scalar = 42.0;
    const int8_t i8[3] = {-1, 0, 1};
    const int64_t s3[1] = {3};
    struct ramp r = {0, 0, -1};
    assert_int_equal(st_writer_add_metadata(&w, "format", "pt", errbuf,
                                            sizeof errbuf), 0);
    assert_int_equal(st_writer_add(&w, "f32", ST_DTYPE_F32, 2, s23, a, errbuf,
                                   sizeof errbuf), 0);
    assert_int_equal(st_writer_add(&w, "bf16", ST_DTYPE_BF16, 2, s23, hb,
                                   errbuf, sizeof errbuf), 0);
    assert_int_equal(st_writer_add(&w, "f16", ST_DTYPE_F16, 1, s6, hh, errbuf,
                                   sizeof errbuf), 0);
    assert_int_equal(st_writer_add(&w, "empty", ST_DTYPE_F32, 2, s0, NULL,
                                   errbuf, sizeof errbuf), 0);
    assert_int_equal(st_writer_add(&w, "scalar", ST_DTYPE_F64, 0, NULL,
                                   &scalar, errbuf, sizeof errbuf), 0);
    assert_int_equal(st_writer_add(&w, "i8", ST_DTYPE_I8, 1, s3, i8, errbuf,
                                   sizeof errbuf), 0);
    assert_int_equal(st_writer_add_fill(&w, "big", ST_DTYPE_F32, 2, big,
                                        ramp_fill, &r, errbuf, sizeof errbuf),
                     0);
    /* Bad additions. */
    assert_int_equal(st_writer_add(&w, "f32", ST_DTYPE_F32, 1, s6, a, errbuf,
                                   sizeof errbuf), TG_EEXIST);
    assert_int_equal(st_writer_add(&w, "__metadata__", ST_DTYPE_F32, 1, s6, a,
                                   errbuf, sizeof errbuf), TG_EINVAL);
    assert_int_equal(st_writer_add(&w, "", ST_DTYPE_F32, 1, s6, a, errbuf,
                                   sizeof errbuf), TG_EINVAL);
    const int64_t neg[1] = {-1};
    assert_int_equal(st_writer_add(&w, "neg", ST_DTYPE_F32, 1, neg, a, errbuf,
                                   sizeof errbuf), TG_EINVAL);
    const int64_t r9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    assert_int_equal(st_writer_add(&w, "r9", ST_DTYPE_F32, 9, r9, a, errbuf,
                                   sizeof errbuf), TG_EINVAL);
    const int64_t huge[2] = {INT64_MAX, 4};
    assert_int_equal(st_writer_add(&w, "huge", ST_DTYPE_F32, 2, huge, a,
                                   errbuf, sizeof errbuf), TG_EINVAL);
    assert_int_equal(st_writer_add(&w, "nodata", ST_DTYPE_F32, 1, s6, NULL,
                                   errbuf, sizeof errbuf), TG_EINVAL);
    assert_int_equal(st_writer_add(&w, "baddt", (enum st_dtype)99, 1, s6, a,
                                   errbuf, sizeof errbuf), TG_EINVAL);
    assert_int_equal(st_writer_add(&w, "bad\xff", ST_DTYPE_F32, 1, s6, a,
                                   errbuf, sizeof errbuf), TG_EINVAL);
    assert_int_equal(st_writer_add_metadata(&w, "format", "x", errbuf,
                                            sizeof errbuf), TG_EEXIST);
    assert_int_equal(st_writer_write(&w, p, errbuf, sizeof errbuf), 0);
    assert_true(r.calls >= 3);
    assert_int_equal(r.next_off, 600 * 1000 * 4);

    /* The header is padded so the data region is 8-byte aligned. */
    FILE *fh = fopen(p, "rb");
    assert_non_null(fh);
    uint8_t len8[8];
    assert_int_equal(fread(len8, 1, 8, fh), 8);
    fclose(fh);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = (hl << 8) | len8[i];
    assert_int_equal((8 + hl) % 8, 0);

    struct st_file f;
    assert_int_equal(st_file_open(&f, p, errbuf, sizeof errbuf), 0);
    assert_int_equal(f.n_tensors, 7);
    assert_string_equal(st_file_metadata(&f, "format"), "pt");
    assert_int_equal(((uintptr_t)f.data - (uintptr_t)f.map) % 8, 0);
    float out[6];
    const char *fl[] = {"f32", "bf16", "f16"};
    for (int k = 0; k < 3; k++) {
        const struct st_tensor *t = st_file_find(&f, fl[k]);
        assert_non_null(t);
        assert_int_equal(st_tensor_read_f32(t, 0, st_tensor_rows(t), out,
                                            errbuf, sizeof errbuf), 0);
        for (int i = 0; i < 6; i++) {
            float want = k == 0   ? a[i]
                         : k == 1 ? st_bf16_to_f32(hb[i])
                                  : st_f16_to_f32(hh[i]);
            assert_true(out[i] == want);
            assert_true(fabsf(out[i] - a[i]) <= 0.01f * fabsf(a[i]) + 1e-6f);
        }
    }
    /* Row ranges. */
    const struct st_tensor *t = st_file_find(&f, "bf16");
    assert_int_equal(st_tensor_rows(t), 2);
    assert_int_equal(st_tensor_read_f32(t, 1, 2, out, errbuf, sizeof errbuf),
                     0);
    assert_true(out[0] == st_bf16_to_f32(hb[3]));
    assert_true(out[2] == st_bf16_to_f32(hb[5]));
    assert_int_equal(st_tensor_read_f32(t, 1, 3, out, errbuf, sizeof errbuf),
                     TG_ERANGE);
    assert_int_equal(st_tensor_read_f32(t, 2, 1, out, errbuf, sizeof errbuf),
                     TG_ERANGE);
    assert_int_equal(st_tensor_read_f32(t, 2, 2, out, errbuf, sizeof errbuf),
                     0);
    t = st_file_find(&f, "i8");
    assert_int_equal(st_tensor_read_f32(t, 0, 1, out, errbuf, sizeof errbuf),
                     TG_EUNSUPPORTED);
    assert_int_equal(((const int8_t *)t->data)[0], -1);
    t = st_file_find(&f, "scalar");
    assert_int_equal(t->rank, 0);
    assert_int_equal(t->numel, 1);
    assert_int_equal(st_tensor_read_f32(t, 0, 1, out, errbuf, sizeof errbuf),
                     0);
    assert_true(out[0] == 42.0f);
    t = st_file_find(&f, "empty");
    assert_int_equal(t->numel, 0);
    assert_int_equal(t->nbytes, 0);
    assert_int_equal(st_tensor_read_f32(t, 0, 0, out, errbuf, sizeof errbuf),
                     0);
    t = st_file_find(&f, "big");
    float *row = malloc(1000 * 4 * 2);
    assert_non_null(row);
    assert_int_equal(st_tensor_read_f32(t, 598, 600, row, errbuf,
                                        sizeof errbuf), 0);
    for (int i = 0; i < 2000; i++)
        assert_true(row[i] == (float)(598 * 1000 + i));
    free(row);
    st_file_close(&f);

    /* A failing fill aborts the write and leaves nothing behind. */
    r = (struct ramp){0, 0, 1};
    assert_int_equal(st_writer_write(&w, p2, errbuf, sizeof errbuf), TG_EIO);
    assert_non_null(strstr(errbuf, "big"));
    assert_int_not_equal(access(p2, F_OK), 0);
    DIR *d = opendir(tmpdir);
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        assert_null(strstr(e->d_name, ".tmp"));
    closedir(d);
    /* Unwritable destination. */
    r = (struct ramp){0, 0, -1};
    assert_int_equal(st_writer_write(&w, tpath("no/such/dir/x.safetensors"),
                                     errbuf, sizeof errbuf), TG_EIO);
    st_writer_free(&w);
    st_writer_free(&w);

    /* An empty writer writes a valid empty file. */
    st_writer_init(&w);
    if (st_writer_write(&w, p2, errbuf, sizeof errbuf) != 0)
        fail_msg("empty writer: %s", errbuf);
    st_writer_free(&w);
    assert_int_equal(st_file_open(&f, p2, errbuf, sizeof errbuf), 0);
    assert_int_equal(f.n_tensors, 0);
    st_file_close(&f);
}

/* ---- model directories ---------------------------------------------------- */

static void write_text(const char *path, const char *s)
{
    write_bytes(path, s, strlen(s));
}

static void write_shard(const char *path, const char *n1, const char *n2,
                        float base)
{
    struct st_writer w;
    st_writer_init(&w);
    float v[4] = {base, base + 1, base + 2, base + 3};
    const int64_t s[2] = {2, 2};
    assert_int_equal(st_writer_add(&w, n1, ST_DTYPE_F32, 2, s, v, errbuf,
                                   sizeof errbuf), 0);
    if (n2 != NULL)
        assert_int_equal(st_writer_add(&w, n2, ST_DTYPE_F32, 2, s, v, errbuf,
                                       sizeof errbuf), 0);
    assert_int_equal(st_writer_write(&w, path, errbuf, sizeof errbuf), 0);
    st_writer_free(&w);
}

static int model_rc(const char *dir)
{
    struct st_model m;
    errbuf[0] = '\0';
    int rc = st_model_open(&m, dir, errbuf, sizeof errbuf);
    if (rc == 0)
        st_model_close(&m);
    else
        assert_null(m.files);
    return rc;
}

static void test_model_dirs(void **state)
{
    (void)state;
    char d1[300], d2[300], p[400];
    /* Single file. */
    snprintf(d1, sizeof d1, "%s/single", tmpdir);
    assert_int_equal(mkdir(d1, 0755), 0);
    assert_int_equal(model_rc(d1), TG_ENOENT);
    snprintf(p, sizeof p, "%s/model.safetensors", d1);
    write_shard(p, "w.a", "w.b", 10);
    struct st_model m;
    assert_int_equal(st_model_open(&m, d1, errbuf, sizeof errbuf), 0);
    assert_int_equal(m.n_files, 1);
    assert_int_equal(m.n_tensors, 2);
    assert_non_null(st_model_find(&m, "w.b"));
    assert_null(st_model_find(&m, "w.c"));
    st_model_close(&m);
    st_model_close(&m);

    /* Two shards with an index. */
    snprintf(d2, sizeof d2, "%s/sharded", tmpdir);
    assert_int_equal(mkdir(d2, 0755), 0);
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", d2);
    write_shard(p, "layer.0", "embed", 0);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", d2);
    write_shard(p, "layer.1", "head", 100);
    char idx[400];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", d2);
    write_text(idx,
               "{\"metadata\":{\"total_size\":64},\"weight_map\":{"
               "\"embed\":\"model-00001-of-00002.safetensors\","
               "\"layer.0\":\"model-00001-of-00002.safetensors\","
               "\"layer.1\":\"model-00002-of-00002.safetensors\","
               "\"head\":\"model-00002-of-00002.safetensors\"}}");
    assert_int_equal(st_model_open(&m, d2, errbuf, sizeof errbuf), 0);
    assert_int_equal(m.n_files, 2);
    assert_int_equal(m.n_tensors, 4);
    for (size_t i = 1; i < m.n_tensors; i++)
        assert_true(strcmp(m.tensors[i - 1]->name, m.tensors[i]->name) < 0);
    const struct st_tensor *t = st_model_find(&m, "head");
    assert_non_null(t);
    float v[4];
    assert_int_equal(st_tensor_read_f32(t, 0, 2, v, errbuf, sizeof errbuf), 0);
    assert_true(v[0] == 100.0f && v[3] == 103.0f);
    t = st_model_find(&m, "layer.0");
    assert_int_equal(st_tensor_read_f32(t, 1, 2, v, errbuf, sizeof errbuf), 0);
    assert_true(v[0] == 2.0f);
    /* pread gives the mapped bytes; each tensor knows its shard. */
    t = st_model_find(&m, "head");
    const struct st_file *f = st_model_file_of(&m, t);
    assert_non_null(f);
    assert_non_null(strstr(f->path, "model-00002-of-00002"));
    assert_ptr_equal(st_model_file_of(&m, st_model_find(&m, "embed")), &m.files[0]);
    uint8_t got[16];
    assert_int_equal(st_file_pread(f, t->offset, got, (size_t)t->nbytes, errbuf,
                                   sizeof errbuf), 0);
    assert_memory_equal(got, t->data, (size_t)t->nbytes);
    assert_int_equal(st_file_pread(f, f->data_len - 2, got, 4, errbuf, sizeof errbuf),
                     TG_ERANGE);
    struct st_tensor other = *t; /* not one of m's */
    assert_null(st_model_file_of(&m, &other));
    st_model_close(&m);

    /* Broken indexes. */
    static const struct {
        const char *what, *json;
        int want;
    } bad[] = {
        {"missing shard",
         "{\"weight_map\":{\"x\":\"model-00003-of-00003.safetensors\"}}",
         TG_ENOENT},
        {"tensor not in its shard",
         "{\"weight_map\":{\"head\":\"model-00001-of-00002.safetensors\"}}",
         TG_EFORMAT},
        {"path escaping the directory",
         "{\"weight_map\":{\"w.a\":\"../single/model.safetensors\"}}",
         TG_EFORMAT},
        {"non-string file", "{\"weight_map\":{\"embed\":3}}", TG_EFORMAT},
        {"no weight_map", "{\"metadata\":{}}", TG_EFORMAT},
        {"empty weight_map", "{\"weight_map\":{}}", TG_EFORMAT},
        {"weight_map not an object", "{\"weight_map\":[]}", TG_EFORMAT},
        {"bad JSON", "{\"weight_map\":", TG_EFORMAT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(idx, bad[i].json);
        int rc = model_rc(d2);
        if (rc != bad[i].want)
            fail_msg("index '%s': got %s (%s), want %s", bad[i].what,
                     tg_err_name(rc), errbuf, tg_err_name(bad[i].want));
    }
    /* A corrupt shard fails the model with the shard's message. */
    write_text(idx, "{\"weight_map\":{\"embed\":"
                    "\"model-00001-of-00002.safetensors\"}}");
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", d2);
    write_st(p, 1000, "{}", 0);
    assert_int_equal(model_rc(d2), TG_EFORMAT);
    assert_non_null(strstr(errbuf, "model-00001-of-00002"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_samples),
        cmocka_unit_test_setup_teardown(test_malformed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nul_in_name, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncations_and_corruption, setup,
                                        teardown),
        cmocka_unit_test(test_conversions),
        cmocka_unit_test_setup_teardown(test_writer_roundtrip, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_model_dirs, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
