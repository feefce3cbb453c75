//! The driver: is it there, what devices it sees, and one shared context per
//! device.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::result::{self as cu, DriverError};
use cudarc::driver::sys::{self, CUctx_flags, CUdevice_attribute, CUresult};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};

use super::nvrtc::{self, Program};
use super::stream::RunCache;
use super::{GpuInfo, guarded};
use crate::KernelError;

const NO_LIBCUDA: &str = "no CUDA driver (libcuda) found";

/// Whether a CUDA driver library can be opened. Only `dlopen`s; calls nothing.
pub(super) fn libcuda_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries to open the candidate library names
    // (running their initialisers, as any dlopen does) and closes them again.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// `cuInit`, once per process. `Ok(false)` when the driver works but sees no
/// device.
fn init() -> Result<bool, KernelError> {
    static INIT: OnceLock<Result<bool, String>> = OnceLock::new();
    INIT.get_or_init(|| {
        if !libcuda_present() {
            return Err(NO_LIBCUDA.to_string());
        }
        let r = guarded("loading libcuda", || match cu::init() {
            Ok(()) => Ok(true),
            Err(DriverError(CUresult::CUDA_ERROR_NO_DEVICE)) => Ok(false),
            Err(e) => Err(KernelError::CudaUnavailable(format!("cuInit failed: {e}"))),
        });
        r.map_err(|e| match e {
            KernelError::CudaUnavailable(m) => m,
            other => other.to_string(),
        })
    })
    .clone()
    .map_err(KernelError::CudaUnavailable)
}

/// Number of visible devices; `None` when the driver sees none.
pub(super) fn device_count() -> Result<Option<usize>, KernelError> {
    if !init()? {
        return Ok(None);
    }
    let n = guarded("cuDeviceGetCount", || {
        cu::device::get_count().map_err(error)
    })?;
    Ok((n > 0).then_some(n as usize))
}

