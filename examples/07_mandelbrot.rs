//! Your own kernel on the GPU too: a Mandelbrot image, one row per item,
//! with its CPU code and its CUDA twin (`examples/cu/mandelbrot.cu`),
//! co-executed by `rt.run`. Rows through the set cost far more than rows
//! outside it, so the split is uneven and the deque's dynamic tail matters.
//!
//! The twin is declared, not written: its source, its entry point, and what
//! a launch reads and writes. The runtime compiles it (NVRTC), launches it
//! over each chunk the GPU takes, and copies back exactly that chunk's rows.
//! No `unsafe`. Without a GPU the image is computed on the CPUs.
//!
//! ```text
//! cargo run --release --example 07_mandelbrot -- [WIDTH] [MAX_ITER] [RUNS]
//! ```
//!
//! The devices are coexec's default (every GPU and core) unless
//! `COEXEC_DEVICES` says otherwise (`cpu`, `cuda:0x2`, …); the last line
//! gives the median time of the runs, the first of which learns the split.

use coexec::kernels::{Chunk, CudaSource, DisjointBuf, GpuTwin, Kernel, KernelError, Twin};

const MANDELBROT: CudaSource = CudaSource::new("mandelbrot.cu", include_str!("cu/mandelbrot.cu"));

/// The region drawn: [-2.2, 0.8] × [-1.5, 1.5].
const X0: f64 = -2.2;
const Y0: f64 = -1.5;
const SPAN: f64 = 3.0;

/// The image's size and depth.
#[derive(Clone, Copy)]
struct Image {
    width: usize,
    height: usize,
    max_iter: u32,
}

struct Mandelbrot {
    image: Image,
    /// Iterations per pixel, a row per item.
    counts: DisjointBuf<u32>,
}

impl Image {
    fn step(&self) -> (f64, f64) {
        (SPAN / self.width as f64, SPAN / self.height as f64)
    }

    /// Iterations before pixel (x, row) escapes, at most `max_iter`: the
    /// twin's arithmetic, operation for operation.
    fn count(&self, x: usize, row: usize) -> u32 {
        let (dx, dy) = self.step();
        let (cr, ci) = (X0 + x as f64 * dx, Y0 + row as f64 * dy);
        let (mut zr, mut zi, mut k) = (0.0f64, 0.0f64, 0);
        while k < self.max_iter {
            let (zr2, zi2) = (zr * zr, zi * zi);
            if zr2 + zi2 > 4.0 {
                break;
            }
            let next = zr2 - zi2 + cr;
            zi = 2.0 * zr * zi + ci;
            zr = next;
            k += 1;
        }
        k
    }
}

impl Kernel for Mandelbrot {
    fn name(&self) -> &str {
        "mandelbrot"
    }

    fn items(&self) -> usize {
        self.image.height
    }

    fn profile_key(&self) -> String {
        let i = &self.image;
        format!("mandelbrot/{}x{}/i{}", i.width, i.height, i.max_iter)
    }

    fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
        let rows = self.counts.chunk_mut(chunk);
        for (row, out) in chunk.range().zip(rows.chunks_exact_mut(self.image.width)) {
            for (x, c) in out.iter_mut().enumerate() {
                *c = self.image.count(x, row);
            }
        }
        Ok(())
    }

    fn cuda(&self) -> Option<&dyn coexec::kernels::cuda::CudaKernel> {
        Some(self)
    }
}

impl GpuTwin for Mandelbrot {
    fn twin(&self) -> Twin<'_> {
        let i = &self.image;
        let (dx, dy) = i.step();
        Twin::new(&MANDELBROT, "mandelbrot")
            .threads_per_item(i.width)
            .output(&self.counts)
            .scalar(i.width as u32)
            .scalar(i.max_iter)
            .scalar(X0)
            .scalar(Y0)
            .scalar(dx)
            .scalar(dy)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let width: usize = args.next().map_or(Ok(1024), |a| a.parse())?;
    let max_iter: u32 = args.next().map_or(Ok(500), |a| a.parse())?;
    let runs: usize = args.next().map_or(Ok(3), |a| a.parse())?;
    if let Err(e) = coexec::kernels::cuda::devices().and_then(|g| {
        g.first()
            .map(drop)
            .ok_or_else(|| KernelError::CudaUnavailable("no device visible".into()))
    }) {
        println!("no GPU found ({e}): running on the CPUs");
    }
    let image = Image {
        width,
        height: width,
        max_iter,
    };
    let rt = coexec::Builder::from_env()?
        .in_memory_profiles()
        .start()
        .await?;
    let mut times = Vec::new();
    for run in 1..=runs.max(1) {
        let kernel = Mandelbrot {
            image,
            counts: DisjointBuf::new(image.height, image.width),
        };
        let done = rt.run(kernel).await?;
        let counts = done.kernel.counts.into_vec();
        // Every 64th row checked against the same code run here, alone.
        for row in (0..image.height).step_by(64) {
            let got = &counts[row * width..(row + 1) * width];
            for (x, &c) in got.iter().enumerate() {
                assert_eq!(c, image.count(x, row), "pixel ({x}, {row})");
            }
        }
        let inside = counts.iter().filter(|&&c| c == max_iter).count();
        println!(
            "run {run}: {inside} pixels in the set; {}",
            done.report.summary()
        );
        times.push(done.report.makespan_s);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "{width}x{width}, at most {max_iter} iterations: median of {} runs {:.4} s",
        times.len(),
        times[times.len() / 2]
    );
    rt.shutdown().await;
    Ok(())
}
