/* admission.c: signed admission records, their store, invites and join
 * strings (admission.h). Pure bookkeeping and libsodium: no sockets; access.c
 * decides what a record may change, zap.c asks about invite keys. */
#include "daemon/net/admission.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "daemon/base/clock.h"

#define RECORD_TAG "TDA1"
#define SIGNED_BYTES (TD__RECORD_BYTES - TD__SIGNATURE_BYTES)
#define SIGN_LABEL "traind ed25519 signing key v1"
#define JOIN_PROOF_LABEL "traind join v1"
#define JOIN_STRING_TAG "ti1"
/* An endpoint's bytes a join string carries as hex, at most. */
#define TD_ENDPOINT_HEX_MAX 128
#define BINDINGS_MAX (TD__RECORDS_MAX + TD_ALLOWLIST_MAX)

typedef enum { INVITE_FREE, INVITE_PENDING, INVITE_HANDSHAKEN, INVITE_USED } invite_state_t;

typedef struct {
  uint8_t pub[TD_KEY_BYTES];
  double expires_at; /* mono seconds */
  bool admin;
  invite_state_t state;
  uint64_t made; /* order of making: the oldest used one is forgotten first */
} invite_t;

typedef struct {
  uint8_t key[TD_KEY_BYTES], sign[TD__SIGN_KEY_BYTES];
} binding_t;

struct td__admission {
  char path[1100];
  uint8_t own[TD_KEY_BYTES], sign_pub[TD__SIGN_KEY_BYTES], sign_secret[64];
  uint64_t last_issued_us;
  td__record_t records[TD__RECORDS_MAX];
  size_t n_records;
  binding_t bindings[BINDINGS_MAX];
  size_t n_bindings;
  invite_t invites[TD__INVITES_MAX];
  uint64_t invites_made, invites_used, refused_used, refused_expired;
  uint64_t applied, refused, stale;
};

static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 7; i >= 0; i--, v >>= 8)
    p[i] = (uint8_t)v;
}

static uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = v << 8 | p[i];
  return v;
}

int td__record_parse(td__record_t *r, const uint8_t *b, size_t len) {
  if (len != TD__RECORD_BYTES || memcmp(b, RECORD_TAG, 4) != 0 || (b[4] != 1 && b[4] != 2) ||
      b[5] > 1)
    return TD_EPROTO;
  memset(r, 0, sizeof *r);
  memcpy(r->bytes, b, TD__RECORD_BYTES);
  r->kind = (td__record_kind_t)b[4];
  r->admin = b[5] == 1;
  r->issued_us = get_u64(b + 6);
  memcpy(r->subject, b + 14, TD_KEY_BYTES);
  memcpy(r->subject_sign, b + 46, TD__SIGN_KEY_BYTES);
  memcpy(r->signer, b + 78, TD_KEY_BYTES);
  return 0;
}

bool td__record_verify(const td__record_t *r, const uint8_t sign_pub[TD__SIGN_KEY_BYTES]) {
  return crypto_sign_verify_detached(r->bytes + SIGNED_BYTES, r->bytes, SIGNED_BYTES,
                                     sign_pub) == 0;
}

void td__sign_keypair_derive(const td_keypair_t *curve, uint8_t pub[TD__SIGN_KEY_BYTES],
                             uint8_t secret[64]) {
  uint8_t raw_secret[TD_KEY_BYTES], seed[crypto_sign_SEEDBYTES];
  char why[8];
  /* the secret was checked against its public key when node.key was read */
  (void)td_key_decode(curve->secret, raw_secret, why, sizeof why);
  crypto_generichash_state st;
  crypto_generichash_init(&st, NULL, 0, sizeof seed);
  crypto_generichash_update(&st, (const uint8_t *)SIGN_LABEL, strlen(SIGN_LABEL));
  crypto_generichash_update(&st, raw_secret, sizeof raw_secret);
  crypto_generichash_final(&st, seed, sizeof seed);
  crypto_sign_seed_keypair(pub, secret, seed);
  sodium_memzero(raw_secret, sizeof raw_secret);
  sodium_memzero(seed, sizeof seed);
}

