/* backend_cuda.cu: the CUDA backend (configure --with-cuda), checked op by op
 * against the CPU backend in tests/unit/test_backend_cuda.c.
 *
 * One backend is one device, one non-blocking stream and one cuBLAS handle
 * bound to that stream, so every op runs in call order and nothing waits on
 * the host except download (which must hand back finished data) and the loss
 * of softmax_xent (which the caller reads as a number). Memory is plain
 * cudaMalloc device memory; host buffers for transfers are pinned
 * (cudaHostAlloc), and the asynchronous copies queue on the same stream.
 * GEMMs go to cuBLAS in full FP32 (no TF32, so the
 * results match the CPU to float rounding): a row-major C = op(A) op(B) is the
 * column-major C^T = op(B)^T op(A)^T, i.e. the same call with A and B swapped.
 * Every other op is a kernel written for clarity first: grid-stride
 * element-wise loops, a 32 x 8 tile per block for the column reductions (so
 * the loads stay coalesced along rows and the sum order is fixed), one block
 * per row for the softmax and the norms. Reductions are deterministic (the
 * same inputs give the same bits on every run) except the token-embedding
 * gradient, whose repeated tokens add atomically. The layer ops (version 3)
 * follow the CPU kernels in compute/layer_*.c: col2im and pooling backward
 * gather per input pixel instead of scattering (no atomics), attention runs
 * each image's heads as one strided-batched GEMM, and the dropout mask is
 * drawn on the host from the CPU's generator, so a seed drops the same units
 * on every backend.
 *
 * Ops return void (the interface is the CPU's), so a CUDA or cuBLAS failure is
 * kept in the backend (the first one wins, TD_EDEVICE with the CUDA message)
 * and reported by the next upload, download or td_backend_error(). The calls
 * may come from any one thread at a time: each op first makes the backend's
 * device current on the calling thread. The layer ops (version 3) are in
 * compute/cuda/backend_cuda_layers.cu; what both files share is backend_cuda.cuh. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/cuda/backend_cuda.cuh"

extern "C" {
#include "common/error.h"
}

namespace td_cuda {


/* Keep the first failure: later ones are usually its consequences. */
void keep_error(td_backend_t *be, const char *what, const char *message) {
  if (be->error != 0)
    return;
  be->error = TD_EDEVICE;
  snprintf(be->error_why, sizeof be->error_why, "cuda:%d: %s: %s", be->device, what, message);
}

bool cuda_ok(td_backend_t *be, cudaError_t err, const char *what) {
  if (err == cudaSuccess)
    return true;
  keep_error(be, what, cudaGetErrorString(err));
  return false;
}

bool blas_ok(td_backend_t *be, cublasStatus_t st, const char *what) {
  if (st == CUBLAS_STATUS_SUCCESS)
    return true;
  keep_error(be, what, cublasGetStatusString(st));
  return false;
}

/* Make the backend's device current on this thread; false (error kept) if not. */
bool enter(td_backend_t *be) { return cuda_ok(be, cudaSetDevice(be->device), "cudaSetDevice"); }

/* After a launch: a bad configuration shows up here, a fault at the next sync. */
void launched(td_backend_t *be, const char *what) { cuda_ok(be, cudaGetLastError(), what); }

unsigned blocks_for(size_t n) {
  size_t b = (n + kThreads - 1) / kThreads;
  if (b < 1)
    b = 1;
  return static_cast<unsigned>(b < kMaxBlocks ? b : kMaxBlocks);
}

} // namespace td_cuda

namespace {

using namespace td_cuda;

/* ---- kernels ------------------------------------------------------------ */

/* y = act(y + bias[col]); `v < 0 ? 0 : v` keeps a NaN (as the CPU does). */
__global__ void bias_act_kernel(float *y, const float *bias, size_t rows, size_t cols, bool relu) {
  size_t n = rows * cols;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float v = y[i] + bias[i % cols];
    y[i] = relu && v < 0.0f ? 0.0f : v;
  }
}

