/* backend.c: the backend registry and the thin wrappers every caller uses.
 *
 * Callers never touch an iface table: they call td_backend_*(), which forward
 * to the table of the backend they opened. The required slots (alloc, free,
 * gemm and the fused ops) are checked once at open; the optional ones (open,
 * close, synchronize, upload/download for backends whose memory the host
 * can address, pinned host memory and asynchronous copies) default here, so a
 * wrapper is one indirect call and, for the ops that read parameters or a
 * batch, one predictable test of the tests-only checked mode
 * (td__backend_open_cpu_as_device: the CPU posing as a device, which keeps a
 * list of its blocks and records a host pointer handed to an op).
 * adamw_step (iface version 2) defaults to the CPU loop when a table lacks it.
 * The CUDA table is NULL unless configure found nvcc (--with-cuda); asking for
 * it then fails with TD_EDEVICE and a reason, and "cpu" is always there.
 * Names are parsed here once (auto | cpu | cuda[:INDEX]); "auto" tries the GPU
 * and falls back to the CPU, keeping the GPU's refusal as the reason. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "compute/backend.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>

#include "compute/backend_impl.h"
#include "compute/cpu/tpool.h"
#include "common/error.h"

#ifndef HAVE_CUDA
const td_backend_iface_t *const td__backend_cuda = NULL;
#endif

/* The highest INDEX accepted in "cuda:INDEX": far above any real machine,
 * low enough that a typo is a parse error rather than a device search. */
#define TD_BACKEND_MAX_DEVICE 255

typedef enum { NAME_CPU, NAME_CUDA, NAME_AUTO } name_kind_t;

/* Parse auto | cpu | cuda[:INDEX]. TD_ECONFIG with why when malformed. */
static int parse_name(const char *name, name_kind_t *kind, int *device, char *why,
                      size_t why_len) {
  *kind = NAME_CPU;
  *device = 0;
  if (name == NULL)
    return td_why(why, why_len, TD_ECONFIG, "no backend name (accepted: auto, cpu, cuda[:INDEX])");
  if (strcmp(name, "cpu") == 0) {
    *kind = NAME_CPU;
    return 0;
  }
  if (strcmp(name, "auto") == 0) {
    *kind = NAME_AUTO;
    return 0;
  }
  if (strncmp(name, "cuda", 4) == 0 && (name[4] == '\0' || name[4] == ':')) {
    *kind = NAME_CUDA;
    if (name[4] == '\0')
      return 0;
    const char *digits = name + 5;
    int index = 0;
    size_t len = strlen(digits);
    if (len == 0 || len > 3 || strspn(digits, "0123456789") != len)
      return td_why(why, why_len, TD_ECONFIG,
                    "bad backend '%s': INDEX in cuda:INDEX must be a number in [0, %d]", name,
                    TD_BACKEND_MAX_DEVICE);
    for (size_t i = 0; i < len; i++)
      index = index * 10 + (digits[i] - '0');
    if (index > TD_BACKEND_MAX_DEVICE)
      return td_why(why, why_len, TD_ECONFIG,
                    "bad backend '%s': INDEX in cuda:INDEX must be a number in [0, %d]", name,
                    TD_BACKEND_MAX_DEVICE);
    *device = index;
    return 0;
  }
  return td_why(why, why_len, TD_ECONFIG,
                "unknown backend '%s' (accepted: auto, cpu, cuda[:INDEX])", name);
}

int td_backend_check_name(const char *name, char *why, size_t why_len) {
  name_kind_t kind;
  int device;
  return parse_name(name, &kind, &device, why, why_len);
}

bool td_backend_available(const char *name) {
  name_kind_t kind;
  int device;
  if (parse_name(name, &kind, &device, NULL, 0) != 0)
    return false;
  return kind != NAME_CUDA || td__backend_cuda != NULL;
}

