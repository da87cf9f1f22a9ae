/* access.c: who this node talks to, and what they may ask of it.
 *
 * Threads: loop thread (opened on the main thread before the loop runs).
 * Owns the node's key pair and its allowlist (daemon/net/keys.h). Secure mode
 * (the default): the ZAP handler (zap.c) admits a connection only for a
 * listed key; the sender of every message is the key of the connection it
 * came on, turned into a node id (td_key_node_id), whatever the envelope's
 * sender field says; a link to a peer authenticates the peer's own key, so
 * no one else can answer on its endpoint; only keys marked `admin` may start
 * or stop runs here (the local operator always may, through the control
 * socket). `trainctl allow/revoke` change the list and write it back; a
 * revoked key's messages are dropped from then on and its link closed.
 * Signed admission records (admission.h) change the list too, once
 * td__access_apply_record has checked that an admin key this node trusts
 * signed them and that they are newer than what it holds about that key.
 * Insecure mode (--insecure) keeps none of this: plain TCP, trusted ids. */
#include "daemon/net/net.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/error.h"
#include "daemon/base/log.h"

struct td__access {
  bool secure;
  td_keypair_t keys;
  td_allowlist_t *allowed;
  td__admission_t *admission;
  uint64_t refused_keys, forged_senders, forbidden;
};