/* One 32 x 8 block per 32 columns: lane (tx, ty) walks rows ty, ty + 8, ...
 * of column tx, masking dy by relu'(y) when asked, then the 8 partial sums of
 * each column are added in a fixed order. */
__global__ void act_backward_kernel(float *dy, const float *y, float *dbias, int rows, int cols,
                                    bool relu) {
  __shared__ float partial[kTileRows][kTileCols];
  int c = blockIdx.x * kTileCols + threadIdx.x;
  float sum = 0.0f;
  if (c < cols) {
    for (int r = threadIdx.y; r < rows; r += kTileRows) {
      size_t i = (size_t)r * (size_t)cols + (size_t)c;
      float g = dy[i];
      if (relu) {
        g = y[i] > 0.0f ? g : 0.0f;
        dy[i] = g;
      }
      sum += g;
    }
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.0f;
    for (int j = 0; j < kTileRows; j++)
      total += partial[j][threadIdx.x];
    dbias[c] = total;
  }
}

/* Block-wide reduction helpers for one block of kThreads threads. */
struct max_arg {
  float value;
  int index;
};

__device__ max_arg better(max_arg a, max_arg b) {
  /* the larger value; on a tie the smaller index (the CPU keeps the first) */
  if (b.value > a.value || (b.value == a.value && b.index < a.index))
    return b;
  return a;
}

/* One block per row: max and argmax, then sum of exp(z - max) in double, then
 * (when training) dlogits = softmax * grad_scale - onehot * grad_scale. A
 * label outside [0, cols) makes the row's loss NaN (never used as an index). */
__global__ void softmax_xent_kernel(const float *logits, const int32_t *labels, float *dlogits,
                                    float grad_scale, int cols, double *row_loss, int *row_hit) {
  __shared__ max_arg best[kThreads];
  __shared__ double sums[kThreads];
  int r = blockIdx.x;
  const float *z = logits + (size_t)r * (size_t)cols;
  max_arg mine = {-INFINITY, cols};
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    max_arg cand = {z[c], c};
    if (c == threadIdx.x)
      mine = cand; /* the first element seen, even if NaN, as the CPU's z[0] */
    else
      mine = better(mine, cand);
  }
  best[threadIdx.x] = mine;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride)
      best[threadIdx.x] = better(best[threadIdx.x], best[threadIdx.x + stride]);
    __syncthreads();
  }
  float max = best[0].value;
  int argmax = best[0].index;
  double sum = 0.0;
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    sum += (double)expf(z[c] - max);
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride)
      sums[threadIdx.x] += sums[threadIdx.x + stride];
    __syncthreads();
  }
  double total = sums[0];
  int32_t label = labels[r];
  bool label_ok = label >= 0 && label < cols;
  if (dlogits != NULL) {
    float *d = dlogits + (size_t)r * (size_t)cols;
    float scale = (float)(grad_scale / total);
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
      d[c] = expf(z[c] - max) * scale - (c == label ? grad_scale : 0.0f);
  }
  if (threadIdx.x == 0) {
    row_loss[r] = label_ok ? log(total) - (double)(z[label] - max) : (double)NAN;
    row_hit[r] = label_ok && argmax == label;
  }
}

__global__ void sgd_kernel(float *w, const float *g, float *v, size_t n, float lr, float mu,
                           float wd, bool nesterov) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float gi = g[i] + wd * w[i];
    if (v == NULL) {
      w[i] -= lr * gi;
      continue;
    }
    float vi = mu * v[i] + gi;
    v[i] = vi;
    w[i] -= lr * (nesterov ? gi + mu * vi : vi);
  }
}

__global__ void adamw_kernel(float *w, const float *g, float *m, float *v, size_t n, float lr,
                             float b1, float b2, float eps, float wd, float inv_bias1,
                             float inv_bias2, float scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float gi = scale * g[i];
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] -= lr * ((mi * inv_bias1) / (sqrtf(vi * inv_bias2) + eps) + wd * w[i]);
  }
}

/* ---- the interface ------------------------------------------------------ */

void cuda_close(td_backend_t *be);

