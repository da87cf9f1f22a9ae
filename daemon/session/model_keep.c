/* model_keep.c: the model every run leaves in its node's ledger.
 *
 * Whatever checkpoint_every says, a run keeps one model row in the ledger's
 * `models` table (daemon/store/ledger.c): the compute thread hands the loop its
 * final consensus model before FINISHED, the anchor of the last round it
 * applied before STOPPED, and each checkpoint is kept in memory too, so a
 * run that fails keeps the model of its last checkpoint (a failure hands no
 * model back: the compute thread may have failed inside the step that
 * would have made it). The row is written when the session finishes, with
 * the run's end state, its final metric, the model spec and the tensor names
 * and shapes (JSON), so `trainctl model` can export it with the daemon down.
 * Storage: one model per run, plus the checkpoints the run asked for
 * (checkpoint_keep). Runs on the loop thread. */
#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/base/log.h"
#include "daemon/session/shared.h"

char *td__layout_json(const td_layout_t *layout) {
  json_object *a = json_object_new_array();
  for (size_t i = 0; a != NULL && i < td_layout_count(layout); i++) {
    const td_tensor_info_t *t = td_layout_tensor(layout, i);
    json_object *o = json_object_new_object(), *shape = json_object_new_array();
    json_object_object_add(o, "name", json_object_new_string(t->name));
    for (uint32_t d = 0; d < t->ndim; d++)
      json_object_array_add(shape, json_object_new_int64(t->shape[d]));
    json_object_object_add(o, "shape", shape);
    json_object_object_add(o, "offset", json_object_new_int64((int64_t)t->offset));
    json_object_array_add(a, o);
  }
  const char *text = a != NULL ? json_object_to_json_string_ext(a, JSON_C_TO_STRING_PLAIN) : NULL;
  char *out = text != NULL ? strdup(text) : NULL;
  json_object_put(a);
  return out;
}

void td__model_hold(td__session_t *s, uint64_t round, float *blob) {
  free(s->kept_model);
  s->kept_model = blob;
  s->kept_round = round;
}

void td__model_keep(td__node_t *n, td__session_t *s, const char *state, double metric) {
  if (s->kept_model == NULL)
    return;
  char *tensors = td__layout_json(td_run_layout(s->run));
  if (tensors == NULL) {
    td_log_error("run %016" PRIx64 ": out of memory: its model is not kept", s->run_id);
    return;
  }
  td__ledger_model(n->ledger, s->run_id, s->kept_round, state, metric, s->spec.model, tensors,
                   s->kept_model, td_run_numel(s->run) * sizeof(float));
  s->kept_model = NULL;
  free(tensors);
}