void td__join_proof_message(const uint8_t invite_pub[TD_KEY_BYTES],
                            const uint8_t key[TD_KEY_BYTES], uint8_t out[TD__JOIN_PROOF_BYTES]) {
  memcpy(out, JOIN_PROOF_LABEL, 14);
  memcpy(out + 14, invite_pub, TD_KEY_BYTES);
  memcpy(out + 14 + TD_KEY_BYTES, key, TD_KEY_BYTES);
}

/* ---- the store --------------------------------------------------------------------- */

static void hex(char *out, const uint8_t *b, size_t n) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[b[i] >> 4];
    out[2 * i + 1] = digits[b[i] & 15];
  }
  out[2 * n] = '\0';
}

static bool unhex(uint8_t *out, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    unsigned v = 0;
    for (int k = 0; k < 2; k++) {
      char c = s[2 * i + (size_t)k];
      unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                   : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                                          : 16u;
      if (d == 16)
        return false;
      v = v << 4 | d;
    }
    out[i] = (uint8_t)v;
  }
  return true;
}

static int record_index(const td__admission_t *a, const uint8_t subject[TD_KEY_BYTES]) {
  for (size_t i = 0; i < a->n_records; i++)
    if (memcmp(a->records[i].subject, subject, TD_KEY_BYTES) == 0)
      return (int)i;
  return -1;
}

static int save(const td__admission_t *a, char *why, size_t why_len) {
  char tmp[1110];
  snprintf(tmp, sizeof tmp, "%s.tmp", a->path);
  unlink(tmp);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (f == NULL) {
    if (fd >= 0)
      close(fd);
    return td_why(why, why_len, TD_EIO, "cannot write %s: %s", tmp, strerror(errno));
  }
  fprintf(f, "# traind admissions: the newest signed admission or revocation per key, "
             "one hex record a line (written by traind; do not edit)\n");
  char line[2 * TD__RECORD_BYTES + 1];
  for (size_t i = 0; i < a->n_records; i++) {
    hex(line, a->records[i].bytes, TD__RECORD_BYTES);
    fprintf(f, "%s\n", line);
  }
  bool ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, a->path) != 0) {
    unlink(tmp);
    return td_why(why, why_len, TD_EIO, "cannot write %s: %s", a->path, strerror(errno));
  }
  return 0;
}

static int load(td__admission_t *a, char *why, size_t why_len) {
  int fd = open(a->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0 && errno == ENOENT)
    return 0;
  if (fd < 0)
    return td_why(why, why_len, TD_EIO, "cannot open %s: %s", a->path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (st.st_mode & 022) != 0) {
    close(fd);
    return td_why(why, why_len, TD_ECONFIG,
                  "%s is not a regular file only its owner may write (chmod 600 %s)", a->path,
                  a->path);
  }
  FILE *f = fdopen(fd, "r");
  if (f == NULL) {
    close(fd);
    return td_why(why, why_len, TD_EIO, "cannot read %s", a->path);
  }
  char line[2 * TD__RECORD_BYTES + 16];
  int lineno = 0, rc = 0;
  while (rc == 0 && fgets(line, sizeof line, f) != NULL) {
    lineno++;
    size_t len = strcspn(line, "\r\n");
    line[len] = '\0';
    if (len == 0 || line[0] == '#')
      continue;
    uint8_t bytes[TD__RECORD_BYTES];
    td__record_t r;
    if (len != 2 * TD__RECORD_BYTES || !unhex(bytes, line, TD__RECORD_BYTES) ||
        td__record_parse(&r, bytes, sizeof bytes) != 0 || a->n_records >= TD__RECORDS_MAX ||
        record_index(a, r.subject) >= 0)
      rc = td_why(why, why_len, TD_ECONFIG,
                  "%s:%d: not an admission record (remove the line, or the file to forget "
                  "every record)", a->path, lineno);
    else
      a->records[a->n_records++] = r;
  }
  fclose(f);
  return rc;
}

