/* td_poison.c: the poison of tests/integration/traind_poison, a traind linked
 * from the same library with `-Wl,--wrap` on three calls, so that the
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
 *   samples            the update is honest but claims 10^9 samples;
 *   transfer           updates go out as computed, but every knowledge-transfer
 *                      EvalReport claims loss 0 and accuracy 1, and every model
 *                      it serves (a SnapshotChunk that is not a reconciliation,
 *                      hub mean or repair) has its floats scaled by -10.
 * Runs on the work pool; corrupts only its own copy of what it is handed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "compress/codec.h"
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
  bool huge = strcmp(mode, "huge") == 0, flip = strcmp(mode, "flip") == 0;
  *rc = 0;
  if (!huge && !flip)
    return NULL;
  size_t numel = td_link_codec_numel(lc);
  float *poisoned = calloc(numel, sizeof *poisoned);
  if (poisoned == NULL) {
    *rc = TD_ENOMEM;
    return NULL;
  }
  for (size_t i = offset; i < offset + count && i < numel; i++)
    poisoned[i] = huge ? copysignf(1e30f, delta[i]) : -10.0f * delta[i];
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
  if (strcmp(mode, "samples") != 0)
    return __real_td_wire_pack(env, out, len);
  Traind__UpdateChunk lying = *env->update;
  Traind__Envelope copy = *env;
  lying.samples = 1000000000u;
  copy.update = &lying;
  return __real_td_wire_pack(&copy, out, len);
}
