/* run_csv.h: what the single-node run tests (test_run_eval, test_run_overlap)
 * share: a small CSV dataset written to a temporary file (three classes, four
 * features; `salt` makes a test set differ from the training set), and a CPU
 * backend opened through the run's open_backend seam, so that evaluations run
 * between rounds rather than on the evaluator thread. Included by one test
 * file each. */
#ifndef TD_TEST_RUN_CSV_H
#define TD_TEST_RUN_CSV_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "compute/backend.h"

/* Writes `rows` rows to a new temporary file whose name goes to path[len]. */
static void run_csv_write(char *path, size_t len, int rows, int salt) {
  snprintf(path, len, "/tmp/td-test-run-XXXXXX"); /* mkstemp's file-name template */
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  FILE *f = fdopen(fd, "w");
  ck_assert_ptr_nonnull(f);
  for (int i = 0; i < rows; i++)
    fprintf(f, "%d,%d.5,%d.25,%d\n", i % 3, (i + salt) % 3 * 2, (i + salt) % 5, i % 7);
  fclose(f);
}

/* td_run_opts_t.open_backend: a plain CPU backend (no evaluator thread). */
static int run_csv_plain_cpu(td_backend_t **out, int threads, char *why, size_t why_len) {
  return td_backend_open(out, "cpu", threads, why, why_len);
}

#endif