int cuda_open(td_backend_t *be, int threads, char *why, size_t why_len) {
  (void)threads;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess)
    return td_why(why, why_len, TD_EDEVICE, "no usable CUDA device: cudaGetDeviceCount: %s%s",
                  cudaGetErrorString(err),
                  err == cudaErrorInsufficientDriver ? " (is an NVIDIA driver installed?)" : "");
  if (count < 1)
    return td_why(why, why_len, TD_EDEVICE, "no CUDA device present");
  if (be->device >= count)
    return td_why(why, why_len, TD_EDEVICE, "no CUDA device of index %d (this machine has %d)",
                  be->device, count);
  cudaDeviceProp prop;
  err = cudaGetDeviceProperties(&prop, be->device);
  if (err == cudaSuccess)
    err = cudaSetDevice(be->device);
  if (err != cudaSuccess)
    return td_why(why, why_len, TD_EDEVICE, "cuda:%d: %s", be->device, cudaGetErrorString(err));
  cuda_ctx *ctx = static_cast<cuda_ctx *>(calloc(1, sizeof *ctx));
  if (ctx == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  be->context = ctx;
  const char *what = "cudaStreamCreate";
  err = cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking);
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  if (err == cudaSuccess) {
    st = cublasCreate(&ctx->blas);
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasSetStream(ctx->blas, ctx->stream);
  }
  if (err != cudaSuccess || st != CUBLAS_STATUS_SUCCESS) {
    const char *message = err != cudaSuccess ? cudaGetErrorString(err) : cublasGetStatusString(st);
    if (err == cudaSuccess)
      what = "cublasCreate";
    td_why(why, why_len, TD_EDEVICE, "cuda:%d: %s: %s", be->device, what, message);
    cuda_close(be);
    return TD_EDEVICE;
  }
  be->device_memory = true;
  snprintf(be->describe, sizeof be->describe, "cuda:%d %.96s (%d SMs, %.1f GiB)", be->device,
           prop.name, prop.multiProcessorCount,
           (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
  return 0;
}

void cuda_close(td_backend_t *be) {
  cuda_ctx *ctx = ctx_of(be);
  if (ctx == NULL)
    return;
  cudaSetDevice(be->device);
  if (ctx->stream != NULL)
    cudaStreamSynchronize(ctx->stream);
  cudaFree(ctx->row_loss);
  cudaFree(ctx->row_hit);
  cudaFreeHost(ctx->host_loss);
  cudaFreeHost(ctx->host_hit);
  cudaFreeHost(ctx->host_mask);
  if (ctx->blas != NULL)
    cublasDestroy(ctx->blas);
  if (ctx->stream != NULL)
    cudaStreamDestroy(ctx->stream);
  free(ctx);
  be->context = NULL;
}

void *cuda_alloc(td_backend_t *be, size_t bytes) {
  if (!enter(be))
    return NULL;
  void *p = NULL;
  /* cudaMalloc aligns to at least 256 bytes, above the interface's 64 */
  if (!cuda_ok(be, cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc"))
    return NULL;
  if (!cuda_ok(be, cudaMemsetAsync(p, 0, bytes, ctx_of(be)->stream), "cudaMemsetAsync")) {
    cudaFree(p);
    return NULL;
  }
  return p;
}

void cuda_free(td_backend_t *be, void *p) {
  if (!enter(be))
    return;
  /* the stream may still be using p: cudaFree waits for the device */
  cuda_ok(be, cudaFree(p), "cudaFree");
}

/* cudaMemcpyDefault: unified addressing tells host from device pointers, so
 * the same call serves host->device, device->host and device->device. The
 * copy is waited for, so the caller may reuse or read its host buffer at once. */
int cuda_copy(td_backend_t *be, void *dst, const void *src, size_t bytes, const char *what) {
  if (bytes != 0 && enter(be)) {
    cudaStream_t stream = ctx_of(be)->stream;
    if (cuda_ok(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream), what))
      cuda_ok(be, cudaStreamSynchronize(stream), what);
  }
  return be->error;
}

int cuda_upload(td_backend_t *be, void *dst, const void *src, size_t bytes) {
  return cuda_copy(be, dst, src, bytes, "upload");
}

int cuda_download(td_backend_t *be, void *dst, const void *src, size_t bytes) {
  return cuda_copy(be, dst, src, bytes, "download");
}

/* Pinned host memory (version 5): page-locked, so cudaMemcpyAsync from and to
 * it is a DMA that does not wait for the host, at full bus speed. */
void *cuda_host_alloc(td_backend_t *be, size_t bytes) {
  if (!enter(be))
    return NULL;
  void *p = NULL;
  if (!cuda_ok(be, cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault), "cudaHostAlloc"))
    return NULL;
  memset(p, 0, bytes ? bytes : 1);
  return p;
}

void cuda_host_free(td_backend_t *be, void *p) {
  if (enter(be))
    cuda_ok(be, cudaFreeHost(p), "cudaFreeHost"); /* waits for copies still using it */
}

/* Queued on the stream, not waited for (td_backend_upload_async). */
int cuda_copy_async(td_backend_t *be, void *dst, const void *src, size_t bytes) {
  if (bytes != 0 && enter(be))
    cuda_ok(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ctx_of(be)->stream),
            "cudaMemcpyAsync");
  return be->error;
}

