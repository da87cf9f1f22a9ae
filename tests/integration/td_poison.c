/* td_poison.c: the poison of tests/integration/traind_poison, a traind linked
 * from the same library with `-Wl,--wrap` on seven calls, so that the
 * product's code holds no hook: every update it encodes (td_link_codec_encode
 * and td_link_codec_encode_range, which the outbox calls) is corrupted
 * first, and every update chunk it packs (td_wire_pack) may lie about its
 * samples. The mode is read from the file named by TD_POISON_FILE
 * at every call, so one cluster can run a clean run and then poisoned ones
 * without restarting the node:
 *   none (or no file)  the update goes out as computed;
 *   huge               every value becomes +-1e30 (finite: only NaN/Inf are
 *                      refused by the decoder);
 *   flip               the update is sign-flipped and scaled by 10;
 *   samples            the update is honest but claims 10^9 samples (and
 *                      signs that claim where updates are signed:
 *                      td__backfill_digest);
 *   transfer           updates go out as computed, but every knowledge-transfer
 *                      EvalReport claims loss 0 and accuracy 1, and every model
 *                      it serves (a SnapshotChunk that is not a reconciliation,
 *                      hub mean or repair) has its floats scaled by -10;
 *   withhold:HEX       updates go out as computed, to every member but the
 *                      node of id HEX, which gets none (td__link_queue: the
 *                      frames of an update for that link are dropped);
 *   unsigned-withhold:HEX  the same, and the updates carry no signature;
 *   lie-withhold:HEX   the same as withhold:HEX, and each update's echo of
 *                      the set it averaged for the round before names
 *                      another set than the one its coordinator signed
 *                      (td_wire_pack), to have the coordinator put out;
 *   close-withhold:HEX  the same as withhold:HEX, and as the run's
 *                      coordinator it sends HEX no RoundClose either
 *                      (td__link_send);
 *   two-faced:K        the update to one member (the K-th link it encodes
 *                      for, counted from 1 since the mode last changed) is
 *                      scaled by 1.5, to the others it goes out as computed:
 *                      two updates for each round, each signed;
 *   close-self         updates go out as in flip; as the run's coordinator
 *                      it closes each round on its own update alone
 *                      (td__roundclose_send), leaving every other member out;
 *   equivocate:HEX     updates go out as computed; as the run's coordinator
 *                      it closes each round twice (td__roundclose_send), on
 *                      its set to every member but HEX and on that set less
 *                      its highest member to HEX: two signed sets for one
 *                      round.
 * Runs on the work pool; corrupts only its own copy of what it is handed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "compress/codec.h"
#include "daemon/net/net.h"
#include "daemon/session/shared.h"
#include "proto/wire.h"

/* The library's own functions, which the linker renamed for this program. */
int __real_td_link_codec_encode(td_link_codec_t *lc, const float *delta, const uint8_t **msg,
                                size_t *len);
int __real_td_link_codec_encode_range(td_link_codec_t *lc, const float *delta, size_t offset,
                                      size_t count, const uint8_t **msg, size_t *len);
int __real_td_wire_pack(Traind__Envelope *env, uint8_t **out, size_t *len);
int __wrap_td_link_codec_encode(td_link_codec_t *lc, const float *delta, const uint8_t **msg,
                                size_t *len);
int __wrap_td_link_codec_encode_range(td_link_codec_t *lc, const float *delta, size_t offset,
                                      size_t count, const uint8_t **msg, size_t *len);
int __wrap_td_wire_pack(Traind__Envelope *env, uint8_t **out, size_t *len);
void __real_td__link_queue(td__link_t *l, td_prio_t prio, uint8_t *frame, size_t len,
                           uint64_t seq);
void __wrap_td__link_queue(td__link_t *l, td_prio_t prio, uint8_t *frame, size_t len,
                           uint64_t seq);
void __real_td__backfill_digest(uint64_t run, uint64_t origin, uint64_t round, uint64_t samples,
                                const uint8_t *msg, size_t len,
                                uint8_t out[TD__BACKFILL_DIGEST]);
void __wrap_td__backfill_digest(uint64_t run, uint64_t origin, uint64_t round, uint64_t samples,
                                const uint8_t *msg, size_t len,
                                uint8_t out[TD__BACKFILL_DIGEST]);
void __real_td__roundclose_send(td__session_t *s, uint64_t round, uint64_t members,
                                const uint8_t (*digests)[32]);
void __wrap_td__roundclose_send(td__session_t *s, uint64_t round, uint64_t members,
                                const uint8_t (*digests)[32]);
int __real_td__link_send(td__transport_t *t, td__link_t *l, Traind__Envelope *env);
int __wrap_td__link_send(td__transport_t *t, td__link_t *l, Traind__Envelope *env);

