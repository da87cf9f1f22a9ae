/* drops.c: the counters of refused peer messages, by kind.
 *
 * Every part that refuses a peer's message (the transport for frames that do
 * not parse, dispatch for strangers and forbidden requests, the session's
 * parts for messages of the wrong run or round) counts it here; status and
 * the monitor read the counts. Logging is rate-limited: the first ones in
 * full, then every DROP_LOG_EVERY-th; the first few of each kind are logged
 * whatever came before, so a new kind of refusal (an attack that starts
 * after a flood of another) is never silent. Loop thread. */
#include "daemon/net/net.h"

#include "daemon/base/log.h"

/* Drops logged one by one before only every LOG_EVERY-th is. */
#define DROP_LOGS_IN_FULL 20
#define DROP_LOG_EVERY 1000
/* Drops of one kind logged in full whatever the other kinds logged. */
#define DROP_LOGS_PER_KIND 3

static const char *const drop_names[] = {
#define TD__DROP_NAME(u, l) #l,
    TD__DROPS(TD__DROP_NAME)
#undef TD__DROP_NAME
};

const char *td__drop_name(td__drop_t kind) {
  return kind < TD__DROP_COUNT ? drop_names[kind] : "unknown";
}

bool td__drop_should_log(uint64_t count) {
  return count <= DROP_LOGS_IN_FULL || count % DROP_LOG_EVERY == 0;
}

void td__drop(td__drops_t *d, td__drop_t kind, const char *what) {
  d->count[kind]++;
  if (what == NULL)
    return;
  d->logged++;
  if (d->count[kind] <= DROP_LOGS_PER_KIND || td__drop_should_log(d->logged))
    td_log_warn("dropped a peer message: %s (drops so far: %u)", what, d->logged);
}