void cuda_synchronize(td_backend_t *be) {
  if (enter(be))
    cuda_ok(be, cudaStreamSynchronize(ctx_of(be)->stream), "cudaStreamSynchronize");
}

void cuda_gemm(td_backend_t *be, bool ta, bool tb, int m, int n, int k, float alpha,
               const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  if (!enter(be))
    return;
  /* row-major C (m x n) = column-major C^T (n x m) = op(B)^T op(A)^T */
  blas_ok(be,
          cublasSgemm(ctx_of(be)->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                      ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb, a, lda, &beta, c,
                      ldc),
          "cublasSgemm");
}

void cuda_bias_act(td_backend_t *be, float *y, const float *bias, int rows, int cols,
                   td_act_t act) {
  if (rows < 1 || cols < 1 || !enter(be))
    return;
  size_t n = (size_t)rows * (size_t)cols;
  bias_act_kernel<<<blocks_for(n), kThreads, 0, ctx_of(be)->stream>>>(
      y, bias, (size_t)rows, (size_t)cols, act == TD_ACT_RELU);
  launched(be, "bias_act");
}

void cuda_act_backward(td_backend_t *be, float *dy, const float *y, float *dbias, int rows,
                       int cols, td_act_t act) {
  if (cols < 1 || !enter(be))
    return;
  dim3 block(kTileCols, kTileRows);
  unsigned grid = static_cast<unsigned>((cols + kTileCols - 1) / kTileCols);
  act_backward_kernel<<<grid, block, 0, ctx_of(be)->stream>>>(dy, y, dbias, rows, cols,
                                                               act == TD_ACT_RELU);
  launched(be, "act_backward");
}

/* Grow the per-row loss buffers to rows (device and pinned host); false if not. */
bool reserve_rows(td_backend_t *be, int rows) {
  cuda_ctx *ctx = ctx_of(be);
  if (rows <= ctx->rows_cap)
    return true;
  cuda_ok(be, cudaStreamSynchronize(ctx->stream), "cudaStreamSynchronize");
  cudaFree(ctx->row_loss);
  cudaFree(ctx->row_hit);
  cudaFreeHost(ctx->host_loss);
  cudaFreeHost(ctx->host_hit);
  ctx->row_loss = NULL;
  ctx->row_hit = NULL;
  ctx->host_loss = NULL;
  ctx->host_hit = NULL;
  ctx->rows_cap = 0;
  size_t n = (size_t)rows;
  if (!cuda_ok(be, cudaMalloc(&ctx->row_loss, n * sizeof(double)), "cudaMalloc") ||
      !cuda_ok(be, cudaMalloc(&ctx->row_hit, n * sizeof(int)), "cudaMalloc") ||
      !cuda_ok(be, cudaMallocHost(&ctx->host_loss, n * sizeof(double)), "cudaMallocHost") ||
      !cuda_ok(be, cudaMallocHost(&ctx->host_hit, n * sizeof(int)), "cudaMallocHost"))
    return false;
  ctx->rows_cap = rows;
  return true;
}