static void poison_mode(char *mode, size_t len) {
  const char *path = getenv("TD_POISON_FILE");
  FILE *f = path != NULL ? fopen(path, "r") : NULL;
  snprintf(mode, len, "none");
  if (f != NULL) {
    char word[32];
    if (fscanf(f, "%31s", word) == 1)
      snprintf(mode, len, "%s", word);
    fclose(f);
  }
}

/* delta's floats [offset, offset + count) poisoned as the mode says, in a
 * copy of the whole buffer (zero elsewhere) the caller frees; NULL when the
 * mode leaves the update alone, or out of memory (*rc says which). */
static float *poisoned_copy(const td_link_codec_t *lc, const float *delta, size_t offset,
                            size_t count, int *rc) {
  char mode[32];
  poison_mode(mode, sizeof mode);
  bool huge = strcmp(mode, "huge") == 0;
  bool flip = strcmp(mode, "flip") == 0 || strcmp(mode, "close-self") == 0;
  bool two_faced = strncmp(mode, "two-faced:", 10) == 0, odd = false;
  static const td_link_codec_t *links[16]; /* two-faced: the links in the order first seen */
  static char links_mode[32];                /* ...since this mode was read */
  *rc = 0;
  if (strcmp(mode, links_mode) != 0) {
    memset(links, 0, sizeof links);
    snprintf(links_mode, sizeof links_mode, "%s", mode);
  }
  if (two_faced) {
    size_t k = strtoul(mode + 10, NULL, 10), i = 0;
    while (i < 16 && links[i] != NULL && links[i] != lc)
      i++;
    if (i < 16 && links[i] == NULL)
      links[i] = lc;
    odd = i + 1 == k;
  }
  if (!huge && !flip && !odd)
    return NULL;
  size_t numel = td_link_codec_numel(lc);
  float *poisoned = calloc(numel, sizeof *poisoned);
  if (poisoned == NULL) {
    *rc = TD_ENOMEM;
    return NULL;
  }
  for (size_t i = offset; i < offset + count && i < numel; i++)
    poisoned[i] = huge ? copysignf(1e30f, delta[i]) : (flip ? -10.0f : 1.5f) * delta[i];
  return poisoned;
}

int __wrap_td_link_codec_encode(td_link_codec_t *lc, const float *delta, const uint8_t **msg,
                                size_t *len) {
  int rc;
  float *poisoned = poisoned_copy(lc, delta, 0, td_link_codec_numel(lc), &rc);
  if (poisoned == NULL)
    return rc != 0 ? rc : __real_td_link_codec_encode(lc, delta, msg, len);
  rc = __real_td_link_codec_encode(lc, poisoned, msg, len);
  free(poisoned); /* *msg is the link's buffer, not this one */
  return rc;
}

/* Mode transfer: the report lies, and the model served is scaled by -10. */
static int pack_transfer_lie(Traind__Envelope *env, uint8_t **out, size_t *len) {
  Traind__Envelope copy = *env;
  if (env->body_case == TRAIND__ENVELOPE__BODY_EVAL_REPORT && env->eval_report != NULL) {
    Traind__EvalReport lying = *env->eval_report;
    lying.loss = 0;
    lying.accuracy = 1;
    copy.eval_report = &lying;
    return __real_td_wire_pack(&copy, out, len);
  }
  Traind__SnapshotChunk *ch = env->snapshot_chunk;
  if (env->body_case != TRAIND__ENVELOPE__BODY_SNAPSHOT_CHUNK || ch == NULL || ch->reconcile ||
      ch->repair || ch->mean_of > 0 || ch->offset % sizeof(float) != 0)
    return __real_td_wire_pack(env, out, len);
  Traind__SnapshotChunk bad = *ch;
  uint8_t *payload = malloc(ch->payload.len + 1);
  if (payload == NULL)
    return TD_ENOMEM;
  memcpy(payload, ch->payload.data, ch->payload.len);
  for (size_t i = 0; i + sizeof(float) <= ch->payload.len; i += sizeof(float)) {
    float v;
    memcpy(&v, payload + i, sizeof v);
    v *= -10.0f;
    memcpy(payload + i, &v, sizeof v);
  }
  bad.payload.data = payload;
  copy.snapshot_chunk = &bad;
  int rc = __real_td_wire_pack(&copy, out, len);
  free(payload);
  return rc;
}

/* The outbox's call: a round's update, or with fragments its slice. */
int __wrap_td_link_codec_encode_range(td_link_codec_t *lc, const float *delta, size_t offset,
                                      size_t count, const uint8_t **msg, size_t *len) {
  int rc;
  float *poisoned = poisoned_copy(lc, delta, offset, count, &rc);
  if (poisoned == NULL)
    return rc != 0 ? rc
                   : __real_td_link_codec_encode_range(lc, delta, offset, count, msg, len);
  rc = __real_td_link_codec_encode_range(lc, poisoned, offset, count, msg, len);
  free(poisoned);
  return rc;
}

