/*
 * tg_config_internal.h — what tg_config.c (parsing) and tg_config_help.c
 * (--help, JSON dump) share. Not part of the public API (tg_config.h).
 */
#ifndef TG_CONFIG_INTERNAL_H
#define TG_CONFIG_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "common/base/tg_config.h"

/* Per type, indexed by enum tg_config_type: the name shown in --help, the
 * default metavar (NULL: none, or the choices for an enum) and the size of
 * the C field. */
struct tg_config__type_info {
    const char *name, *metavar;
    size_t size;
};
extern const struct tg_config__type_info tg_config__types[];

/* Writes the range ("[1, 64]", "(0, 1] or [1MiB, 1PiB]") or the choices
 * ("cpu|cuda") of e into buf[0..len); "" when it has none. */
void tg_config__format_range(const struct tg_config_entry *e, char *buf,
                             size_t len);

/* tg_config_help, with the ENVIRONMENT column (and the sentence about the
 * environment) left out when show_env is false. Returns 0, TG_ENOMEM or
 * TG_EIO. */
int tg_config__help(const struct tg_config_entry *table, size_t n,
                    const char *usage, bool show_env, FILE *out);

#endif /* TG_CONFIG_INTERNAL_H */
