/* control_run.c: the control commands about the run: `start`, `stop` and
 * `verify`.
 *
 * Threads: loop thread. A start answers only once it knows how it went. It
 * runs here first, unannounced, until its data and backend are ready, so a
 * mistake this node can see (model vs dataset, a missing backend, its limits)
 * starts nothing anywhere; then the members are told, and the answer waits
 * until each has said ready (heartbeat run_state 2) or refused (RunRefused),
 * bounded. */
#include "daemon/control_run.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "compute/safetensors.h"
#include "daemon/base/log.h"

/* A start waits at most START_LOCAL_MS for this node's own data and backend
 * before it tells the members anyway, and answers within START_WAIT_MS (under
 * trainctl's 30 s) whether or not every member has said ready or refused. */
#define START_LOCAL_MS 12000
#define START_WAIT_MS 25000
/* Once told, the members have this long to show (heartbeat) that they hold
 * the run before this node's first round goes anyway: an update of a run a
 * node does not hold yet is dropped. */
#define START_HOLD_MS 3000
#define START_TICK_MS 100

/* A run id nobody else picks: FNV-1a over the spec, our id and the time. */
#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull
static uint64_t fnv1a64(const void *data, size_t len, uint64_t h) {
  const uint8_t *p = data;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= FNV_PRIME;
  }
  return h;
}

/* Tell the members about the run started here (the RunStart kept until now). */
static void announce(conn_t *c, td__session_t *s) {
  Traind__RunStart rs = TRAIND__RUN_START__INIT;
  rs.spec = c->start_text;
  rs.members = c->start_members;
  rs.n_members = c->start_n;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_RUN_START;
  env.run_start = &rs;
  env.run_id = c->start_run;
  td__node_t *n = c->ctl->n;
  td__transport_broadcast(n->net, &env);
  /* a member silent now (stopped, suspended, stalled past the dead mark while
   * this node set the run up) still gets the run: its connection holds the
   * message until it resumes, and it then learns the run's fate from us */
  for (size_t i = 0; i < c->start_n; i++) {
    uint64_t id = c->start_members[i];
    td__link_t *l = id != n->node_id && !td_members_reachable(n->members, id)
                        ? td__link_find(n->net, id) : NULL;
    if (l != NULL)
      td__link_send(n->net, l, &env);
  }
  s->unannounced = false;
  free(c->start_text);
  c->start_text = NULL;
  c->start_announced_ms = uv_now(&c->ctl->n->loop);
}

/* The answer to a start once each member has said ready or refused (or the
 * wait is over): a run nobody else takes part in is stopped and refused. */
static void answer_start(conn_t *c, td__session_t *s, size_t ready, size_t refused,
                         size_t waiting) {
  uv_timer_stop(&c->wait_timer);
  char msg[768];
  if (refused > 0 && refused == s->n_members - 1) {
    snprintf(msg, sizeof msg, "no other member can run it, so run %016" PRIx64 " is stopped: %s",
             s->run_id, s->refused);
    td_run_stop(s->run);
    respond(c, TD_EINVAL, msg, NULL);
    return;
  }
  json_object *o = json_object_new_object();
  json_object_object_add(o, "run_id", td__json_id(s->run_id));
  json_object_object_add(o, "nodes", json_object_new_int((int)s->n_members));
  json_object_object_add(o, "ready", json_object_new_int((int)ready + 1));
  json_object_object_add(o, "waiting", json_object_new_int((int)waiting));
  json_object_object_add(o, "wait_s", json_object_new_double(START_WAIT_MS / 1000.0));
  json_object_object_add(o, "refused", json_object_new_string(s->refused));
  respond_json(c, o);
}

