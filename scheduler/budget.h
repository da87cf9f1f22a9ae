/* budget.h: the per-link byte budget of codec = auto
 * (docs/algorithms.md#per-link-budgets-codec-auto).
 *
 * Pure arithmetic on a link's measurements: the goodput estimate (bytes/s)
 * that update acknowledgements feed, and the bytes an update may take so that
 * the exchange hides behind the next round's compute. No clock, no socket:
 * the daemon (daemon/net/transport.c) passes the times in. */
#ifndef TD_BUDGET_H
#define TD_BUDGET_H

#include <stdint.h>

/* Share of the link's goodput an update may use (the rest: control traffic). */
#define TD_BUDGET_SHARE 0.8
/* An update under this fraction of the budget was app-limited: its ack time
 * is mostly latency, so it may raise the goodput estimate, never lower it. */
#define TD_BUDGET_APP_LIMITED 0.5
/* EWMA weight of a new goodput sample. */
#define TD_BUDGET_EWMA 0.3

/* Bytes the link carries in the time the round computed (at least min_s, so
 * a round of milliseconds does not starve every update down to the floor),
 * times TD_BUDGET_SHARE. 0 when the goodput is unknown (<= 0). */
double td_budget_link_bytes(double goodput_bps, double compute_s, double min_s);

/* The goodput estimate after an ack of `bytes` that took `seconds` since the
 * send: the EWMA of the sample, except that an app-limited update (under
 * TD_BUDGET_APP_LIMITED of `budget`) may only raise it. Unchanged when
 * seconds is not positive. */
double td_budget_goodput_acked(double goodput_bps, double bytes, double seconds,
                               double budget);

/* An update of `bytes` still unacknowledged `since_s` after its send: the link
 * delivered less than bytes / since_s, so a higher estimate comes down to that,
 * and a link not measured yet (goodput_bps not > 0) takes it as its first
 * estimate. Without it a size too big for the link locks itself in: its
 * updates are never acked in time to correct it (an overestimate; or the
 * cautious first codec of an unmeasured link whose first acks come after
 * their slot is reused: a 2 Mbit/s uplink then stays saturated for a whole
 * run). Unchanged when nothing is pending. */
double td_budget_goodput_unacked(double goodput_bps, uint64_t bytes, double since_s);

#endif
