/* backend_impl.h: what a backend implementation provides (private to compute/).
 *
 * A backend is an interface table plus its own context, after ggml-backend.
 * `version` lets optional slots be added later: a slot that is NULL (or beyond
 * the table's version) falls back to the portable CPU code in backend.c.
 * Only compute/ includes this header. */
#ifndef TD_BACKEND_IMPL_H
#define TD_BACKEND_IMPL_H

#include "compute/backend.h"

/* 1: the MLP ops and sgd_step. 2: adamw_step (optional: a table of version 1,
 * or a NULL slot, gets the portable loop in backend.c). */
#define TD_BACKEND_IFACE_VERSION 2

typedef struct {
  int version;
  const char *name;
  int (*open)(td_backend_t *be, int threads, char *why, size_t why_len);
  void (*close)(td_backend_t *be);
  void *(*alloc)(td_backend_t *be, size_t bytes);
  void (*free)(td_backend_t *be, void *ptr);
  int (*upload)(td_backend_t *be, void *dst, const void *src, size_t bytes);
  int (*download)(td_backend_t *be, void *dst, const void *src, size_t bytes);
  void (*synchronize)(td_backend_t *be);
  void (*gemm)(td_backend_t *be, bool ta, bool tb, int m, int n, int k, float alpha,
               const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
  void (*bias_act)(td_backend_t *be, float *y, const float *bias, int rows, int cols,
                   td_act_t act);
  void (*act_backward)(td_backend_t *be, float *dy, const float *y, float *dbias, int rows,
                       int cols, td_act_t act);
  double (*softmax_xent)(td_backend_t *be, const float *logits, const int32_t *labels,
                         float *dlogits, float grad_scale, int rows, int cols, int *correct);
  void (*sgd_step)(td_backend_t *be, float *w, const float *g, float *v, size_t n,
                   const td_sgd_hparams_t *hp);
  /* version 2 */
  void (*adamw_step)(td_backend_t *be, float *w, const float *g, float *m, float *v, size_t n,
                     const td_adamw_hparams_t *hp);
} td_backend_iface_t;

struct td_backend {
  const td_backend_iface_t *iface;
  void *context; /* owned by the implementation */
  int threads;
  int device;         /* the INDEX of "cuda:INDEX" (0 otherwise), set before open */
  bool device_memory; /* set by open when alloc returns memory the host cannot read */
  int error;          /* first device error (a TD_E* code), kept by the implementation */
  char error_why[256];
  char describe[160]; /* filled by open; backend.c defaults it to the name */
};

/* The registered implementations; cuda is NULL unless compiled in. */
extern const td_backend_iface_t td__backend_cpu;
extern const td_backend_iface_t *const td__backend_cuda;

#endif
