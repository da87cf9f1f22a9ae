/* td_corrupt.c: the corruption of tests/integration/traind_corrupt, a traind
 * linked from the same library with `-Wl,--wrap=td_outer_step`, so that the
 * product's code holds no hook. The file that TD_CORRUPT_FILE names holds a
 * round N: the first outer step this node applies at or after its Nth (round
 * N of a sync run it trained from round 1) is moved by +1 on its first 64
 * values, once per process, so this node's anchor leaves the members' for
 * good, as a flipped bit in memory or an update applied on one node alone
 * would. The file is read at every outer step, so a test writes it when it
 * wants the corruption; without it the node is honest. The outer step runs
 * on the compute thread only. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "scheduler/outer.h"

/* The library's own function, which the linker renamed for this program. */
void __real_td_outer_step(const td_outer_opts_t *o, const float *avg, float *buf, float *step,
                          size_t n);
void __wrap_td_outer_step(const td_outer_opts_t *o, const float *avg, float *buf, float *step,
                          size_t n);

/* Values moved, and by how much. */
#define CORRUPT_VALUES 64
#define CORRUPT_BY 1.0f

/* The round the file names; 0 when there is none. */
static unsigned long corrupt_round(void) {
  const char *path = getenv("TD_CORRUPT_FILE");
  FILE *f = path != NULL ? fopen(path, "r") : NULL;
  unsigned long round = 0;
  if (f != NULL) {
    if (fscanf(f, "%lu", &round) != 1)
      round = 0;
    fclose(f);
  }
  return round;
}

void __wrap_td_outer_step(const td_outer_opts_t *o, const float *avg, float *buf, float *step,
                          size_t n) {
  static unsigned long calls; /* the compute thread's outer steps, in order */
  static bool done;
  __real_td_outer_step(o, avg, buf, step, n);
  unsigned long at = ++calls, want = done ? 0 : corrupt_round();
  if (want == 0 || at < want)
    return;
  done = true;
  for (size_t i = 0; i < n && i < CORRUPT_VALUES; i++)
    step[i] += CORRUPT_BY;
  fprintf(stderr, "td_corrupt: outer step %lu moved by %g on %d values\n", at, CORRUPT_BY,
          CORRUPT_VALUES);
}