/* The answer to a start whose run finished before every member answered. */
static void answer_ended(conn_t *c, const td__run_stats_t *last) {
  size_t refused = 0;
  for (const char *p = last->refused; (p = strstr(p, " refused: ")) != NULL; p++)
    refused++;
  json_object *o = json_object_new_object();
  json_object_object_add(o, "run_id", td__json_id(last->run_id));
  json_object_object_add(o, "nodes", json_object_new_int((int)last->nodes));
  json_object_object_add(o, "ready", json_object_new_int((int)(last->nodes - refused)));
  json_object_object_add(o, "waiting", json_object_new_int(0));
  json_object_object_add(o, "refused", json_object_new_string(last->refused));
  respond_json(c, o);
}

/* Every START_TICK_MS of a pending start: first this node's own set-up (a
 * failure there is the answer, and nobody else heard of the run), then the
 * members' heartbeats (ready) and refusals. */
static void on_start_tick(uv_timer_t *t) {
  conn_t *c = t->data;
  td__node_t *n = c->ctl->n;
  td__session_t *s = td__session_of(n, c->start_run);
  uint64_t waited = uv_now(t->loop) - c->start_began_ms;
  char msg[768];
  if (s == NULL) { /* the run ended here before the answer */
    uv_timer_stop(t);
    const td__run_stats_t *last = n->last_run;
    bool ours = last != NULL && last->run_id == c->start_run;
    if (ours && c->start_text == NULL && last->state == TD__RUN_FINISHED) {
      answer_ended(c, last); /* a short run, over already */
      return;
    }
    snprintf(msg, sizeof msg, "%s%s",
             c->start_text != NULL ? "run not started: " : "the run ended at once: ",
             ours && last->error[0] ? last->error : "it ended before it began");
    respond(c, TD_ECONFIG, msg, NULL);
    return;
  }
  if (c->start_text != NULL) {
    if (!s->ready && waited < START_LOCAL_MS)
      return;
    announce(c, s);
  }
  size_t ready = 0, refused = 0, waiting = 0, unheard = 0;
  for (size_t i = 0; i < s->n_members; i++) {
    const td_member_t *m = td_members_find(n->members, s->members[i]);
    if (s->members[i] == n->node_id)
      continue;
    if (s->since[i] == UINT64_MAX)
      refused += !s->out[i]; /* put out (away too often, comeback.c) is not a refusal */
    else if (m != NULL && m->run_id == s->run_id && m->run_ready)
      ready++;
    else
      waiting++;
    if (s->since[i] != UINT64_MAX && (m == NULL || m->run_id != s->run_id))
      unheard++;
  }
  if (!c->start_released &&
      (unheard == 0 || uv_now(t->loop) - c->start_announced_ms >= START_HOLD_MS)) {
    c->start_released = true;
    td_run_go(s->run);
  }
  if (c->start_released && (waiting == 0 || waited >= START_WAIT_MS))
    answer_start(c, s, ready, refused, waiting);
}

/* init = FILE: the spec carries this node's file's hash, so that every member
 * checks it holds the same file (the path resolved as its policy does). */
static int init_hash(td__node_t *n, td_runspec_t *spec, char *why, size_t why_len) {
  if (strcmp(spec->init, "none") == 0 || strcmp(spec->init_hash, "none") != 0)
    return 0;
  td_runspec_t resolved = *spec;
  int rc = td__policy_check(&n->policy, &resolved, 1, why, why_len);
  char hex[TD_SAFETENSORS_HASH_HEX];
  if (rc == 0)
    rc = td_safetensors_file_hash(resolved.init, hex, why, why_len);
  if (rc == 0)
    snprintf(spec->init_hash, sizeof spec->init_hash, "%s", hex);
  return rc;
}

