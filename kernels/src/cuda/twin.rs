//! Declared twins ([`GpuTwin`]) run on a stream: the source compiled once
//! per device, run inputs through the run cache, the chunk's item inputs
//! uploaded, one device buffer per output holding the chunk's elements and
//! nothing else, and those brought back into the chunk's part of each
//! output buffer.

use super::nvrtc::Program;
use cudarc::driver::LaunchConfig;

use super::CudaKernel;
use super::stream::{Arg, DevPtr, Out, StreamWorker, grid_1d};
use crate::twin::{Scalar, Twin, TwinArg};
use crate::{Chunk, GpuTwin, KernelError};

/// Threads per launch at most: grids index threads with 32-bit integers.
const MAX_THREADS: u64 = u32::MAX as u64;

/// A launch argument: a device address or a scalar.
enum Value {
    Ptr(DevPtr),
    Scalar(Scalar),
}

impl Value {
    fn arg(&self) -> &dyn Arg {
        match self {
            Value::Ptr(p) => p,
            Value::Scalar(Scalar::U8(v)) => v,
            Value::Scalar(Scalar::I32(v)) => v,
            Value::Scalar(Scalar::U32(v)) => v,
            Value::Scalar(Scalar::I64(v)) => v,
            Value::Scalar(Scalar::U64(v)) => v,
            Value::Scalar(Scalar::F32(v)) => v,
            Value::Scalar(Scalar::F64(v)) => v,
        }
    }
}

/// Bytes an argument takes in the launch's parameter list: a device
/// address for buffers, the value's size for scalars.
fn param_bytes(a: &TwinArg<'_>) -> usize {
    match a {
        TwinArg::Run { .. } | TwinArg::Items { .. } | TwinArg::Out { .. } => 8,
        TwinArg::Scalar(Scalar::U8(_)) => 1,
        TwinArg::Scalar(Scalar::I32(_) | Scalar::U32(_) | Scalar::F32(_)) => 4,
        TwinArg::Scalar(Scalar::I64(_) | Scalar::U64(_) | Scalar::F64(_)) => 8,
    }
}

/// Checks a launch's parameter sizes (bytes, in order) against the
/// compiled entry point's, as the driver reports them: a launch that
/// passed fewer or smaller arguments than the kernel takes would have the
/// driver read past the host's argument array. The answer names the first
/// difference.
pub(super) fn check_signature(declared: &[usize], kernel: &[usize]) -> Result<(), String> {
    if let Some(i) = (0..declared.len().min(kernel.len())).find(|&i| declared[i] != kernel[i]) {
        return Err(format!(
            "parameter {i} takes {} bytes, the twin passes {} (kernel {kernel:?}, twin \
             {declared:?}, in bytes)",
            kernel[i], declared[i]
        ));
    }
    if declared.len() != kernel.len() {
        return Err(format!(
            "the kernel takes {} parameters, the twin passes {} (kernel {kernel:?}, twin \
             {declared:?}, in bytes)",
            kernel.len(),
            declared.len()
        ));
    }
    Ok(())
}

fn program(t: &Twin<'_>) -> Program {
    Program {
        name: t.source.name,
        src: t.source.text,
    }
}

fn invalid(t: &Twin<'_>, why: String) -> KernelError {
    KernelError::invalid(
        "GPU twin",
        format!("{} `{}`: {why}", t.source.name, t.entry),
    )
}

impl<K: GpuTwin> CudaKernel for K {
    fn prepare(&self, w: &mut StreamWorker) -> Result<(), KernelError> {
        let t = self.twin();
        w.function(&program(&t), t.entry).map(drop)
    }

    fn stage(&self, w: &mut StreamWorker) -> Result<(), KernelError> {
        let t = self.twin();
        for a in &t.args {
            match a {
                TwinArg::Run { id, bytes, .. } => drop(w.run_input::<u8>(*id, bytes)?),
                // Copied straight from and to while they live, where locked.
                TwinArg::Items { host: Some(h), .. } => {
                    let _ = w.pin(h.pinnable, true);
                }
                TwinArg::Items { host: None, .. } => {}
                TwinArg::Out { buf, .. } => {
                    let _ = w.pin(buf.pinnable(), true);
                }
                TwinArg::Scalar(_) => {}
            }
        }
        Ok(())
    }

    fn threads_per_item(&self) -> usize {
        self.twin().threads_per_item
    }

