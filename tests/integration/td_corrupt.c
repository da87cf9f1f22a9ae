/* td_corrupt.c: the corruption of tests/integration/traind_corrupt, a traind
 * linked from the same library with `-Wl,--wrap=td_outer_step` and
 * `-Wl,--wrap=td_wire_pack`, so that the product's code holds no hook. The
 * file that TD_CORRUPT_FILE names says what goes wrong; it is read at every
 * call, so a test writes it when it wants the fault, and without it the node
 * is honest:
 *   N (a round)  the first outer step this node applies at or after its Nth
 *                (round N of a sync run it trained from round 1) is moved by
 *                +1 on its first 64 values, once per process: its anchor
 *                leaves the members' for good, as a flipped bit in memory or
 *                an update applied on one node alone would;
 *   lie          its model stays honest, but every state hash it sends
 *                (StateHash) has its first byte flipped: a member lying
 *                about its state.
 * The outer step runs on the compute thread, the packing on the loop thread
 * and the work pool; each corrupts only what it is handed. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/wire.h"
#include "scheduler/outer.h"

/* The library's own functions, which the linker renamed for this program. */
void __real_td_outer_step(const td_outer_opts_t *o, const float *avg, float *buf, float *step,
                          size_t n);
void __wrap_td_outer_step(const td_outer_opts_t *o, const float *avg, float *buf, float *step,
                          size_t n);
int __real_td_wire_pack(Traind__Envelope *env, uint8_t **out, size_t *len);
int __wrap_td_wire_pack(Traind__Envelope *env, uint8_t **out, size_t *len);

/* Values moved, and by how much. */
#define CORRUPT_VALUES 64
#define CORRUPT_BY 1.0f

/* The file's first word ("" when there is none). */
static void corrupt_mode(char *word, size_t len) {
  const char *path = getenv("TD_CORRUPT_FILE");
  FILE *f = path != NULL ? fopen(path, "r") : NULL;
  word[0] = '\0';
  if (f != NULL) {
    char w[32];
    if (fscanf(f, "%31s", w) == 1)
      snprintf(word, len, "%s", w);
    fclose(f);
  }
}

void __wrap_td_outer_step(const td_outer_opts_t *o, const float *avg, float *buf, float *step,
                          size_t n) {
  static unsigned long calls; /* the compute thread's outer steps, in order */
  static bool done;
  __real_td_outer_step(o, avg, buf, step, n);
  char mode[32];
  corrupt_mode(mode, sizeof mode);
  unsigned long at = ++calls, want = done ? 0 : strtoul(mode, NULL, 10);
  if (want == 0 || at < want)
    return;
  done = true;
  for (size_t i = 0; i < n && i < CORRUPT_VALUES; i++)
    step[i] += CORRUPT_BY;
  fprintf(stderr, "td_corrupt: outer step %lu moved by %g on %d values\n", at, CORRUPT_BY,
          CORRUPT_VALUES);
}

int __wrap_td_wire_pack(Traind__Envelope *env, uint8_t **out, size_t *len) {
  if (env->body_case != TRAIND__ENVELOPE__BODY_STATE_HASH || env->state_hash == NULL ||
      env->state_hash->hash.len == 0)
    return __real_td_wire_pack(env, out, len);
  char mode[32];
  corrupt_mode(mode, sizeof mode);
  if (strcmp(mode, "lie") != 0)
    return __real_td_wire_pack(env, out, len);
  uint8_t lie[64];
  size_t n = env->state_hash->hash.len < sizeof lie ? env->state_hash->hash.len : sizeof lie;
  memcpy(lie, env->state_hash->hash.data, n);
  lie[0] ^= 0xff;
  Traind__StateHash sh = *env->state_hash;
  Traind__Envelope copy = *env;
  sh.hash.data = lie;
  sh.hash.len = n;
  copy.state_hash = &sh;
  return __real_td_wire_pack(&copy, out, len);
}
