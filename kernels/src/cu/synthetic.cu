// The synthetic kernel's GPU twin (see workloads/synthetic.rs).
//
// Item i spends `work` rounds of the same dependent multiply-xorshift chain as
// the CPU and outputs splitmix64(i ^ golden), equal to Synthetic::expected(i).
// The chain's result feeds the output through a branch that is never taken
// (x is never 0: it starts odd and every step is a bijection that fixes only
// 0), which the compiler cannot prove, so the work is not optimised away.

typedef unsigned long long u64;

__device__ __forceinline__ u64 splitmix64(u64 z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

__device__ __forceinline__ u64 busy(u64 seed, unsigned int rounds)
{
    u64 x = seed | 1ULL;
    for (unsigned int r = 0; r < rounds; ++r) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x *= 0x2545f4914f6cdd1dULL;
    }
    return x;
}

// out[k] for item lo + k, k < n.
extern "C" __global__ void synthetic(u64* __restrict__ out, u64 lo, unsigned int n, unsigned int work)
{
    unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) return;
    u64 i = lo + k;
    u64 v = splitmix64(i ^ 0x9e3779b97f4a7c15ULL);
    if (busy(i, work) == 0ULL) v = ~v;
    out[k] = v;
}