int __wrap_td_wire_pack(Traind__Envelope *env, uint8_t **out, size_t *len) {
  char mode[32];
  if (env->body_case == TRAIND__ENVELOPE__BODY_EVAL_REPORT ||
      env->body_case == TRAIND__ENVELOPE__BODY_SNAPSHOT_CHUNK) {
    poison_mode(mode, sizeof mode);
    return strcmp(mode, "transfer") == 0 ? pack_transfer_lie(env, out, len)
                                         : __real_td_wire_pack(env, out, len);
  }
  if (env->body_case != TRAIND__ENVELOPE__BODY_UPDATE || env->update == NULL)
    return __real_td_wire_pack(env, out, len);
  poison_mode(mode, sizeof mode);
  bool strip = strncmp(mode, "unsigned-", 9) == 0, lie = strncmp(mode, "lie-", 4) == 0;
  if (strcmp(mode, "samples") != 0 && !strip && !lie)
    return __real_td_wire_pack(env, out, len);
  Traind__UpdateChunk lying = *env->update;
  Traind__Envelope copy = *env;
  if (strip)
    lying.signature.len = 0;
  else if (lie)
    lying.applied_members ^= (lying.applied_members ^ 1) != 0 ? 1 : 2;
  else
    lying.samples = 1000000000u;
  copy.update = &lying;
  return __real_td_wire_pack(&copy, out, len);
}

/* Modes withhold:HEX: an update's frames for the link to HEX are dropped. */
void __wrap_td__link_queue(td__link_t *l, td_prio_t prio, uint8_t *frame, size_t len,
                           uint64_t seq) {
  char mode[32];
  poison_mode(mode, sizeof mode);
  const char *target = strstr(mode, "withhold:");
  if (prio == TD_PRIO_UPDATE && target != NULL &&
      strtoull(target + 9, NULL, 16) == td__link_peer(l)) {
    free(frame);
    return;
  }
  __real_td__link_queue(l, prio, frame, len, seq);
}

/* Mode equivocate:HEX: which of the two closes of a round goes out now (1:
 * the true set, to all but HEX; 2: the other one, to HEX alone; 0: none).
 * Loop thread only. */
static int equivocating;

void __wrap_td__roundclose_send(td__session_t *s, uint64_t round, uint64_t members,
                                const uint8_t (*digests)[32]) {
  char mode[32];
  poison_mode(mode, sizeof mode);
  if (strcmp(mode, "close-self") == 0) { /* its own update alone, when it is in */
    size_t self = td__session_member(s, s->node->node_id);
    if (self < 64 && (members >> self & 1))
      members = UINT64_C(1) << self;
    __real_td__roundclose_send(s, round, members, digests);
    return;
  }
  if (strncmp(mode, "equivocate:", 11) != 0) {
    __real_td__roundclose_send(s, round, members, digests);
    return;
  }
  uint64_t other = members;
  for (int b = 63; b >= 0; b--)
    if ((members >> b & 1) && (members & ~(UINT64_C(1) << b)) != 0) {
      other = members & ~(UINT64_C(1) << b);
      break;
    }
  equivocating = 1;
  __real_td__roundclose_send(s, round, members, digests);
  equivocating = 2;
  __real_td__roundclose_send(s, round, other, digests);
  equivocating = 0;
}

/* Modes close-withhold:HEX (no RoundClose for the link to HEX either) and
 * equivocate:HEX (each of the two closes to its own side). */
int __wrap_td__link_send(td__transport_t *t, td__link_t *l, Traind__Envelope *env) {
  char mode[32];
  if (env->body_case == TRAIND__ENVELOPE__BODY_ROUND_CLOSE) {
    poison_mode(mode, sizeof mode);
    if (strncmp(mode, "close-withhold:", 15) == 0 &&
        strtoull(mode + 15, NULL, 16) == td__link_peer(l))
      return 0;
    bool target = strncmp(mode, "equivocate:", 11) == 0 &&
                  strtoull(mode + 11, NULL, 16) == td__link_peer(l);
    if ((equivocating == 1 && target) || (equivocating == 2 && !target))
      return 0;
  }
  return __real_td__link_send(t, l, env);
}

/* Mode samples: what the outbox signs is the claim that goes out (only the
 * outbox's calls come here: the check of a received update is inside the
 * library's own file, which --wrap does not reach). */
void __wrap_td__backfill_digest(uint64_t run, uint64_t origin, uint64_t round, uint64_t samples,
                                const uint8_t *msg, size_t len,
                                uint8_t out[TD__BACKFILL_DIGEST]) {
  char mode[32];
  poison_mode(mode, sizeof mode);
  if (strcmp(mode, "samples") == 0)
    samples = 1000000000u;
  __real_td__backfill_digest(run, origin, round, samples, msg, len, out);
}
