/* clients.h: virtual clients, several data partitions one node trains in turn.
 *
 * With the run key `clients = K` a node hosts K federated clients. Their rows
 * are consecutive ranges of the node's one training set (client j's after
 * client j - 1's), and a client's state is only its range and its walk over
 * it (td_trainer_rows_t): the node keeps one model (the trainer's, a scratch
 * copy every client starts from) and one accumulator (the round's delta), so
 * memory grows by a few words per client, never by a model per client.
 * A round trains the sampled clients one after another, each from the
 * round's model for the round's H steps, and the node's update is their
 * sample-weighted mean, which is what the mesh averages (it sees nodes, not
 * clients). docs/algorithms.md#virtual-clients. One object belongs to one
 * thread (the run's compute thread). */
#ifndef TD_CLIENTS_H
#define TD_CLIENTS_H

#include <stddef.h>

#include "compute/trainer.h"

/* Most clients one node hosts. */
#define TD_CLIENTS_MAX 4096u

typedef struct td_clients td_clients_t;

/* count clients (1 to TD_CLIENTS_MAX) over consecutive rows: client j holds
 * rows [offsets[j], offsets[j + 1]) of the trainer's set (offsets: count + 1
 * values, ascending, copied), named by global index first_index + j (its
 * shuffle stream: its walk is td_trainer_rows_init(offsets[j], its rows,
 * first_index + j + 1)). A client may hold no rows. Caller owns *out. TD_EINVAL,
 * TD_ENOMEM. */
int td_clients_open(td_clients_t **out, const size_t *offsets, unsigned count,
                    unsigned first_index);
void td_clients_close(td_clients_t **self_p);
unsigned td_clients_count(const td_clients_t *cl);
/* Client j's rows (0 for j out of range). */
size_t td_clients_rows(const td_clients_t *cl, unsigned j);

/* SCAFFOLD (compute/scaffold.h) for every later td_clients_train: client j's
 * steps add c - ci_j to the gradient (ci_j = ci + j * numel, ci holding
 * count x numel floats), ci_j moves by option II after them, and the clients
 * are weighed alike in delta. c, ci and corr (numel floats of scratch) are
 * borrowed until the next call; c == NULL turns it off. CPU trainers only
 * (td_trainer_set_correction's refusal comes back from td_clients_train). */
void td_clients_set_scaffold(td_clients_t *cl, const float *c, float *ci, float *corr);

/* One round of the clients which[0..n) (local indices, each holding rows),
 * in that order: each starts from base (numel host floats, borrowed) with a
 * zeroed optimizer (a client keeps no optimizer state between rounds) at
 * the trainer's global step `step`, and takes `steps` steps on its own rows.
 * delta (numel floats) gets sum_j w_j (x_j - base) / sum_j w_j, w_j the
 * samples client j trained (one client: x - base exactly); st the summed
 * steps and samples and the sample-weighted loss. The trainer ends at step
 * `step + steps`, unbound, its model holding the last client's result.
 * TD_EINVAL (no client, an empty or unknown one), or the trainer's error
 * with why. */
int td_clients_train(td_clients_t *cl, td_trainer_t *tr, const unsigned *which, unsigned n,
                     const float *base, unsigned long step, unsigned long steps, float *delta,
                     td_train_stats_t *st, char *why, size_t why_len);

#endif
