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

// Launched as a declared twin (see `GpuTwin for NbodyStep`): the chunk's
// first body and count, the run's positions and masses (all n), the chunk's
// old velocities, its new positions and velocities, then the scalars.
extern "C" __global__ void nbody(unsigned long long lo,
                                 unsigned int cnt,
                                 const float* __restrict__ x,
                                 const float* __restrict__ y,
                                 const float* __restrict__ z,
                                 const float* __restrict__ m,
                                 const float* __restrict__ vx,  // the chunk's, from lo
                                 const float* __restrict__ vy,
                                 const float* __restrict__ vz,
                                 float* __restrict__ px,        // the chunk's, from lo
                                 float* __restrict__ py,
                                 float* __restrict__ pz,
                                 float* __restrict__ ovx,
                                 float* __restrict__ ovy,
                                 float* __restrict__ ovz,
                                 unsigned int n,
                                 float dt,
                                 float eps2,
                                 float damping)
{
    __shared__ float sx[TILE], sy[TILE], sz[TILE], sm[TILE];

    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    const bool live = k < cnt;
    const unsigned int i = (unsigned int)lo + (live ? k : 0);
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
        float nvx = (vx[k] + ax * dt) * damping;
        float nvy = (vy[k] + ay * dt) * damping;
        float nvz = (vz[k] + az * dt) * damping;
        px[k] = xi + nvx * dt;
        py[k] = yi + nvy * dt;
        pz[k] = zi + nvz * dt;
        ovx[k] = nvx;
        ovy[k] = nvy;
        ovz[k] = nvz;
    }
}
