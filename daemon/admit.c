/* admit.c: admission by invite, and signed admissions and revocations that
 * spread to every member.
 *
 * Threads: loop thread. `trainctl invite` on an admin node makes one-time
 * invites (daemon/net/admission.h); a new node presents one on a connection
 * its one-time key authenticated (zap.c, transport.c) with a join request,
 * and this node answers it here: it signs an admission of the new key, lists
 * the key, sends the admission to every member and grants the new node every
 * record it holds. Every member checks each record it receives
 * (td__access_apply_record: fresh, signed by an admin key it lists, the
 * signature good) before listing or unlisting its key, then passes it on;
 * a record it already holds stops there, so a record crosses each link about
 * once. A revoked key's member ends here as `trainctl revoke` ends it. A node
 * that answers a hello also sends its records (they are few), so a member
 * that was away catches up. Refused records are counted and logged. */
#include "daemon/internal.h"

#include <inttypes.h>
#include <json-c/json.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/error.h"
#include "daemon/base/log.h"

/* Passes over a grant's records: a record signed by an admin that another
 * record of the grant admits applies on a later pass. */
#define GRANT_PASSES 4

void td__admit_forget(td__node_t *n, uint64_t peer) {
  td_member_t *m = td_members_find(n->members, peer);
  if (m != NULL && !m->self) {
    td_members_left(n->members, peer);
    td__ledger_peer(n->ledger, m);
  }
  if (n->session != NULL)
    td__rounds_forget_peer(n->session, peer);
  td__link_close_peer(n->net, peer);
}

static void send_records(td__node_t *n, td__link_t *only, const td__record_t **records,
                         size_t count) {
  if (count == 0)
    return;
  ProtobufCBinaryData *bins = calloc(count, sizeof *bins);
  if (bins == NULL)
    return;
  for (size_t i = 0; i < count; i++)
    bins[i] = (ProtobufCBinaryData){.len = TD__RECORD_BYTES, .data = (uint8_t *)records[i]->bytes};
  Traind__Admissions adm = TRAIND__ADMISSIONS__INIT;
  adm.records = bins;
  adm.n_records = count;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_ADMISSIONS;
  env.admissions = &adm;
  if (only != NULL)
    td__link_send(n->net, only, &env);
  else
    td__transport_broadcast(n->net, &env);
  free(bins);
}

void td__admit_send_all(td__node_t *n, td__link_t *l) {
  td__admission_t *adm = td__access_admission(n->access);
  size_t count = td__admission_count(adm);
  if (!td__access_secure(n->access) || count == 0 || l == NULL)
    return;
  const td__record_t *records[TD__RECORDS_MAX];
  for (size_t i = 0; i < count; i++)
    records[i] = td__admission_at(adm, i);
  send_records(n, l, records, count);
}

/* Apply one record; log what it did or why it was refused (counted).
 * quiet: a refusal for want of a signer is left for a later pass. */
static td__record_result_t apply(td__node_t *n, const td__record_t *r, uint64_t from,
                                 bool quiet) {
  td__admission_t *adm = td__access_admission(n->access);
  char why[512] = "", subject_z85[TD_KEY_Z85_LEN + 1];
  uint64_t subject = 0;
  td__record_result_t res = td__access_apply_record(n->access, r, &subject, why, sizeof why);
  zmq_z85_encode(subject_z85, r->subject, TD_KEY_BYTES);
  bool revoke = r->kind == TD__RECORD_REVOKE;
  switch (res) {
  case TD__RECORD_APPLIED:
    td__admission_count_applied(adm);
    td_log_info("%s key %s (node %016" PRIx64 ")%s by a signed record (from %016" PRIx64 ")",
                revoke ? "revoked" : "admitted", subject_z85, subject,
                !revoke && r->admin ? " as admin" : "", from);
    td__ledger_event(n->ledger, revoke ? "key_revoked" : "key_allowed", "%s %016" PRIx64 "%s",
                     subject_z85, subject, !revoke && r->admin ? " admin" : "");
    if (subject == n->node_id)
      td_log_warn("this node's own key was %s by an admin", revoke ? "revoked" :
                  r->admin ? "admitted as admin" : "admitted without admin");
    else if (revoke)
      td__admit_forget(n, subject);
    break;
  case TD__RECORD_DUPLICATE: break;
  case TD__RECORD_UNKNOWN_SIGNER:
    if (quiet)
      break;
    /* fall through */
  case TD__RECORD_STALE:
  case TD__RECORD_FORGED:
  case TD__RECORD_FAILED: {
    td__admission_count_refused(adm, res == TD__RECORD_STALE);
    td__admission_stats_t st;
    td__admission_stats(adm, &st);
    uint64_t so_far = st.records_refused + st.records_stale;
    if (td__drop_should_log(so_far))
      td_log_warn("refused %s (from node %016" PRIx64 "; refused records so far: %" PRIu64 ")",
                  why, from, so_far);
    break;
  }
  }
  return res;
}

