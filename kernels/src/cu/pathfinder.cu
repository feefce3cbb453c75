// pathfinder's GPU twin (see workloads/pathfinder.rs): Rodinia's pyramid with
// ghost zones.
//
// One launch advances `hp` grid rows. A block loads blockDim.x consecutive
// columns of the previous result into shared memory and applies
//     next[n] = wall[t][n] + min(prev[n-1], prev[n], prev[n+1])
// hp times in place; a column outside the grid is no neighbour (as on the
// CPU), a column past the tile's edge is unknown. After hp levels the tile's
// middle blockDim.x - 2*hp columns are exact, and only those are written, so
// neighbouring blocks overlap by 2*hp columns (the ghost zones). Integers:
// every order gives the same result.
//
// `wall` holds only the columns [wall_lo, wall_lo + pitch) of the hp rows
// (the chunk's columns and their ghost zones), `pitch` bytes a row: a chunk
// moves its own share of the grid over the bus, not whole rows. A column
// outside them is unknown; no exact output depends on one.

#define MAX_TILE 1024
#define UNKNOWN 0x7fffffff

extern "C" __global__ void pathfinder(const int* __restrict__ src,
                                      int src_off,
                                      int src_len,
                                      const unsigned char* __restrict__ wall,
                                      int wall_lo,
                                      int pitch,
                                      int cols,
                                      int hp,
                                      int out_lo,
                                      int out_len,
                                      int* __restrict__ dst)
{
    __shared__ int prev[MAX_TILE];
    __shared__ int next[MAX_TILE];

    const int tile = blockDim.x;
    const int width = tile - 2 * hp;          // exact columns per block
    const int tx = threadIdx.x;
    const int first = out_lo + blockIdx.x * width;
    const int g = first - hp + tx;            // this thread's grid column
    const bool in_grid = g >= 0 && g < cols;
    const bool in_band = g >= wall_lo && g < wall_lo + pitch;

    prev[tx] = (g >= src_off && g < src_off + src_len) ? src[g - src_off] : UNKNOWN;
    __syncthreads();

    for (int i = 0; i < hp; ++i) {
        int v = UNKNOWN;
        if (in_grid) {
            int m = prev[tx];
            if (g > 0) m = min(m, tx > 0 ? prev[tx - 1] : UNKNOWN);
            if (g + 1 < cols) m = min(m, tx + 1 < tile ? prev[tx + 1] : UNKNOWN);
            v = (m == UNKNOWN || !in_band) ? UNKNOWN
                                           : m + (int)wall[(size_t)i * pitch + (g - wall_lo)];
        }
        next[tx] = v;
        __syncthreads();
        prev[tx] = next[tx];
        __syncthreads();
    }

    const int end = out_lo + out_len;
    if (tx >= hp && tx < tile - hp && g < end && g >= first) {
        dst[g - out_lo] = prev[tx];
    }
}
