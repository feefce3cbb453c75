use std::path::PathBuf;

/// What can go wrong inside a kernel or while preparing its inputs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// Parameters a kernel cannot run with, or results that cannot be right
    /// (a stream model's outputs that do not match its batch).
    #[error("invalid {what}: {why}")]
    Invalid {
        /// The parameter or input at fault.
        what: &'static str,
        /// Why it was refused.
        why: String,
    },
    /// An input file could not be read or parsed.
    #[error("{}:{line}: {why}", path.display())]
    Input {
        /// The file.
        path: PathBuf,
        /// 1-based line number (0 when the fault is not tied to a line).
        line: usize,
        /// What is wrong there.
        why: String,
    },
    /// A tensor file (safetensors) is malformed or lacks what the kernel needs.
    /// `tensor` is empty when the fault is the file as a whole.
    #[error(
        "{}: {}{why}",
        path.display(),
        if tensor.is_empty() { "not a safetensors file: ".to_string() } else { format!("tensor `{tensor}`: ") }
    )]
    Tensor {
        /// The file.
        path: PathBuf,
        /// The tensor at fault (empty for the file's header or layout).
        tensor: String,
        /// What is wrong with it.
        why: String,
    },
    /// A model folder's JSON config lacks a field, or holds one this
    /// crate cannot serve (`…/config.json: field `model_type`: …`).
    #[error("{}: field `{field}`: {why}", path.display())]
    Config {
        /// The file.
        path: PathBuf,
        /// The field at fault.
        field: &'static str,
        /// What is wrong with it.
        why: String,
    },
    /// An I/O error reading an input.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// CUDA is not compiled in, or no driver or device was found at run time.
    #[error("CUDA unavailable: {0}")]
    CudaUnavailable(String),
    /// A CUDA call failed.
    #[error("CUDA error: {0}")]
    Cuda(String),
    /// The device's memory cannot hold this chunk's buffers; a smaller
    /// chunk may fit, and the runtime tries the halves. Refused before
    /// CUDA is asked where the device's free memory is known to be short
    /// (`need` and `free` say by how much), or CUDA's own out-of-memory
    /// (both 0).
    #[error(
        "device out of memory for a chunk of {items} items{}",
        if *need == 0 { String::new() } else { format!(": it needs {}, {} is free", bytes(*need), bytes(*free)) }
    )]
    OutOfMemory {
        /// The chunk size that did not fit.
        items: usize,
        /// Bytes the chunk's buffers needed (0: not known).
        need: u64,
        /// Bytes the device had free, less the headroom kept (0: not known).
        free: u64,
    },
    /// A buffer of the whole run (an input every chunk reads) that the
    /// device's free memory cannot hold, refused before CUDA is asked: no
    /// chunk of this run can use the device, so its chunks run on another
    /// kind of device.
    #[error(
        "{what} needs {} of device memory; {} of {} is free",
        bytes(*need), bytes(*free), bytes(*total)
    )]
    DeviceMemory {
        /// The buffer.
        what: &'static str,
        /// Its bytes.
        need: u64,
        /// Bytes the device had free, less the headroom kept.
        free: u64,
        /// The device's memory.
        total: u64,
    },
    /// The kernel has no implementation for the device it was given.
    #[error("kernel `{kernel}` has no {device} implementation")]
    Unsupported {
        /// Kernel name.
        kernel: String,
        /// Device kind.
        device: &'static str,
    },
    /// User code panicked: a kernel's method (a chunk's run among them), or
    /// a stream model's `build` or `outputs`. The message says which, where
    /// the caller knows.
    #[error("panicked: {0}")]
    Panicked(String),
    /// The runtime took the chunk back from a device that ran far past its
    /// predicted time; it runs elsewhere (the attempt wrote nothing the
    /// retry does not write again).
    #[error("taken back after {secs:.3} s, far past its device's predicted time")]
    TakenBack {
        /// Seconds the attempt had run.
        secs: f64,
    },
    /// The kernel's own failure, in its words: what a kernel returns for
    /// a fault none of the other variants names. The chunk is run again,
    /// elsewhere first, as for any failure.
    #[error("{0}")]
    Failed(String),
}

