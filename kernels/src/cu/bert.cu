// The element-wise and per-row steps of the sentence encoder's GPU twin
// (cuda/embed.rs); cuBLAS does the dense layers and attention's products.
// A piece of a batch is T tokens back to back ([T, H] row-major); the
// tables (ids, positions, sequence starts, padded rows) are those of
// embed/plan.rs. Row kernels take one block per row (a token, or for pool
// a sequence) of a multiple of 32 threads; embed_ln and bias_residual_ln
// take H floats of dynamic shared memory and sum in double, as the CPU pass
// does. Element-wise kernels index with 32 bits: the host checks that
// every buffer they walk holds fewer than 2^32 elements.

#define NONE 0xffffffffu

// The sum of v over the block; every thread gets it. red holds 32 doubles.
__device__ double block_sum(double v, double* red)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        unsigned warps = (blockDim.x + 31u) >> 5;
        v = lane < warps ? red[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
        if (lane == 0) red[0] = v;
    }
    __syncthreads();
    double s = red[0];
    __syncthreads(); // red is reused by the next call
    return s;
}

// out[0..h) = LayerNorm(row[0..h)) · gamma + beta, mean and variance in
// double; row is this block's shared copy.
__device__ void layer_norm(const float* row, const float* __restrict__ gamma,
                           const float* __restrict__ beta, unsigned h, float eps,
                           float* __restrict__ out)
{
    __shared__ double red[32];
    double s = 0.0;
    for (unsigned c = threadIdx.x; c < h; c += blockDim.x) s += (double)row[c];
    double mean = block_sum(s, red) / h;
    double v = 0.0;
    for (unsigned c = threadIdx.x; c < h; c += blockDim.x) {
        double d = (double)row[c] - mean;
        v += d * d;
    }
    double var = block_sum(v, red) / h;
    float inv = (float)(1.0 / sqrt(var + (double)eps));
    float m = (float)mean;
    for (unsigned c = threadIdx.x; c < h; c += blockDim.x)
        out[c] = (row[c] - m) * inv * gamma[c] + beta[c];
}

// x[t] = LayerNorm(word[ids[t]] + pos_type[pos[t]]): the embeddings.
extern "C" __global__ void embed_ln(const unsigned* __restrict__ ids,
                                    const unsigned* __restrict__ pos,
                                    const float* __restrict__ word,
                                    const float* __restrict__ pos_type,
                                    const float* __restrict__ gamma,
                                    const float* __restrict__ beta, unsigned tokens,
                                    unsigned h, float eps, float* __restrict__ x)
{
    extern __shared__ float row[];
    unsigned t = blockIdx.x;
    if (t >= tokens) return;
    const float* w = word + (unsigned long long)ids[t] * h;
    const float* p = pos_type + (unsigned long long)pos[t] * h;
    for (unsigned c = threadIdx.x; c < h; c += blockDim.x) row[c] = w[c] + p[c];
    layer_norm(row, gamma, beta, h, eps, x + (unsigned long long)t * h);
}

// x[t] = LayerNorm(x[t] + y[t] + b): a sublayer's bias, residual and norm.
extern "C" __global__ void bias_residual_ln(const float* __restrict__ y,
                                            const float* __restrict__ b, float* x,
                                            const float* __restrict__ gamma,
                                            const float* __restrict__ beta, unsigned tokens,
                                            unsigned h, float eps)
{
    extern __shared__ float row[];
    unsigned t = blockIdx.x;
    if (t >= tokens) return;
    float* xt = x + (unsigned long long)t * h;
    const float* yt = y + (unsigned long long)t * h;
    for (unsigned c = threadIdx.x; c < h; c += blockDim.x) row[c] = xt[c] + (yt[c] + b[c]);
    layer_norm(row, gamma, beta, h, eps, xt);
}

// y[i] = GELU(y[i] + b[i % out]), the erf form. Grid-stride.
extern "C" __global__ void bias_gelu(float* __restrict__ y, const float* __restrict__ b,
                                     unsigned rows, unsigned out)
{
    unsigned n = rows * out;
    unsigned step = gridDim.x * blockDim.x;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        float v = y[i] + b[i % out];
        y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    }
}