void td__on_admissions(td__node_t *n, const Traind__Envelope *env, td__link_t *l, size_t bytes) {
  (void)l;
  (void)bytes;
  if (!td__access_secure(n->access))
    return;
  const Traind__Admissions *a = env->admissions;
  const td__record_t *fresh[TD_WIRE_MAX_RECORDS];
  td__record_t *parsed = calloc(a->n_records ? a->n_records : 1, sizeof *parsed);
  if (parsed == NULL)
    return;
  size_t n_fresh = 0;
  for (size_t i = 0; i < a->n_records; i++) {
    if (td__record_parse(&parsed[i], a->records[i].data, a->records[i].len) != 0) {
      td__drop(&n->drops, TD__DROP_MALFORMED, "malformed admission record");
      continue;
    }
    if (apply(n, &parsed[i], env->sender, false) == TD__RECORD_APPLIED)
      fresh[n_fresh++] = &parsed[i];
  }
  send_records(n, NULL, fresh, n_fresh); /* pass on what was news here */
  free(parsed);
}

size_t td__admit_apply_grant(td__node_t *n, const Traind__JoinGrant *g, uint64_t from) {
  size_t applied = 0;
  td__record_t *parsed = calloc(g->n_records ? g->n_records : 1, sizeof *parsed);
  bool *done = calloc(g->n_records ? g->n_records : 1, sizeof *done);
  for (size_t i = 0; parsed != NULL && done != NULL && i < g->n_records; i++)
    done[i] = td__record_parse(&parsed[i], g->records[i].data, g->records[i].len) != 0;
  for (int pass = 0; parsed != NULL && done != NULL && pass < GRANT_PASSES; pass++)
    for (size_t i = 0; i < g->n_records; i++) {
      if (done[i])
        continue;
      td__record_result_t r = apply(n, &parsed[i], from, pass + 1 < GRANT_PASSES);
      done[i] = r != TD__RECORD_UNKNOWN_SIGNER;
      applied += r == TD__RECORD_APPLIED;
    }
  free(parsed);
  free(done);
  return applied;
}

bool td__admit_room(td__node_t *n, uint64_t joiner, const char *how, char *why, size_t why_len) {
  if (td_members_has_room(n->members, joiner, td_clock_mono_s()))
    return true;
  snprintf(why, why_len, "cluster is full: %d members, the most traind supports", TD_MEMBERS_MAX);
  char what[256];
  snprintf(what, sizeof what, "node %016" PRIx64 " asked to join (%.32s): %.160s", joiner, how,
           why);
  td__drop(&n->drops, TD__DROP_CLUSTER_FULL, what);
  return false;
}

static void grant(td__invite_reply_t *reply, td__admission_t *adm, const char *refused) {
  Traind__JoinGrant g = TRAIND__JOIN_GRANT__INIT;
  ProtobufCBinaryData bins[TD__RECORDS_MAX];
  if (refused != NULL) {
    g.refused = (char *)refused;
  } else {
    g.n_records = td__admission_count(adm);
    for (size_t i = 0; i < g.n_records; i++)
      bins[i] = (ProtobufCBinaryData){.len = TD__RECORD_BYTES,
                                      .data = (uint8_t *)td__admission_at(adm, i)->bytes};
    g.records = bins;
  }
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_JOIN_GRANT;
  env.join_grant = &g;
  if (td__transport_reply(reply, &env) != 0)
    td_log_warn("cannot answer a join request: its connection is gone");
}

void td__admit_on_invite(void *user, const uint8_t invite_key[TD_KEY_BYTES],
                         const Traind__Envelope *env, td__invite_reply_t *reply) {
  td__node_t *n = user;
  td__admission_t *adm = td__access_admission(n->access);
  const Traind__JoinRequest *req = env->join_request;
  bool admin = false;
  char invite_z85[TD_KEY_Z85_LEN + 1], key_z85[TD_KEY_Z85_LEN + 1];
  zmq_z85_encode(invite_z85, invite_key, TD_KEY_BYTES);
  char full[128];
  if (!td__admit_room(n, td_key_node_id(req->key.data), "by invite", full, sizeof full)) {
    grant(reply, adm, full); /* before the invite is used: it serves once there is room */
    return;
  }
  if (!td__admission_invite_use(adm, invite_key, &admin)) {
    td__drop(&n->drops, TD__DROP_DUPLICATE, "a second join request on an invite's connection");
    return;
  }
  uint8_t proof_msg[TD__JOIN_PROOF_BYTES];
  td__join_proof_message(invite_key, req->key.data, proof_msg);
  if (crypto_sign_verify_detached(req->proof.data, proof_msg, sizeof proof_msg,
                                  req->sign_key.data) != 0) {
    td_log_warn("refused the join request on invite %s: its proof does not verify", invite_z85);
    grant(reply, adm, "the join request's proof does not verify (a damaged or foreign request)");
    return;
  }
  if (memcmp(req->key.data, td__access_keypair(n->access)->pub_raw, TD_KEY_BYTES) == 0) {
    grant(reply, adm, "that is the inviting node's own key");
    return;
  }
  if (!td__access_self_admin(n->access)) {
    grant(reply, adm, "the inviting node is no admin any more");
    return;
  }
  td__record_t r;
  td__admission_sign(adm, TD__RECORD_ADMIT, req->key.data, req->sign_key.data, admin, &r);
  if (apply(n, &r, n->node_id, false) != TD__RECORD_APPLIED) {
    grant(reply, adm, "the inviting node cannot record the admission (see its log)");
    return;
  }
  zmq_z85_encode(key_z85, req->key.data, TD_KEY_BYTES);
  td_log_info("invite %s used: admitted key %s (node %016" PRIx64 ")%s; telling the members",
              invite_z85, key_z85, td_key_node_id(req->key.data), admin ? " as admin" : "");
  const td__record_t *one = &r;
  send_records(n, NULL, &one, 1);
  grant(reply, adm, NULL);
}

