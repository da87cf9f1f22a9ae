/* clients.c: a node's virtual clients trained one after another (clients.h).
 *
 * The node's update is kept as a running weighted mean in the delta buffer
 * itself (delta = delta * W/(W + w) + d * w/(W + w)), so no second buffer is
 * needed and a single client's update is its own x - base bit for bit. */
#include "compute/clients.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "compute/scaffold.h"

struct td_clients {
  const float *scaffold_c; /* SCAFFOLD (td_clients_set_scaffold): c, or NULL: off */
  float *scaffold_ci;      /* count x numel: client j's ci at j * numel */
  float *scaffold_corr;    /* numel floats of scratch: c - ci of the client training */
  unsigned count;
  td_trainer_rows_t walk[]; /* one per client: its range and where its epoch is */
};

int td_clients_open(td_clients_t **out, const size_t *offsets, unsigned count,
                    unsigned first_index) {
  *out = NULL;
  if (offsets == NULL || count == 0 || count > TD_CLIENTS_MAX)
    return TD_EINVAL;
  for (unsigned j = 0; j < count; j++)
    if (offsets[j + 1] < offsets[j])
      return TD_EINVAL;
  td_clients_t *cl = calloc(1, sizeof *cl + (size_t)count * sizeof cl->walk[0]);
  if (cl == NULL)
    return TD_ENOMEM;
  cl->count = count;
  for (unsigned j = 0; j < count; j++)
    td_trainer_rows_init(&cl->walk[j], offsets[j], offsets[j + 1] - offsets[j],
                         (uint64_t)first_index + j + 1); /* 0 would be nobody's */
  *out = cl;
  return 0;
}

void td_clients_close(td_clients_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  free(*self_p);
  *self_p = NULL;
}

unsigned td_clients_count(const td_clients_t *cl) { return cl->count; }

size_t td_clients_rows(const td_clients_t *cl, unsigned j) {
  return j < cl->count ? cl->walk[j].rows : 0;
}

void td_clients_set_scaffold(td_clients_t *cl, const float *c, float *ci, float *corr) {
  cl->scaffold_c = c;
  cl->scaffold_ci = ci;
  cl->scaffold_corr = corr;
}

int td_clients_train(td_clients_t *cl, td_trainer_t *tr, const unsigned *which, unsigned n,
                     const float *base, unsigned long step, unsigned long steps, float *delta,
                     td_train_stats_t *st, char *why, size_t why_len) {
  if (n == 0)
    return td_why(why, why_len, TD_EINVAL, "no client to train");
  for (unsigned i = 0; i < n; i++)
    if (which[i] >= cl->count || cl->walk[which[i]].rows == 0)
      return td_why(why, why_len, TD_EINVAL, "client %u holds no rows", which[i]);
  td_model_t *model = td_trainer_model(tr);
  float *params = td_model_host_params(model);
  size_t numel = td_model_numel(model);
  double weight = 0, loss_sum = 0;
  *st = (td_train_stats_t){0};
  int rc = 0;
  for (unsigned i = 0; i < n && rc == 0; i++) {
    memcpy(params, base, numel * sizeof(float));
    if ((rc = td_model_push(model, why, why_len)) != 0)
      break;
    if ((rc = td_trainer_reset_optim(tr)) != 0) {
      td_why(why, why_len, rc, "out of memory resetting the optimizer for client %u", which[i]);
      break;
    }
    td_trainer_seek(tr, step);
    td_trainer_bind_rows(tr, &cl->walk[which[i]]); /* checked above: cannot fail */
    float *ci = cl->scaffold_c != NULL ? cl->scaffold_ci + (size_t)which[i] * numel : NULL;
    if (ci != NULL) { /* this client's steps descend g - ci + c */
      td_scaffold_correction(cl->scaffold_corr, cl->scaffold_c, ci, numel);
      if ((rc = td_trainer_set_correction(tr, cl->scaffold_corr, why, why_len)) != 0)
        break;
    }
    td_train_stats_t one = {0};
    if ((rc = td_trainer_steps(tr, steps, &one, why, why_len)) != 0 ||
        (rc = td_model_pull(model, why, why_len)) != 0)
      break;
    if (ci != NULL) /* option II: ci += -c + (base - y) / Σlr */
      td_scaffold_client_update(ci, cl->scaffold_c, base, params,
                                td_trainer_lr_sum(tr, step, steps), numel);
    /* SCAFFOLD weighs the clients alike: the run's c follows their plain mean */
    double w = ci != NULL ? 1.0 : (double)one.samples, total = weight + w;
    if (i == 0) {
      for (size_t k = 0; k < numel; k++)
        delta[k] = params[k] - base[k];
    } else if (total > 0) {
      float keep = (float)(weight / total), add = (float)(w / total);
      for (size_t k = 0; k < numel; k++)
        delta[k] = delta[k] * keep + (params[k] - base[k]) * add;
    }
    weight = total;
    loss_sum += one.loss * w;
    st->steps += one.steps;
    st->samples += one.samples;
    st->seconds += one.seconds;
    st->lr = one.lr;
  }
  td_trainer_bind_rows(tr, NULL);
  td_trainer_set_correction(tr, NULL, NULL, 0); /* turning it off cannot fail */
  td_trainer_seek(tr, step + steps);
  st->loss = weight > 0 ? loss_sum / weight : 0;
  return rc;
}
