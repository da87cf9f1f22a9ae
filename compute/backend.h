/* backend.h: the small compute interface that every device implements.
 *
 * After ggml-backend: a backend is an interface table (iface) plus a context.
 * The CPU backend (OpenBLAS + fused C loops) is always present and is the
 * reference; the CUDA slots exist so a GPU backend plugs in without touching
 * callers, and td_backend_open("cuda") fails with TD_EDEVICE when it is not
 * compiled in or no device is present. Callers only use the td_backend_* wrappers.
 * Pointers passed to ops are device pointers from td_backend_alloc(): on the
 * CUDA backend that is GPU memory the host cannot read, so host data goes in
 * with td_backend_upload() and comes out with td_backend_download(). Ops are
 * asynchronous on a device (one stream per backend, so they run in call order)
 * and return nothing: a device failure is kept, and the next upload, download
 * or td_backend_error() reports it (TD_EDEVICE with the CUDA message). */
#ifndef TD_BACKEND_H
#define TD_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct td_backend td_backend_t;

typedef enum {
  TD_ACT_NONE = 0,
  TD_ACT_RELU,
  TD_ACT_GELU, /* tanh form (GPT-2); element-wise ops only, not bias_act */
} td_act_t;

/* One image-to-columns geometry: input c x h x w (channels-first), square
 * window k, stride, zero padding pad, output ho x wo; ld is the stride
 * between rows of the column matrix (0: ho*wo; a batch of images side by side
 * uses n*ho*wo, so one GEMM covers the whole batch). */
typedef struct {
  int c, h, w, k, stride, pad, ho, wo, ld;
} td_conv_geom_t;

typedef enum {
  TD_POOL_MAX = 0,
  TD_POOL_AVG,
} td_pool_t;

typedef struct {
  float lr;
  float momentum;     /* 0 disables the velocity buffer update */
  float weight_decay; /* L2, added to the gradient */
  bool nesterov;
} td_sgd_hparams_t;

typedef struct {
  float lr;
  float beta1, beta2;  /* in [0, 1) */
  float eps;           /* > 0, added to sqrt(v_hat) */
  float weight_decay;  /* decoupled: w -= lr * weight_decay * w, not added to g */
  float bias1, bias2;  /* 1 - beta1^t and 1 - beta2^t at step t >= 1 (computed in double) */
  float grad_scale;    /* g is read as grad_scale * g (1: as is; clipping passes its factor) */
} td_adamw_hparams_t;

/* Open a backend by name: "cpu", "cuda" (device 0), "cuda:INDEX" or "auto"
 * (the GPU when one is usable, the CPU otherwise). On the CPU, threads > 0
 * starts that many compute threads, over which every op splits its work,
 * GEMMs included, and sets OpenBLAS (process-wide) to one thread so no other
 * threads compete with them; threads <= 0 keeps the BLAS default and runs
 * the other ops on the caller's thread. TD_ECONFIG (with why) for a
 * malformed name, TD_EDEVICE (with why) when the backend is not compiled in,
 * has no device or no such device index. Caller owns *out. */
int td_backend_open(td_backend_t **out, const char *name, int threads, char *why, size_t why_len);
/* td_backend_open() that also says, in reason, which backend it chose and why
 * (for "auto": the GPU it found, or the CPU and the reason the GPU was not
 * usable); on failure reason holds the error. For the daemon's status. */
int td_backend_open_auto(td_backend_t **out, const char *name, int threads, char *reason,
                         size_t reason_len);
/* Whether name is a well-formed backend name (auto | cpu | cuda[:INDEX]),
 * compiled in or not: 0, or TD_ECONFIG with why. For config validation. */
int td_backend_check_name(const char *name, char *why, size_t why_len);
/* One line about the opened backend ("cpu", "cuda:0 NVIDIA H100 (132 SMs, 79.2 GiB)"). */
const char *td_backend_describe(const td_backend_t *be);
/* Whether td_backend_alloc() memory lives on a device the host cannot read
 * (cuda): callers then keep their tensors there and move them with the
 * transfers below (td_model keeps its parameters, gradients and batches on
 * the device and a host copy of the parameters in pinned memory). */
bool td_backend_device_memory(const td_backend_t *be);
/* CPU seconds this backend's compute has used so far, for measuring what a
 * piece of work cost in CPU rather than in wall time (slowdown emulation):
 * the calling thread's clock plus the pool workers' on a CPU backend opened
 * with threads > 0 (OpenBLAS single-threaded inside them, so nothing computes
 * elsewhere). NAN where that is not the whole cost: threads <= 0 (BLAS runs
 * its own threads) or a device. Call from the thread that runs the ops. */
double td_backend_cpu_seconds(const td_backend_t *be);
/* The first device error since open (0 if none), with its message in why.
 * Waits for the queued work first. */
int td_backend_error(td_backend_t *be, char *why, size_t why_len);
void td_backend_close(td_backend_t **self_p);
const char *td_backend_name(const td_backend_t *be);
/* Whether a backend of that name is compiled in (not whether a device exists). */
bool td_backend_available(const char *name);

