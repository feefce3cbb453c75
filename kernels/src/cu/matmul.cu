// matmul's GPU twin (see workloads/matmul.rs): a batch of independent
// dim x dim row-major products C = A.B, stored back to back.
//
// Operation order, the CPU's exactly: every C[r][c] is one f32 chain
// acc = 0; acc = acc + A[r][k]*B[k][c] for k = 0, 1, ..., dim-1, each product
// rounded before the add. Compiled with --fmad=false (deterministic mode) the
// product and the sum stay two roundings, so the result is bit-identical. The
// shared-memory tiles change where operands come from, not the order.

#define TILE 16

// One block computes one TILE x TILE tile of one product; blockIdx.x walks
// the tiles of a product, blockIdx.y (with a stride loop) the products.
extern "C" __global__ void matmul(const float* __restrict__ a,
                                  const float* __restrict__ b,
                                  float* __restrict__ c,
                                  unsigned int count,
                                  unsigned int dim)
{
    __shared__ float at[TILE][TILE];
    __shared__ float bs[TILE][TILE + 1];

    const unsigned int tiles = (dim + TILE - 1) / TILE;
    const unsigned int tr = blockIdx.x / tiles;
    const unsigned int tc = blockIdx.x % tiles;
    const unsigned int row = tr * TILE + threadIdx.y;
    const unsigned int col = tc * TILE + threadIdx.x;
    const size_t d2 = (size_t)dim * dim;

    for (unsigned int p = blockIdx.y; p < count; p += gridDim.y) {
        const float* ap = a + p * d2;
        const float* bp = b + p * d2;
        float acc = 0.0f;
        for (unsigned int k0 = 0; k0 < dim; k0 += TILE) {
            // Coalesced: consecutive threadIdx.x read consecutive columns.
            unsigned int ak = k0 + threadIdx.x;
            unsigned int bk = k0 + threadIdx.y;
            at[threadIdx.y][threadIdx.x] = (row < dim && ak < dim) ? ap[(size_t)row * dim + ak] : 0.0f;
            bs[threadIdx.y][threadIdx.x] = (bk < dim && col < dim) ? bp[(size_t)bk * dim + col] : 0.0f;
            __syncthreads();
            unsigned int kend = dim - k0 < TILE ? dim - k0 : TILE;
            // Only real k: the CPU's chain has exactly dim terms.
            for (unsigned int k = 0; k < kend; ++k) {
                float prod = at[threadIdx.y][k] * bs[k][threadIdx.x];
                acc = acc + prod;
            }
            __syncthreads();
        }
        if (row < dim && col < dim) {
            c[p * d2 + (size_t)row * dim + col] = acc;
        }
    }
}
