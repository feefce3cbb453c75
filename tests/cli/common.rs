//! What the CLI tests share.

/// `coexec args…` with a profile folder of this call's own (no state shared
/// between tests or left from an earlier run; removed after) and none of
/// the environment that would change its defaults: (exit code, stdout,
/// stderr). `tag` names the folder.
pub fn coexec(tag: &str, args: &[&str]) -> (i32, String, String) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    let profiles = std::env::temp_dir().join(format!("{tag}-{}-{n}", std::process::id()));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_coexec"))
        .args(args)
        .env("COEXEC_PROFILE_DIR", &profiles)
        .env("COEXEC_INDEX_DIR", profiles.join("corpus-index"))
        .env_remove("COEXEC_DEVICES")
        .env_remove("COEXEC_POLICY")
        .env_remove("RUST_LOG")
        .output()
        .expect("run coexec");
    let _ = std::fs::remove_dir_all(&profiles);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// all-MiniLM-L6-v2's folder (`COEXEC_EMBED_MODEL`, else where
/// `scripts/fetch_model.sh` caches it), or `None` and a line saying `test`
/// is skipped.
pub fn embed_model(test: &str) -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    let dir = std::env::var_os("COEXEC_EMBED_MODEL")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| PathBuf::from(h).join(".cache/coexec/models/all-MiniLM-L6-v2"))
        })?;
    if dir.join("model.safetensors").is_file() {
        Some(dir)
    } else {
        eprintln!(
            "{test}: skipped, no model at {} (scripts/fetch_model.sh fetches it)",
            dir.display()
        );
        None
    }
}

/// A copy of the model folder `model` under the temporary directory, named
/// by `tag`, its files links to the real ones (90 MB not copied) until
/// [`Hostile::write`] replaces one: a model folder with one edit, as a
/// careless user or a broken download leaves it. Removed on drop.
pub struct Hostile {
    pub dir: std::path::PathBuf,
    model: std::path::PathBuf,
}

impl Hostile {
    pub fn new(model: &std::path::Path, tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("coexec-hostile-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for file in [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "sentence_bert_config.json",
            "1_Pooling/config.json",
        ] {
            let (from, to) = (model.join(file), dir.join(file));
            if from.exists() {
                std::fs::create_dir_all(to.parent().unwrap()).unwrap();
                std::os::unix::fs::symlink(&from, &to).unwrap();
            }
        }
        Self {
            dir,
            model: model.to_path_buf(),
        }
    }

    /// The real model's `file`.
    pub fn read(&self, file: &str) -> Vec<u8> {
        std::fs::read(self.model.join(file)).unwrap()
    }

    /// The real model's JSON `file`, edited by `edit`, in place of the link.
    pub fn edit_json(&self, file: &str, edit: impl FnOnce(&mut serde_json::Value)) {
        let mut v: serde_json::Value = serde_json::from_slice(&self.read(file)).unwrap();
        edit(&mut v);
        self.write(file, v.to_string().as_bytes());
    }

    /// `bytes` as `file`, in place of the link.
    pub fn write(&self, file: &str, bytes: &[u8]) {
        let path = self.dir.join(file);
        let _ = std::fs::remove_file(&path);
        std::fs::write(path, bytes).unwrap();
    }

    /// The folder as a command-line argument.
    pub fn arg(&self) -> &str {
        self.dir.to_str().unwrap()
    }

    /// A copy of `model` whose query and key weights are scaled by 1e19:
    /// attention's scores overflow, and every vector is NaN.
    pub fn overflowing(model: &std::path::Path, tag: &str) -> Self {
        use safetensors::tensor::TensorView;
        let h = Self::new(model, tag);
        let bytes = h.read("model.safetensors");
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = st
            .tensors()
            .into_iter()
            .map(|(name, t)| {
                let data = if name.ends_with("attention.self.query.weight")
                    || name.ends_with("attention.self.key.weight")
                {
                    assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
                    t.data()
                        .chunks_exact(4)
                        .flat_map(|b| {
                            (f32::from_le_bytes(b.try_into().unwrap()) * 1e19).to_le_bytes()
                        })
                        .collect()
                } else {
                    t.data().to_vec()
                };
                (name, t.dtype(), t.shape().to_vec(), data)
            })
            .collect();
        let views: Vec<(String, TensorView<'_>)> = tensors
            .iter()
            .map(|(n, dtype, s, d)| (n.clone(), TensorView::new(*dtype, s.clone(), d).unwrap()))
            .collect();
        h.write(
            "model.safetensors",
            &safetensors::serialize(views, None).unwrap(),
        );
        h
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