int td__admission_open(td__admission_t **out, const char *data_dir, const td_keypair_t *own,
                       char *why, size_t why_len) {
  *out = NULL;
  if (sodium_init() < 0)
    return td_why(why, why_len, TD_EIO, "libsodium cannot start");
  td__admission_t *a = calloc(1, sizeof *a);
  if (a == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  snprintf(a->path, sizeof a->path, "%s/" TD__ADMISSIONS_FILE, data_dir);
  memcpy(a->own, own->pub_raw, TD_KEY_BYTES);
  td__sign_keypair_derive(own, a->sign_pub, a->sign_secret);
  int rc = load(a, why, why_len);
  if (rc != 0) {
    td__admission_close(&a);
    return rc;
  }
  td__admission_bind(a, a->own, a->sign_pub);
  for (size_t i = 0; i < a->n_records; i++) {
    a->last_issued_us = a->records[i].issued_us > a->last_issued_us &&
                                memcmp(a->records[i].signer, a->own, TD_KEY_BYTES) == 0
                            ? a->records[i].issued_us
                            : a->last_issued_us;
    if (a->records[i].kind == TD__RECORD_ADMIT)
      td__admission_bind(a, a->records[i].subject, a->records[i].subject_sign);
  }
  *out = a;
  return 0;
}

void td__admission_close(td__admission_t **self_p) {
  td__admission_t *a = *self_p;
  if (a == NULL)
    return;
  *self_p = NULL;
  sodium_memzero(a->sign_secret, sizeof a->sign_secret);
  free(a);
}

const uint8_t *td__admission_sign_pub(const td__admission_t *a) { return a->sign_pub; }

void td__admission_sign(td__admission_t *a, td__record_kind_t kind,
                        const uint8_t subject[TD_KEY_BYTES], const uint8_t *subject_sign,
                        bool admin, td__record_t *out) {
  uint64_t now = (uint64_t)(td_clock_wall_s() * 1e6);
  a->last_issued_us = now > a->last_issued_us ? now : a->last_issued_us + 1;
  uint8_t b[TD__RECORD_BYTES] = {0};
  memcpy(b, RECORD_TAG, 4);
  b[4] = (uint8_t)kind;
  b[5] = admin ? 1 : 0;
  put_u64(b + 6, a->last_issued_us);
  memcpy(b + 14, subject, TD_KEY_BYTES);
  if (subject_sign != NULL)
    memcpy(b + 46, subject_sign, TD__SIGN_KEY_BYTES);
  memcpy(b + 78, a->own, TD_KEY_BYTES);
  crypto_sign_detached(b + SIGNED_BYTES, NULL, b, SIGNED_BYTES, a->sign_secret);
  td__record_parse(out, b, sizeof b);
}

void td__admission_sign_message(const td__admission_t *a, const uint8_t *msg, size_t len,
                                uint8_t signature[TD__SIGNATURE_BYTES]) {
  crypto_sign_detached(signature, NULL, msg, len, a->sign_secret);
}

int td__admission_freshness(const td__admission_t *a, const td__record_t *r) {
  int i = record_index(a, r->subject);
  if (i < 0)
    return 1;
  const td__record_t *have = &a->records[i];
  if (memcmp(have->bytes, r->bytes, TD__RECORD_BYTES) == 0)
    return 0;
  return r->issued_us > have->issued_us ? 1 : -1;
}

int td__admission_store(td__admission_t *a, const td__record_t *r, char *why, size_t why_len) {
  int i = record_index(a, r->subject);
  if (i < 0 && a->n_records >= TD__RECORDS_MAX)
    return td_why(why, why_len, TD_ERANGE, "%d admission records kept already (the limit)",
                  TD__RECORDS_MAX);
  a->records[i >= 0 ? (size_t)i : a->n_records++] = *r;
  if (r->kind == TD__RECORD_ADMIT && td__admission_binding(a, r->subject) == NULL)
    td__admission_bind(a, r->subject, r->subject_sign);
  return save(a, why, why_len);
}

const td__record_t *td__admission_latest(const td__admission_t *a,
                                         const uint8_t subject[TD_KEY_BYTES]) {
  int i = record_index(a, subject);
  return i >= 0 ? &a->records[i] : NULL;
}

size_t td__admission_count(const td__admission_t *a) { return a->n_records; }
const td__record_t *td__admission_at(const td__admission_t *a, size_t i) {
  return i < a->n_records ? &a->records[i] : NULL;
}

const uint8_t *td__admission_binding(const td__admission_t *a, const uint8_t key[TD_KEY_BYTES]) {
  for (size_t i = 0; i < a->n_bindings; i++)
    if (memcmp(a->bindings[i].key, key, TD_KEY_BYTES) == 0)
      return a->bindings[i].sign;
  return NULL;
}

void td__admission_bind(td__admission_t *a, const uint8_t key[TD_KEY_BYTES],
                        const uint8_t sign[TD__SIGN_KEY_BYTES]) {
  binding_t *b = NULL;
  for (size_t i = 0; i < a->n_bindings && b == NULL; i++)
    if (memcmp(a->bindings[i].key, key, TD_KEY_BYTES) == 0)
      b = &a->bindings[i];
  if (b == NULL && memcmp(key, a->own, TD_KEY_BYTES) != 0 && a->n_bindings >= BINDINGS_MAX)
    return; /* full: records bind only listed keys, far fewer than this */
  if (b == NULL)
    b = &a->bindings[a->n_bindings++];
  if (memcmp(key, a->own, TD_KEY_BYTES) == 0 && memcmp(b->key, key, TD_KEY_BYTES) == 0 &&
      memcmp(sign, a->sign_pub, TD__SIGN_KEY_BYTES) != 0)
    return; /* our own binding is what we derive, whatever anyone says */
  memcpy(b->key, key, TD_KEY_BYTES);
  memcpy(b->sign, sign, TD__SIGN_KEY_BYTES);
}

/* ---- invites ------------------------------------------------------------------------- */

int td__admission_invite(td__admission_t *a, bool admin, uint32_t ttl_s,
                         uint8_t secret[TD_KEY_BYTES], uint8_t pub[TD_KEY_BYTES], char *why,
                         size_t why_len) {
  double now = td_clock_mono_s();
  invite_t *slot = NULL;
  for (size_t i = 0; i < TD__INVITES_MAX; i++) {
    invite_t *v = &a->invites[i];
    bool done = v->state == INVITE_FREE || v->state == INVITE_USED || now > v->expires_at;
    if (done && (slot == NULL || slot->state != INVITE_FREE) &&
        (slot == NULL || v->state == INVITE_FREE || v->made < slot->made))
      slot = v;
  }
  if (slot == NULL)
    return td_why(why, why_len, TD_ERANGE,
                  "%d invites are pending already: use them or wait for them to expire",
                  TD__INVITES_MAX);
  randombytes_buf(secret, TD_KEY_BYTES);
  crypto_scalarmult_base(pub, secret);
  *slot = (invite_t){.expires_at = now + ttl_s,
                     .admin = admin,
                     .state = INVITE_PENDING,
                     .made = ++a->invites_made};
  memcpy(slot->pub, pub, TD_KEY_BYTES);
  return 0;
}

static invite_t *find_invite(td__admission_t *a, const uint8_t key[TD_KEY_BYTES]) {
  for (size_t i = 0; i < TD__INVITES_MAX; i++)
    if (a->invites[i].state != INVITE_FREE &&
        memcmp(a->invites[i].pub, key, TD_KEY_BYTES) == 0)
      return &a->invites[i];
  return NULL;
}

td__invite_check_t td__admission_invite_handshake(td__admission_t *a,
                                                  const uint8_t key[TD_KEY_BYTES]) {
  invite_t *v = find_invite(a, key);
  if (v == NULL)
    return TD__INVITE_NONE;
  if (v->state != INVITE_PENDING) {
    a->refused_used++;
    return TD__INVITE_USED;
  }
  if (td_clock_mono_s() > v->expires_at) {
    a->refused_expired++;
    return TD__INVITE_EXPIRED;
  }
  v->state = INVITE_HANDSHAKEN; /* its one handshake: any other is refused */
  return TD__INVITE_OK;
}

bool td__admission_invite_use(td__admission_t *a, const uint8_t key[TD_KEY_BYTES], bool *admin) {
  invite_t *v = find_invite(a, key);
  if (v == NULL || v->state != INVITE_HANDSHAKEN)
    return false;
  v->state = INVITE_USED;
  a->invites_used++;
  *admin = v->admin;
  return true;
}

void td__admission_count_refused(td__admission_t *a, bool stale) {
  if (stale)
    a->stale++;
  else
    a->refused++;
}

void td__admission_count_applied(td__admission_t *a) { a->applied++; }

void td__admission_stats(const td__admission_t *a, td__admission_stats_t *out) {
  double now = td_clock_mono_s();
  size_t pending = 0;
  for (size_t i = 0; i < TD__INVITES_MAX; i++)
    pending += a->invites[i].state == INVITE_PENDING && now <= a->invites[i].expires_at;
  *out = (td__admission_stats_t){.records = a->n_records,
                                 .invites_pending = pending,
                                 .invites_made = a->invites_made,
                                 .invites_used = a->invites_used,
                                 .invites_refused_used = a->refused_used,
                                 .invites_refused_expired = a->refused_expired,
                                 .records_applied = a->applied,
                                 .records_refused = a->refused,
                                 .records_stale = a->stale};
}

/* ---- join strings -------------------------------------------------------------------- */

static bool shell_safe(const char *s) {
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
          strchr(".:/_-", *s) != NULL))
      return false;
  return true;
}

