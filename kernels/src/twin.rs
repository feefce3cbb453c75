//! GPU twins declared, not written: a kernel names its CUDA C source and
//! entry point, and declares what a launch reads and writes; the runtime
//! compiles the source (NVRTC, cached per device), uploads what the chunk
//! needs, launches over the chunk and brings back exactly the chunk's
//! outputs. No `unsafe` on the user's side.
//!
//! ```text
//!   GpuTwin::twin(&self) -> Twin        once per run and chunk, cheap
//!     Twin::new(&SOURCE, "entry")
//!       .threads_per_item(t)            grid: chunk items × t threads
//!       .run_input(&TwinInput)          whole, once per run and device
//!       .item_input(&TwinInput, stride) the chunk's items only
//!       .output(&DisjointBuf)           the chunk's items, brought back
//!       .in_out(&DisjointBuf)           the chunk's items, uploaded and brought back
//!       .block_output(&DisjointBuf)     the chunk's grain blocks, brought back
//!       .block_per_grain(threads)       grid: one CUDA block per grain block
//!       .scalar(x)                      by value
//! ```
//!
//! The entry point's parameters are `(unsigned long long lo, unsigned int
//! n, …)`: the chunk's first item and its item count, then one parameter
//! per declared argument in declaration order: `const T*` for inputs, `T*`
//! for outputs, the value for scalars. Item pointers start at the chunk's
//! first item (element `(i - lo) * stride + k` is item `i`'s `k`-th);
//! run inputs are whole. Before the first launch of an entry point the
//! declaration is checked against the compiled kernel's parameters, as the
//! driver reports them (their count and each one's size in bytes): a
//! twin that declares fewer, more or differently sized arguments gets a
//! [`KernelError::Invalid`](crate::KernelError) naming the first
//! difference and is never launched, so safe code cannot make the driver
//! read past the argument array. The driver reports parameters from CUDA
//! 12.4 on; on an older driver a declared twin does not launch. (Sizes,
//! not types: a pointer declared
//! where the kernel takes a 64-bit integer passes the check, and what the
//! kernel then does with it is the device's fault to report, as below.)
//!
//! **What a launch may touch** (the twin's contract): the elements of the
//! pointers it is given, within their extents: `n × stride` elements of an
//! item input or output, `⌈n / grain⌉ × stride` of a block output, the whole
//! of a run input; it writes only outputs. Outputs are device buffers that
//! hold the chunk's elements and nothing else, and only they are copied
//! back, into the chunk's own part of each [`DisjointBuf`]: a launch cannot
//! reach another chunk's outputs on the host. A launch that writes past an
//! extent corrupts device memory, as out-of-bounds C does (run it under
//! `compute-sanitizer` to find one).

use std::ops::Deref;

use crate::buf::HostBuf;
use crate::{Chunk, DisjointBuf, Kernel};

mod sealed {
    /// Byte views of the element types that cross the bus.
    pub trait Sealed: Sized {
        fn bytes(v: &[Self]) -> &[u8];
        fn bytes_mut(v: &mut [Self]) -> &mut [u8];
        fn scalar(self) -> Scalar;
    }

    /// A scalar launch argument.
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub enum Scalar {
        U8(u8),
        I32(i32),
        U32(u32),
        I64(i64),
        U64(u64),
        F32(f32),
        F64(f64),
    }
}

pub(crate) use sealed::Scalar;

/// Element types a twin's buffers and scalars may hold: plain integers and
/// floats, copied to and from the device as their bytes. Sealed.
pub trait DeviceCopy: sealed::Sealed + Copy + Send + Sync + 'static {}

macro_rules! device_copy {
    ($($t:ty => $v:ident),*) => {$(
        impl sealed::Sealed for $t {
            fn bytes(v: &[Self]) -> &[u8] {
                // SAFETY: a plain number type: no padding, every byte
                // initialised; the length is the slice's size in bytes.
                unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
            }
            fn bytes_mut(v: &mut [Self]) -> &mut [u8] {
                // SAFETY: as `bytes`; and every bit pattern is a valid value,
                // so any bytes written leave valid elements.
                unsafe {
                    std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v))
                }
            }
            fn scalar(self) -> Scalar {
                Scalar::$v(self)
            }
        }
        impl DeviceCopy for $t {}
    )*};
}

device_copy!(u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64, f32 => F32, f64 => F64);

