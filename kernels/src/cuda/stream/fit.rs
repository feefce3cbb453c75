//! Device memory asked of the driver before a buffer is allocated, so that
//! a buffer that cannot fit is refused with its sizes, never a CUDA
//! out-of-memory in the middle of a run.

use super::*;

/// Device memory an allocation leaves free: the other streams of this
/// process allocate too, the driver rounds allocations up to its pages,
/// and cuBLAS and module loads take some of their own.
const HEADROOM: u64 = 64 << 20;

/// What to allocate for a buffer that must hold `bytes` and would grow to
/// `grown` (at least `bytes`), with `free` bytes free on the device: the
/// grown size where it fits, else `bytes` where that fits, else the bytes
/// usable (free less the headroom) as the error.
fn fit(bytes: u64, grown: u64, free: u64) -> Result<u64, u64> {
    let usable = free.saturating_sub(HEADROOM);
    if grown <= usable {
        Ok(grown)
    } else if bytes <= usable {
        Ok(bytes)
    } else {
        Err(usable)
    }
}

impl StreamWorker {
    /// The device's free bytes, or `None` where the driver cannot say (CUDA
    /// then decides at the allocation).
    fn free_bytes(&self) -> Option<u64> {
        let (free, _total) = self.stream.context().mem_get_info().ok()?;
        Some(free as u64)
    }

    /// The bytes to allocate for a slot that must hold `bytes` and held
    /// `have` (already freed): grown by half where that fits, else exactly
    /// `bytes`; where not even that fits, [`KernelError::OutOfMemory`] with
    /// the sizes, and the runtime tries the chunk's halves.
    pub(super) fn slot_bytes(&self, bytes: usize, have: usize) -> Result<usize, KernelError> {
        let grown = Self::grown(bytes, have);
        let Some(free) = self.free_bytes() else {
            return Ok(grown);
        };
        fit(bytes as u64, grown as u64, free)
            .map(|n| n as usize)
            .map_err(|usable| KernelError::OutOfMemory {
                items: self.items,
                need: bytes as u64,
                free: usable,
            })
    }

    /// Refuses a buffer of the whole run that the device cannot hold:
    /// [`KernelError::DeviceMemory`] with the sizes.
    pub(super) fn check_run_buffer(&self, bytes: usize) -> Result<(), KernelError> {
        let Some(free) = self.free_bytes() else {
            return Ok(());
        };
        fit(bytes as u64, bytes as u64, free)
            .map(drop)
            .map_err(|usable| KernelError::DeviceMemory {
                what: "an input of the whole run",
                need: bytes as u64,
                free: usable,
                total: self.dev.info.memory_bytes,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_buffer_grows_where_it_fits_and_is_refused_with_its_sizes_where_not() {
        // Room for the grown size: grown.
        assert_eq!(fit(100 * MIB, 150 * MIB, 1024 * MIB), Ok(150 * MIB));
        // Room for the size asked, not the growth: exactly the size.
        assert_eq!(fit(100 * MIB, 150 * MIB, 200 * MIB), Ok(100 * MIB));
        // The headroom counts: 100 MiB free holds 36 MiB.
        assert_eq!(fit(40 * MIB, 40 * MIB, 100 * MIB), Err(36 * MIB));
        assert_eq!(fit(36 * MIB, 36 * MIB, 100 * MIB), Ok(36 * MIB));
        // Less free than the headroom: nothing fits.
        assert_eq!(fit(1, 1, 10 * MIB), Err(0));
    }

    #[test]
    fn the_refusals_name_the_sizes() {
        let chunk = KernelError::OutOfMemory {
            items: 4096,
            need: 3 << 30,
            free: 512 * MIB,
        };
        assert_eq!(
            chunk.to_string(),
            "device out of memory for a chunk of 4096 items: it needs 3.00 GiB, 512.0 MiB is free"
        );
        let cuda_said = KernelError::OutOfMemory {
            items: 8,
            need: 0,
            free: 0,
        };
        assert_eq!(
            cuda_said.to_string(),
            "device out of memory for a chunk of 8 items"
        );
        let run = KernelError::DeviceMemory {
            what: "an input of the whole run",
            need: 90 << 30,
            free: 70 << 30,
            total: 80 << 30,
        };
        assert_eq!(
            run.to_string(),
            "an input of the whole run needs 90.00 GiB of device memory; 70.00 GiB of 80.00 GiB is free"
        );
    }
}
