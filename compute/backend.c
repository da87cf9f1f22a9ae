/* backend.c: backend registry and the thin wrappers every caller uses.
 *
 * The CUDA entry is NULL in this build: its slots are defined by
 * backend_impl.h and a GPU implementation plugs in there; until then asking for
 * "cuda" fails with TD_EDEVICE and the CPU backend is the fallback. */
#include "compute/backend.h"

#include <stdlib.h>
#include <string.h>

#include "compute/backend_impl.h"
#include "compute/error.h"

const td_backend_iface_t *const td__backend_cuda = NULL;

bool td_backend_available(const char *name) {
  if (strcmp(name, "cpu") == 0)
    return true;
  if (strcmp(name, "cuda") == 0)
    return td__backend_cuda != NULL;
  return false;
}

int td_backend_open(td_backend_t **out, const char *name, int threads, char *why,
                    size_t why_len) {
  *out = NULL;
  const td_backend_iface_t *iface = NULL;
  if (strcmp(name, "cpu") == 0)
    iface = &td__backend_cpu;
  else if (strcmp(name, "cuda") == 0)
    iface = td__backend_cuda;
  else
    return td_why(why, why_len, TD_ECONFIG, "unknown backend '%s' (accepted: cpu, cuda)", name);
  if (iface == NULL)
    return td_why(why, why_len, TD_EDEVICE,
                  "the CUDA backend is not available in this build (use backend = cpu)");
  td_backend_t *be = calloc(1, sizeof *be);
  if (be == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  be->iface = iface;
  be->threads = threads;
  int rc = iface->open ? iface->open(be, threads, why, why_len) : 0;
  if (rc != 0) {
    free(be);
    return rc;
  }
  *out = be;
  return 0;
}

void td_backend_close(td_backend_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  td_backend_t *be = *self_p;
  if (be->iface->close)
    be->iface->close(be);
  free(be);
  *self_p = NULL;
}

const char *td_backend_name(const td_backend_t *be) { return be->iface->name; }

void *td_backend_alloc(td_backend_t *be, size_t bytes) { return be->iface->alloc(be, bytes); }
void td_backend_free(td_backend_t *be, void *ptr) {
  if (ptr)
    be->iface->free(be, ptr);
}
int td_backend_upload(td_backend_t *be, void *dst, const void *src, size_t bytes) {
  return be->iface->upload(be, dst, src, bytes);
}
int td_backend_download(td_backend_t *be, void *dst, const void *src, size_t bytes) {
  return be->iface->download(be, dst, src, bytes);
}
void td_backend_synchronize(td_backend_t *be) {
  if (be->iface->synchronize)
    be->iface->synchronize(be);
}

void td_backend_gemm(td_backend_t *be, bool ta, bool tb, int m, int n, int k, float alpha,
                     const float *a, int lda, const float *b, int ldb, float beta, float *c,
                     int ldc) {
  be->iface->gemm(be, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void td_backend_bias_act(td_backend_t *be, float *y, const float *bias, int rows, int cols,
                         td_act_t act) {
  be->iface->bias_act(be, y, bias, rows, cols, act);
}
void td_backend_act_backward(td_backend_t *be, float *dy, const float *y, float *dbias, int rows,
                             int cols, td_act_t act) {
  be->iface->act_backward(be, dy, y, dbias, rows, cols, act);
}
double td_backend_softmax_xent(td_backend_t *be, const float *logits, const int32_t *labels,
                               float *dlogits, float grad_scale, int rows, int cols,
                               int *correct) {
  return be->iface->softmax_xent(be, logits, labels, dlogits, grad_scale, rows, cols, correct);
}
void td_backend_sgd_step(td_backend_t *be, float *w, const float *g, float *v, size_t n,
                         const td_sgd_hparams_t *hp) {
  be->iface->sgd_step(be, w, g, v, n, hp);
}
