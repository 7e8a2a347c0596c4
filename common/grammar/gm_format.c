/* gm_format.c — JSON Schema formats as whole-string patterns
 * (gm_format.h). The patterns are ECMA-262 text for gm_regex, assembled
 * from the RFCs' ABNF rules below. */
#include "common/grammar/gm_format.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/base/tg_err.h"

/* ---- RFC 3339 ------------------------------------------------------------ */

/* full-date: days per month; Feb 29 in the years divisible by 4, except
 * centuries not divisible by 400 (year 0000 included). */
#define DATE                                                    \
    "(?:[0-9]{4}-(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])" \
    "|[0-9]{4}-(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"           \
    "|[0-9]{4}-02-(?:0[1-9]|1[0-9]|2[0-8])"                     \
    "|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])"             \
    "|(?:0[048]|[2468][048]|[13579][26])00)-02-29)"
#define FRAC "(?:\\.[0-9]+)?"
/* partial-time without leap seconds, then time-offset */
#define TIME_PLAIN                                    \
    "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]" FRAC \
    "(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"

/* A leap second is 23:59:60 UTC: at offset o the local time is 23:59 + o.
 * The offsets of 0, 30 and 45 minutes past the hour (every zone in use)
 * are listed; other offsets never get a leap second (a subset). */
static char time_pat[12800], date_time_pat[13600];
static pthread_once_t time_once = PTHREAD_ONCE_INIT;

static void build_time(void)
{
    static const int mins[3] = {0, 30, 45};
    char leap[12000];
    size_t n = 0;
    n += (size_t)snprintf(leap + n, sizeof leap - n, "23:59:60" FRAC "[Zz]");
    /* one alternative per local time, its offsets together */
    for (int local = 0; local < 1440; local++) {
        char offs[400];
        size_t k = 0;
        for (int sign = 0; sign < 2; sign++)
            for (int hh = 0; hh < 24; hh++)
                for (int i = 0; i < 3; i++) {
                    int off = hh * 60 + mins[i];
                    int l = ((23 * 60 + 59 + (sign ? -off : off)) % 1440 +
                             1440) %
                            1440;
                    if (l != local)
                        continue;
                    k += (size_t)snprintf(offs + k, sizeof offs - k,
                                          "%s%s%02d:%02d", k ? "|" : "",
                                          sign ? "-" : "\\+", hh, mins[i]);
                }
        if (k == 0)
            continue;
        n += (size_t)snprintf(leap + n, sizeof leap - n,
                              "|%02d:%02d:60" FRAC "(?:%s)", local / 60,
                              local % 60, offs);
    }
    snprintf(time_pat, sizeof time_pat, "(?:" TIME_PLAIN "|%s)", leap);
    snprintf(date_time_pat, sizeof date_time_pat, DATE "[Tt]%s", time_pat);
}

/* ---- addresses ------------------------------------------------------------ */

#define OCTET "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
#define IPV4 "(?:" OCTET "\\." OCTET "\\." OCTET "\\." OCTET ")"
#define H16 "[0-9A-Fa-f]{1,4}"
#define LS32 "(?:" H16 ":" H16 "|" IPV4 ")"
/* RFC 3986 §3.2.2 IPv6address */
#define IPV6                                                            \
    "(?:(?:" H16 ":){6}" LS32 "|::(?:" H16 ":){5}" LS32 "|(?:" H16      \
    ")?::(?:" H16 ":){4}" LS32 "|(?:(?:" H16 ":)?" H16 ")?::(?:" H16    \
    ":){3}" LS32 "|(?:(?:" H16 ":){0,2}" H16 ")?::(?:" H16 ":){2}" LS32 \
    "|(?:(?:" H16 ":){0,3}" H16 ")?::" H16 ":" LS32 "|(?:(?:" H16       \
    ":){0,4}" H16 ")?::" LS32 "|(?:(?:" H16 ":){0,5}" H16 ")?::" H16    \
    "|(?:(?:" H16 ":){0,6}" H16 ")?::)"

/* RFC 1123 LDH labels; 63 characters in all; no "??--" label */
#define LABEL "[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
#define HOSTNAME "(?=.{1,63}$)(?!(?:.*\\.)?[^.]{2}--)" LABEL "(?:\\." LABEL ")*"

/* RFC 5321 Mailbox: Dot-string / Quoted-string, "@", Domain /
 * address-literal; the local part at most 64 octets. Subset: no "@"
 * inside a quoted local part, so the first "@" ends it. */
/* The addresses every common validator accepts (RFC 5321's dot-atom and
 * hostname, narrowed to what zod (v3 and v4), pydantic's email-validator
 * and HTML's input type=email all take): a local part of letters, digits
 * and _+- in dot-separated atoms (64 bytes at most), a domain of
 * letter-or-digit labels with inner hyphens, a top-level label of 2-63
 * letters. A subset of the format: never an address the format rejects,
 * and none that a client's own check would refuse. */
#define EMAIL                                                              \
    "(?=[^@]{1,64}@)[A-Za-z0-9_+-]+(?:\\.[A-Za-z0-9_+-]+)*@(?:[A-Za-z0-9]" \
    "(?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\\.)+[A-Za-z]{2,63}"

