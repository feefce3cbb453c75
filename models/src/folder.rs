//! A model folder's small JSON files (Hugging Face's `config.json`,
//! sentence-transformers' module files), read with errors that name the
//! file and the line or field.

use std::path::Path;

use serde::de::DeserializeOwned;

use coexec_kernels::KernelError;

/// A model folder's JSON files are a few KiB: past this, not read.
const MAX_JSON_BYTES: u64 = 16 << 20;

/// The largest width, depth or vocabulary taken: far past any encoder
/// served, and a bound on what a hostile config can make the loader
/// allocate.
pub(crate) const MAX_DIM: usize = 1 << 20;

/// A [`KernelError::Config`] naming the file and the field.
pub(crate) fn config_err(path: &Path, field: &'static str, why: impl Into<String>) -> KernelError {
    KernelError::Config {
        path: path.to_path_buf(),
        field,
        why: why.into(),
    }
}

/// The bytes of `path`; `None` when the file does not exist. A symbolic
/// link to nothing is an error, not an absent file: it says the file was
/// meant to be there (a model copied without its target), and taking it
/// as absent would serve another pooling, length or module list.
pub(crate) fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, KernelError> {
    match coexec_kernels::read_file(path, MAX_JSON_BYTES) {
        Ok(b) => Ok(Some(b)),
        Err(KernelError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            match std::fs::read_link(path) {
                Ok(target) => Err(KernelError::Io {
                    path: path.to_path_buf(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!(
                            "a symbolic link to {}, which does not exist",
                            target.display()
                        ),
                    ),
                }),
                Err(_) => Ok(None),
            }
        }
        Err(e) => Err(e),
    }
}

/// `bytes` (the file `path`) as `T`; a JSON or type error names the file
/// and its line.
pub(crate) fn parse<T: DeserializeOwned>(path: &Path, bytes: &[u8]) -> Result<T, KernelError> {
    serde_json::from_slice(bytes).map_err(|e| KernelError::Input {
        path: path.to_path_buf(),
        line: e.line(),
        why: e.to_string(),
    })
}

/// The JSON file `path` as `T`; `None` when it does not exist
/// ([`read_optional`]).
pub(crate) fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, KernelError> {
    read_optional(path)?.map(|b| parse(path, &b)).transpose()
}

/// A dimension read from a config: a whole number from 1 to [`MAX_DIM`]
/// (serde's error, with the file's line, for anything else).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dim(pub(crate) usize);

impl<'de> serde::Deserialize<'de> for Dim {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = u64::deserialize(d)?;
        if n == 0 || n > MAX_DIM as u64 {
            return Err(serde::de::Error::custom(format_args!(
                "{n}; expected a whole number from 1 to {MAX_DIM}"
            )));
        }
        Ok(Dim(n as usize))
    }
}
