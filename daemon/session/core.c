/* core.c: the session's core, which every run-side part reads: who the
 * members are and which of them take part in a round, the running session
 * of a run id, and the reference count that keeps a session alive while
 * pool jobs borrow its buffers.
 *
 * It sits below the parts (rounds, outbox, transfer, join, reconcile,
 * comeback) and session.c, which starts and ends a run and gives each
 * session its destructor: the last td__session_unref() calls it, so nothing
 * here calls back up into the parts it frees. Loop thread. */
#include "daemon/session/shared.h"

#include <inttypes.h>
#include <math.h>

#include "daemon/base/log.h"

/* Mixed into the link codec seed: the 64-bit golden ratio (Fibonacci hashing). */
#define CODEC_SEED_MIX 0x9e3779b97f4a7c15ull

const char *td__run_state_name(td__run_state_t s) {
  switch (s) {
  case TD__RUN_IDLE: return "idle";
  case TD__RUN_RUNNING: return "running";
  case TD__RUN_FINISHED: return "finished";
  case TD__RUN_FAILED: return "failed";
  case TD__RUN_STOPPED: return "stopped";
  case TD__RUN_MISSED: return "missed";
  }
  return "unknown";
}

size_t td__session_member(const td__session_t *s, uint64_t peer) {
  for (size_t i = 0; i < s->n_members; i++)
    if (s->members[i] == peer)
      return i;
  return TD_MEMBERS_MAX;
}

bool td__session_takes_part(td__session_t *s, size_t i, uint64_t round) {
  return i < s->n_members && s->members[i] != s->node->node_id && !s->away[i] &&
         s->since[i] != UINT64_MAX && (round == 0 || s->since[i] <= round) &&
         td_members_reachable(s->node->members, s->members[i]);
}

size_t td__session_peers(td__session_t *s, uint64_t round, uint64_t *out) {
  size_t k = 0;
  for (size_t i = 0; i < s->n_members; i++)
    if (td__session_takes_part(s, i, round))
      out[k++] = s->members[i];
  return k;
}

size_t td__session_partners(td__session_t *s, uint64_t round, bool sends, uint64_t *out,
                            bool *all) {
  size_t np = td__session_peers(s, round, out);
  td_topology_t topo = td_runspec_topology(&s->spec);
  size_t pos[TD_MEMBERS_MAX], me = TD_MEMBERS_MAX, n = 0;
  for (size_t i = 0; i < s->n_members; i++)
    if (s->since[i] != UINT64_MAX && s->since[i] <= round) {
      if (s->members[i] == s->node->node_id)
        me = n;
      pos[n++] = i;
    }
  bool last = s->rounds > 0 && round == s->rounds;
  if (topo.kind == TD_TOPO_MESH || last || me == TD_MEMBERS_MAX ||
      td_topology_at(&topo, n).kind == TD_TOPO_MESH) {
    if (all != NULL)
      *all = true;
    return np;
  }
  if (all != NULL)
    *all = false;
  size_t with[TD_MEMBERS_MAX];
  size_t k = sends ? td_topology_sends(&topo, s->spec.seed, round, n, me, with)
                   : td_topology_receives(&topo, s->spec.seed, round, n, me, with);
  size_t kept = 0;
  for (size_t p = 0; p < np; p++)
    for (size_t j = 0; j < k; j++)
      if (s->members[pos[with[j]]] == out[p]) {
        out[kept++] = out[p];
        break;
      }
  return kept;
}

uint64_t td__session_codec_seed(const td__session_t *s, uint64_t peer) {
  return peer ^ (s->node->node_id * CODEC_SEED_MIX);
}


double td__session_staleness(td__node_t *n, uint64_t peer) {
  if (n->session == NULL)
    return NAN;
  size_t i = td__session_member(n->session, peer);
  return i < TD_MEMBERS_MAX && n->session->staleness[i] >= 0 ? (double)n->session->staleness[i]
                                                             : NAN;
}

void td__session_send_all(td__session_t *s, Traind__Envelope *env) {
  uint64_t peers[TD_MEMBERS_MAX];
  size_t k = td__session_peers(s, 0, peers);
  for (size_t i = 0; i < k; i++) {
    td__link_t *l = td__link_find(s->node->net, peers[i]);
    if (l != NULL)
      td__link_send(s->node->net, l, env);
  }
}

td__session_t *td__session_of(td__node_t *n, uint64_t run_id) {
  return n->session != NULL && n->session->run_id == run_id ? n->session : NULL;
}

uint64_t td__session_last_id(td__node_t *n) {
  return n->session != NULL ? n->session->run_id : n->last_run ? n->last_run->run_id : 0;
}

void td__session_ref(td__session_t *s) { s->refs++; }

void td__session_unref(td__session_t **s_p) {
  td__session_t *s = *s_p;
  if (s == NULL)
    return;
  *s_p = NULL;
  if (--s->refs == 0)
    s->destroy(s);
}

void td__session_rejoined(td__node_t *n, uint64_t run_id, uint64_t round) {
  if (n->rejoin.run_id != run_id)
    return;
  uint64_t last = n->rejoin.last_round;
  td_log_info("back in run %016" PRIx64 " at round %" PRIu64 " (last round here %" PRIu64 ")",
              run_id, round, last);
  td__ledger_event(n->ledger, "run_rejoined",
                   "run %016" PRIx64 " back at round %" PRIu64 " after round %" PRIu64
                   ": rounds %" PRIu64 "..%" PRIu64 " missed",
                   run_id, round, last, last + 1, round - 1);
  n->rejoin.run_id = 0;
}