int td__access_open(td__access_t **out, const char *data_dir, bool insecure, char *why,
                    size_t why_len) {
  *out = NULL;
  td__access_t *a = calloc(1, sizeof *a);
  if (a == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  a->secure = !insecure;
  if (a->secure && !zmq_has("curve")) {
    free(a);
    return td_why(why, why_len, TD_ENOTSUP,
                  "this libzmq was built without CURVE security (zmq_has(\"curve\") is 0): "
                  "install a libzmq with libsodium/tweetnacl, or run with --insecure on "
                  "loopback");
  }
  char path[1024];
  snprintf(path, sizeof path, "%s/" TD_ALLOWLIST_FILE, data_dir);
  int rc = td_keypair_load_or_create(data_dir, &a->keys, why, why_len);
  if (rc == 0)
    rc = td_allowlist_load(&a->allowed, path, why, why_len);
  if (rc == 0)
    rc = td__admission_open(&a->admission, data_dir, &a->keys, why, why_len);
  if (rc != 0) {
    td_allowlist_close(&a->allowed);
    free(a);
    return rc;
  }
  *out = a;
  return 0;
}

void td__access_close(td__access_t **self_p) {
  td__access_t *a = *self_p;
  if (a == NULL)
    return;
  *self_p = NULL;
  td_allowlist_close(&a->allowed);
  td__admission_close(&a->admission);
  memset(a->keys.secret, 0, sizeof a->keys.secret);
  free(a);
}

bool td__access_secure(const td__access_t *a) { return a->secure; }
const td_keypair_t *td__access_keypair(const td__access_t *a) { return &a->keys; }
uint64_t td__access_node_id(const td__access_t *a) { return td_key_node_id(a->keys.pub_raw); }

const char *td__access_key_of(const td__access_t *a, uint64_t peer) {
  const td_allowed_key_t *k = a->secure ? td_allowlist_find_id(a->allowed, peer) : NULL;
  return k != NULL ? k->z85 : NULL;
}

bool td__access_known(const td__access_t *a, uint64_t peer) {
  return !a->secure || td_allowlist_find_id(a->allowed, peer) != NULL;
}

bool td__access_admits(td__access_t *a, const uint8_t raw[TD_KEY_BYTES]) {
  if (td_allowlist_find_raw(a->allowed, raw) != NULL)
    return true;
  a->refused_keys++;
  return false;
}

bool td__access_listed(const td__access_t *a, const uint8_t raw[TD_KEY_BYTES]) {
  return td_allowlist_find_raw(a->allowed, raw) != NULL;
}

td__admission_t *td__access_admission(td__access_t *a) { return a->admission; }

bool td__access_self_admin(const td__access_t *a) {
  const td__record_t *own = td__admission_latest(a->admission, a->keys.pub_raw);
  return a->secure && (own == NULL || (own->kind == TD__RECORD_ADMIT && own->admin));
}

const uint8_t *td__access_sign_key_of(const td__access_t *a, uint64_t peer) {
  const td_allowed_key_t *k = a->secure ? td_allowlist_find_id(a->allowed, peer) : NULL;
  return k != NULL ? td__admission_binding(a->admission, k->raw) : NULL;
}

void td__access_bind_sign(td__access_t *a, uint64_t peer, const uint8_t *sign, size_t len) {
  const td_allowed_key_t *k = a->secure ? td_allowlist_find_id(a->allowed, peer) : NULL;
  if (k != NULL && len == TD__SIGN_KEY_BYTES)
    td__admission_bind(a->admission, k->raw, sign);
}

td__record_result_t td__access_apply_record(td__access_t *a, const td__record_t *r,
                                            uint64_t *subject, char *why, size_t why_len) {
  char signer[TD_KEY_Z85_LEN + 1], subj[TD_KEY_Z85_LEN + 1];
  zmq_z85_encode(signer, r->signer, TD_KEY_BYTES);
  zmq_z85_encode(subj, r->subject, TD_KEY_BYTES);
  *subject = td_key_node_id(r->subject);
  const char *what = r->kind == TD__RECORD_ADMIT ? "admission" : "revocation";
  if (!a->secure) {
    td_why(why, why_len, TD_EINVAL, "this node runs --insecure: keys are not checked");
    return TD__RECORD_FORGED;
  }
  int fresh = td__admission_freshness(a->admission, r);
  if (fresh == 0)
    return TD__RECORD_DUPLICATE;
  if (fresh < 0) {
    const td__record_t *have = td__admission_latest(a->admission, r->subject);
    td_why(why, why_len, TD_EINVAL, "an outdated %s of key %s (a replay: this node holds a "
           "newer %s of that key)", what, subj,
           have->kind == TD__RECORD_ADMIT ? "admission" : "revocation");
    return TD__RECORD_STALE;
  }
  bool own_signer = memcmp(r->signer, a->keys.pub_raw, TD_KEY_BYTES) == 0;
  const td_allowed_key_t *k = td_allowlist_find_raw(a->allowed, r->signer);
  if (own_signer ? !td__access_self_admin(a) : (k == NULL || !k->admin)) {
    td_why(why, why_len, TD_EINVAL, "an %s of key %s signed by key %s, which is not an admin "
           "here", what, subj, signer);
    return k == NULL && !own_signer ? TD__RECORD_UNKNOWN_SIGNER : TD__RECORD_FORGED;
  }
  const uint8_t *sign = td__admission_binding(a->admission, r->signer);
  if (sign == NULL) {
    td_why(why, why_len, TD_EINVAL, "an %s of key %s signed by admin key %s, whose signing "
           "key this node has not learned yet", what, subj, signer);
    return TD__RECORD_UNKNOWN_SIGNER;
  }
  if (!td__record_verify(r, sign)) {
    td_why(why, why_len, TD_EINVAL, "an %s of key %s claiming admin key %s: its signature "
           "does not verify (forged)", what, subj, signer);
    return TD__RECORD_FORGED;
  }
  bool self = memcmp(r->subject, a->keys.pub_raw, TD_KEY_BYTES) == 0;
  int rc = 0;
  if (!self && r->kind == TD__RECORD_ADMIT)
    rc = td_allowlist_add(a->allowed, subj, r->admin, why, why_len);
  else if (!self)
    td_allowlist_remove(a->allowed, subj); /* TD_ENOENT: not listed here, nothing to end */
  if (rc == 0 && !self)
    rc = td_allowlist_save(a->allowed, why, why_len);
  if (rc == 0)
    rc = td__admission_store(a->admission, r, why, why_len);
  return rc == 0 ? TD__RECORD_APPLIED : TD__RECORD_FAILED;
}

uint64_t td__access_sender(td__access_t *a, const char *user_id, uint64_t claimed) {
  if (!a->secure)
    return claimed;
  const td_allowed_key_t *k = user_id != NULL ? td_allowlist_find_z85(a->allowed, user_id) : NULL;
  if (k == NULL)
    return 0; /* revoked since it connected, or no authenticated key at all */
  if (claimed != k->node_id) {
    a->forged_senders++;
    if (a->forged_senders <= 20 || a->forged_senders % 1000 == 0)
      td_log_warn("a message from key %s claims sender %016" PRIx64 ": attributed to its key's "
                  "node %016" PRIx64 " (forged senders so far: %" PRIu64 ")",
                  k->z85, claimed, k->node_id, a->forged_senders);
  }
  return k->node_id;
}

bool td__access_is_admin(const td__access_t *a, uint64_t peer) {
  const td_allowed_key_t *k = a->secure ? td_allowlist_find_id(a->allowed, peer) : NULL;
  return k != NULL && k->admin;
}

bool td__access_may_run(td__access_t *a, uint64_t peer) {
  if (!a->secure)
    return true;
  const td_allowed_key_t *k = td_allowlist_find_id(a->allowed, peer);
  if (k != NULL && k->admin)
    return true;
  a->forbidden++;
  return false;
}

int td__access_allow(td__access_t *a, const char *z85, bool admin, char *why, size_t why_len) {
  if (!a->secure)
    return td_why(why, why_len, TD_EINVAL, "this node runs --insecure: keys are not checked");
  if (strcmp(z85, a->keys.pub) == 0)
    return td_why(why, why_len, TD_EINVAL, "that is this node's own key");
  int rc = td_allowlist_add(a->allowed, z85, admin, why, why_len);
  return rc != 0 ? rc : td_allowlist_save(a->allowed, why, why_len);
}

int td__access_revoke(td__access_t *a, const char *z85, uint64_t *node_id, char *why,
                      size_t why_len) {
  if (!a->secure)
    return td_why(why, why_len, TD_EINVAL, "this node runs --insecure: keys are not checked");
  const td_allowed_key_t *k = td_allowlist_find_z85(a->allowed, z85);
  if (k == NULL)
    return td_why(why, why_len, TD_ENOENT, "that key is not on this node's allowlist");
  *node_id = k->node_id;
  td_allowlist_remove(a->allowed, z85);
  return td_allowlist_save(a->allowed, why, why_len);
}

void td__access_stats(const td__access_t *a, td__access_stats_t *out) {
  *out = (td__access_stats_t){.secure = a->secure,
                              .allowed = td_allowlist_count(a->allowed),
                              .refused_keys = a->refused_keys,
                              .forged_senders = a->forged_senders,
                              .forbidden = a->forbidden};
}

size_t td__access_count(const td__access_t *a) { return td_allowlist_count(a->allowed); }
const td_allowed_key_t *td__access_at(const td__access_t *a, size_t i) {
  return td_allowlist_at(a->allowed, i);
}

/* The host of tcp://HOST:PORT is a loopback address. */
static bool loopback_endpoint(const char *listen) {
  if (strncmp(listen, "tcp://", 6) != 0)
    return false;
  const char *host = listen + 6;
  const char *colon = strrchr(host, ':');
  size_t len = colon != NULL ? (size_t)(colon - host) : strlen(host);
  if ((len == 9 && strncmp(host, "localhost", 9) == 0) ||
      (len == 5 && strncmp(host, "[::1]", 5) == 0))
    return true;
  if (len < 7 || len > 15 || strncmp(host, "127.", 4) != 0)
    return false;
  for (size_t i = 4; i < len; i++)
    if (!((host[i] >= '0' && host[i] <= '9') || host[i] == '.'))
      return false;
  return true;
}

int td__access_check_listen(const char *listen, bool insecure, bool force, char *why,
                            size_t why_len) {
  if (!insecure || force || loopback_endpoint(listen) || strcmp(listen, TD_LISTEN_NONE) == 0)
    return 0; /* none: no port for anyone to reach */
  return td_why(why, why_len, TD_ECONFIG,
                "--insecure on %s would let anyone who reaches that address join, start and "
                "stop runs and read the traffic; plain TCP is for loopback only (add "
                "--insecure-force to do it anyway)",
                listen);
}
