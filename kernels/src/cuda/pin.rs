//! Page-locked kernel buffers: chunks copy straight from and to them.
//!
//! A copy from pageable memory is staged: a thread first copies it into
//! page-locked memory (this crate's pinned staging, or the driver's), at
//! 7–10 GB/s on one core, while the copy engine moves 50+ GB/s from memory
//! it may address directly. `cuMemHostRegister` page-locks a kernel's own
//! buffer, so the copy engine reads and writes it without staging.
//!
//! A lock belongs to the allocation it locks: [`HostPin`] is a field of the
//! owning buffer ([`HostBuf`](crate::buf::HostBuf), and through it
//! [`DisjointBuf`](crate::DisjointBuf)), taken at most once, by the first
//! stream that asks ([`StreamWorker::pin`](super::StreamWorker::pin), from a
//! kernel's `stage`, before the run's first chunk), and released by the
//! owner before its memory goes back to the allocator. Releasing first waits
//! for every stream that copied from or to the memory (a taken-back chunk's
//! copies may still be in flight), then unlocks it.
//!
//! Locking costs driver time proportional to the pages (milliseconds per
//! GB), once per buffer: [`host_pin_stats`] counts it. Small buffers
//! ([`PIN_MIN_BYTES`]) are staged: their copies cost less than a lock.
//! Large ones are allocated with a little spare capacity
//! ([`crate::buf::pinnable_capacity`]), so that two of them never share a
//! page (the driver would refuse to lock the second).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaStream};

pub(crate) use crate::buf::PIN_MIN_BYTES;

/// The page-lock of one host allocation, owned by the allocation's owner:
/// empty until a stream locks it ([`HostPin::lock_with`]), then locked (or
/// staged, when locking failed or was not wanted) until the owner releases
/// it ([`HostPin::release`]).
#[derive(Default)]
pub(crate) struct HostPin {
    state: OnceLock<Option<Lock>>,
}

impl std::fmt::Debug for HostPin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.state.get() {
            None => f.write_str("HostPin(untried)"),
            Some(None) => f.write_str("HostPin(staged)"),
            Some(Some(l)) => write!(f, "HostPin(locked {} bytes)", l.len),
        }
    }
}

impl HostPin {
    /// The lock, taken by `lock` on the first call (`None`: staged from then
    /// on); later calls wait for the first and give its answer.
    pub(super) fn lock_with(&self, lock: impl FnOnce() -> Option<Lock>) -> Option<&Lock> {
        self.state.get_or_init(lock).as_ref()
    }

    /// The lock, when it covers the `len` bytes at `addr`.
    pub(super) fn covering(&self, addr: usize, len: usize) -> Option<&Lock> {
        self.state
            .get()?
            .as_ref()
            .filter(|l| addr >= l.base && addr.saturating_add(len) <= l.base + l.len)
    }

    /// Whether the memory is page-locked.
    #[cfg(test)]
    pub(crate) fn is_locked(&self) -> bool {
        matches!(self.state.get(), Some(Some(_)))
    }

    /// Unlocks the memory, after every stream that copied from or to it is
    /// done; the owner calls this before it frees the memory, and frees it
    /// only on `true`. `false`: the driver still locks it (unlocking
    /// failed), and the memory must never return to the allocator (a new
    /// buffer there would be copied as if locked, from pages no longer its
    /// own). Idempotent; `true` when nothing was locked.
    pub(crate) fn release(&mut self) -> bool {
        match self.state.take() {
            Some(Some(mut l)) => l.unlock(),
            _ => true,
        }
    }
}

/// A page-locked range and the streams that copied from or to it.
pub(super) struct Lock {
    base: usize,
    len: usize,
    users: Mutex<Vec<Arc<CudaStream>>>,
    unlock: Unlock,
    /// Whether unlocking was tried, and how it went.
    unlocked: Option<bool>,
}