void td__admit_spread_revoke(td__node_t *n, const uint8_t key[TD_KEY_BYTES]) {
  if (!td__access_self_admin(n->access))
    return; /* a member without admin revokes for itself only */
  td__admission_t *adm = td__access_admission(n->access);
  td__record_t r;
  td__admission_sign(adm, TD__RECORD_REVOKE, key, NULL, false, &r);
  char why[256];
  if (td__admission_store(adm, &r, why, sizeof why) != 0) {
    td_log_warn("the revocation is not spread: %s", why);
    return;
  }
  const td__record_t *one = &r;
  send_records(n, NULL, &one, 1);
}

int td__admit_invite(td__node_t *n, bool admin, uint32_t ttl_s, uint32_t count,
                     json_object **out, char *why, size_t why_len) {
  *out = NULL;
  if (!td__access_secure(n->access))
    return td_why(why, why_len, TD_EINVAL, "this node runs --insecure: invites need CURVE keys");
  if (!td__access_self_admin(n->access))
    return td_why(why, why_len, TD_EINVAL,
                  "this node was admitted without admin: only an admin node can invite (ask "
                  "one, or have an admin run trainctl invite --admin for a new admin node)");
  if (strcmp(td__transport_endpoint(n->net), TD_LISTEN_NONE) == 0)
    return td_why(why, why_len, TD_EINVAL,
                  "this node runs --listen none: a new node could not connect to it; make the "
                  "invite on a member that accepts connections");
  if (count == 0 || count > TD__INVITES_MAX)
    return td_why(why, why_len, TD_EINVAL, "--count takes 1 to %d", TD__INVITES_MAX);
  if (ttl_s == 0 || ttl_s > TD__INVITE_TTL_MAX_S)
    return td_why(why, why_len, TD_EINVAL, "--ttl takes 1 s to 7 d");
  td__admission_t *adm = td__access_admission(n->access);
  const td_keypair_t *kp = td__access_keypair(n->access);
  json_object *o = json_object_new_object(), *list = json_object_new_array();
  for (uint32_t i = 0; i < count; i++) {
    uint8_t secret[TD_KEY_BYTES], pub[TD_KEY_BYTES];
    int rc = td__admission_invite(adm, admin, ttl_s, secret, pub, why, why_len);
    if (rc != 0) {
      json_object_put(list);
      json_object_put(o);
      return rc;
    }
    char s[TD__JOIN_STRING_MAX];
    td__join_string_format(s, td__transport_endpoint(n->net), kp->pub_raw,
                           td__admission_sign_pub(adm), secret);
    sodium_memzero(secret, sizeof secret);
    json_object_array_add(list, json_object_new_string(s));
  }
  td_log_info("made %u invite(s)%s valid %u s", count, admin ? " for admin nodes" : "", ttl_s);
  json_object_object_add(o, "invites", list);
  json_object_object_add(o, "admin", json_object_new_boolean(admin));
  json_object_object_add(o, "ttl_s", json_object_new_int64(ttl_s));
  *out = o;
  return 0;
}

json_object *td__admit_status(td__node_t *n) {
  td__admission_stats_t st;
  td__admission_stats(td__access_admission(n->access), &st);
  json_object *o = json_object_new_object();
  json_object_object_add(o, "admin", json_object_new_boolean(td__access_self_admin(n->access)));
  json_object_object_add(o, "records", json_object_new_int64((int64_t)st.records));
  json_object_object_add(o, "invites_pending", json_object_new_int64((int64_t)st.invites_pending));
  json_object_object_add(o, "invites_made", json_object_new_int64((int64_t)st.invites_made));
  json_object_object_add(o, "invites_used", json_object_new_int64((int64_t)st.invites_used));
  json_object_object_add(o, "invites_refused_used",
                         json_object_new_int64((int64_t)st.invites_refused_used));
  json_object_object_add(o, "invites_refused_expired",
                         json_object_new_int64((int64_t)st.invites_refused_expired));
  json_object_object_add(o, "records_applied", json_object_new_int64((int64_t)st.records_applied));
  json_object_object_add(o, "records_refused", json_object_new_int64((int64_t)st.records_refused));
  json_object_object_add(o, "records_stale", json_object_new_int64((int64_t)st.records_stale));
  return o;
}