static bool v3_complete(const td_backend_iface_t *f) {
  return f->im2col && f->col2im && f->swap01 && f->channel_bias_act && f->channel_act_backward &&
         f->pool_forward && f->pool_backward && f->layernorm_forward && f->layernorm_backward &&
         f->groupnorm_forward && f->groupnorm_backward && f->act_forward && f->act_backward2 &&
         f->add && f->dropout_forward && f->dropout_backward && f->embed_forward &&
         f->embed_backward && f->attention_forward && f->attention_backward;
}

/* A version-1 or -2 table (GEMM, the MLP ops, maybe adamw) still opens; the
 * layer ops then need version 3, which td_backend_supports_layers() reports. */
static bool iface_complete(const td_backend_iface_t *iface) {
  return iface->version >= 1 && iface->alloc && iface->free && iface->gemm && iface->bias_act &&
         iface->act_backward && iface->softmax_xent && iface->sgd_step &&
         (iface->version < 3 || v3_complete(iface));
}

/* Open one concrete backend (cpu, or cuda on one device). */
static int open_iface(td_backend_t **out, const td_backend_iface_t *iface, int device,
                      int threads, char *why, size_t why_len) {
  if (iface == NULL)
    return td_why(why, why_len, TD_EDEVICE,
                  "the CUDA backend is not compiled in (configure --with-cuda)");
  if (!iface_complete(iface))
    return td_why(why, why_len, TD_EDEVICE, "the %s backend lacks required operations",
                  iface->name);
  td_backend_t *be = calloc(1, sizeof *be);
  if (be == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  be->iface = iface;
  be->threads = threads;
  be->device = device;
  snprintf(be->describe, sizeof be->describe, "%s", iface->name);
  int rc = iface->open ? iface->open(be, threads, why, why_len) : 0;
  if (rc != 0) {
    free(be);
    return rc;
  }
  *out = be;
  return 0;
}

int td_backend_open_auto(td_backend_t **out, const char *name, int threads, char *reason,
                         size_t reason_len) {
  if (out == NULL)
    return td_why(reason, reason_len, TD_EINVAL, "no output pointer");
  *out = NULL;
  name_kind_t kind;
  int device;
  int rc = parse_name(name, &kind, &device, reason, reason_len);
  if (rc != 0)
    return rc;
  if (kind != NAME_AUTO) {
    rc = open_iface(out, kind == NAME_CPU ? &td__backend_cpu : td__backend_cuda, device, threads,
                    reason, reason_len);
    if (rc == 0)
      td_why(reason, reason_len, 0, "%s (as configured)", (*out)->describe);
    return rc;
  }
  char cuda_why[256];
  rc = open_iface(out, td__backend_cuda, 0, threads, cuda_why, sizeof cuda_why);
  if (rc == 0) {
    td_why(reason, reason_len, 0, "%s (auto: a usable GPU was found)", (*out)->describe);
    return 0;
  }
  rc = open_iface(out, &td__backend_cpu, 0, threads, reason, reason_len);
  if (rc == 0)
    td_why(reason, reason_len, 0, "cpu (auto: no usable GPU: %s)", cuda_why);
  return rc;
}

int td__backend_open_cpu_as_device(td_backend_t **out, int threads, char *why, size_t why_len) {
  if (out == NULL)
    return td_why(why, why_len, TD_EINVAL, "no output pointer");
  *out = NULL;
  int rc = open_iface(out, &td__backend_cpu, 0, threads, why, why_len);
  if (rc != 0)
    return rc;
  (*out)->device_memory = true;
  (*out)->checked = true;
  snprintf((*out)->describe, sizeof (*out)->describe, "cpu (as a device, for tests)");
  return 0;
}

/* ---- the checked mode's block list ---- */

static bool in_blocks(const td_backend_t *be, const void *p) {
  const char *c = p;
  for (size_t i = 0; i < be->n_blocks; i++)
    if (c >= be->blocks[i].base && c < be->blocks[i].base + be->blocks[i].bytes)
      return true;
  return false;
}

/* The first misplaced pointer becomes the backend's error. */
static void misplaced(td_backend_t *be, const char *op, const char *what) {
  if (be->error != 0)
    return;
  be->error = TD_EDEVICE;
  snprintf(be->error_why, sizeof be->error_why, "%s: %s", op, what);
}

/* Checked mode: each of the n pointers that follow (NULL: absent) must lie in
 * a block from td_backend_alloc(). */
static void check_dev(td_backend_t *be, const char *op, int n, ...) {
  va_list ap;
  va_start(ap, n);
  for (int i = 0; i < n; i++) {
    const void *p = va_arg(ap, const void *);
    if (p != NULL && !in_blocks(be, p))
      misplaced(be, op, "a host pointer where device memory belongs");
  }
  va_end(ap);
}
#define TD__CHECK(be, op, ...)                                                              \
  do {                                                                                      \
    if ((be)->checked)                                                                      \
      check_dev((be), (op), TD__NARGS(__VA_ARGS__), __VA_ARGS__);                           \
  } while (0)
#define TD__NARGS(...) TD__NARGS_(__VA_ARGS__, 6, 5, 4, 3, 2, 1, 0)
#define TD__NARGS_(a, b, c, d, e, f, n, ...) n

static void track(td_backend_t *be, void *p, size_t bytes) {
  if (be->n_blocks == be->cap_blocks) {
    size_t cap = be->cap_blocks ? 2 * be->cap_blocks : 16;
    struct td__block *b = realloc(be->blocks, cap * sizeof *b);
    if (b == NULL) { /* cannot check this block: the checks would be wrong */
      misplaced(be, "alloc", "out of memory for the checked mode's block list");
      return;
    }
    be->blocks = b;
    be->cap_blocks = cap;
  }
  be->blocks[be->n_blocks++] = (struct td__block){.base = p, .bytes = bytes ? bytes : 1};
}

static void untrack(td_backend_t *be, const void *p) {
  for (size_t i = 0; i < be->n_blocks; i++)
    if (be->blocks[i].base == p) {
      be->blocks[i] = be->blocks[--be->n_blocks];
      return;
    }
  misplaced(be, "free", "a pointer that td_backend_alloc() did not hand out");
}

int td_backend_open(td_backend_t **out, const char *name, int threads, char *why,
                    size_t why_len) {
  char reason[512];
  int rc = td_backend_open_auto(out, name, threads, reason, sizeof reason);
  if (rc != 0)
    td_why(why, why_len, rc, "%s", reason);
  return rc;
}

void td_backend_close(td_backend_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  td_backend_t *be = *self_p;
  if (be->iface->close)
    be->iface->close(be);
  free(be->blocks);
  free(be);
  *self_p = NULL;
}

const char *td_backend_name(const td_backend_t *be) { return be->iface->name; }
const char *td_backend_describe(const td_backend_t *be) { return be->describe; }
bool td_backend_device_memory(const td_backend_t *be) { return be->device_memory; }

int td_backend_error(td_backend_t *be, char *why, size_t why_len) {
  td_backend_synchronize(be);
  if (be->error == 0)
    return 0;
  return td_why(why, why_len, be->error, "%s", be->error_why);
}

void td_backend_parallel_for(td_backend_t *be, size_t n, td_backend_for_fn fn, void *arg) {
  td_tpool_for(td__cpu_tpool(be), n, 1, fn, arg);
}

int td_backend_threads(const td_backend_t *be) { return td_tpool_threads(td__cpu_tpool(be)); }

double td_backend_cpu_seconds(const td_backend_t *be) {
  const td_tpool_t *pool = td__cpu_tpool(be);
  struct timespec ts;
  if (pool == NULL || be->device_memory || clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
    return NAN;
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + td_tpool_worker_cpu_s(pool);
}

void *td_backend_alloc(td_backend_t *be, size_t bytes) {
  void *p = be->iface->alloc(be, bytes);
  if (p != NULL && be->checked)
    track(be, p, bytes);
  return p;
}

void td_backend_free(td_backend_t *be, void *ptr) {
  if (ptr == NULL)
    return;
  if (be->checked)
    untrack(be, ptr);
  be->iface->free(be, ptr);
}

/* Checked mode: a transfer's device side in a block, its host side not;
 * false (nothing is copied, the error is kept) when it is misplaced. */
static bool transfer_ok(td_backend_t *be, const char *op, const void *dev, const void *host,
                        size_t bytes) {
  if (!be->checked || bytes == 0)
    return true;
  if (!in_blocks(be, dev) || !in_blocks(be, (const char *)dev + bytes - 1))
    misplaced(be, op, "the device side is not (all) in device memory");
  else if (in_blocks(be, host))
    misplaced(be, op, "the host side is in device memory");
  else
    return true;
  return false;
}

int td_backend_upload(td_backend_t *be, void *dst, const void *host_src, size_t bytes) {
  if (!transfer_ok(be, "upload", dst, host_src, bytes))
    return be->error;
  int rc = be->iface->upload ? be->iface->upload(be, dst, host_src, bytes) : 0;
  if (be->iface->upload == NULL)
    memcpy(dst, host_src, bytes);
  return rc != 0 ? rc : be->error;
}

int td_backend_download(td_backend_t *be, void *host_dst, const void *src, size_t bytes) {
  if (!transfer_ok(be, "download", src, host_dst, bytes))
    return be->error;
  int rc = be->iface->download ? be->iface->download(be, host_dst, src, bytes) : 0;
  if (be->iface->download == NULL)
    memcpy(host_dst, src, bytes);
  return rc != 0 ? rc : be->error;
}

/* Without the slot: the CPU's aligned, zero-filled, whole-cache-line blocks. */
void *td_backend_host_alloc(td_backend_t *be, size_t bytes) {
  if (be->iface->version >= 5 && be->iface->host_alloc != NULL)
    return be->iface->host_alloc(be, bytes);
  return td__backend_cpu.alloc(be, bytes);
}

void td_backend_host_free(td_backend_t *be, void *ptr) {
  if (ptr == NULL)
    return;
  if (be->iface->version >= 5 && be->iface->host_free != NULL)
    be->iface->host_free(be, ptr);
  else
    td__backend_cpu.free(be, ptr);
}

int td_backend_upload_async(td_backend_t *be, void *dst, const void *host_src, size_t bytes) {
  if (be->iface->version >= 5 && be->iface->upload_async != NULL)
    return transfer_ok(be, "upload_async", dst, host_src, bytes)
               ? be->iface->upload_async(be, dst, host_src, bytes)
               : be->error;
  return td_backend_upload(be, dst, host_src, bytes);
}

int td_backend_download_async(td_backend_t *be, void *host_dst, const void *src, size_t bytes) {
  if (be->iface->version >= 5 && be->iface->download_async != NULL)
    return transfer_ok(be, "download_async", src, host_dst, bytes)
               ? be->iface->download_async(be, host_dst, src, bytes)
               : be->error;
  return td_backend_download(be, host_dst, src, bytes);
}

void td_backend_synchronize(td_backend_t *be) {
  if (be->iface->synchronize)
    be->iface->synchronize(be);
}

void td_backend_gemm(td_backend_t *be, bool trans_a, bool trans_b, int m, int n, int k,
                     float alpha, const float *a, int lda, const float *b, int ldb, float beta,
                     float *c, int ldc) {
  TD__CHECK(be, "gemm", a, b, c);
  be->iface->gemm(be, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void td_backend_bias_act(td_backend_t *be, float *y, const float *bias, int rows, int cols,
                         td_act_t act) {
  TD__CHECK(be, "bias_act", y, bias);
  be->iface->bias_act(be, y, bias, rows, cols, act);
}

void td_backend_act_backward(td_backend_t *be, float *dy, const float *y, float *dbias, int rows,
                             int cols, td_act_t act) {
  TD__CHECK(be, "act_backward", dy, y, dbias);
  be->iface->act_backward(be, dy, y, dbias, rows, cols, act);
}

double td_backend_softmax_xent(td_backend_t *be, const float *logits, const int32_t *labels,
                               float *dlogits, float grad_scale, int rows, int cols,
                               int *correct) {
  TD__CHECK(be, "softmax_xent", logits, labels, dlogits);
  return be->iface->softmax_xent(be, logits, labels, dlogits, grad_scale, rows, cols, correct);
}

void td_backend_adamw_step(td_backend_t *be, float *w, const float *g, float *m, float *v,
                           size_t n, const td_adamw_hparams_t *hp) {
  TD__CHECK(be, "adamw_step", w, g, m, v);
  /* version-1 tables and NULL slots get the CPU loop, which only needs
   * host-addressable memory */
  if (be->iface->version >= 2 && be->iface->adamw_step != NULL)
    be->iface->adamw_step(be, w, g, m, v, n, hp);
  else
    td__backend_cpu.adamw_step(be, w, g, m, v, n, hp);
}

bool td_backend_supports_prox(const td_backend_t *be) {
  return be->iface->version >= 6 && be->iface->prox_grad != NULL;
}

void td_backend_prox_grad(td_backend_t *be, float *g, const float *w, const float *center,
                          float mu, size_t n) {
  TD__CHECK(be, "prox_grad", g, w, center);
  assert(td_backend_supports_prox(be)); /* callers check first (td_trainer_set_prox) */
  be->iface->prox_grad(be, g, w, center, mu, n);
}

void td_backend_sgd_step(td_backend_t *be, float *w, const float *g, float *v, size_t n,
                         const td_sgd_hparams_t *hp) {
  TD__CHECK(be, "sgd_step", w, g, v);
  be->iface->sgd_step(be, w, g, v, n, hp);
}

bool td_backend_supports_layers(const td_backend_t *be) { return be->iface->version >= 3; }

void td_backend_im2col(td_backend_t *be, float *col, const float *img, const td_conv_geom_t *g) {
  be->iface->im2col(be, col, img, g);
}

/* A table without the batch slot gets one call per image. */
void td_backend_im2col_batch(td_backend_t *be, float *col, const float *img, int n,
                             const td_conv_geom_t *g) {
  TD__CHECK(be, "im2col_batch", col, img);
  if (be->iface->version >= 4 && be->iface->im2col_batch != NULL) {
    be->iface->im2col_batch(be, col, img, n, g);
    return;
  }
  size_t in_size = (size_t)g->c * (size_t)g->h * (size_t)g->w;
  for (int b = 0; b < n; b++)
    be->iface->im2col(be, col + (size_t)b * (size_t)g->ho * (size_t)g->wo,
                      img + (size_t)b * in_size, g);
}

void td_backend_col2im_batch(td_backend_t *be, float *img, const float *col, int n,
                             const td_conv_geom_t *g, bool acc) {
  if (be->iface->version >= 4 && be->iface->col2im_batch != NULL) {
    be->iface->col2im_batch(be, img, col, n, g, acc);
    return;
  }
  size_t in_size = (size_t)g->c * (size_t)g->h * (size_t)g->w;
  for (int b = 0; b < n; b++)
    be->iface->col2im(be, img + (size_t)b * in_size,
                      col + (size_t)b * (size_t)g->ho * (size_t)g->wo, g, acc);
}

void td_backend_col2im(td_backend_t *be, float *img, const float *col, const td_conv_geom_t *g,
                       bool acc) {
  be->iface->col2im(be, img, col, g, acc);
}

void td_backend_swap01(td_backend_t *be, float *out, const float *inp, int d0, int d1, int inner) {
  be->iface->swap01(be, out, inp, d0, d1, inner);
}

void td_backend_channel_bias_act(td_backend_t *be, float *y, const float *bias, int n, int c,
                                 int hw, td_act_t act) {
  TD__CHECK(be, "channel_bias_act", y, bias);
  be->iface->channel_bias_act(be, y, bias, n, c, hw, act);
}

void td_backend_channel_act_backward(td_backend_t *be, float *dy, const float *y, float *dbias,
                                     int n, int c, int hw, td_act_t act) {
  be->iface->channel_act_backward(be, dy, y, dbias, n, c, hw, act);
}

void td_backend_pool_forward(td_backend_t *be, float *out, int32_t *idx, const float *inp, int n,
                             const td_conv_geom_t *g, td_pool_t kind) {
  be->iface->pool_forward(be, out, idx, inp, n, g, kind);
}

void td_backend_pool_backward(td_backend_t *be, float *dinp, const float *dout,
                              const int32_t *idx, int n, const td_conv_geom_t *g, td_pool_t kind,
                              bool acc) {
  be->iface->pool_backward(be, dinp, dout, idx, n, g, kind, acc);
}

void td_backend_layernorm_forward(td_backend_t *be, float *out, float *mean, float *rstd,
                                  const float *inp, const float *weight, const float *bias,
                                  int rows, int cols) {
  TD__CHECK(be, "layernorm_forward", out, inp, weight, bias);
  be->iface->layernorm_forward(be, out, mean, rstd, inp, weight, bias, rows, cols);
}

void td_backend_layernorm_backward(td_backend_t *be, float *dinp, float *dweight, float *dbias,
                                   const float *dout, const float *inp, const float *weight,
                                   const float *mean, const float *rstd, int rows, int cols,
                                   bool acc) {
  be->iface->layernorm_backward(be, dinp, dweight, dbias, dout, inp, weight, mean, rstd, rows, cols, acc);
}

void td_backend_groupnorm_forward(td_backend_t *be, float *out, float *mean, float *rstd,
                                  const float *inp, const float *weight, const float *bias, int n,
                                  int c, int hw, int groups) {
  be->iface->groupnorm_forward(be, out, mean, rstd, inp, weight, bias, n, c, hw, groups);
}

void td_backend_groupnorm_backward(td_backend_t *be, float *dinp, float *dweight, float *dbias,
                                   const float *dout, const float *inp, const float *weight,
                                   const float *mean, const float *rstd, int n, int c, int hw,
                                   int groups, bool acc) {
  be->iface->groupnorm_backward(be, dinp, dweight, dbias, dout, inp, weight, mean, rstd, n, c, hw, groups, acc);
}

void td_backend_act_forward(td_backend_t *be, float *out, const float *inp, size_t count,
                            td_act_t act) {
  be->iface->act_forward(be, out, inp, count, act);
}

void td_backend_act_backward2(td_backend_t *be, float *dinp, const float *dout, const float *inp,
                              size_t count, td_act_t act, bool acc) {
  be->iface->act_backward2(be, dinp, dout, inp, count, act, acc);
}

void td_backend_add(td_backend_t *be, float *out, const float *a, const float *b, size_t count) {
  be->iface->add(be, out, a, b, count);
}

void td_backend_dropout_forward(td_backend_t *be, float *out, float *mask, const float *inp,
                                size_t count, float p, uint64_t seed) {
  be->iface->dropout_forward(be, out, mask, inp, count, p, seed);
}

void td_backend_dropout_backward(td_backend_t *be, float *dinp, const float *dout,
                                 const float *mask, size_t count, bool acc) {
  be->iface->dropout_backward(be, dinp, dout, mask, count, acc);
}

void td_backend_embed_forward(td_backend_t *be, float *out, const int32_t *tokens,
                              const float *wte, const float *wpe, int n, int t, int c) {
  TD__CHECK(be, "embed_forward", out, tokens, wte, wpe);
  be->iface->embed_forward(be, out, tokens, wte, wpe, n, t, c);
}

void td_backend_embed_backward(td_backend_t *be, float *dwte, float *dwpe, const float *dout,
                               const int32_t *tokens, int n, int t, int c) {
  TD__CHECK(be, "embed_backward", dwte, dwpe, dout, tokens);
  be->iface->embed_backward(be, dwte, dwpe, dout, tokens, n, t, c);
}

void td_backend_attention_forward(td_backend_t *be, float *out, float *att, const float *qkv,
                                  int n, int t, int c, int heads) {
  be->iface->attention_forward(be, out, att, qkv, n, t, c, heads);
}

void td_backend_attention_backward(td_backend_t *be, float *dqkv, float *datt, const float *dout,
                                   const float *qkv, const float *att, int n, int t, int c,
                                   int heads) {
  be->iface->attention_backward(be, dqkv, datt, dout, qkv, att, n, t, c, heads);
}