/// A twin's CUDA C source: a name (for errors; `"mandelbrot.cu"`) and the
/// text, a literal or `include_str!` of a file.
#[derive(Debug, Clone, Copy)]
pub struct CudaSource {
    pub(crate) name: &'static str,
    pub(crate) text: &'static str,
}

impl CudaSource {
    /// The source `text`, called `name` in errors.
    pub const fn new(name: &'static str, text: &'static str) -> Self {
        Self { name, text }
    }

    /// Its name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Its text.
    pub fn text(&self) -> &'static str {
        self.text
    }
}

/// An input a twin uploads: fixed host data a GPU stream may page-lock
/// while it lives, read on the CPU through `Deref`. As a run input it
/// crosses the bus once per run and device (its identity says it has not
/// changed: it cannot change).
///
/// ```
/// let x = coexec_kernels::TwinInput::new(vec![1.0f32, 2.0, 3.0]);
/// assert_eq!(x[1], 2.0);
/// assert_eq!(x.len(), 3);
/// ```
pub struct TwinInput<T> {
    buf: HostBuf<T>,
    id: u64,
}

impl<T: DeviceCopy> TwinInput<T> {
    /// Takes `data` as it is.
    pub fn new(data: Vec<T>) -> Self {
        Self {
            buf: HostBuf::from(data),
            id: crate::claim::next_id(),
        }
    }

    /// The data back.
    pub fn into_vec(self) -> Vec<T> {
        self.buf.into_vec()
    }
}

impl<T> Deref for TwinInput<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.buf
    }
}

impl<T> std::fmt::Debug for TwinInput<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TwinInput")
            .field("len", &self.buf.len())
            .finish()
    }
}

/// An output buffer's chunk part as bytes, whatever its element type.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) trait OutputBytes: Sync {
    /// Items (or blocks) the buffer holds.
    fn len(&self) -> usize;
    /// The chunk's part: its items, or with `grain`, its blocks. Exclusive
    /// as [`DisjointBuf::chunk_mut`]'s: the chunk's claim unlocks it once.
    #[allow(clippy::mut_from_ref)]
    fn chunk_bytes<'c>(&'c self, chunk: &'c Chunk, grain: Option<usize>) -> &'c mut [u8];
    #[cfg(feature = "cuda")]
    fn pin(&self) -> &crate::cuda::HostPin;
    #[cfg(feature = "cuda")]
    fn pinnable(&self) -> crate::buf::Pinnable<'_>;
}

impl<T: DeviceCopy> OutputBytes for DisjointBuf<T> {
    fn len(&self) -> usize {
        self.items()
    }
    #[allow(clippy::mut_from_ref)]
    fn chunk_bytes<'c>(&'c self, chunk: &'c Chunk, grain: Option<usize>) -> &'c mut [u8] {
        let part = match grain {
            Some(g) => self.chunk_mut_blocks(chunk, g),
            None => self.chunk_mut(chunk),
        };
        T::bytes_mut(part)
    }
    #[cfg(feature = "cuda")]
    fn pin(&self) -> &crate::cuda::HostPin {
        DisjointBuf::pin(self)
    }
    #[cfg(feature = "cuda")]
    fn pinnable(&self) -> crate::buf::Pinnable<'_> {
        DisjointBuf::pinnable(self)
    }
}

/// One declared argument of a launch.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) enum TwinArg<'a> {
    /// Uploaded whole, once per run and device.
    Run {
        id: u64,
        bytes: &'a [u8],
    },
    /// The chunk's items, `item_bytes` each; staged where `host` is `None`.
    Items {
        bytes: &'a [u8],
        item_bytes: usize,
        host: Option<Host<'a>>,
    },
    /// The chunk's items (or with `blocks`, its grain blocks), brought
    /// back; with `input`, uploaded first (read and written in place).
    Out {
        buf: &'a dyn OutputBytes,
        blocks: bool,
        input: bool,
    },
    Scalar(Scalar),
}

/// An input's host buffer, for the stream to page-lock and copy from.
#[derive(Clone, Copy)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct Host<'a> {
    #[cfg(feature = "cuda")]
    pub(crate) pin: &'a crate::cuda::HostPin,
    #[cfg(feature = "cuda")]
    pub(crate) pinnable: crate::buf::Pinnable<'a>,
    #[cfg(not(feature = "cuda"))]
    _buf: std::marker::PhantomData<&'a ()>,
}

