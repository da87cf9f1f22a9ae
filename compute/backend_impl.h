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
 * or a NULL slot, gets the portable loop in backend.c). 3: the layer ops (all
 * or none: a table of version 3 must fill every one). 4: im2col and col2im of
 * a whole batch in one call (optional: NULL, or a table below version 4, gets
 * a loop over the one-image ops in backend.c). 5: pinned host memory and
 * asynchronous copies (optional: NULL, or a table below version 5, gets
 * aligned host memory and the blocking upload/download). 6: prox_grad
 * (optional: without it td_backend_supports_prox() is false and FedProx is
 * refused on that backend). */
#define TD_BACKEND_IFACE_VERSION 6

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
  /* version 3: the layer ops of backend.h, same arguments after be. */
  void (*im2col)(td_backend_t *be, float *col, const float *img, const td_conv_geom_t *g);
  void (*col2im)(td_backend_t *be, float *img, const float *col, const td_conv_geom_t *g,
                 bool acc);
  void (*swap01)(td_backend_t *be, float *out, const float *inp, int d0, int d1, int inner);
  void (*channel_bias_act)(td_backend_t *be, float *y, const float *bias, int n, int c, int hw,
                           td_act_t act);
  void (*channel_act_backward)(td_backend_t *be, float *dy, const float *y, float *dbias, int n,
                               int c, int hw, td_act_t act);
  void (*pool_forward)(td_backend_t *be, float *out, int32_t *idx, const float *inp, int n,
                       const td_conv_geom_t *g, td_pool_t kind);
  void (*pool_backward)(td_backend_t *be, float *dinp, const float *dout, const int32_t *idx,
                        int n, const td_conv_geom_t *g, td_pool_t kind, bool acc);
  void (*layernorm_forward)(td_backend_t *be, float *out, float *mean, float *rstd,
                            const float *inp, const float *weight, const float *bias, int rows,
                            int cols);
  void (*layernorm_backward)(td_backend_t *be, float *dinp, float *dweight, float *dbias,
                             const float *dout, const float *inp, const float *weight,
                             const float *mean, const float *rstd, int rows, int cols, bool acc);
  void (*groupnorm_forward)(td_backend_t *be, float *out, float *mean, float *rstd,
                            const float *inp, const float *weight, const float *bias, int n,
                            int c, int hw, int groups);
  void (*groupnorm_backward)(td_backend_t *be, float *dinp, float *dweight, float *dbias,
                             const float *dout, const float *inp, const float *weight,
                             const float *mean, const float *rstd, int n, int c, int hw,
                             int groups, bool acc);
  void (*act_forward)(td_backend_t *be, float *out, const float *inp, size_t count,
                      td_act_t act);
  void (*act_backward2)(td_backend_t *be, float *dinp, const float *dout, const float *inp,
                        size_t count, td_act_t act, bool acc);
  void (*add)(td_backend_t *be, float *out, const float *a, const float *b, size_t count);
  void (*dropout_forward)(td_backend_t *be, float *out, float *mask, const float *inp,
                          size_t count, float p, uint64_t seed);
  void (*dropout_backward)(td_backend_t *be, float *dinp, const float *dout, const float *mask,
                           size_t count, bool acc);
  void (*embed_forward)(td_backend_t *be, float *out, const int32_t *tokens, const float *wte,
                        const float *wpe, int n, int t, int c);
  void (*embed_backward)(td_backend_t *be, float *dwte, float *dwpe, const float *dout,
                         const int32_t *tokens, int n, int t, int c);
  void (*attention_forward)(td_backend_t *be, float *out, float *att, const float *qkv, int n,
                            int t, int c, int heads);
  void (*attention_backward)(td_backend_t *be, float *dqkv, float *datt, const float *dout,
                             const float *qkv, const float *att, int n, int t, int c, int heads);
  /* version 4 */
  void (*im2col_batch)(td_backend_t *be, float *col, const float *img, int n,
                       const td_conv_geom_t *g);
  void (*col2im_batch)(td_backend_t *be, float *img, const float *col, int n,
                       const td_conv_geom_t *g, bool acc);
  /* version 5 */
  void *(*host_alloc)(td_backend_t *be, size_t bytes);
  void (*host_free)(td_backend_t *be, void *ptr);
  int (*upload_async)(td_backend_t *be, void *dst, const void *src, size_t bytes);
  int (*download_async)(td_backend_t *be, void *dst, const void *src, size_t bytes);
  /* version 6 */
  void (*prox_grad)(td_backend_t *be, float *g, const float *w, const float *center, float mu,
                    size_t n);
} td_backend_iface_t;

struct td_tpool;

/* The CPU layer kernels (compute/layer_*.c), the reference implementations
 * that fill the version-3 slots of the CPU table. */
void td__cpu_im2col(td_backend_t *be, float *col, const float *img, const td_conv_geom_t *g);
void td__cpu_col2im(td_backend_t *be, float *img, const float *col, const td_conv_geom_t *g,
                    bool acc);
void td__cpu_im2col_batch(td_backend_t *be, float *col, const float *img, int n,
                          const td_conv_geom_t *g);
void td__cpu_col2im_batch(td_backend_t *be, float *img, const float *col, int n,
                          const td_conv_geom_t *g, bool acc);
