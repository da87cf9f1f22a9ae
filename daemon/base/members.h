/* members.h: the membership table and its failure detector.
 *
 * Pure bookkeeping, no sockets: the daemon reports what it heard (hello,
 * heartbeat, gossip) and ticks the table with the current time; the table
 * answers with transitions. A peer not heard from for suspect_after_s is
 * SUSPECT, for dead_after_s DEAD (a run carries on without it); a dead peer
 * that is heard from again is readmitted as ALIVE. LEFT is final until the
 * peer says hello again. The local node is a member too (always alive).
 *
 * Slots are reused, so a full table (TD_MEMBERS_MAX) does not stay full until
 * restart: a new node takes the slot of a member that left (or was revoked)
 * at once, else of the member dead longest, once it has been dead for
 * TD_MEMBERS_EVICT_AFTER_S. A member that is alive or suspect is never
 * evicted, nor one the `pinned` hook keeps (a current run member). Nothing
 * outside this table holds a slot index: links, run member lists, the
 * ledger's peers and ranks all name members by node id, so a reused slot
 * cannot be mistaken for its old occupant. */
#ifndef TD_MEMBERS_H
#define TD_MEMBERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/limits.h"

#define TD_MEMBERS_MAX TD_MAX_NODES
#define TD_ENDPOINT_MAX 256
/* How long a member must have been dead (after dead_after_s of silence)
 * before a new node may take its slot in a full table: 10 minutes, far past
 * any restart or network blip a run rides out (`trainctl leave` and revoke
 * free a slot at once). */
#define TD_MEMBERS_EVICT_AFTER_S 600.0

typedef enum {
  TD_PEER_ALIVE = 0,
  TD_PEER_SUSPECT,
  TD_PEER_DEAD,
  TD_PEER_LEFT,
} td_peer_state_t;

typedef struct {
  uint64_t node_id;
  char endpoint[TD_ENDPOINT_MAX];
  td_peer_state_t state;
  double last_heard; /* seconds, monotonic clock of the caller */
  double capacity;   /* samples/s reported in heartbeats */
  uint64_t round;    /* last round reported */
  uint64_t run_id;   /* run of its last heartbeat (0: idle) */
  uint64_t ended_run; /* the last run it says it ended (0: none) */
  bool reported;     /* a heartbeat arrived (run_id is known) */
  bool run_ready;    /* its last heartbeat said its run's data and backend are ready */
  bool self;
  unsigned redials;  /* the owner's: its link dialed again since it was last alive */
  bool vouched;      /* the owner's: dead here, but listed alive by another member since */
} td_member_t;

typedef enum {
  TD_MEMBER_NOCHANGE = 0,
  TD_MEMBER_JOINED,    /* first time seen */
  TD_MEMBER_REVIVED,   /* was suspect, dead or left; alive again */
  TD_MEMBER_SUSPECTED,
  TD_MEMBER_DIED,
} td_member_event_t;

typedef struct td_members td_members_t;

/* What the owner of the table says about reuse: `pinned` answers whether a
 * member must keep its slot whatever its state (a current run member);
 * `evicted` hears of a member whose slot goes to a new node, just before the
 * slot is overwritten (the member is borrowed for the call). Either may be
 * NULL. */
typedef struct {
  bool (*pinned)(uint64_t node_id, void *user);
  void (*evicted)(const td_member_t *gone, void *user);
  void *user;
} td_members_hooks_t;

int td_members_open(td_members_t **out, uint64_t self_id, const char *self_endpoint,
                    double suspect_after_s, double dead_after_s);
void td_members_close(td_members_t **self_p);
/* Installs the reuse hooks (copied; NULL removes them). */
void td_members_set_hooks(td_members_t *m, const td_members_hooks_t *hooks);

/* Direct evidence that node_id is alive at `now`. Adds it if new, in a free
 * or reusable slot (see above); returns TD_ERANGE when the table is full,
 * TD_MEMBERS_MAX entries, this node's included, and none can be reused.
 * *event says what changed. endpoint may be NULL (keep the known one). */
int td_members_heard(td_members_t *m, uint64_t node_id, const char *endpoint, double now,
                     td_member_event_t *event);
/* Whether node_id is in the table already or would fit at `now` (a free or
 * reusable slot): false is the answer to give a node that asks to join a
 * full cluster. */
bool td_members_has_room(const td_members_t *m, uint64_t node_id, double now);
/* Learn of a peer second hand (gossip): added as alive with last_heard = now
 * if unknown (reusing a slot like td_members_heard), otherwise nothing
 * changes. Returns 1 when it was new. */
int td_members_learn(td_members_t *m, uint64_t node_id, const char *endpoint, double now);
/* The peer said it leaves. */
void td_members_left(td_members_t *m, uint64_t node_id);
/* Advance the failure detector; fn is called for every transition. */
typedef void (*td_members_event_fn)(const td_member_t *peer, td_member_event_t ev, void *user);
void td_members_tick(td_members_t *m, double now, td_members_event_fn fn, void *user);

size_t td_members_count(const td_members_t *m);
/* How many members lost their slot to a new node since the table opened. */
uint64_t td_members_evictions(const td_members_t *m);
/* Borrowed until the next call that changes the table. */
const td_member_t *td_members_at(const td_members_t *m, size_t i);
td_member_t *td_members_find(td_members_t *m, uint64_t node_id);
/* The member is alive or suspect, and not us (false when unknown; m may be NULL). */
bool td_members_reachable(const td_members_t *m, uint64_t node_id);
/* Node ids of alive (and suspect, when include_suspect) members, self
 * included, sorted ascending. Returns how many were written (<= cap). */
size_t td_members_live(const td_members_t *m, bool include_suspect, uint64_t *ids, size_t cap);
const char *td_peer_state_name(td_peer_state_t s);

#endif
