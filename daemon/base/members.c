/* members.c: a fixed-size table (TD_MEMBERS_MAX, the cluster limit) with a
 * timeout-based failure detector and slot reuse (a member that left, then
 * the one dead longest past TD_MEMBERS_EVICT_AFTER_S, gives its slot to a
 * new node). Kept deliberately free of I/O so the state machine is
 * unit-tested with a fake clock. */
#include "daemon/base/members.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

struct td_members {
  td_member_t peers[TD_MEMBERS_MAX];
  size_t count;
  double suspect_after_s, dead_after_s;
  td_members_hooks_t hooks;
  uint64_t evictions;
};

int td_members_open(td_members_t **out, uint64_t self_id, const char *self_endpoint,
                    double suspect_after_s, double dead_after_s) {
  td_members_t *m = calloc(1, sizeof *m);
  if (m == NULL)
    return TD_ENOMEM;
  m->suspect_after_s = suspect_after_s;
  m->dead_after_s = dead_after_s;
  td_member_t *me = &m->peers[m->count++];
  me->node_id = self_id;
  snprintf(me->endpoint, sizeof me->endpoint, "%s", self_endpoint ? self_endpoint : "");
  me->state = TD_PEER_ALIVE;
  me->self = true;
  *out = m;
  return 0;
}

void td_members_close(td_members_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  free(*self_p);
  *self_p = NULL;
}

void td_members_set_hooks(td_members_t *m, const td_members_hooks_t *hooks) {
  m->hooks = hooks != NULL ? *hooks : (td_members_hooks_t){0};
}

td_member_t *td_members_find(td_members_t *m, uint64_t node_id) {
  for (size_t i = 0; i < m->count; i++)
    if (m->peers[i].node_id == node_id)
      return &m->peers[i];
  return NULL;
}

bool td_members_reachable(const td_members_t *m, uint64_t node_id) {
  for (size_t i = 0; m != NULL && i < m->count; i++)
    if (m->peers[i].node_id == node_id)
      return !m->peers[i].self &&
             (m->peers[i].state == TD_PEER_ALIVE || m->peers[i].state == TD_PEER_SUSPECT);
  return false;
}

/* The slot a new node may take in a full table at `now`: a member that left
 * (the one silent longest), else the member dead longest once dead for
 * TD_MEMBERS_EVICT_AFTER_S; never this node, an alive or suspect member, or
 * one the owner pins. NULL when there is none. */
static td_member_t *reusable_slot(const td_members_t *m, double now) {
  const td_member_t *best = NULL;
  for (size_t i = 0; i < m->count; i++) {
    const td_member_t *p = &m->peers[i];
    bool left = p->state == TD_PEER_LEFT;
    bool dead_long = p->state == TD_PEER_DEAD &&
                     now - p->last_heard >= m->dead_after_s + TD_MEMBERS_EVICT_AFTER_S;
    if (p->self || !(left || dead_long))
      continue;
    if (m->hooks.pinned != NULL && m->hooks.pinned(p->node_id, m->hooks.user))
      continue;
    bool best_left = best != NULL && best->state == TD_PEER_LEFT;
    if (best == NULL || (left && !best_left) ||
        (left == best_left && p->last_heard < best->last_heard))
      best = p;
  }
  return (td_member_t *)best;
}

bool td_members_has_room(const td_members_t *m, uint64_t node_id, double now) {
  if (m->count < TD_MEMBERS_MAX)
    return true;
  for (size_t i = 0; i < m->count; i++)
    if (m->peers[i].node_id == node_id)
      return true;
  return reusable_slot(m, now) != NULL;
}

static td_member_t *add(td_members_t *m, uint64_t node_id, const char *endpoint, double now) {
  td_member_t *p = NULL;
  if (m->count < TD_MEMBERS_MAX) {
    p = &m->peers[m->count++];
  } else if ((p = reusable_slot(m, now)) != NULL) {
    m->evictions++;
    if (m->hooks.evicted != NULL)
      m->hooks.evicted(p, m->hooks.user);
  } else {
    return NULL;
  }
  memset(p, 0, sizeof *p);
  p->node_id = node_id;
  snprintf(p->endpoint, sizeof p->endpoint, "%s", endpoint ? endpoint : "");
  p->state = TD_PEER_ALIVE;
  p->last_heard = now;
  return p;
}

int td_members_heard(td_members_t *m, uint64_t node_id, const char *endpoint, double now,
                     td_member_event_t *event) {
  *event = TD_MEMBER_NOCHANGE;
  td_member_t *p = td_members_find(m, node_id);
  if (p == NULL) {
    if ((p = add(m, node_id, endpoint, now)) == NULL)
      return TD_ERANGE;
    *event = TD_MEMBER_JOINED;
    return 0;
  }
  if (p->self)
    return 0;
  if (endpoint != NULL && endpoint[0] != '\0')
    snprintf(p->endpoint, sizeof p->endpoint, "%s", endpoint);
  if (p->state != TD_PEER_ALIVE)
    *event = TD_MEMBER_REVIVED;
  p->state = TD_PEER_ALIVE;
  p->last_heard = now;
  return 0;
}

int td_members_learn(td_members_t *m, uint64_t node_id, const char *endpoint, double now) {
  if (td_members_find(m, node_id) != NULL)
    return 0;
  return add(m, node_id, endpoint, now) != NULL;
}

void td_members_left(td_members_t *m, uint64_t node_id) {
  td_member_t *p = td_members_find(m, node_id);
  if (p != NULL && !p->self)
    p->state = TD_PEER_LEFT;
}

void td_members_tick(td_members_t *m, double now, td_members_event_fn fn, void *user) {
  for (size_t i = 0; i < m->count; i++) {
    td_member_t *p = &m->peers[i];
    if (p->self || p->state == TD_PEER_DEAD || p->state == TD_PEER_LEFT)
      continue;
    double silent = now - p->last_heard;
    if (silent >= m->dead_after_s) {
      p->state = TD_PEER_DEAD;
      if (fn)
        fn(p, TD_MEMBER_DIED, user);
    } else if (silent >= m->suspect_after_s && p->state == TD_PEER_ALIVE) {
      p->state = TD_PEER_SUSPECT;
      if (fn)
        fn(p, TD_MEMBER_SUSPECTED, user);
    }
  }
}

size_t td_members_count(const td_members_t *m) { return m->count; }

uint64_t td_members_evictions(const td_members_t *m) { return m->evictions; }

const td_member_t *td_members_at(const td_members_t *m, size_t i) {
  return i < m->count ? &m->peers[i] : NULL;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

size_t td_members_live(const td_members_t *m, bool include_suspect, uint64_t *ids, size_t cap) {
  size_t n = 0;
  for (size_t i = 0; i < m->count && n < cap; i++) {
    td_peer_state_t s = m->peers[i].state;
    if (s == TD_PEER_ALIVE || (include_suspect && s == TD_PEER_SUSPECT))
      ids[n++] = m->peers[i].node_id;
  }
  qsort(ids, n, sizeof *ids, cmp_u64);
  return n;
}

const char *td_peer_state_name(td_peer_state_t s) {
  switch (s) {
  case TD_PEER_ALIVE: return "alive";
  case TD_PEER_SUSPECT: return "suspect";
  case TD_PEER_DEAD: return "dead";
  case TD_PEER_LEFT: return "left";
  }
  return "unknown";
}