/// How a lock is undone.
pub(super) enum Unlock {
    /// `cuMemHostUnregister` with this context current.
    Driver(Arc<CudaContext>),
    /// A stand-in for tests without a GPU: says "unlocked" (or "refused")
    /// in the log.
    #[cfg(test)]
    Log(Arc<Mutex<Vec<&'static str>>>, bool),
}

impl Lock {
    /// Page-locks the `len` bytes at `base` for every context of the process
    /// (`CU_MEMHOSTREGISTER_PORTABLE`), with `ctx` current; `None` when the
    /// driver refuses (the memory is then staged).
    ///
    /// # Safety
    ///
    /// The range is one live allocation that does not move, whose owner
    /// holds the [`HostPin`] this lock goes to and releases it before the
    /// memory is freed.
    pub(super) unsafe fn register(ctx: &Arc<CudaContext>, base: usize, len: usize) -> Option<Lock> {
        let t = Instant::now();
        let r = ctx.bind_to_thread().and_then(|()| {
            // SAFETY: the caller's promise: the range is live and stays
            // where it is until the lock is undone. Locking reads and writes
            // none of its bytes.
            unsafe {
                sys::cuMemHostRegister_v2(
                    base as *mut std::ffi::c_void,
                    len,
                    sys::CU_MEMHOSTREGISTER_PORTABLE,
                )
            }
            .result()
        });
        match r {
            Ok(()) => {
                STATS.locked(len, t.elapsed().as_nanos() as u64);
                Some(Lock::new(base, len, Unlock::Driver(ctx.clone())))
            }
            Err(e) => {
                STATS.refused(format!("{len} bytes: {e}"));
                None
            }
        }
    }

    pub(super) fn new(base: usize, len: usize, unlock: Unlock) -> Self {
        Self {
            base,
            len,
            users: Mutex::new(Vec::new()),
            unlock,
            unlocked: None,
        }
    }

    /// Records that `stream` copies from or to the memory: unlocking waits
    /// for it first.
    pub(super) fn add_user(&self, stream: &Arc<CudaStream>) {
        let mut users = self.users.lock().unwrap_or_else(|p| p.into_inner());
        if !users.iter().any(|s| Arc::ptr_eq(s, stream)) {
            users.push(stream.clone());
        }
    }

    /// Waits for every user stream, then unlocks (once); `true` when
    /// unlocked.
    fn unlock(&mut self) -> bool {
        if let Some(done) = self.unlocked {
            return done;
        }
        let t = Instant::now();
        let users = std::mem::take(self.users.get_mut().unwrap_or_else(|p| p.into_inner()));
        // A stream whose wait fails may still copy: the memory stays locked
        // (and is leaked, never handed back to the allocator).
        let idle = users.iter().all(|s| s.synchronize().is_ok());
        if !idle {
            self.unlocked = Some(false);
            return false;
        }
        let done = match &self.unlock {
            Unlock::Driver(ctx) => ctx.bind_to_thread().is_ok_and(|()| {
                // SAFETY: `base` was locked by `register`, and this runs
                // once (`unlocked`); no copy from or to it is in flight (every
                // stream that copied was synchronised above without error,
                // and a stream copies only memory whose lock it is a user of).
                unsafe { sys::cuMemHostUnregister(self.base as *mut std::ffi::c_void) }
                    .result()
                    .is_ok()
            }),
            #[cfg(test)]
            Unlock::Log(log, ok) => {
                log.lock()
                    .unwrap()
                    .push(if *ok { "unlocked" } else { "refused" });
                *ok
            }
        };
        if done {
            STATS.unlocked(t.elapsed().as_nanos() as u64);
        }
        self.unlocked = Some(done);
        done
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        self.unlock();
    }
}

/// What page-locking has cost this process so far ([`host_pin_stats`]).
#[derive(Debug, Clone, Default, serde::Serialize)]
#[non_exhaustive]
pub struct HostPinStats {
    /// Buffers page-locked.
    pub locked: u64,
    /// Their bytes.
    pub locked_bytes: u64,
    /// Seconds spent locking them (`cuMemHostRegister`).
    pub lock_secs: f64,
    /// Seconds spent unlocking, waiting for their streams included.
    pub unlock_secs: f64,
    /// Buffers the driver refused to lock (they are staged).
    pub refused: u64,
    /// Why the last one was refused.
    pub last_refusal: Option<String>,
}

struct Stats {
    locked: AtomicU64,
    bytes: AtomicU64,
    lock_ns: AtomicU64,
    unlock_ns: AtomicU64,
    refused: AtomicU64,
    last_refusal: Mutex<Option<String>>,
}

static STATS: Stats = Stats {
    locked: AtomicU64::new(0),
    bytes: AtomicU64::new(0),
    lock_ns: AtomicU64::new(0),
    unlock_ns: AtomicU64::new(0),
    refused: AtomicU64::new(0),
    last_refusal: Mutex::new(None),
};

impl Stats {
    fn locked(&self, bytes: usize, ns: u64) {
        self.locked.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.lock_ns.fetch_add(ns, Ordering::Relaxed);
    }

