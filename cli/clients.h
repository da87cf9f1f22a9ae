/* clients.h: the per-client view of a run in trainctl (issue 40, item 4).
 *
 * Reads the ledger tables client_labels (each client's training rows per
 * label, every node's known to every node) and client_evals (the global
 * model's accuracy on a client's held-out share, client_eval = true; each
 * node records its own), for `trainctl show` and `trainctl plot --y
 * client_accuracy`. A ledger older than those tables has no clients: nothing
 * is printed and nothing fails. Runs on trainctl's only thread. */
#ifndef TD_CLI_CLIENTS_H
#define TD_CLI_CLIENTS_H

#include <json-c/json.h>
#include <stdio.h>

#include "cli/ledgers.h"

/* One client of a run as one ledger knows it. */
typedef struct {
  int64_t node, client;
  int64_t rows;         /* its training rows */
  int64_t *labels;      /* rows per label, n_labels of them; owned by the list */
  size_t n_labels;
  double skew;          /* total variation distance of its label mix from the run's whole
                           training set's, in [0, 1]: 0 iid, 1 disjoint labels */
  double accuracy;      /* its last client evaluation in this ledger; NaN: none */
  int64_t eval_round, eval_rows;
} td__client_t;

/* The run's clients in its ledger, ordered by (node, client). Caller frees with
 * td__clients_free. 0 (with *n 0 when the ledger has none), or 1 after
 * printing why. */
int td__clients_read(const td__ledgers_run_t *r, td__client_t **out, size_t *n);
void td__clients_free(td__client_t *c, size_t n);
/* `trainctl show`'s lines: a summary, then one line per client. */
void td__clients_print(FILE *f, const td__client_t *c, size_t n);
/* The same as JSON, an array; caller owns it. */
json_object *td__clients_json(const td__client_t *c, size_t n);

/* `trainctl plot --y client_accuracy`: for each distinct run among the
 * series, every client's accuracy per round pooled over the ledgers holding
 * the run, written as datablock $cK (round, min, median, max over clients).
 * *blocks gets how many were written, runs[k] the index of the series that
 * names the k-th; 0, or 1 after printing why (a run without client_evals). */
int td__clients_write_spread(FILE *gp, const td__ledgers_run_t *series, size_t n,
                             size_t *runs, size_t *blocks);

#endif