/* Device memory: 64-byte aligned, zero-filled; NULL on failure. */
void *td_backend_alloc(td_backend_t *be, size_t bytes);
void td_backend_free(td_backend_t *be, void *ptr);
int td_backend_upload(td_backend_t *be, void *dst, const void *host_src, size_t bytes);
int td_backend_download(td_backend_t *be, void *host_dst, const void *src, size_t bytes);
void td_backend_synchronize(td_backend_t *be);
/* Host memory for transfers: pinned (page-locked) on a GPU, so copies to and
 * from it run asynchronously at full speed; plain aligned memory on the CPU.
 * 64-byte aligned, zero-filled; NULL on failure. */
void *td_backend_host_alloc(td_backend_t *be, size_t bytes);
void td_backend_host_free(td_backend_t *be, void *ptr);
/* Queue a copy on the backend's stream and return before it is done: later
 * ops run after it, and the host side (from td_backend_host_alloc()) must stay
 * unwritten (upload) or unread (download) until td_backend_synchronize(), a
 * blocking transfer or softmax_xent has waited. Copy at once where the
 * backend has no stream (the CPU). Return the first device error so far. */
int td_backend_upload_async(td_backend_t *be, void *dst, const void *host_src, size_t bytes);
int td_backend_download_async(td_backend_t *be, void *host_dst, const void *src, size_t bytes);

/* Host threads: fn(arg, begin, end, part) over contiguous chunks of [0, n)
 * on the backend's threads (the CPU backend's pool; the caller's thread
 * alone elsewhere), returning when all are done. Backend ops issued from fn
 * run on the thread that calls them, unsplit. For work that mirrors a
 * kernel's own split (the bench's GEMM-only reference step). */
typedef void (*td_backend_for_fn)(void *arg, size_t begin, size_t end, int part);
void td_backend_parallel_for(td_backend_t *be, size_t n, td_backend_for_fn fn, void *arg);
/* Threads the backend's ops split over (1 unless it is the CPU with a pool). */
int td_backend_threads(const td_backend_t *be);

/* C[m x n] = alpha * op(A) op(B) + beta * C, row-major, op = transpose if t*. */
void td_backend_gemm(td_backend_t *be, bool trans_a, bool trans_b, int m, int n, int k,
                     float alpha, const float *a, int lda, const float *b, int ldb, float beta,
                     float *c, int ldc);
/* In place: y[r][c] = act(y[r][c] + bias[c]) for rows x cols. */
void td_backend_bias_act(td_backend_t *be, float *y, const float *bias, int rows, int cols,
                         td_act_t act);
/* Backward of bias_act: dy[r][c] *= act'(y[r][c]) (y is the activated output),
 * then dbias[c] = sum_r dy[r][c]. */
void td_backend_act_backward(td_backend_t *be, float *dy, const float *y, float *dbias, int rows,
                             int cols, td_act_t act);
/* Softmax cross-entropy over rows x cols logits with labels in [0, cols):
 * dlogits = (softmax - onehot) * grad_scale (dlogits may be NULL for evaluation).
 * Returns the SUM of per-row losses (double); *correct counts argmax hits. */
double td_backend_softmax_xent(td_backend_t *be, const float *logits, const int32_t *labels,
                               float *dlogits, float grad_scale, int rows, int cols,
                               int *correct);
/* One fused SGD pass over n floats: g' = g + wd*w; v = mu*v + g';
 * w -= lr * (nesterov ? g' + mu*v : v)   (v untouched and w -= lr*g' when mu == 0). */
void td_backend_sgd_step(td_backend_t *be, float *w, const float *g, float *v, size_t n,
                         const td_sgd_hparams_t *hp);
/* One fused AdamW pass over n floats (Loshchilov & Hutter), g' = grad_scale * g:
 * m = b1*m + (1-b1)*g';  v = b2*v + (1-b2)*g'^2;
 * w -= lr * ((m/bias1) / (sqrt(v/bias2) + eps) + weight_decay * w)   (w on the right: old w). */
void td_backend_adamw_step(td_backend_t *be, float *w, const float *g, float *m, float *v,
                           size_t n, const td_adamw_hparams_t *hp);
/* FedProx's proximal term over n floats: g += mu * (w - center). Only where
 * td_backend_supports_prox() says so (iface version 6; the CPU has it). */
void td_backend_prox_grad(td_backend_t *be, float *g, const float *w, const float *center,
                          float mu, size_t n);
bool td_backend_supports_prox(const td_backend_t *be);


/* Whether the backend implements the layer ops below (iface version 3). */
bool td_backend_supports_layers(const td_backend_t *be);

/* ---- layer ops (iface version 3). Batch n, rows x cols row-major unless
 * said otherwise. A backward op whose `acc` is true ADDS its input gradient
 * into din (the tensor feeds more than one layer); otherwise it overwrites.
 * Parameter gradients are always overwritten. */

/* col[(ci*k+ki)*k+kj][oh*wo+ow] = img[ci][oh*s-p+ki][ow*s-p+kj] (0 outside). */
void td_backend_im2col(td_backend_t *be, float *col, const float *img, const td_conv_geom_t *g);
/* img (+)= the sum of the columns back onto the image (overlaps add). */
void td_backend_col2im(td_backend_t *be, float *img, const float *col, const td_conv_geom_t *g,
                       bool acc);