double cuda_softmax_xent(td_backend_t *be, const float *logits, const int32_t *labels,
                         float *dlogits, float grad_scale, int rows, int cols, int *correct) {
  if (correct != NULL)
    *correct = 0;
  if (rows < 1)
    return 0.0;
  if (cols < 1 || !enter(be) || !reserve_rows(be, rows))
    return NAN;
  cuda_ctx *ctx = ctx_of(be);
  softmax_xent_kernel<<<static_cast<unsigned>(rows), kThreads, 0, ctx->stream>>>(
      logits, labels, dlogits, grad_scale, cols, ctx->row_loss, ctx->row_hit);
  launched(be, "softmax_xent");
  size_t n = (size_t)rows;
  if (!cuda_ok(be, cudaMemcpyAsync(ctx->host_loss, ctx->row_loss, n * sizeof(double),
                                   cudaMemcpyDeviceToHost, ctx->stream),
               "softmax_xent") ||
      !cuda_ok(be, cudaMemcpyAsync(ctx->host_hit, ctx->row_hit, n * sizeof(int),
                                   cudaMemcpyDeviceToHost, ctx->stream),
               "softmax_xent") ||
      !cuda_ok(be, cudaStreamSynchronize(ctx->stream), "softmax_xent"))
    return NAN;
  /* summed in row order on the host, as the CPU does */
  double total = 0.0;
  int hits = 0;
  for (int r = 0; r < rows; r++) {
    total += ctx->host_loss[r];
    hits += ctx->host_hit[r];
  }
  if (correct != NULL)
    *correct = hits;
  return total;
}

void cuda_sgd_step(td_backend_t *be, float *w, const float *g, float *v, size_t n,
                   const td_sgd_hparams_t *hp) {
  if (n == 0 || !enter(be))
    return;
  /* momentum 0: no velocity, v untouched (and possibly NULL), as on the CPU */
  sgd_kernel<<<blocks_for(n), kThreads, 0, ctx_of(be)->stream>>>(
      w, g, hp->momentum == 0.0f ? NULL : v, n, hp->lr, hp->momentum, hp->weight_decay,
      hp->nesterov);
  launched(be, "sgd_step");
}

void cuda_adamw_step(td_backend_t *be, float *w, const float *g, float *m, float *v, size_t n,
                     const td_adamw_hparams_t *hp) {
  if (n == 0 || !enter(be))
    return;
  adamw_kernel<<<blocks_for(n), kThreads, 0, ctx_of(be)->stream>>>(
      w, g, m, v, n, hp->lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay, 1.0f / hp->bias1,
      1.0f / hp->bias2, hp->grad_scale);
  launched(be, "adamw_step");
}

/* Filled by name, so slots added to the interface later stay NULL (and the
 * version says which this table implements) until they are written. */
td_backend_iface_t make_iface() {
  td_backend_iface_t t{};
  t.version = 5; /* the MLP ops, adamw_step, the layer ops, pinned memory and async copies
                    (no batch im2col/col2im: version 4's slots are optional) */
  t.name = "cuda";
  t.open = cuda_open;
  t.close = cuda_close;
  t.alloc = cuda_alloc;
  t.free = cuda_free;
  t.upload = cuda_upload;
  t.download = cuda_download;
  t.synchronize = cuda_synchronize;
  t.host_alloc = cuda_host_alloc;
  t.host_free = cuda_host_free;
  t.upload_async = cuda_copy_async;
  t.download_async = cuda_copy_async;
  t.gemm = cuda_gemm;
  t.bias_act = cuda_bias_act;
  t.act_backward = cuda_act_backward;
  t.softmax_xent = cuda_softmax_xent;
  t.sgd_step = cuda_sgd_step;
  t.adamw_step = cuda_adamw_step;
  td_cuda::fill_layer_ops(&t);
  return t;
}

const td_backend_iface_t cuda_iface = make_iface();

} // namespace

extern "C" const td_backend_iface_t *const td__backend_cuda = &cuda_iface;
