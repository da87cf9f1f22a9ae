/* td_poison.c: the poison of tests/integration/traind_poison, a traind built
 * from the same sources whose daemon/session/outbox.c (compiled with TD_TEST_POISON)
 * hands each outgoing update here before encoding it. The mode is read from
 * the file named by TD_POISON_FILE at every update, so one cluster can run a
 * clean run and then poisoned ones without restarting the node:
 *   none (or no file)  the update goes out as computed;
 *   huge               every value becomes +-1e30 (finite: only NaN/Inf are
 *                      refused by the decoder);
 *   flip               the update is sign-flipped and scaled by 10;
 *   samples            the update is honest but claims 10^9 samples.
 * Runs on the work pool; touches only the copy it is handed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void td__test_poison(float *delta, size_t numel, uint64_t *samples);

void td__test_poison(float *delta, size_t numel, uint64_t *samples) {
  const char *path = getenv("TD_POISON_FILE");
  char mode[32] = "none";
  FILE *f = path != NULL ? fopen(path, "r") : NULL;
  if (f != NULL) {
    if (fscanf(f, "%31s", mode) != 1)
      snprintf(mode, sizeof mode, "none");
    fclose(f);
  }
  if (strcmp(mode, "huge") == 0) {
    for (size_t i = 0; i < numel; i++)
      delta[i] = copysignf(1e30f, delta[i]);
  } else if (strcmp(mode, "flip") == 0) {
    for (size_t i = 0; i < numel; i++)
      delta[i] *= -10.0f;
  } else if (strcmp(mode, "samples") == 0) {
    *samples = 1000000000u;
  }
}
