//! A kernel with a declared GPU twin (`GpuTwin`) is an ordinary kernel to
//! the runtime: on a machine without a GPU it runs on the CPU classes with
//! the CPU code's results, and its twin is what `Kernel::cuda` offers.

use coexec::kernels::{
    Chunk, CudaSource, DisjointBuf, GpuTwin, Kernel, KernelError, Twin, TwinInput,
};

const AXPY: CudaSource = CudaSource::new(
    "axpy.cu",
    r#"extern "C" __global__ void axpy(unsigned long long lo, unsigned int n,
                                      const float* x, float* y, float a) {
        unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = a * x[i] + (float)(lo + i);
    }"#,
);

struct Axpy {
    a: f32,
    x: TwinInput<f32>,
    y: DisjointBuf<f32>,
}

impl Kernel for Axpy {
    fn name(&self) -> &str {
        "axpy"
    }
    fn items(&self) -> usize {
        self.x.len()
    }
    fn run_cpu(&self, c: &Chunk) -> Result<(), KernelError> {
        for (y, i) in self.y.chunk_mut(c).iter_mut().zip(c.range()) {
            *y = self.a * self.x[i] + i as f32;
        }
        Ok(())
    }
    fn cuda(&self) -> Option<&dyn coexec::kernels::cuda::CudaKernel> {
        Some(self)
    }
}

impl GpuTwin for Axpy {
    fn twin(&self) -> Twin<'_> {
        Twin::new(&AXPY, "axpy")
            .item_input(&self.x, 1)
            .output(&self.y)
            .scalar(self.a)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_with_a_declared_twin_runs_on_the_cpus() {
    let n = 200_000;
    let k = Axpy {
        a: 3.0,
        x: TwinInput::new((0..n).map(|i| (i % 97) as f32).collect()),
        y: DisjointBuf::new(n, 1),
    };
    assert!(k.cuda().is_some());
    assert!(format!("{:?}", k.twin()).contains("axpy"));
    let rt = coexec::Runtime::builder()
        .devices("cpu:2,sim:1@1")
        .unwrap()
        .in_memory_profiles()
        .start()
        .await
        .unwrap();
    let done = rt.run(k).await.unwrap();
    let y = done.kernel.y.into_vec();
    for (i, v) in y.iter().enumerate() {
        assert_eq!(*v, 3.0 * (i % 97) as f32 + i as f32, "item {i}");
    }
    rt.shutdown().await;
}
