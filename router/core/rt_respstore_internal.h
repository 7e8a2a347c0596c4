/*
 * rt_respstore_internal.h — what rt_respstore.c (memory) and
 * rt_respstore_db.c (SQLite) share. Not for other modules. Loop thread
 * unless a comment says otherwise.
 */
#ifndef RT_RESPSTORE_INTERNAL_H
#define RT_RESPSTORE_INTERNAL_H

#include "router/core/rt_respstore.h"

/* What e counts against max_bytes. */
size_t rt_respstore__entry_bytes(const struct rt_resp_entry *e);

/* A reference more on e. */
void rt_respstore__ref(struct rt_resp_entry *e);

/* Lists e (its fields set, refs ignored: the store's reference is made
 * here) as the newest entry (`newest`) or, for entries read back from the
 * database newest first, as the oldest so far. Returns 0 or TG_ENOMEM. */
int rt_respstore__list(struct rt_respstore *st, struct rt_resp_entry *e,
                       int newest);

/* The database (rt_respstore_db.c). open: opens or creates st->cfg.db_path,
 * reads the scope key and the entries back (within the bounds; the rest
 * deleted); 0 or TG_EIO / TG_ENOMEM with err. close: commits what is
 * pending on the calling thread (callbacks called), closes. put / delete:
 * queue the change (put takes a reference to e until it is written),
 * `done` (may be NULL) called once with the commit's outcome; 0 or
 * TG_ENOMEM. kick: hands what is queued to a job when none is in flight. */
int rt_respstore__db_open(struct rt_respstore *st, char *err, size_t errlen);
void rt_respstore__db_close(struct rt_respstore *st);
int rt_respstore__db_put(struct rt_respstore *st, struct rt_resp_entry *e,
                         rt_respstore_done_fn done, void *ud);
int rt_respstore__db_delete(struct rt_respstore *st, const char *id,
                            rt_respstore_done_fn done, void *ud);
void rt_respstore__db_kick(struct rt_respstore *st);

#endif /* RT_RESPSTORE_INTERNAL_H */
