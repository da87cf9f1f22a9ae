/* admission.h: signed admissions, one-time invites and join strings.
 *
 * A cluster grows by invites instead of every node listing every other key:
 * an admin node makes a one-time invite, the new node presents it and gets
 * an admission record signed by the admin, and that record spreads to every
 * member, each of which checks the signature against an admin key it trusts
 * before listing the new key (daemon/net/access.c applies records; the node's
 * daemon/admit.c spreads them; docs/security.md has the trust model).
 *
 * Signing keys: each node signs with an Ed25519 key derived from the secret
 * of its CURVE key (BLAKE2b of a fixed label and the secret as the seed), so
 * it lives and is protected exactly as node.key is. Its public half is bound
 * to the node's CURVE key by what the verifier already trusts: the node's own
 * authenticated hello, the join string that named it, or an admission record
 * of that key signed by an admin.
 *
 * A record (TD__RECORD_BYTES, fixed layout, big-endian):
 *
 *     "TDA1" | kind (1: admit, 2: revoke) | admin (0/1) | issued_us (8)
 *     | subject CURVE key (32) | subject Ed25519 key (32, zero for revoke)
 *     | signer CURVE key (32) | Ed25519 signature over all before it (64)
 *
 * issued_us is the signer's wall clock, made to grow on every record it
 * signs. The store keeps the newest record per subject key in
 * DATA_DIR/admissions (mode 0600, one hex record a line); a record not
 * newer than the stored one for its subject is a duplicate (the same bytes)
 * or stale (a replay: refused), so a revoked key cannot be brought back by
 * replaying its old admission.
 *
 * Invites: a fresh Curve25519 key pair each; its secret is the token in the
 * join string and never crosses the network: the new node proves it holds it
 * in a CURVE handshake, which the ZAP handler accepts for that one pending
 * invite once (a used or expired one is refused, counted and logged). At
 * most TD__INVITES_MAX invites exist at once; they live in memory only (a
 * restart cancels them). Threads: loop thread. */
#ifndef TD_DAEMON_ADMISSION_H
#define TD_DAEMON_ADMISSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/net/keys.h"

#define TD__RECORD_BYTES 174
#define TD__SIGN_KEY_BYTES 32
#define TD__SIGNATURE_BYTES 64
#define TD__ADMISSIONS_FILE "admissions"
#define TD__JOIN_PROOF_BYTES (14 + 2 * TD_KEY_BYTES)
/* Records kept (one per subject key). */
#define TD__RECORDS_MAX 512
/* Invites that may exist at once (pending, used or expired but remembered). */
#define TD__INVITES_MAX 64
/* The longest and the default life of an invite, seconds. */
#define TD__INVITE_TTL_MAX_S (7 * 24 * 3600)
#define TD__INVITE_TTL_DEFAULT_S 3600
/* A join string: "ti1,ENDPOINT,INVITER_KEY,INVITER_SIGN_KEY,SECRET" (keys hex). */
#define TD__JOIN_STRING_MAX 512

typedef enum { TD__RECORD_ADMIT = 1, TD__RECORD_REVOKE = 2 } td__record_kind_t;

typedef struct {
  td__record_kind_t kind;
  bool admin;
  uint64_t issued_us;
  uint8_t subject[TD_KEY_BYTES], subject_sign[TD__SIGN_KEY_BYTES], signer[TD_KEY_BYTES];
  uint8_t bytes[TD__RECORD_BYTES]; /* the record as signed and sent */
} td__record_t;

/* Parse a record's bytes (only its form; the signature is checked by
 * td__record_verify). TD_EPROTO on a wrong size, tag or kind. */
int td__record_parse(td__record_t *r, const uint8_t *bytes, size_t len);
/* The signature is sign_pub's over the record. */
bool td__record_verify(const td__record_t *r, const uint8_t sign_pub[TD__SIGN_KEY_BYTES]);

/* The Ed25519 pair derived from a CURVE key pair (see above). */
void td__sign_keypair_derive(const td_keypair_t *curve, uint8_t pub[TD__SIGN_KEY_BYTES],
                             uint8_t secret[64]);
/* What a new node signs to show it holds its signing key (the join proof):
 * "traind join v1", the invite's public key and the new node's CURVE key. */
void td__join_proof_message(const uint8_t invite_pub[TD_KEY_BYTES],
                            const uint8_t key[TD_KEY_BYTES], uint8_t out[TD__JOIN_PROOF_BYTES]);

typedef struct td__admission td__admission_t;