impl<'a> Host<'a> {
    fn of<T>(buf: &'a HostBuf<T>) -> Self {
        #[cfg(feature = "cuda")]
        {
            Self {
                pin: buf.pin(),
                pinnable: buf.pinnable(),
            }
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = buf;
            Self {
                _buf: std::marker::PhantomData,
            }
        }
    }
}

/// One launch of a twin, as [`GpuTwin::twin`] declares it (see the module
/// docs for the entry point's parameters and what a launch may touch).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub struct Twin<'a> {
    pub(crate) source: CudaSource,
    pub(crate) entry: &'static str,
    pub(crate) threads_per_item: usize,
    pub(crate) block: u32,
    /// One CUDA block per grain block ([`Twin::block_per_grain`]).
    pub(crate) per_grain: bool,
    pub(crate) args: Vec<TwinArg<'a>>,
}

impl std::fmt::Debug for Twin<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Twin")
            .field("source", &self.source.name)
            .field("entry", &self.entry)
            .field("threads_per_item", &self.threads_per_item)
            .field("args", &self.args.len())
            .finish()
    }
}

impl<'a> Twin<'a> {
    /// A launch of `entry` in `source`: one thread per item, blocks of 256,
    /// no arguments beyond `(lo, n)` yet.
    pub fn new(source: &CudaSource, entry: &'static str) -> Self {
        Self {
            source: *source,
            entry,
            threads_per_item: 1,
            block: 256,
            per_grain: false,
            args: Vec::new(),
        }
    }

    /// GPU threads per item (at least one): the grid covers `n × t`
    /// threads, rounded up to whole blocks (threads past it must return).
    pub fn threads_per_item(mut self, t: usize) -> Self {
        self.threads_per_item = t.max(1);
        self
    }

    /// Threads per block (1 to 1024; default 256).
    pub fn block_size(mut self, threads: u32) -> Self {
        self.block = threads.clamp(1, 1024);
        self
    }

    /// An input every chunk reads whole (`const T*`): uploaded once per run
    /// and device, before the run's first timed chunk.
    pub fn run_input<T: DeviceCopy>(mut self, input: &'a TwinInput<T>) -> Self {
        self.args.push(TwinArg::Run {
            id: input.id,
            bytes: T::bytes(&input.buf),
        });
        self
    }

    /// An input of `stride` elements per item (`const T*`): the chunk's
    /// items only, starting at its first.
    pub fn item_input<T: DeviceCopy>(mut self, input: &'a TwinInput<T>, stride: usize) -> Self {
        self.args.push(TwinArg::Items {
            bytes: T::bytes(&input.buf),
            item_bytes: stride * std::mem::size_of::<T>(),
            host: Some(Host::of(&input.buf)),
        });
        self
    }

    /// [`Twin::run_input`] for a built-in kernel's own data: `id` (from
    /// [`crate::claim::next_id`]) names `data` for as long as it does not
    /// change.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    #[cfg_attr(not(feature = "workloads"), allow(dead_code))]
    pub(crate) fn run_slice<T: DeviceCopy>(mut self, id: u64, data: &'a [T]) -> Self {
        self.args.push(TwinArg::Run {
            id,
            bytes: T::bytes(data),
        });
        self
    }

    /// [`Twin::item_input`] from a plain slice: its chunk part is staged.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    #[cfg_attr(not(feature = "workloads"), allow(dead_code))]
    pub(crate) fn item_slice<T: DeviceCopy>(mut self, data: &'a [T], stride: usize) -> Self {
        self.args.push(TwinArg::Items {
            bytes: T::bytes(data),
            item_bytes: stride * std::mem::size_of::<T>(),
            host: None,
        });
        self
    }

    /// An output of the buffer's stride per item (`T*`): the chunk's items,
    /// starting at its first, brought back into the chunk's part of `out`.
    pub fn output<T: DeviceCopy>(mut self, out: &'a DisjointBuf<T>) -> Self {
        self.args.push(TwinArg::Out {
            buf: out,
            blocks: false,
            input: false,
        });
        self
    }

    /// A per-block output (`T*`): one entry of the buffer's stride per block
    /// of [`Kernel::grain`] items (partial sums, say), the chunk's blocks
    /// starting at its first, brought back into the chunk's blocks of `out`.
    pub fn block_output<T: DeviceCopy>(mut self, out: &'a DisjointBuf<T>) -> Self {
        self.args.push(TwinArg::Out {
            buf: out,
            blocks: true,
            input: false,
        });
        self
    }

