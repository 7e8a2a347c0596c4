/*
 * gm_format.h — JSON Schema's `format`s as string languages: each is a
 * regular expression (gm_regex.h) whose every string is a valid value of
 * the format, so a grammar built from it never writes an invalid one.
 * Most are exact; where the exact language is not regular or would need
 * a very large automaton, a stated subset (the valid values outside it
 * are never generated):
 *
 *   date-time  RFC 3339 date "T" time (t, z in either case); days per
 *              month exact, Feb 29 only in leap years (Gregorian, years
 *              0000-9999); leap seconds (second 60) only at 23:59 UTC, and
 *              only with an offset of Z or of 00, 30 or 45 minutes (a
 *              leap second at an offset like +05:17 is never generated)
 *   date       RFC 3339 full-date, exact as above
 *   time       RFC 3339 full-time, leap seconds as above
 *   duration   ISO 8601 as RFC 3339 Appendix A's ABNF (P1Y2M, PT36H,
 *              P2W), exact
 *   email      RFC 5321 Mailbox: a dot-atom or quoted-string local part
 *              of at most 64 octets, "@", a domain as `hostname` below or
 *              an address literal [IPv4] or [IPv6:...]; subset: the
 *              domain's limit, and no general address literal
 *   uuid       RFC 4122 text form, hex digits of either case, exact
 *   ipv4       dotted quad, no leading zeros, exact
 *   ipv6       RFC 4291 text form (:: compression, embedded IPv4), no zone,
 *              exact
 *   hostname   RFC 1123 LDH labels (letters, digits, inner hyphens) joined
 *              by dots; subset: at most 63 characters in all (so every
 *              label fits), and no label with "--" in its 3rd and 4th
 *              characters (A-labels "xn--..." would need Punycode and IDNA
 *              checks)
 *   uri        RFC 3986 URI (scheme ":" hier-part ["?" query] ["#"
 *              fragment], percent-encodings checked, IP literals checked),
 *              ASCII only, exact for RFC 3986
 *   uri-reference  URI or relative reference, exact as above
 *   iri, iri-reference  the URI forms (ASCII IRIs): subset
 *   json-pointer, relative-json-pointer  RFC 6901 / the JSON Schema
 *              draft, exact
 *   idn-email, idn-hostname  the ASCII forms above: subset
 * Any other name (regex, uri-template, a typo, a vendor's own) is unknown
 * here: gm_format_find returns NULL and the functions TG_ENOTFOUND, and
 * the caller decides (JSON Schema 2020-12's default vocabulary makes
 * `format` an annotation, so an unknown one constrains nothing).
 * Thread: any (the tables are constant; the date-time pattern is built
 * once, thread-safely).
 */
#ifndef GM_FORMAT_H
#define GM_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "common/grammar/gm_ir.h"
#include "common/grammar/gm_regex.h"

struct gm_format {
    const char *name;
    const char *pattern; /* whole-string pattern (GM_RX_FULL), static */
    int exact;           /* 1: every valid value; 0: a stated subset */
    const char *label;   /* `format "name"`, for messages */
};

/* The format named [name, name + n), or NULL when unknown here. */
const struct gm_format *gm_format_find(const char *name, size_t n);

/* The condition "is a valid `name`" as a regex item (GM_RX_FULL over the
 * format's static pattern), to combine with a `pattern` and lengths in
 * one gm_regex_expr call. Returns 0 or TG_ENOTFOUND. */
int gm_format_item(const char *name, size_t n, struct gm_rx_item *out);

/* A whole JSON string of format `name` with min_len..max_len code points
 * (max_len GM_REPEAT_INF: none), as a new rule of ir. Returns the rule
 * id, TG_ENOTFOUND (an unknown format: nothing is written and nothing is
 * recorded in the IR), or gm_regex_expr's codes (TG_EINVAL when no value
 * of the format has such a length). */
int32_t gm_format_json_string(struct gm_ir *ir, const char *name, size_t n,
                              uint32_t min_len, uint32_t max_len, char *err,
                              size_t errlen);

#endif /* GM_FORMAT_H */
