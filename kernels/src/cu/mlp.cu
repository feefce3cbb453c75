// The element-wise tail of each dense layer of the mlp kernel's GPU twin (see
// workloads/mlp.rs and cuda/workloads.rs). cuBLAS computes y = x·Wᵀ; these add
// the bias and apply the activation, as the CPU does after its GEMM.
//
// y is row-major [rows, out]; b is [out].

// y[i] += b[i % out], then max(y[i], 0) when relu != 0. Grid-stride over the
// rows·out elements.
extern "C" __global__ void bias_act(float* __restrict__ y, const float* __restrict__ b,
                                    unsigned int rows, unsigned int out, unsigned int relu)
{
    unsigned long long n = (unsigned long long)rows * out;
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        float v = y[i] + b[i % out];
        y[i] = (relu && v < 0.0f) ? 0.0f : v;
    }
}

// Row r of y: add the bias, then softmax shifted by the row's maximum (the
// CPU's order: max, exp and sum, divide). One thread per row: the classes of
// a classifier are few (10 for the digits model).
extern "C" __global__ void bias_softmax(float* __restrict__ y, const float* __restrict__ b,
                                        unsigned int rows, unsigned int classes)
{
    unsigned int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    float* v = y + (unsigned long long)r * classes;
    float m = -__int_as_float(0x7f800000); // -inf (NVRTC has no INFINITY)
    for (unsigned int c = 0; c < classes; ++c) {
        v[c] += b[c];
        m = fmaxf(m, v[c]);
    }
    float s = 0.0f;
    for (unsigned int c = 0; c < classes; ++c) {
        v[c] = expf(v[c] - m);
        s += v[c];
    }
    for (unsigned int c = 0; c < classes; ++c) {
        v[c] /= s;
    }
}