void td__join_string_format(char *out, const char *endpoint, const uint8_t inviter[TD_KEY_BYTES],
                            const uint8_t inviter_sign[TD__SIGN_KEY_BYTES],
                            const uint8_t secret[TD_KEY_BYTES]) {
  char ep[2 * TD_ENDPOINT_HEX_MAX + 2], k1[65], k2[65], k3[65];
  if (shell_safe(endpoint)) {
    snprintf(ep, sizeof ep, "%s", endpoint);
  } else {
    size_t n = strlen(endpoint);
    ep[0] = 'x';
    hex(ep + 1, (const uint8_t *)endpoint, n < TD_ENDPOINT_HEX_MAX ? n : TD_ENDPOINT_HEX_MAX);
  }
  hex(k1, inviter, TD_KEY_BYTES);
  hex(k2, inviter_sign, TD__SIGN_KEY_BYTES);
  hex(k3, secret, TD_KEY_BYTES);
  snprintf(out, TD__JOIN_STRING_MAX, JOIN_STRING_TAG ",%s,%s,%s,%s", ep, k1, k2, k3);
}

int td__join_string_parse(const char *s, char *endpoint, size_t endpoint_cap,
                          uint8_t inviter[TD_KEY_BYTES],
                          uint8_t inviter_sign[TD__SIGN_KEY_BYTES],
                          uint8_t secret[TD_KEY_BYTES], char *why, size_t why_len) {
  static const char usage[] = "not a join string (it starts with " JOIN_STRING_TAG
                              ", and is printed whole by trainctl invite on an admin node)";
  if (s == NULL || strlen(s) >= TD__JOIN_STRING_MAX || strncmp(s, JOIN_STRING_TAG ",", 4) != 0)
    return td_why(why, why_len, TD_ECONFIG, "%s", usage);
  const char *ep = s + 4, *comma = strchr(ep, ',');
  if (comma == NULL || strlen(comma) != 3 * 65)
    return td_why(why, why_len, TD_ECONFIG, "%s; this one is cut short or has extra text",
                  usage);
  size_t ep_len = (size_t)(comma - ep);
  if (ep_len > 0 && ep[0] == 'x') {
    if ((ep_len - 1) % 2 != 0 || (ep_len - 1) / 2 >= endpoint_cap ||
        !unhex((uint8_t *)endpoint, ep + 1, (ep_len - 1) / 2))
      return td_why(why, why_len, TD_ECONFIG, "%s; its endpoint is garbled", usage);
    endpoint[(ep_len - 1) / 2] = '\0';
  } else {
    if (ep_len >= endpoint_cap)
      return td_why(why, why_len, TD_ECONFIG, "%s; its endpoint is too long", usage);
    memcpy(endpoint, ep, ep_len);
    endpoint[ep_len] = '\0';
  }
  if (comma[65] != ',' || comma[130] != ',' || !unhex(inviter, comma + 1, TD_KEY_BYTES) ||
      !unhex(inviter_sign, comma + 66, TD__SIGN_KEY_BYTES) ||
      !unhex(secret, comma + 131, TD_KEY_BYTES))
    return td_why(why, why_len, TD_ECONFIG, "%s; its keys are garbled (copy it whole)", usage);
  if (strncmp(endpoint, "tcp://", 6) != 0 || strchr(endpoint + 6, ':') == NULL)
    return td_why(why, why_len, TD_ECONFIG, "%s; its endpoint is not tcp://HOST:PORT", usage);
  return 0;
}
