/* backend_cuda.cuh: what the two CUDA files share (compute/cuda/backend_cuda.cu:
 * device, memory, GEMM, the MLP and optimizer ops, the interface table;
 * compute/cuda/backend_cuda_layers.cu: the layer ops of interface version 3).
 * Private to compute/, compiled only with --with-cuda. */
#ifndef TD_BACKEND_CUDA_CUH
#define TD_BACKEND_CUDA_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "compute/backend_impl.h"
}

namespace td_cuda {

constexpr int kThreads = 256;  /* threads per block of the element-wise kernels */
constexpr int kMaxBlocks = 4096; /* grid-stride loops cover the rest */
constexpr int kTileCols = 32;  /* column-reduction tile: 32 columns ... */
constexpr int kTileRows = 8;   /* ... by 8 row lanes */

struct cuda_ctx {
  cudaStream_t stream;
  cublasHandle_t blas;
  double *row_loss; /* softmax_xent: per-row loss and hit, summed on the host */
  int *row_hit;
  double *host_loss; /* pinned mirrors of the two above */
  int *host_hit;
  int rows_cap;
  float *host_mask; /* dropout: the mask drawn on the host, pinned */
  size_t mask_cap;
};

inline cuda_ctx *ctx_of(td_backend_t *be) { return static_cast<cuda_ctx *>(be->context); }

/* Keep the first CUDA/cuBLAS failure in the backend (TD_EDEVICE + message). */
void keep_error(td_backend_t *be, const char *what, const char *message);
bool cuda_ok(td_backend_t *be, cudaError_t err, const char *what);
bool blas_ok(td_backend_t *be, cublasStatus_t st, const char *what);
/* Make the backend's device current on this thread; false (error kept) if not. */
bool enter(td_backend_t *be);
/* After a launch: a bad configuration shows up here, a fault at the next sync. */
void launched(td_backend_t *be, const char *what);
unsigned blocks_for(size_t n);
/* Fill the layer-op slots (backend_cuda_layers.cu). */
void fill_layer_ops(td_backend_iface_t *t);

} // namespace td_cuda

#endif