/// What `devices()` says about ordinal `id`, without creating a context.
pub(super) fn info(id: usize) -> Result<GpuInfo, KernelError> {
    guarded("querying a device", || {
        let dev = cu::device::get(id as i32).map_err(error)?;
        let attr = |a: CUdevice_attribute| -> Result<u32, KernelError> {
            // SAFETY: `dev` came from `cuDeviceGet` just above.
            let v = unsafe { cu::device::get_attribute(dev, a) }.map_err(error)?;
            Ok(v.max(0) as u32)
        };
        // SAFETY: as above.
        let memory = unsafe { cu::device::total_mem(dev) }.map_err(error)?;
        Ok(GpuInfo {
            id,
            name: cu::device::get_name(dev).map_err(error)?,
            memory_bytes: memory as u64,
            sm_count: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            compute_capability: (
                attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
        })
    })
}

/// A driver error as a kernel error. Allocation failures become
/// [`KernelError::OutOfMemory`] through [`error_for`] where the chunk size is
/// known.
pub(super) fn error(e: DriverError) -> KernelError {
    KernelError::Cuda(e.to_string())
}

/// A driver error met while running a chunk of `items` items.
pub(super) fn error_for(items: usize) -> impl Fn(DriverError) -> KernelError {
    move |e| match e.0 {
        CUresult::CUDA_ERROR_OUT_OF_MEMORY => KernelError::OutOfMemory {
            items,
            need: 0,
            free: 0,
        },
        _ => error(e),
    }
}

/// What every stream of one device shares: the context, the loaded modules and
/// the run cache.
/// A loaded module's program ([`Program::key`]) and math mode.
type ModuleKey = ((&'static str, usize), bool);

pub(crate) struct Device {
    pub(super) info: GpuInfo,
    pub(super) ctx: Arc<CudaContext>,
    /// Loaded modules by (program, deterministic).
    modules: Mutex<HashMap<ModuleKey, Arc<CudaModule>>>,
    /// Each loaded function's parameter sizes (by its handle), asked of
    /// the driver once.
    params: Mutex<HashMap<usize, Arc<[usize]>>>,
    pub(super) run_cache: RunCache,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// The shared state of device `ordinal`, created on first use and kept for the
/// life of the process.
pub(super) fn device(ordinal: usize) -> Result<Arc<Device>, KernelError> {
    static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<Device>>>> = OnceLock::new();
    let count = device_count()?.unwrap_or(0);
    if ordinal >= count {
        return Err(KernelError::CudaUnavailable(format!(
            "no CUDA device {ordinal} ({count} visible)"
        )));
    }
    let mut map = DEVICES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(d) = map.get(&ordinal) {
        return Ok(d.clone());
    }
    let d = Arc::new(guarded("creating a CUDA context", || open(ordinal))?);
    map.insert(ordinal, d.clone());
    Ok(d)
}

/// Opens the primary context of `ordinal` with blocking synchronisation.
///
/// cudarc's `CudaContext::new` retains the device's primary context and takes
/// no flags, so the scheduling flag is set on the primary context first with
/// `cuDevicePrimaryCtxSetFlags_v2` (allowed even while the context is active
/// since CUDA 11), keeping any non-scheduling flags another user of the
/// context set. With `CU_CTX_SCHED_BLOCKING_SYNC` a thread waiting in
/// `cuStreamSynchronize` sleeps on an interrupt instead of spinning, so a GPU
/// worker thread does not eat the CPU core a CPU worker needs.
fn open(ordinal: usize) -> Result<Device, KernelError> {
    let info = info(ordinal)?;
    let dev = cu::device::get(ordinal as i32).map_err(error)?;
    let mut flags: std::ffi::c_uint = 0;
    let mut active: std::ffi::c_int = 0;
    // SAFETY: `dev` is a valid device handle; both out-pointers point to live
    // locals of the right types.
    unsafe { sys::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active) }
        .result()
        .map_err(error)?;
    let flags = (flags & !(CUctx_flags::CU_CTX_SCHED_MASK as u32))
        | CUctx_flags::CU_CTX_SCHED_BLOCKING_SYNC as u32;
    // SAFETY: `dev` is valid; the flags are a valid combination (one scheduling
    // policy plus the flags that were already set).
    unsafe { sys::cuDevicePrimaryCtxSetFlags_v2(dev, flags) }
        .result()
        .map_err(error)?;
    let ctx = CudaContext::new(ordinal).map_err(error)?;
    // Each worker synchronises its own stream before it touches its buffers
    // again, and run-cache uploads are synchronised before any other stream
    // sees them, so cudarc's per-buffer event tracking would only add an event
    // record per use (and race between threads recording the same event).
    // SAFETY: called before any buffer of this context exists, so no buffer
    // is left half-tracked; the synchronisation duties are met as said above.
    unsafe { ctx.disable_event_tracking() };
    Ok(Device {
        info,
        ctx,
        modules: Mutex::new(HashMap::new()),
        params: Mutex::new(HashMap::new()),
        run_cache: RunCache::default(),
    })
}

impl Device {
    /// The sizes in bytes of `f`'s parameters, in order, as the driver
    /// reports them (`cuFuncGetParamInfo`, CUDA 12.4 and later drivers; on
    /// an older driver the missing symbol is an error, so a launch that
    /// cannot be checked does not happen).
    pub(super) fn param_sizes(&self, f: &CudaFunction) -> Result<Arc<[usize]>, KernelError> {
        let key = f.cu_function() as usize;
        let mut known = self.params.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = known.get(&key) {
            return Ok(p.clone());
        }
        let sizes = guarded("asking a kernel's parameters", || {
            let h = f.cu_function();
            let mut sizes = Vec::new();
            // Index by index until the driver says there is no such
            // parameter (the count query is CUDA 13.2's; this works from
            // 12.4). A kernel takes at most 32 764 bytes of parameters.
            while sizes.len() < 32_768 {
                let (mut offset, mut size) = (0usize, 0usize);
                // SAFETY: `h` is a function of a module `f` holds loaded;
                // both out-pointers are live locals.
                let r = unsafe { sys::cuFuncGetParamInfo(h, sizes.len(), &mut offset, &mut size) };
                match r {
                    CUresult::CUDA_SUCCESS => sizes.push(size),
                    CUresult::CUDA_ERROR_INVALID_VALUE => break,
                    other => return Err(error(other.result().expect_err("not success"))),
                }
            }
            Ok(Arc::<[usize]>::from(sizes))
        })?;
        known.insert(key, sizes.clone());
        Ok(sizes)
    }

    /// Function `name` of `program`, compiling and loading the program on
    /// first use (per process and device; the NVRTC output is shared by devices
    /// of the same architecture).
    pub(super) fn function(
        &self,
        program: &Program,
        name: &str,
        deterministic: bool,
    ) -> Result<CudaFunction, KernelError> {
        let module = {
            let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
            match modules.get(&(program.key(), deterministic)) {
                Some(m) => m.clone(),
                None => {
                    let image =
                        nvrtc::compile(program, self.info.compute_capability, deterministic)?;
                    let m = self
                        .ctx
                        .load_module(image)
                        .map_err(|e| KernelError::Cuda(format!("loading {}: {e}", program.name)))?;
                    modules.insert((program.key(), deterministic), m.clone());
                    m
                }
            }
        };
        module
            .load_function(name)
            .map_err(|e| KernelError::Cuda(format!("{}: no function `{name}`: {e}", program.name)))
    }
}
