/* td_liar.c: the lie of tests/integration/traind_liar, a traind linked from
 * the same library with `-Wl,--wrap=td_wire_pack` (and td__backfill_digest,
 * so that in runs whose updates are signed it signs the samples it claims,
 * as a real liar holding its own key would), so that the product's code
 * holds no hook: a member that tells each node something else. The outbox
 * packs a round's update once per peer, peers in member order, so the n-th
 * chunk 0 of a round goes to the n-th peer (target 0, 1, 2, ...). The mode is
 * read from the file named by TD_LIAR_FILE at every update chunk, so one
 * cluster can run a clean run and then lying ones without restarting:
 *   none (or no file)  every chunk goes out as packed;
 *   capacity           target 0 is told a capacity of 1e6 samples/s, target 1
 *                      a capacity of 1 (the others the measured one);
 *   echo               the capacity is honest, but the capacities it echoes
 *                      for the other members (heard_capacity) are x 1000 to
 *                      target 0 and / 1000 to target 1;
 *   both               capacity and echo together;
 *   samples            the capacity is honest; target 1 is told a quarter of
 *                      the samples the update was made from (a claim below
 *                      any bound, so a weight only that node would use);
 *   withhold           target 1 is sent no update at all (the packing fails
 *                      for it), the others every one (not in the test: a
 *                      manual experiment; see docs/security.md).
 * Runs on the work pool, one update at a time (the outbox encodes one round
 * after the other); changes only its own copies of what it is handed. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "daemon/session/shared.h"
#include "proto/wire.h"

/* The library's own function, which the linker renamed for this program. */
int __real_td_wire_pack(Traind__Envelope *env, uint8_t **out, size_t *len);
int __wrap_td_wire_pack(Traind__Envelope *env, uint8_t **out, size_t *len);
void __real_td__backfill_digest(uint64_t run, uint64_t origin, uint64_t round, uint64_t samples,
                                const uint8_t *msg, size_t len,
                                uint8_t out[TD__BACKFILL_DIGEST]);
void __wrap_td__backfill_digest(uint64_t run, uint64_t origin, uint64_t round, uint64_t samples,
                                const uint8_t *msg, size_t len,
                                uint8_t out[TD__BACKFILL_DIGEST]);

static void liar_mode(char *mode, size_t len) {
  const char *path = getenv("TD_LIAR_FILE");
  FILE *f = path != NULL ? fopen(path, "r") : NULL;
  snprintf(mode, len, "none");
  if (f != NULL) {
    char word[32];
    if (fscanf(f, "%31s", word) == 1)
      snprintf(mode, len, "%s", word);
    fclose(f);
  }
}

/* The peer this chunk goes to, as an index in the order the outbox packs. */
static unsigned target_of(const Traind__UpdateChunk *up) {
  static uint64_t round = UINT64_MAX;
  static unsigned seen; /* chunk 0s packed for `round` */
  if (up->round != round) {
    round = up->round;
    seen = 0;
  }
  if (up->chunk == 0)
    seen++;
  return seen > 0 ? seen - 1 : 0;
}

int __wrap_td_wire_pack(Traind__Envelope *env, uint8_t **out, size_t *len) {
  if (env->body_case != TRAIND__ENVELOPE__BODY_UPDATE || env->update == NULL)
    return __real_td_wire_pack(env, out, len);
  char mode[32];
  liar_mode(mode, sizeof mode);
  unsigned target = target_of(env->update);
  bool capacity = strcmp(mode, "capacity") == 0 || strcmp(mode, "both") == 0;
  bool echo = strcmp(mode, "echo") == 0 || strcmp(mode, "both") == 0;
  bool samples = strcmp(mode, "samples") == 0;
  if (strcmp(mode, "withhold") == 0 && target == 1)
    return TD_EIO;
  if ((!capacity && !echo && !samples) || target > 1)
    return __real_td_wire_pack(env, out, len);
  Traind__UpdateChunk lying = *env->update;
  Traind__Envelope copy = *env;
  double heard[TD_WIRE_MAX_PEERS];
  if (capacity)
    lying.capacity = target == 0 ? 1e6 : 1;
  if (samples && target == 1)
    lying.samples = lying.samples / 4 + 1;
  if (echo && lying.n_heard_capacity <= TD_WIRE_MAX_PEERS) {
    for (size_t i = 0; i < lying.n_heard_capacity; i++)
      heard[i] = lying.heard_capacity[i] * (target == 0 ? 1000.0 : 0.001);
    lying.heard_capacity = heard;
  }
  copy.update = &lying;
  return __real_td_wire_pack(&copy, out, len);
}

/* The outbox signs each peer's copy just before packing it, peers in the
 * same order: the n-th digest of a round is target n's. In mode samples
 * target 1's copy is signed with the samples it will be told. */
void __wrap_td__backfill_digest(uint64_t run, uint64_t origin, uint64_t round, uint64_t samples,
                                const uint8_t *msg, size_t len,
                                uint8_t out[TD__BACKFILL_DIGEST]) {
  static uint64_t last = UINT64_MAX;
  static unsigned seen;
  if (round != last) {
    last = round;
    seen = 0;
  }
  unsigned target = seen++;
  char mode[32];
  liar_mode(mode, sizeof mode);
  if (strcmp(mode, "samples") == 0 && target == 1)
    samples = samples / 4 + 1;
  __real_td__backfill_digest(run, origin, round, samples, msg, len, out);
}