void td__control_cmd_start(conn_t *c, const Traind__ControlRequest *req) {
  td__node_t *n = c->ctl->n;
  char why[1536] = ""; /* room for an unknown key's list of every run key */
  td_runspec_t spec;
  td_runspec_defaults(&spec);
  int rc = 0;
  if (req->ini_text != NULL && req->ini_text[0] != '\0') /* parsed in memory, no disk */
    rc = td_runspec_load_ini_text(&spec, req->ini_text, "run file", why, sizeof why);
  for (size_t i = 0; rc == 0 && i < req->n_settings; i++)
    rc = td_runspec_set_arg(&spec, req->settings[i], why, sizeof why);
  if (rc == 0)
    rc = td_runspec_validate(&spec, why, sizeof why);
  if (rc != 0) {
    respond(c, TD_ECONFIG, why, NULL);
    return;
  }
  if (n->session != NULL) {
    if (td_run_stopping(n->session->run))
      snprintf(why, sizeof why, "run %016" PRIx64 " is still stopping; start again in a moment",
               n->session->run_id);
    else
      snprintf(why, sizeof why, "run %016" PRIx64 " is still running (trainctl stop first)",
               n->session->run_id);
    respond(c, TD_EINVAL, why, NULL);
    return;
  }
  if ((rc = init_hash(n, &spec, why, sizeof why)) != 0) {
    respond(c, rc, why, NULL);
    return;
  }
  size_t need = td_runspec_format(&spec, NULL, 0) + 1;
  char *text = malloc(need);
  if (text == NULL) {
    respond(c, TD_ENOMEM, "out of memory", NULL);
    return;
  }
  td_runspec_format(&spec, text, need);
  uint64_t members[TD_MEMBERS_MAX];
  size_t nm = td_members_live(n->members, false, members, TD_MEMBERS_MAX);
  double now = td_clock_wall_s();
  uint64_t run_id = fnv1a64(text, strlen(text), FNV_OFFSET);
  run_id = fnv1a64(&n->node_id, sizeof n->node_id, run_id);
  run_id = fnv1a64(&now, sizeof now, run_id);
  if (run_id == 0)
    run_id = 1;
  rc = td__session_start(n, run_id, text, members, nm, 1, 0, true, why, sizeof why);
  if (rc != 0) {
    free(text);
    respond(c, rc, why, NULL);
    return;
  }
  c->start_run = run_id;
  c->start_text = text;
  memcpy(c->start_members, members, nm * sizeof *members);
  c->start_n = nm;
  c->start_began_ms = uv_now(&n->loop);
  uv_timer_start(&c->wait_timer, on_start_tick, START_TICK_MS, START_TICK_MS);
}

void td__control_cmd_stop(conn_t *c) {
  td__node_t *n = c->ctl->n;
  td__session_t *s = n->session;
  if (s == NULL) {
    respond(c, TD_EINVAL, "no run is running", NULL);
    return;
  }
  Traind__RunStop stop = TRAIND__RUN_STOP__INIT;
  stop.reason = "trainctl stop";
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_RUN_STOP;
  env.run_stop = &stop;
  env.run_id = s->run_id;
  td__transport_broadcast(n->net, &env);
  td_run_stop(s->run);
  json_object *o = json_object_new_object();
  json_object_object_add(o, "stopping", td__json_id(s->run_id));
  respond_json(c, o);
}

/* trainctl verify: every member hashes its state a few rounds ahead; the
 * answer names that round, and status shows the vote once it is decided. */
void td__control_cmd_verify(conn_t *c) {
  td__node_t *n = c->ctl->n;
  td__session_t *s = n->session;
  char why[256];
  uint64_t round = 0;
  if (s == NULL) {
    respond(c, TD_EINVAL, "no run is running: there is no shared model to verify", NULL);
    return;
  }
  int rc = td__verify_ask(s, &round, why, sizeof why);
  if (rc != 0) {
    respond(c, rc, why, NULL);
    return;
  }
  td_log_info("trainctl verify: the members hash their state after round %" PRIu64, round);
  json_object *o = json_object_new_object();
  json_object_object_add(o, "run_id", td__json_id(s->run_id));
  json_object_object_add(o, "round", json_object_new_int64((int64_t)round));
  respond_json(c, o);
}