    fn unlocked(&self, ns: u64) {
        self.unlock_ns.fetch_add(ns, Ordering::Relaxed);
    }

    fn refused(&self, why: String) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        *self.last_refusal.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
    }
}

/// What page-locking kernel buffers has cost this process so far: buffers
/// and bytes locked, the seconds locking and unlocking took, and refusals.
///
/// ```
/// let s = coexec_kernels::cuda::host_pin_stats();
/// assert!(s.lock_secs >= 0.0);
/// ```
pub fn host_pin_stats() -> HostPinStats {
    let s = &STATS;
    HostPinStats {
        locked: s.locked.load(Ordering::Relaxed),
        locked_bytes: s.bytes.load(Ordering::Relaxed),
        lock_secs: s.lock_ns.load(Ordering::Relaxed) as f64 * 1e-9,
        unlock_secs: s.unlock_ns.load(Ordering::Relaxed) as f64 * 1e-9,
        refused: s.refused.load(Ordering::Relaxed),
        last_refusal: s
            .last_refusal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone(),
    }
}

/// Which kernel buffers stream workers page-lock, so that chunks copy
/// straight from and to them instead of through the streams' own pinned
/// buffers. Results are the same bit for bit whichever is chosen.
///
/// Page-locking a buffer costs time of its own, paid once for the buffer's
/// life and inside the run that first uses it. Measured on an H200
/// (2026-11-26, `matmul_pinned_chunks_copy_at_dma_speed`): locking matmul's
/// 3.6 GB took 194 ms and its chunks then copied at 41.5 GB/s, 58 ms, where
/// staging them took 406 ms; the one-run job on the GPU alone went from
/// 0.47-0.49 s to 0.27-0.28 s. So every large buffer is locked by default.
///
/// ```
/// use coexec_kernels::cuda::HostPinning;
/// assert_eq!("all".parse::<HostPinning>().unwrap(), HostPinning::All);
/// assert_eq!("0".parse::<HostPinning>().unwrap(), HostPinning::Off);
/// assert!("sometimes".parse::<HostPinning>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HostPinning {
    /// Nothing: every copy is staged.
    Off,
    /// Only the buffers a job keeps across its runs (an iterative job's
    /// data set, its rows, its memberships), where locking is surely paid
    /// back.
    Reused,
    /// Every large buffer, a one-run job's too (its locking lands in that
    /// run): the default.
    #[default]
    All,
}

impl std::str::FromStr for HostPinning {
    type Err = String;