/* The same for n images side by side (g->ld >= n*ho*wo: image b's columns
 * start at column b*ho*wo, its pixels at img + b*c*h*w): one call for a
 * batch, which a backend may spread over its threads. */
void td_backend_im2col_batch(td_backend_t *be, float *col, const float *img, int n,
                             const td_conv_geom_t *g);
void td_backend_col2im_batch(td_backend_t *be, float *img, const float *col, int n,
                             const td_conv_geom_t *g, bool acc);
/* out[j][i][:] = inp[i][j][:] for inp d0 x d1 x inner (batch-major <-> channel-major). */
void td_backend_swap01(td_backend_t *be, float *out, const float *inp, int d0, int d1, int inner);
/* y[b][c][i] = act(y[b][c][i] + bias[c]) over n x c x hw (relu or none). */
void td_backend_channel_bias_act(td_backend_t *be, float *y, const float *bias, int n, int c,
                                 int hw, td_act_t act);
/* dy *= act'(y) in place, dbias[c] = sum over b, i of dy[b][c][i] (dbias may be NULL). */
void td_backend_channel_act_backward(td_backend_t *be, float *dy, const float *y, float *dbias,
                                     int n, int c, int hw, td_act_t act);
/* Pooling of n images (g->c channels) with window k, stride s, no padding.
 * Max keeps the argmax offset within the plane in idx (ties: first). */
void td_backend_pool_forward(td_backend_t *be, float *out, int32_t *idx, const float *inp, int n,
                             const td_conv_geom_t *g, td_pool_t kind);
void td_backend_pool_backward(td_backend_t *be, float *dinp, const float *dout,
                              const int32_t *idx, int n, const td_conv_geom_t *g, td_pool_t kind,
                              bool acc);
/* LayerNorm over the cols of each row (eps 1e-5); saves mean and rstd per row. */
void td_backend_layernorm_forward(td_backend_t *be, float *out, float *mean, float *rstd,
                                  const float *inp, const float *weight, const float *bias,
                                  int rows, int cols);
void td_backend_layernorm_backward(td_backend_t *be, float *dinp, float *dweight, float *dbias,
                                   const float *dout, const float *inp, const float *weight,
                                   const float *mean, const float *rstd, int rows, int cols,
                                   bool acc);
/* GroupNorm of n x c x hw into `groups` groups of c/groups channels, affine per channel. */
void td_backend_groupnorm_forward(td_backend_t *be, float *out, float *mean, float *rstd,
                                  const float *inp, const float *weight, const float *bias, int n,
                                  int c, int hw, int groups);
void td_backend_groupnorm_backward(td_backend_t *be, float *dinp, float *dweight, float *dbias,
                                   const float *dout, const float *inp, const float *weight,
                                   const float *mean, const float *rstd, int n, int c, int hw,
                                   int groups, bool acc);
/* out = act(inp) over count floats (relu or gelu); din (+)= dout * act'(inp). */
void td_backend_act_forward(td_backend_t *be, float *out, const float *inp, size_t count,
                            td_act_t act);
void td_backend_act_backward2(td_backend_t *be, float *dinp, const float *dout, const float *inp,
                              size_t count, td_act_t act, bool acc);
/* out = a + b (b NULL: out = a); the residual add and its backward. */
void td_backend_add(td_backend_t *be, float *out, const float *a, const float *b, size_t count);
/* Inverted dropout: mask[i] = 0 with probability p else 1/(1-p), drawn from
 * a stream seeded by seed; out = inp * mask. Backward: din (+)= dout * mask. */
void td_backend_dropout_forward(td_backend_t *be, float *out, float *mask, const float *inp,
                                size_t count, float p, uint64_t seed);
void td_backend_dropout_backward(td_backend_t *be, float *dinp, const float *dout,
                                 const float *mask, size_t count, bool acc);
/* out[b][t] = wte[tokens[b][t]] + wpe[t], c wide; tokens in [0, vocab). */
void td_backend_embed_forward(td_backend_t *be, float *out, const int32_t *tokens,
                              const float *wte, const float *wpe, int n, int t, int c);
/* dwte[tok] += dout rows (accumulates: a tied table already holds the head's
 * gradient); dwpe[t] = sum over b (overwritten). */
void td_backend_embed_backward(td_backend_t *be, float *dwte, float *dwpe, const float *dout,
                               const int32_t *tokens, int n, int t, int c);
/* Causal multi-head self-attention. qkv is n x t x 3c (q | k | v, head h at
 * columns h*c/heads), out n x t x c, att n x heads x t x t the probabilities
 * (saved for backward; masked entries 0). Backward writes dqkv (overwrite)
 * using datt (n x heads x t x t) as workspace. */
void td_backend_attention_forward(td_backend_t *be, float *out, float *att, const float *qkv,
                                  int n, int t, int c, int heads);
void td_backend_attention_backward(td_backend_t *be, float *dqkv, float *datt, const float *dout,
                                   const float *qkv, const float *att, int n, int t, int c,
                                   int heads);

#endif