    fn run_cuda(&self, w: &mut StreamWorker, chunk: &Chunk) -> Result<(), KernelError> {
        let t = self.twin();
        let (items, grain) = (self.items(), self.grain().max(1));
        let (lo, n) = (chunk.lo(), chunk.len());
        if chunk.hi() > items {
            return Err(invalid(
                &t,
                format!("chunk {lo}..{} past {items} items", chunk.hi()),
            ));
        }
        let threads = n as u64 * t.threads_per_item as u64;
        if threads > MAX_THREADS {
            return Err(invalid(
                &t,
                format!(
                    "{n} items × {} threads exceed one launch",
                    t.threads_per_item
                ),
            ));
        }
        let blocks = n.div_ceil(grain);
        let mut values = Vec::with_capacity(t.args.len());
        // Each output's slot and the chunk's part of it, taken once.
        let mut dsts: Vec<Out<'_>> = Vec::new();
        for (slot, a) in t.args.iter().enumerate() {
            let v = match a {
                TwinArg::Run { id, bytes } => {
                    let buf = w.run_input::<u8>(*id, bytes)?;
                    Value::Ptr(w.addr(&buf))
                }
                TwinArg::Items {
                    bytes,
                    item_bytes,
                    host,
                } => {
                    let need = items * item_bytes;
                    if bytes.len() < need {
                        return Err(invalid(
                            &t,
                            format!(
                                "an item input of {} bytes for {items} items of {item_bytes}",
                                bytes.len()
                            ),
                        ));
                    }
                    let part = &bytes[lo * item_bytes..(lo + n) * item_bytes];
                    Value::Ptr(match host {
                        Some(h) => w.upload_from::<u8>(slot, part, h.pin)?,
                        None => w.upload::<u8>(slot, &[part])?,
                    })
                }
                TwinArg::Out {
                    buf,
                    blocks: by_block,
                    input,
                } => {
                    let want = if *by_block {
                        items.div_ceil(grain)
                    } else {
                        items
                    };
                    if buf.len() < want {
                        return Err(invalid(
                            &t,
                            format!("an output of {} entries for {want}", buf.len()),
                        ));
                    }
                    let dst = buf.chunk_bytes(chunk, by_block.then_some(grain));
                    let ptr = if *input {
                        w.upload_from::<u8>(slot, dst, buf.pin())?
                    } else {
                        w.scratch::<u8>(slot, dst.len())?
                    };
                    dsts.push(Out::new::<u8>(slot, 0, dst, buf.pin()));
                    Value::Ptr(ptr)
                }
                TwinArg::Scalar(s) => Value::Scalar(*s),
            };
            values.push(v);
        }
        let f = w.function(&program(&t), t.entry)?;
        // What the launch passes against what the compiled kernel takes:
        // a declaration that differs never launches.
        let declared: Vec<usize> = [8, 4]
            .into_iter()
            .chain(t.args.iter().map(param_bytes))
            .collect();
        check_signature(&declared, &w.param_sizes(&f)?)
            .map_err(|why| invalid(&t, format!("{why}; the first two are `lo` and `n`")))?;
        let (lo64, n32) = (lo as u64, n as u32);
        let mut args: Vec<&dyn Arg> = vec![&lo64, &n32];
        args.extend(values.iter().map(Value::arg));
        let cfg = if t.per_grain {
            LaunchConfig {
                grid_dim: (u32::try_from(blocks).unwrap_or(u32::MAX), 1, 1),
                block_dim: (t.block, 1, 1),
                shared_mem_bytes: 0,
            }
        } else {
            grid_1d(threads as usize, t.block)
        };
        // SAFETY: the arguments are `(u64 lo, u32 n, …)` then one per
        // declared argument in order, and the compiled kernel takes exactly
        // as many parameters of exactly those sizes (checked just above
        // against the driver's report, so the driver reads no further than
        // the argument array); every pointer is a device buffer of this stream holding
        // the declared extent (checked above against the buffers' sizes),
        // valid until `finish_into` has synchronised the stream. Host memory
        // is written only by `finish_into`, into the chunk's own part of
        // each output buffer.
        unsafe { w.launch(&f, cfg, &args)? };
        w.finish_into(&mut dsts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CudaSource, DisjointBuf, TwinInput};

    #[test]
    fn the_signature_check_names_the_first_difference() {
        assert_eq!(check_signature(&[8, 4, 8, 1], &[8, 4, 8, 1]), Ok(()));
        let fewer = check_signature(&[8, 4, 8], &[8, 4, 8, 4]).unwrap_err();
        assert!(
            fewer.contains("takes 4 parameters, the twin passes 3"),
            "{fewer}"
        );
        let more = check_signature(&[8, 4, 8, 8], &[8, 4, 8]).unwrap_err();
        assert!(
            more.contains("takes 3 parameters, the twin passes 4"),
            "{more}"
        );
        let size = check_signature(&[8, 4, 4, 8], &[8, 4, 8, 8]).unwrap_err();
        assert!(
            size.contains("parameter 2 takes 8 bytes, the twin passes 4"),
            "{size}"
        );
    }

    #[test]
    fn declared_sizes_are_addresses_and_scalar_widths() {
        const SRC: CudaSource = CudaSource::new("k.cu", "");
        let x = TwinInput::new(vec![1.0f32; 4]);
        let y: DisjointBuf<f32> = DisjointBuf::new(4, 1);
        let t = Twin::new(&SRC, "k")
            .item_input(&x, 1)
            .output(&y)
            .scalar(3u8)
            .scalar(2.5f32)
            .scalar(7u64);
        let sizes: Vec<usize> = t.args.iter().map(param_bytes).collect();
        assert_eq!(sizes, [8, 8, 1, 4, 8]);
    }
}