void td__cpu_swap01(td_backend_t *be, float *out, const float *inp, int d0, int d1, int inner);
void td__cpu_channel_bias_act(td_backend_t *be, float *y, const float *bias, int n, int c,
                              int hw, td_act_t act);
void td__cpu_channel_act_backward(td_backend_t *be, float *dy, const float *y, float *dbias,
                                  int n, int c, int hw, td_act_t act);
void td__cpu_pool_forward(td_backend_t *be, float *out, int32_t *idx, const float *inp, int n,
                          const td_conv_geom_t *g, td_pool_t kind);
void td__cpu_pool_backward(td_backend_t *be, float *dinp, const float *dout, const int32_t *idx,
                           int n, const td_conv_geom_t *g, td_pool_t kind, bool acc);
void td__cpu_layernorm_forward(td_backend_t *be, float *out, float *mean, float *rstd,
                               const float *inp, const float *weight, const float *bias,
                               int rows, int cols);
void td__cpu_layernorm_backward(td_backend_t *be, float *dinp, float *dweight, float *dbias,
                                const float *dout, const float *inp, const float *weight,
                                const float *mean, const float *rstd, int rows, int cols,
                                bool acc);
void td__cpu_groupnorm_forward(td_backend_t *be, float *out, float *mean, float *rstd,
                               const float *inp, const float *weight, const float *bias, int n,
                               int c, int hw, int groups);
void td__cpu_groupnorm_backward(td_backend_t *be, float *dinp, float *dweight, float *dbias,
                                const float *dout, const float *inp, const float *weight,
                                const float *mean, const float *rstd, int n, int c, int hw,
                                int groups, bool acc);
void td__cpu_act_forward(td_backend_t *be, float *out, const float *inp, size_t count,
                         td_act_t act);
void td__cpu_act_backward2(td_backend_t *be, float *dinp, const float *dout, const float *inp,
                           size_t count, td_act_t act, bool acc);
void td__cpu_add(td_backend_t *be, float *out, const float *a, const float *b, size_t count);
void td__cpu_dropout_forward(td_backend_t *be, float *out, float *mask, const float *inp,
                             size_t count, float p, uint64_t seed);
void td__cpu_dropout_backward(td_backend_t *be, float *dinp, const float *dout,
                              const float *mask, size_t count, bool acc);
void td__cpu_embed_forward(td_backend_t *be, float *out, const int32_t *tokens, const float *wte,
                           const float *wpe, int n, int t, int c);
void td__cpu_embed_backward(td_backend_t *be, float *dwte, float *dwpe, const float *dout,
                            const int32_t *tokens, int n, int t, int c);
void td__cpu_attention_forward(td_backend_t *be, float *out, float *att, const float *qkv, int n,
                               int t, int c, int heads);
void td__cpu_attention_backward(td_backend_t *be, float *dqkv, float *datt, const float *dout,
                                const float *qkv, const float *att, int n, int t, int c,
                                int heads);

struct td_backend {
  const td_backend_iface_t *iface;
  void *context; /* owned by the implementation */
  int threads;
  int device;         /* the INDEX of "cuda:INDEX" (0 otherwise), set before open */
  bool device_memory; /* set by open when alloc returns memory the host cannot read */
  int error;          /* first device error (a TD_E* code), kept by the implementation */
  char error_why[256];
  char describe[160]; /* filled by open; backend.c defaults it to the name */
  struct td_tpool *cpu_pool; /* the CPU backend's thread pool, set by its open (or NULL) */
  /* td__backend_open_cpu_as_device() only: the blocks td_backend_alloc()
   * handed out, against which transfers and the ops that read parameters or
   * a batch check their device-side pointers */
  bool checked;
  struct td__block {
    const char *base;
    size_t bytes;
  } *blocks;
  size_t n_blocks, cap_blocks;
};

/* The CPU backend's thread pool (compute/cpu/tpool.h), or NULL: one thread, or
 * a backend other than the CPU's (whose be borrows a CPU kernel as fallback).
 * The pool hangs on the backend, so the kernels of compute/cpu/ reach it
 * without calling back into the file that registers them. */
static inline struct td_tpool *td__cpu_tpool(const td_backend_t *be) {
  return be != NULL ? be->cpu_pool : NULL;
}

/* For tests: the CPU backend that reports device memory
 * (td_backend_device_memory() true), so a caller takes its device-resident
 * path (uploads, downloads, pinned host buffers, asynchronous copies) on a
 * machine without a GPU and runs the same code as on one. Its memory is host
 * memory and its ops are the CPU's, so results must match the host path bit
 * for bit. It also checks what a GPU would fault on: a transfer whose device
 * side is not in a block from td_backend_alloc() (or whose host side is), and
 * a GEMM, bias, loss, optimizer, im2col or embedding op handed a pointer
 * outside those blocks, record TD_EDEVICE (td_backend_error() reports it).
 * Caller owns *out. */
int td__backend_open_cpu_as_device(td_backend_t **out, int threads, char *why, size_t why_len);

/* The registered implementations; cuda is NULL unless compiled in. */
extern const td_backend_iface_t td__backend_cpu;
extern const td_backend_iface_t *const td__backend_cuda;

#endif