// Q, K and V (with their biases) from the [T, 3H] projections into the
// groups' [B, heads, P, d] layout; padded rows get zeros. Grid-stride over
// rows · h.
extern "C" __global__ void split_heads(const float* __restrict__ qkv,
                                       const float* __restrict__ bias,
                                       const unsigned* __restrict__ src,
                                       const unsigned* __restrict__ dst,
                                       const unsigned* __restrict__ stride, unsigned rows,
                                       unsigned h, unsigned d, float* __restrict__ q,
                                       float* __restrict__ k, float* __restrict__ v)
{
    unsigned n = rows * h;
    unsigned step = gridDim.x * blockDim.x;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        unsigned r = i / h, c = i % h;
        unsigned o = dst[r] + (c / d) * stride[r] + c % d;
        unsigned s = src[r];
        if (s == NONE) {
            q[o] = 0.0f;
            k[o] = 0.0f;
            v[o] = 0.0f;
        } else {
            const float* row = qkv + s * 3u * h;
            q[o] = row[c] + bias[c];
            k[o] = row[h + c] + bias[h + c];
            v[o] = row[2u * h + c] + bias[2u * h + c];
        }
    }
}

// Each score row of a group (count · heads · p rows of p) becomes its
// softmax over the sequence's real keys; the padded keys get 0. One warp
// per row; starts are the group's sequence starts (count + 1).
extern "C" __global__ void softmax_rows(float* __restrict__ s, const unsigned* __restrict__ starts,
                                        unsigned count, unsigned heads, unsigned p)
{
    unsigned long long rows = (unsigned long long)count * heads * p;
    unsigned long long r =
        ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    unsigned lane = threadIdx.x & 31u;
    if (r >= rows) return;
    unsigned b = (unsigned)(r / ((unsigned long long)heads * p));
    unsigned len = starts[b + 1] - starts[b];
    float* row = s + r * p;
    float m = -__int_as_float(0x7f800000); // -inf (NVRTC has no INFINITY)
    for (unsigned j = lane; j < len; j += 32u) m = fmaxf(m, row[j]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float sum = 0.0f;
    for (unsigned j = lane; j < len; j += 32u) {
        float e = expf(row[j] - m);
        row[j] = e;
        sum += e;
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    float inv = 1.0f / sum;
    for (unsigned j = lane; j < p; j += 32u) row[j] = j < len ? row[j] * inv : 0.0f;
}

// The heads' context rows back into [T, H] (the inverse of split_heads for
// real rows; padded rows are dropped). Grid-stride over rows · h.
extern "C" __global__ void merge_heads(const float* __restrict__ o,
                                       const unsigned* __restrict__ src,
                                       const unsigned* __restrict__ dst,
                                       const unsigned* __restrict__ stride, unsigned rows,
                                       unsigned h, unsigned d, float* __restrict__ ctx)
{
    unsigned n = rows * h;
    unsigned step = gridDim.x * blockDim.x;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        unsigned r = i / h, c = i % h;
        unsigned s = src[r];
        if (s == NONE) continue;
        ctx[s * h + c] = o[dst[r] + (c / d) * stride[r] + c % d];
    }
}

// out[s] = the mean of sequence s's rows of x (mean != 0), else its first
// row. One block per sequence; threads over the columns.
extern "C" __global__ void pool(const float* __restrict__ x, const unsigned* __restrict__ starts,
                                unsigned seqs, unsigned h, unsigned mean,
                                float* __restrict__ out)
{
    unsigned s = blockIdx.x;
    if (s >= seqs) return;
    unsigned a = starts[s], e = starts[s + 1];
    for (unsigned c = threadIdx.x; c < h; c += blockDim.x) {
        float v;
        if (mean) {
            v = 0.0f;
            for (unsigned t = a; t < e; ++t) v += x[(unsigned long long)t * h + c];
            v *= 1.0f / (float)(e - a);
        } else {
            v = x[(unsigned long long)a * h + c];
        }
        out[(unsigned long long)s * h + c] = v;
    }
}