typedef enum {
  TD__INVITE_NONE,    /* not an invite key */
  TD__INVITE_OK,      /* a pending invite: this handshake is its one */
  TD__INVITE_USED,    /* presented before */
  TD__INVITE_EXPIRED, /* its time is up */
} td__invite_check_t;

typedef struct {
  size_t records, invites_pending;
  uint64_t invites_made, invites_used, invites_refused_used, invites_refused_expired;
  uint64_t records_applied, records_refused, records_stale;
} td__admission_stats_t;

/* Read DATA_DIR/admissions (missing: none) and derive the signing key of
 * `own`. TD_ECONFIG + why (file:line) on a malformed file or one others may
 * write. Caller owns *out; `own` is copied. */
int td__admission_open(td__admission_t **out, const char *data_dir, const td_keypair_t *own,
                       char *why, size_t why_len);
void td__admission_close(td__admission_t **self_p);
const uint8_t *td__admission_sign_pub(const td__admission_t *a);

/* Sign a new record about `subject` with this node's key (issued now, later
 * than any record it signed before). subject_sign: NULL for a revoke. */
void td__admission_sign(td__admission_t *a, td__record_kind_t kind,
                        const uint8_t subject[TD_KEY_BYTES], const uint8_t *subject_sign,
                        bool admin, td__record_t *out);
/* Sign `len` bytes with this node's signing key (the join proof). */
void td__admission_sign_message(const td__admission_t *a, const uint8_t *msg, size_t len,
                                uint8_t signature[TD__SIGNATURE_BYTES]);
/* The record is newer than the stored one for its subject (1), the same
 * record (0), or older/conflicting (-1: a replay). */
int td__admission_freshness(const td__admission_t *a, const td__record_t *r);
/* Keep `r` as its subject's newest record and write the file; TD_ERANGE
 * when full, TD_EIO when it cannot be written. */
int td__admission_store(td__admission_t *a, const td__record_t *r, char *why, size_t why_len);
/* The newest record about `subject`; NULL when none (borrowed until the next store). */
const td__record_t *td__admission_latest(const td__admission_t *a,
                                         const uint8_t subject[TD_KEY_BYTES]);
size_t td__admission_count(const td__admission_t *a);
const td__record_t *td__admission_at(const td__admission_t *a, size_t i);

/* The signing key bound to a CURVE key (see above): NULL when unknown. */
const uint8_t *td__admission_binding(const td__admission_t *a, const uint8_t key[TD_KEY_BYTES]);
void td__admission_bind(td__admission_t *a, const uint8_t key[TD_KEY_BYTES],
                        const uint8_t sign[TD__SIGN_KEY_BYTES]);

/* A new invite valid ttl_s seconds; its key pair's secret goes into the join
 * string, its public half is kept. TD_ERANGE when TD__INVITES_MAX are pending. */
int td__admission_invite(td__admission_t *a, bool admin, uint32_t ttl_s,
                         uint8_t secret[TD_KEY_BYTES], uint8_t pub[TD_KEY_BYTES], char *why,
                         size_t why_len);
/* ZAP: is `key` an invite that may make its one handshake now? Counts
 * refusals of used and expired invites. */
td__invite_check_t td__admission_invite_handshake(td__admission_t *a,
                                                  const uint8_t key[TD_KEY_BYTES]);
/* The join request on that handshake's connection: true (and the invite's
 * admin mark) the first time only; the invite is used from then on. */
bool td__admission_invite_use(td__admission_t *a, const uint8_t key[TD_KEY_BYTES], bool *admin);
void td__admission_count_refused(td__admission_t *a, bool stale);
void td__admission_count_applied(td__admission_t *a);
void td__admission_stats(const td__admission_t *a, td__admission_stats_t *out);

/* Write a join string into out (TD__JOIN_STRING_MAX); only characters a shell
 * takes literally: letters, digits and , . : / _ - (an endpoint with others
 * is written as x + hex). */
void td__join_string_format(char *out, const char *endpoint, const uint8_t inviter[TD_KEY_BYTES],
                            const uint8_t inviter_sign[TD__SIGN_KEY_BYTES],
                            const uint8_t secret[TD_KEY_BYTES]);
/* Parse one; TD_ECONFIG + a one-line why on anything malformed. */
int td__join_string_parse(const char *s, char *endpoint, size_t endpoint_cap,
                          uint8_t inviter[TD_KEY_BYTES],
                          uint8_t inviter_sign[TD__SIGN_KEY_BYTES],
                          uint8_t secret[TD_KEY_BYTES], char *why, size_t why_len);

#endif
