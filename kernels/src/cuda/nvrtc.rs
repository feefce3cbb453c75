//! Run-time compilation of `src/cu/*.cu` with NVRTC, once per process,
//! architecture and math mode.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char};
use std::sync::{Mutex, OnceLock};

use cudarc::nvrtc::{Ptx, result, sys};

use super::guarded;
use crate::KernelError;

/// A CUDA C source: one of this crate's, or a declared twin's.
#[derive(Debug)]
pub(crate) struct Program {
    /// File name, for errors.
    pub(crate) name: &'static str,
    /// The source text.
    pub(crate) src: &'static str,
}

impl Program {
    /// What identifies the source in the caches: its name and where its
    /// text lives (a user's `"kernel.cu"` is not this crate's).
    pub(crate) fn key(&self) -> (&'static str, usize) {
        (self.name, self.src.as_ptr() as usize)
    }
}

macro_rules! program {
    ($name:ident, $file:literal) => {
        pub(crate) const $name: Program = Program {
            name: $file,
            src: include_str!(concat!("../cu/", $file)),
        };
    };
}

program!(SYNTHETIC, "synthetic.cu");
#[cfg(feature = "workloads")]
program!(MATMUL, "matmul.cu");
#[cfg(feature = "workloads")]
program!(PATHFINDER, "pathfinder.cu");
#[cfg(feature = "workloads")]
program!(MLP, "mlp.cu");
#[cfg(feature = "bert")]
program!(BERT, "bert.cu");

/// Whether an NVRTC library can be opened. Only `dlopen`s.
fn libnvrtc_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to open the candidate library names.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// The compiled image of `program` for compute capability `cc`.
///
/// Compiles for the real architecture (`sm_XY`, a CUBIN the driver loads
/// as is); if NVRTC refuses that architecture, for the virtual one
/// (`compute_XY`, PTX the driver JIT-compiles). Deterministic mode adds
/// `--fmad=false` so no multiply and add are fused into one rounding; IEEE
/// division and square root are NVRTC's defaults and stay on in both modes.
pub(super) fn compile(
    program: &Program,
    cc: (u32, u32),
    deterministic: bool,
) -> Result<Ptx, KernelError> {
    type Key = ((&'static str, usize), (u32, u32), bool);
    static CACHE: OnceLock<Mutex<HashMap<Key, Ptx>>> = OnceLock::new();
    if !libnvrtc_present() {
        return Err(KernelError::CudaUnavailable(
            "no NVRTC library (libnvrtc) found; put the CUDA toolkit's lib64 on LD_LIBRARY_PATH"
                .into(),
        ));
    }
    // Held while compiling: two streams asking at once wait for one compile.
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let key = (program.key(), cc, deterministic);
    if let Some(p) = cache.get(&key) {
        return Ok(p.clone());
    }
    let mut opts = vec![
        format!("--fmad={}", !deterministic),
        "--prec-div=true".to_string(),
        "--prec-sqrt=true".to_string(),
        "--ftz=false".to_string(),
        "--std=c++17".to_string(),
    ];
    let (major, minor) = cc;
    opts.push(format!("--gpu-architecture=sm_{major}{minor}"));
    let image = match guarded("NVRTC", || build(program, &opts, true)) {
        Ok(image) => image,
        Err(real) => {
            opts.pop();
            opts.push(format!("--gpu-architecture=compute_{major}{minor}"));
            guarded("NVRTC", || build(program, &opts, false)).map_err(|virt| {
                KernelError::Cuda(format!(
                    "compiling {} for sm_{major}{minor}: {real}; for compute_{major}{minor}: {virt}",
                    program.name
                ))
            })?
        }
    };
    cache.insert(key, image.clone());
    Ok(image)
}

/// One NVRTC compile: a CUBIN when `cubin`, else PTX.
fn build(program: &Program, opts: &[String], cubin: bool) -> Result<Ptx, KernelError> {
    let src = CString::new(program.src)
        .map_err(|_| KernelError::invalid("CUDA source", "contains a NUL byte"))?;
    let name = CString::new(program.name)
        .map_err(|_| KernelError::invalid("CUDA source name", "contains a NUL byte"))?;
    let prog = Prog(result::create_program(&src, Some(&name)).map_err(nv)?);
    // SAFETY: `prog.0` was just created and is destroyed only by `Prog`'s drop.
    if let Err(e) = unsafe { result::compile_program(prog.0, opts) } {
        // SAFETY: as above; the log is NUL-terminated by NVRTC.
        let log = unsafe { result::get_program_log(prog.0) }
            .map(|l| {
                // SAFETY: NVRTC writes a NUL-terminated string of the size it reported.
                unsafe { CStr::from_ptr(l.as_ptr()) }
                    .to_string_lossy()
                    .into_owned()
            })
            .unwrap_or_default();
        return Err(KernelError::Cuda(format!(
            "{} ({}): {e:?}\n{log}",
            program.name,
            opts.join(" ")
        )));
    }
    if !cubin {
        // SAFETY: `prog.0` is valid and compiled.
        let ptx = unsafe { result::get_ptx(prog.0) }.map_err(nv)?;
        let bytes = ptx.iter().map(|&c| c as u8).collect::<Vec<u8>>();
        return Ok(Ptx::from_binary(bytes));
    }
    let mut size = 0usize;
    // SAFETY: `prog.0` is valid and compiled; `size` is a live out-pointer.
    unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) }
        .result()
        .map_err(nv)?;
    if size == 0 {
        return Err(KernelError::Cuda(format!(
            "{}: NVRTC produced no CUBIN",
            program.name
        )));
    }
    let mut bytes = vec![0u8; size];
    // SAFETY: `bytes` holds the `size` bytes NVRTC said it will write.
    unsafe { sys::nvrtcGetCUBIN(prog.0, bytes.as_mut_ptr() as *mut c_char) }
        .result()
        .map_err(nv)?;
    Ok(Ptx::from_binary(bytes))
}

/// Destroys the NVRTC program on every path out of [`build`].
struct Prog(sys::nvrtcProgram);

impl Drop for Prog {
    fn drop(&mut self) {
        // SAFETY: created by `create_program` and destroyed only here.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

fn nv(e: result::NvrtcError) -> KernelError {
    KernelError::Cuda(format!("NVRTC: {e:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_embedded_and_export_c_names() {
        #[allow(unused_mut)]
        let mut programs = vec![&SYNTHETIC];
        #[cfg(feature = "workloads")]
        programs.extend([&MATMUL, &PATHFINDER, &MLP]);
        #[cfg(feature = "bert")]
        programs.push(&BERT);
        for p in programs {
            assert!(p.src.contains("extern \"C\" __global__"), "{}", p.name);
            assert!(!p.src.contains('\0'), "{}", p.name);
            // NVRTC has no standard headers unless told where they are.
            assert!(!p.src.contains("#include"), "{} includes a header", p.name);
        }
    }
}
