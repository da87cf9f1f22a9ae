/* standalone.h: `traind --standalone`, the N = 1 baseline every experiment is
 * compared with: load the dataset, take partition K of N, train for the given
 * epochs with per-epoch progress on stdout, and optionally end with one JSON
 * object holding the final figures. */
#ifndef TD_STANDALONE_H
#define TD_STANDALONE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "daemon/run/runspec.h"

/* Train as the spec says, printing progress to out. Returns 0, or a TD_E* code
 * with a one-line reason in why (bad data, shape mismatch, divergence...). */
int td_standalone_run(const td_runspec_t *rs, bool json, FILE *out, char *why, size_t why_len);

#endif
