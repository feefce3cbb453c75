// kmeans' GPU twin (see workloads/kmeans.rs): one iteration over a chunk of
// whole reduction blocks.
//
// One CUDA block per reduction block of `g` points. First every point finds
// its nearest centre exactly as the CPU does (d = sum over features in order
// from +0.0 of (x-c)*(x-c), each operation rounded on its own; centres in
// order, strict <, starting from FLT_MAX, so the first minimum wins and a NaN
// distance never does); then thread (k, f) adds x[i][f] of the block's points
// with membership k in increasing i, from +0.0 -- the CPU's order -- so the
// block's partial sums are bit-identical. Counts and changes are integers.

#define FLT_MAX_ 3.402823466e+38f

// Launched as a declared twin (see `GpuTwin for KmeansStep`): the chunk's
// first point and count, then the arguments in declaration order. One CUDA
// block per reduction block of the chunk.
extern "C" __global__ void kmeans(unsigned long long lo,
                                  unsigned int n,
                                  const float* __restrict__ pts_all, // every point, n_all x f
                                  const float* __restrict__ centres, // k x f
                                  int* __restrict__ member,          // the chunk's: old in, new out
                                  float* __restrict__ sums,          // the chunk's blocks x k x f
                                  unsigned int* __restrict__ counts, // the chunk's blocks x k
                                  unsigned int* __restrict__ changed,// the chunk's blocks
                                  unsigned int k,
                                  unsigned int f,
                                  unsigned int g)
{
    const float* __restrict__ pts = pts_all + (size_t)lo * f;
    __shared__ unsigned int moved;
    const unsigned int b = blockIdx.x;
    const unsigned int first = b * g;
    const unsigned int last = min(first + g, n);
    if (threadIdx.x == 0) moved = 0;
    __syncthreads();

    for (unsigned int i = first + threadIdx.x; i < last; i += blockDim.x) {
        const float* x = pts + (size_t)i * f;
        float best = FLT_MAX_;
        unsigned int idx = 0;
        for (unsigned int c = 0; c < k; ++c) {
            const float* ct = centres + (size_t)c * f;
            float d = 0.0f;
            for (unsigned int j = 0; j < f; ++j) {
                float diff = x[j] - ct[j];
                d = d + diff * diff;
            }
            if (d < best) {
                best = d;
                idx = c;
            }
        }
        if (member[i] != (int)idx) atomicAdd(&moved, 1u);
        member[i] = (int)idx;
    }
    // Orders this block's membership writes before the reads below.
    __syncthreads();

    const unsigned int pairs = k * f;
    for (unsigned int p = threadIdx.x; p < pairs; p += blockDim.x) {
        const unsigned int c = p / f, j = p % f;
        float s = 0.0f;
        unsigned int cnt = 0;
        for (unsigned int i = first; i < last; ++i) {
            if (member[i] == (int)c) {
                s = s + pts[(size_t)i * f + j];
                ++cnt;
            }
        }
        sums[(size_t)b * pairs + p] = s;
        if (j == 0) counts[(size_t)b * k + c] = cnt;
    }
    if (threadIdx.x == 0) changed[b] = moved;
}