/// `n` bytes for a person: "512 B", "3.0 MiB", "1.25 GiB".
fn bytes(n: u64) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    match n {
        0..1024 => format!("{n} B"),
        1024..0x4000_0000 => format!("{:.1} MiB", n as f64 / MIB),
        _ => format!("{:.2} GiB", n as f64 / (MIB * 1024.0)),
    }
}

impl KernelError {
    /// Shorthand for [`KernelError::Invalid`].
    pub fn invalid(what: &'static str, why: impl Into<String>) -> Self {
        Self::Invalid {
            what,
            why: why.into(),
        }
    }

    /// Runs user code (a kernel's or a model's method), a panic in it
    /// becoming [`KernelError::Panicked`] with the panic's message.
    ///
    /// The panic hook is left as the application set it: each panic reaches
    /// it, as any panic does (the default hook prints it). A kernel that
    /// panics on every chunk panics once per chunk and retry; a program
    /// that owns its process can have each place printed once
    /// ([`KernelError::print_each_panic_once`]).
    ///
    /// ```
    /// use coexec_kernels::KernelError;
    /// let r: Result<(), _> = KernelError::catch(|| panic!("row {} is bad", 3));
    /// assert!(matches!(r, Err(KernelError::Panicked(m)) if m == "row 3 is bad"));
    /// ```
    pub fn catch<T>(f: impl FnOnce() -> Result<T, KernelError>) -> Result<T, KernelError> {
        let _catching = quiet::Catching::enter();
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
            .unwrap_or_else(|p| Err(Self::Panicked(panic_message(&*p).to_string())))
    }

    /// Wraps the process's panic hook, once, so that a panic inside
    /// [`KernelError::catch`] reaches it only the first time its place
    /// (file and line) panics: a kernel that panics on every chunk fails
    /// its job with one printed panic, not one per chunk and retry. Panics
    /// elsewhere reach the previous hook as before. A process-wide change,
    /// for programs that own their process (the `coexec` command calls it
    /// at start); a hook set after it replaces it. Does nothing on a thread
    /// that is unwinding (changing the hook there would abort).
    pub fn print_each_panic_once() {
        quiet::install();
    }
}

mod quiet {
    //! The panic hook of [`KernelError::print_each_panic_once`](super::KernelError::print_each_panic_once):
    //! a panic inside [`KernelError::catch`](super::KernelError::catch) is
    //! printed the first time its place panics.

    use std::cell::Cell;
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};

    /// Places whose panics were printed; past this many, no more are
    /// (a kernel whose message moves with its input stays bounded).
    const MAX_PLACES: usize = 256;

    thread_local! {
        /// `catch` calls in progress on this thread.
        static DEPTH: Cell<u32> = const { Cell::new(0) };
    }

    /// A `catch` call in progress on this thread, until dropped.
    pub(super) struct Catching;

    impl Catching {
        pub(super) fn enter() -> Self {
            DEPTH.with(|d| d.set(d.get() + 1));
            Catching
        }
    }

    impl Drop for Catching {
        fn drop(&mut self) {
            DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
        }
    }

    /// Wraps the process's panic hook, once. Not from a thread that is
    /// unwinding (a `catch` in a destructor): changing the hook there would
    /// panic again and abort; a later call installs it.
    pub(super) fn install() {
        static INSTALLED: OnceLock<()> = OnceLock::new();
        if std::thread::panicking() {
            return;
        }
        INSTALLED.get_or_init(|| {
            let previous = std::panic::take_hook();
            let printed: Mutex<HashSet<String>> = Mutex::new(HashSet::new());
            std::panic::set_hook(Box::new(move |info| {
                if DEPTH.with(Cell::get) == 0 {
                    return previous(info);
                }
                let place = info
                    .location()
                    .map_or_else(String::new, |l| format!("{}:{}", l.file(), l.line()));
                let first = {
                    let mut p = printed.lock().unwrap_or_else(|e| e.into_inner());
                    p.len() < MAX_PLACES && p.insert(place)
                };
                if first {
                    previous(info);
                }
            }));
        });
    }
}

/// The message a panic carried (`panic!` with a literal or a format).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("non-string panic payload")
}