    /// `off` (or `0`, `false`, `no`), `reused` (or `on`, `1`, `true`, `yes`),
    /// `all`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "0" | "false" | "no" => Ok(Self::Off),
            "reused" | "on" | "1" | "true" | "yes" => Ok(Self::Reused),
            "all" => Ok(Self::All),
            other => Err(format!(
                "`{other}` is not one of off, reused, all (page-locking kernel buffers)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::HostBuf;
    use crate::{ClaimSpace, DisjointBuf};

    type Log = Arc<Mutex<Vec<&'static str>>>;

    /// Logs "freed" when dropped: tells when a buffer's memory is freed.
    #[derive(Debug)]
    struct Freed(Option<Log>);

    impl Drop for Freed {
        fn drop(&mut self) {
            if let Some(log) = &self.0 {
                log.lock().unwrap().push("freed");
            }
        }
    }

    /// Locks `pin` over `mem` with a stand-in that logs its unlocking.
    fn fake_lock(p: crate::buf::Pinnable<'_>, log: &Log, ok: bool) -> bool {
        p.pin()
            .lock_with(|| Some(Lock::new(p.addr(), p.len(), Unlock::Log(log.clone(), ok))))
            .is_some()
    }

    /// A buffer whose first element logs its freeing.
    fn tracked(log: &Log, n: usize) -> HostBuf<Freed> {
        let mut v = vec![Freed(Some(log.clone()))];
        v.extend((1..n).map(|_| Freed(None)));
        HostBuf::from(v)
    }

    #[test]
    fn a_buffer_is_unlocked_before_its_memory_is_freed() {
        let log = Log::default();
        let b = tracked(&log, 4);
        assert!(fake_lock(b.pinnable(), &log, true));
        assert!(b.pin().is_locked());
        drop(b);
        assert_eq!(*log.lock().unwrap(), ["unlocked", "freed"]);
    }

    #[test]
    fn a_lock_moves_with_its_memory_between_buffer_kinds() {
        let log = Log::default();
        let b = HostBuf::from(vec![7u32; 1024]);
        assert!(fake_lock(b.pinnable(), &log, true));
        let (addr, len) = (b.as_ptr() as usize, b.len() * 4);
        // Input → output → input (pathfinder's rows): the same memory, still
        // locked, never unlocked on the way.
        let mut d = DisjointBuf::from_host(b, 1);
        assert!(d.pin().covering(addr, len).is_some());
        assert_eq!(d.as_slice()[3], 7);
        let b = d.into_host();
        assert!(b.pin().covering(addr, len).is_some());
        assert!(log.lock().unwrap().is_empty());
        // Handed out as a plain vector: unlocked first, values kept.
        let v = b.into_vec();
        assert_eq!(*log.lock().unwrap(), ["unlocked"]);
        assert_eq!(v, vec![7u32; 1024]);
    }

    #[test]
    fn an_output_buffer_is_unlocked_before_it_becomes_a_vector() {
        let log = Log::default();
        let d = DisjointBuf::<u64>::new(100, 2);
        assert!(fake_lock(d.pinnable(), &log, true));
        let space = ClaimSpace::new();
        let c = crate::Chunk::claim(&space, 10..20).unwrap();
        d.chunk_mut(&c).fill(5);
        drop(c);
        let v = d.into_vec();
        assert_eq!(*log.lock().unwrap(), ["unlocked"]);
        assert_eq!(v[20..40], [5; 20]);
    }

    #[test]
    fn memory_the_driver_keeps_locked_is_never_freed() {
        let log = Log::default();
        let b = tracked(&log, 3);
        assert!(fake_lock(b.pinnable(), &log, false));
        drop(b);
        // Leaked, not freed: its pages must not return to the allocator.
        assert_eq!(*log.lock().unwrap(), ["refused"]);

        // Handed out as a vector: the values move to a fresh allocation.
        let b = HostBuf::from(vec![1.5f32; 5000]);
        assert!(fake_lock(b.pinnable(), &log, false));
        let locked = b.as_ptr() as usize;
        let v = b.into_vec();
        assert_ne!(v.as_ptr() as usize, locked);
        assert_eq!(v, vec![1.5f32; 5000]);
    }

    #[test]
    fn a_buffer_is_locked_once_and_covers_only_its_own_bytes() {
        let log = Log::default();
        let (a, other) = (HostBuf::from(vec![0u8; 8192]), vec![0u8; 64]);
        assert!(fake_lock(a.pinnable(), &log, true));
        // A second stream asks: the first answer stands, nothing is locked again.
        let again = a
            .pinnable()
            .pin()
            .lock_with(|| unreachable!("locked twice"));
        assert!(again.is_some());
        let base = a.as_ptr() as usize;
        assert!(a.pin().covering(base, 8192).is_some());
        assert!(a.pin().covering(base + 100, 50).is_some());
        assert!(a.pin().covering(base + 8000, 193).is_none(), "past the end");
        assert!(a.pin().covering(other.as_ptr() as usize, 64).is_none());
        // Refused (or not wanted) once: staged for good, asked again or not.
        let s = HostBuf::from(vec![0u8; 10]);
        assert!(s.pinnable().pin().lock_with(|| None).is_none());
        assert!(s.pin().lock_with(|| unreachable!()).is_none());
        assert!(s.pin().covering(s.as_ptr() as usize, 1).is_none());
    }

    #[test]
    fn the_choice_parses_from_what_a_user_writes() {
        for off in ["0", "off", "OFF", "false", "no", " 0 "] {
            assert_eq!(off.parse::<HostPinning>(), Ok(HostPinning::Off), "{off}");
        }
        for on in ["1", "on", "reused", "yes"] {
            assert_eq!(on.parse::<HostPinning>(), Ok(HostPinning::Reused), "{on}");
        }
        assert_eq!("All".parse::<HostPinning>(), Ok(HostPinning::All));
        assert!("".parse::<HostPinning>().is_err());
    }
}
