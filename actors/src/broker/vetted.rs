//! A kernel's answers taken once, on the submitter's thread, under a panic
//! guard: the broker and the workers ask these copies, so a kernel whose
//! `items()` (or `name()`, `grain()`, `profile_key()`, `cuda()`) panics fails
//! its own job instead of the actor thread, and one whose `items()` changes
//! during its run is caught when it comes back.

use std::sync::Arc;
use std::time::Duration;

use coexec_kernels::cuda::CudaKernel;
use coexec_kernels::{Chunk, Kernel, KernelError};

use crate::ActorError;
use crate::worker::guarded;

/// `inner` with its metadata fixed at submission.
pub(crate) struct Vetted {
    inner: Arc<dyn Kernel>,
    name: String,
    items: usize,
    profile_key: String,
    grain: usize,
    has_cuda: bool,
}

fn ask<T>(name: &str, what: &'static str, f: impl FnOnce() -> T) -> Result<T, ActorError> {
    guarded(|| Ok(f())).map_err(|e| ActorError::KernelMisbehaved {
        kernel: name.to_string(),
        why: format!("{what}: {e}"),
    })
}

impl Vetted {
    /// Asks `inner` everything the runtime needs before running it.
    pub(crate) fn new(inner: Arc<dyn Kernel>) -> Result<Self, ActorError> {
        let name = ask("?", "name()", || inner.name().to_string())?;
        let items = ask(&name, "items()", || inner.items())?;
        let profile_key = ask(&name, "profile_key()", || inner.profile_key())?;
        let grain = ask(&name, "grain()", || inner.grain())?;
        let has_cuda = ask(&name, "cuda()", || inner.cuda().is_some())?;
        Ok(Self {
            inner,
            name,
            items,
            profile_key,
            grain,
            has_cuda,
        })
    }

    /// Checks, after the run, that `kernel` still has the items it had at
    /// submission: items added during the run were never computed.
    pub(crate) fn still_matches(&self, kernel: &dyn Kernel) -> Result<(), ActorError> {
        let now = ask(&self.name, "items()", || kernel.items())?;
        if now == self.items {
            Ok(())
        } else {
            Err(ActorError::KernelMisbehaved {
                kernel: self.name.clone(),
                why: format!(
                    "items() was {} at submission and {now} after the run: only 0..{} were computed",
                    self.items, self.items
                ),
            })
        }
    }
}

impl Kernel for Vetted {
    fn name(&self) -> &str {
        &self.name
    }
    fn items(&self) -> usize {
        self.items
    }
    fn profile_key(&self) -> String {
        self.profile_key.clone()
    }
    fn grain(&self) -> usize {
        self.grain
    }
    fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
        self.inner.run_cpu(chunk)
    }
    fn run_modeled(&self, chunk: &Chunk) -> Option<Result<Duration, KernelError>> {
        self.inner.run_modeled(chunk)
    }
    fn cuda(&self) -> Option<&dyn CudaKernel> {
        if self.has_cuda {
            self.inner.cuda()
        } else {
            None
        }
    }
}