    /// An output read and written in place (`T*`): the chunk's items of
    /// `buf` uploaded before the launch, then brought back into them (an
    /// iteration's memberships, say).
    pub fn in_out<T: DeviceCopy>(mut self, buf: &'a DisjointBuf<T>) -> Self {
        self.args.push(TwinArg::Out {
            buf,
            blocks: false,
            input: true,
        });
        self
    }

    /// One CUDA block of `threads` (1 to 1024) per block of
    /// [`Kernel::grain`] items of the chunk, instead of `n ×
    /// threads_per_item` threads: for a kernel that reduces each grain block
    /// in one CUDA block (block `b` of the grid is the chunk's `b`-th).
    pub fn block_per_grain(mut self, threads: u32) -> Self {
        self.block = threads.clamp(1, 1024);
        self.per_grain = true;
        self
    }

    /// A scalar parameter, by value.
    pub fn scalar<T: DeviceCopy>(mut self, value: T) -> Self {
        self.args.push(TwinArg::Scalar(value.scalar()));
        self
    }
}

/// A kernel's GPU twin, declared: CUDA C source, entry point, and what a
/// launch reads and writes ([`Twin`]). A kernel that implements it is a
/// [`CudaKernel`](crate::cuda::CudaKernel) and returns itself from
/// [`Kernel::cuda`]; the runtime does the rest, and a panic in it fails the
/// chunk (which is run again), not the device.
///
/// ```
/// use coexec_kernels::{Chunk, CudaSource, DisjointBuf, GpuTwin, Kernel, KernelError, Twin, TwinInput};
///
/// const SQUARE: CudaSource = CudaSource::new(
///     "square.cu",
///     r#"extern "C" __global__ void square(unsigned long long lo, unsigned int n,
///                                          const float* x, float* y) {
///         unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
///         if (i < n) y[i] = x[i] * x[i];
///     }"#,
/// );
///
/// struct Square { x: TwinInput<f32>, y: DisjointBuf<f32> }
///
/// impl Kernel for Square {
///     fn name(&self) -> &str { "square" }
///     fn items(&self) -> usize { self.x.len() }
///     fn run_cpu(&self, c: &Chunk) -> Result<(), KernelError> {
///         for (y, x) in self.y.chunk_mut(c).iter_mut().zip(&self.x[c.range()]) {
///             *y = x * x;
///         }
///         Ok(())
///     }
///     fn cuda(&self) -> Option<&dyn coexec_kernels::cuda::CudaKernel> { Some(self) }
/// }
///
/// impl GpuTwin for Square {
///     fn twin(&self) -> Twin<'_> {
///         Twin::new(&SQUARE, "square").item_input(&self.x, 1).output(&self.y)
///     }
/// }
///
/// let mut k = Square { x: TwinInput::new(vec![1.0, 2.0, 3.0]), y: DisjointBuf::new(3, 1) };
/// coexec_kernels::with_chunk(&mut k, 0..3, |k, c| k.run_cpu(c)).unwrap();
/// assert_eq!(k.y.as_slice(), &[1.0, 4.0, 9.0]);
/// ```
///
/// A twin names whole buffers; the runtime cuts the chunk's part. A slice
/// of outputs (another chunk's, or the chunk's own) is not an output:
///
/// ```compile_fail,E0308
/// # use coexec_kernels::{Chunk, CudaSource, DisjointBuf, Twin};
/// # const SRC: CudaSource = CudaSource::new("k.cu", "");
/// fn twin<'a>(out: &'a DisjointBuf<f32>, other: &'a Chunk) -> Twin<'a> {
///     Twin::new(&SRC, "k").output(out.chunk_mut(other))
/// }
/// ```
///
/// Nor is a buffer the twin does not borrow for the launch (it could change
/// while the launch reads or writes it):
///
/// ```compile_fail,E0308
/// # use coexec_kernels::{CudaSource, DisjointBuf, Twin};
/// # const SRC: CudaSource = CudaSource::new("k.cu", "");
/// fn twin<'a>(out: DisjointBuf<f32>) -> Twin<'a> {
///     Twin::new(&SRC, "k").output(out)
/// }
/// ```
pub trait GpuTwin: Kernel {
    /// This kernel's launch, declared. Called once per run and stream, and
    /// once per chunk: keep it cheap (no allocation beyond the [`Twin`]).
    fn twin(&self) -> Twin<'_>;
}
