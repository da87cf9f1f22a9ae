/* roundclose.c: one set of contributors per round, agreed through a coordinator.
 *
 * Threads: loop thread. In sync runs whose rounds may close before every
 * update is in (min_updates, round_deadline = adaptive), each node used to
 * close a round on the updates it had received, so a straggler's update that
 * reached some nodes before their cut and others after it parted their
 * models. Now one member decides: the coordinator, the member of lowest id
 * that takes part (in this node's view). It cuts by the run's rule, closes
 * the round and sends RoundClose{round, members} to the others, who cut
 * exactly the members outside that set (their updates are left out of the
 * average even when they came) and wait for those inside it. The fixed
 * deadline (round_timeout) still holds: a member that hears no RoundClose by
 * then closes on what it has, as before. A RoundClose is taken only from a
 * member that may be the coordinator (no member of lower id takes part in
 * this node's view), once per round, for the open round and the next
 * TD__RING - 1. rounds.c hands this file the message and then closes the
 * round; this file never calls rounds.c. */
#include "daemon/session/shared.h"

#include <inttypes.h>

#include "common/error.h"
#include "daemon/base/log.h"

bool td__roundclose_coordinated(const td__session_t *s) {
  return s->n_members > 1 && s->spec.mode_kind == TD_MODE_SYNC &&
         (s->spec.min_updates > 0 || s->spec.deadline_mad_c > 0);
}

/* Whether `id` may coordinate: no member of lower id takes part (this node
 * counts as taking part). */
static bool may_coordinate(td__session_t *s, uint64_t id) {
  if (s->node->node_id < id)
    return false;
  for (size_t i = 0; i < s->n_members; i++)
    if (s->members[i] < id && td__session_takes_part(s, i, 0))
      return false;
  return true;
}

bool td__roundclose_coordinates(td__session_t *s) {
  return td__roundclose_coordinated(s) && may_coordinate(s, s->node->node_id);
}

bool td__roundclose_agreed(const td__session_t *s, uint64_t round, uint64_t *members) {
  const td__round_close_t *c = &s->closes[round % TD__RING];
  if (round == 0 || c->round != round)
    return false;
  *members = c->members;
  return true;
}

void td__roundclose_send(td__session_t *s, uint64_t round, uint64_t members) {
  Traind__RoundClose rc = TRAIND__ROUND_CLOSE__INIT;
  rc.round = round;
  rc.members = members;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_ROUND_CLOSE;
  env.round_close = &rc;
  env.run_id = s->run_id;
  td__session_send_all(s, &env);
}

bool td__roundclose_take(td__node_t *n, td__session_t *s, const Traind__Envelope *env) {
  const Traind__RoundClose *rc = env->round_close;
  if (s == NULL || td__session_member(s, env->sender) == TD_MEMBERS_MAX ||
      !td__roundclose_coordinated(s)) {
    td__drop(&n->drops, TD__DROP_WRONG_RUN, "round close outside our run");
    return false;
  }
  if (rc->round < s->round) {
    td__drop(&n->drops, TD__DROP_LATE, NULL);
    return false;
  }
  if (rc->round >= s->round + TD__RING || rc->round > s->rounds) {
    td__drop(&n->drops, TD__DROP_AHEAD, NULL);
    return false;
  }
  uint64_t all = s->n_members >= 64 ? UINT64_MAX : (1ull << s->n_members) - 1;
  if ((rc->members & ~all) != 0) {
    td__drop(&n->drops, TD__DROP_MALFORMED, "round close naming members the run lacks");
    return false;
  }
  if (!may_coordinate(s, env->sender)) {
    td__drop(&n->drops, TD__DROP_FORBIDDEN, NULL);
    if (td__drop_should_log(n->drops.count[TD__DROP_FORBIDDEN]))
      td_log_warn("run %016" PRIx64 ": refused round %" PRIu64 "'s close from %016" PRIx64
                  ": a member of lower id coordinates", s->run_id, rc->round, env->sender);
    return false;
  }
  td__round_close_t *c = &s->closes[rc->round % TD__RING];
  if (c->round == rc->round) { /* the first close of a round counts */
    td__drop(&n->drops, TD__DROP_DUPLICATE, NULL);
    return false;
  }
  *c = (td__round_close_t){.round = rc->round, .members = rc->members};
  return true;
}
