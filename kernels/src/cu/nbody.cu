// nbody's GPU twin (see workloads/nbody.rs): one softened all-pairs step.
//
// Operation order, the CPU's exactly, each operation rounded on its own
// (compiled with --fmad=false, IEEE sqrtf and division in deterministic mode):
//   a = 0; for j = 0 .. n-1 in order:
//     r = pj - pi; d2 = ((rx*rx + ry*ry) + rz*rz) + eps2
//     inv = 1.0f / sqrtf(d2); s = mj * ((inv*inv)*inv); a += r*s
//   v' = (v + a*dt)*damping; p' = p + v'*dt
// Bodies j are staged through shared memory a tile at a time; every thread
// still walks j in increasing order.

#define TILE 256

extern "C" __global__ void nbody(const float* __restrict__ x,
                                 const float* __restrict__ y,
                                 const float* __restrict__ z,
                                 const float* __restrict__ m,
                                 const float* __restrict__ vel,   // vx[cnt] vy[cnt] vz[cnt] of lo..lo+cnt
                                 float* __restrict__ out,         // px py pz vx vy vz, cnt each
                                 unsigned int n,
                                 unsigned int lo,
                                 unsigned int cnt,
                                 float dt,
                                 float eps2,
                                 float damping)
{
    __shared__ float sx[TILE], sy[TILE], sz[TILE], sm[TILE];

    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    const bool live = k < cnt;
    const unsigned int i = live ? lo + k : lo;
    const float xi = x[i], yi = y[i], zi = z[i];
    float ax = 0.0f, ay = 0.0f, az = 0.0f;

    for (unsigned int j0 = 0; j0 < n; j0 += TILE) {
        unsigned int j = j0 + threadIdx.x;
        if (j < n) {
            sx[threadIdx.x] = x[j];
            sy[threadIdx.x] = y[j];
            sz[threadIdx.x] = z[j];
            sm[threadIdx.x] = m[j];
        }
        __syncthreads();
        unsigned int jend = n - j0 < TILE ? n - j0 : TILE;
        for (unsigned int t = 0; t < jend; ++t) {
            float rx = sx[t] - xi;
            float ry = sy[t] - yi;
            float rz = sz[t] - zi;
            float d2 = rx * rx + ry * ry;
            d2 = d2 + rz * rz;
            d2 = d2 + eps2;
            float inv = 1.0f / sqrtf(d2);
            float s = sm[t] * ((inv * inv) * inv);
            ax = ax + rx * s;
            ay = ay + ry * s;
            az = az + rz * s;
        }
        __syncthreads();
    }

    if (live) {
        // Offsets in 64 bits: 6·cnt overflows 32 bits past 715 M bodies.
        unsigned long long c = cnt;
        float nvx = (vel[k] + ax * dt) * damping;
        float nvy = (vel[c + k] + ay * dt) * damping;
        float nvz = (vel[2 * c + k] + az * dt) * damping;
        out[k] = xi + nvx * dt;
        out[c + k] = yi + nvy * dt;
        out[2 * c + k] = zi + nvz * dt;
        out[3 * c + k] = nvx;
        out[4 * c + k] = nvy;
        out[5 * c + k] = nvz;
    }
}