/* ---- RFC 3986 ------------------------------------------------------------ */

#define PCT "%[0-9A-Fa-f]{2}"
#define PCHAR "(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|" PCT ")"
#define PCHAR_NC "(?:[A-Za-z0-9._~!$&'()*+,;=@-]|" PCT ")"
#define USERINFO "(?:[A-Za-z0-9._~!$&'()*+,;=:-]|" PCT ")*"
#define REGNAME "(?:[A-Za-z0-9._~!$&'()*+,;=-]|" PCT ")*"
#define IPLIT \
    "\\[(?:" IPV6 "|[Vv][0-9A-Fa-f]+\\.[A-Za-z0-9._~!$&'()*+,;=:-]+)\\]"
#define AUTHORITY "(?:" USERINFO "@)?(?:" IPLIT "|" REGNAME ")(?::[0-9]*)?"
#define ABEMPTY "(?:/" PCHAR "*)*"
#define QUERY "(?:" PCHAR "|[/?])*"
#define TAIL "(?:\\?" QUERY ")?(?:#" QUERY ")?"
#define URI                                                         \
    "[A-Za-z][A-Za-z0-9+.-]*:(?://" AUTHORITY ABEMPTY "|/(?:" PCHAR \
    "+" ABEMPTY ")?|" PCHAR "+" ABEMPTY ")?" TAIL
#define RELATIVE_REF                                                   \
    "(?://" AUTHORITY ABEMPTY "|/(?:" PCHAR "+" ABEMPTY ")?|" PCHAR_NC \
    "+" ABEMPTY ")?" TAIL

/* ---- the rest ------------------------------------------------------------- */

#define DURATION_TIME \
    "T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)"
#define DURATION                                                          \
    "P(?:(?:[0-9]+D|[0-9]+M(?:[0-9]+D)?|[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?)" \
    "(?:" DURATION_TIME ")?|" DURATION_TIME "|[0-9]+W)"
#define UUID                                                       \
    "[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-" \
    "[0-9A-Fa-f]{12}"
#define JSON_POINTER "(?:/(?:[^~/]|~[01])*)*"
#define REL_JSON_POINTER "(?:0|[1-9][0-9]*)(?:#|" JSON_POINTER ")"

static struct gm_format formats[] = {
    {"date-time", NULL, 0, "format \"date-time\""},
    {"date", DATE, 1, "format \"date\""},
    {"time", NULL, 0, "format \"time\""},
    {"duration", DURATION, 1, "format \"duration\""},
    {"email", EMAIL, 0, "format \"email\""},
    {"uuid", UUID, 1, "format \"uuid\""},
    {"ipv4", IPV4, 1, "format \"ipv4\""},
    {"ipv6", IPV6, 1, "format \"ipv6\""},
    {"hostname", HOSTNAME, 0, "format \"hostname\""},
    {"uri", URI, 1, "format \"uri\""},
    {"uri-reference", "(?:" URI "|" RELATIVE_REF ")", 1,
     "format \"uri-reference\""},
    {"iri", URI, 0, "format \"iri\""},
    {"iri-reference", "(?:" URI "|" RELATIVE_REF ")", 0,
     "format \"iri-reference\""},
    {"json-pointer", JSON_POINTER, 1, "format \"json-pointer\""},
    {"relative-json-pointer", REL_JSON_POINTER, 1,
     "format \"relative-json-pointer\""},
};

const struct gm_format *gm_format_find(const char *name, size_t n)
{
    for (size_t i = 0; i < sizeof formats / sizeof *formats; i++) {
        struct gm_format *f = &formats[i];
        if (strlen(f->name) != n || memcmp(f->name, name, n) != 0)
            continue;
        if (f->pattern == NULL) {
            pthread_once(&time_once, build_time);
            /* written once; every thread reads the same static text */
            static const struct gm_format dt = {"date-time", date_time_pat, 0,
                                                "format \"date-time\""};
            static const struct gm_format t = {"time", time_pat, 0,
                                               "format \"time\""};
            return strcmp(f->name, "time") == 0 ? &t : &dt;
        }
        return f;
    }
    return NULL;
}

int gm_format_item(const char *name, size_t n, struct gm_rx_item *out)
{
    const struct gm_format *f = gm_format_find(name, n);
    if (f == NULL)
        return TG_ENOTFOUND;
    *out = (struct gm_rx_item){.text = f->pattern,
                               .len = strlen(f->pattern),
                               .kind = GM_RX_FULL,
                               .name = f->label};
    return 0;
}

int32_t gm_format_json_string(struct gm_ir *ir, const char *name, size_t n,
                              uint32_t min_len, uint32_t max_len, char *err,
                              size_t errlen)
{
    struct gm_rx_item it;
    if (gm_format_item(name, n, &it) != 0)
        return tg_err_set(err, errlen, TG_ENOTFOUND,
                          "format \"%.*s\" is not known",
                          (int)(n > 64 ? 64 : n), name);
    return gm_regex_json_string_items(ir, &it, 1, min_len, max_len, err,
                                      errlen);
}
