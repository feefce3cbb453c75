// The twin of examples/07_mandelbrot.rs: one thread per pixel of the
// chunk's rows. The same double operations in the same order as the CPU
// code, so that (compiled without fused multiply-add, coexec's default) the
// counts are the CPU's bit for bit.
extern "C" __global__ void mandelbrot(unsigned long long lo, unsigned int n,
                                      unsigned int* counts, unsigned int width,
                                      unsigned int max_iter, double x0, double y0,
                                      double dx, double dy) {
    unsigned long long t = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (unsigned long long)n * width) return;
    unsigned long long row = lo + t / width;
    unsigned int x = (unsigned int)(t % width);
    double cr = x0 + (double)x * dx;
    double ci = y0 + (double)row * dy;
    double zr = 0.0, zi = 0.0;
    unsigned int k = 0;
    while (k < max_iter) {
        double zr2 = zr * zr;
        double zi2 = zi * zi;
        if (zr2 + zi2 > 4.0) break;
        double next = zr2 - zi2 + cr;
        zi = 2.0 * zr * zi + ci;
        zr = next;
        k++;
    }
    counts[t] = k;
}
