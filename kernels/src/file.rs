//! Reading an input file whole, safely: a regular file only, and never more
//! bytes than the caller allows.

use std::io::Read;
use std::path::Path;

use crate::KernelError;

/// The bytes of the regular file `path`, at most `max_bytes` of them.
///
/// Anything else is refused before it is opened, with an error naming the
/// file: a FIFO (opening it blocks until a writer comes), a device such as
/// `/dev/zero` (it reports no length and never ends), a folder, a socket;
/// symbolic links are followed to what they name. The cap holds while
/// reading too, for a file that grows after its length was read.
///
/// ```
/// let path = std::env::temp_dir().join(format!("coexec-read-doc-{}", std::process::id()));
/// std::fs::write(&path, b"0123456789").unwrap();
/// assert_eq!(coexec_kernels::read_file(&path, 10).unwrap(), b"0123456789");
/// assert!(coexec_kernels::read_file(&path, 9).is_err()); // over the cap
/// assert!(coexec_kernels::read_file(std::path::Path::new("/dev/zero"), 1 << 20).is_err());
/// # std::fs::remove_file(&path).unwrap();
/// ```
pub fn read_file(path: &Path, max_bytes: u64) -> Result<Vec<u8>, KernelError> {
    let io = |source| KernelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let refuse = |why: String| KernelError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, why),
    };
    let file = open_regular(path)?;
    let meta = file.metadata().map_err(io)?;
    let over = |n: u64| {
        refuse(format!(
            "{n} bytes, over the {max_bytes} this input may take"
        ))
    };
    if meta.len() > max_bytes {
        return Err(over(meta.len()));
    }
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(meta.len() as usize)
        .map_err(|e| refuse(format!("cannot allocate {} bytes: {e}", meta.len())))?;
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > max_bytes {
        return Err(over(bytes.len() as u64));
    }
    Ok(bytes)
}

/// The regular file `path`, opened for reading; anything else refused
/// before it is opened, as [`read_file`] does, and checked again once open
/// (a path swapped for a FIFO or a device in between is refused too).
///
/// For a reader that streams a file too large to hold (a corpus).
///
/// ```
/// assert!(coexec_kernels::open_regular(std::path::Path::new("/dev/zero")).is_err());
/// assert!(coexec_kernels::open_regular(std::path::Path::new("/")).is_err());
/// ```
pub fn open_regular(path: &Path) -> Result<std::fs::File, KernelError> {
    let io = |source| KernelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let refuse = |meta: &std::fs::Metadata| KernelError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "not a regular file but {}: refused (it may block or never end)",
                kind(meta)
            ),
        ),
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_file() {
        return Err(refuse(&meta));
    }
    let file = std::fs::File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(refuse(&meta));
    }
    Ok(file)
}

/// What a path that is not a regular file is, in words.
fn kind(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        return "a folder";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_char_device() || t.is_block_device() {
            return "a device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    "not a file"
}
