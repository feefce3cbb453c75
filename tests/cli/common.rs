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
/// `scripts/fetch_model.sh` caches it) where its weights are there.
fn minilm_dir() -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    let dir = std::env::var_os("COEXEC_EMBED_MODEL")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| PathBuf::from(h).join(".cache/coexec/models/all-MiniLM-L6-v2"))
        })?;
    dir.join("model.safetensors").is_file().then_some(dir)
}

/// tests/data/tiny-bert: a BERT of all-MiniLM-L6-v2's layout and files,
/// 32 wide, 2 layers, 357 word pieces, random weights
/// (`scripts/make_tiny_bert.py` writes it).
pub fn tiny_bert() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tiny-bert")
}

/// Whether this run is CI's (`COEXEC_CI=1`, as `.ci/run` sets it), where
/// what a test needs has been fetched, and its absence is a failure.
pub fn in_ci() -> bool {
    std::env::var("COEXEC_CI").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// `test` cannot run without `what`: a line saying it is skipped, or,
/// in CI ([`in_ci`]), a failure.
pub fn missing(test: &str, what: &str) {
    assert!(
        !in_ci(),
        "{test}: {what}, and COEXEC_CI is set: .ci/run fetches it, so this is a failure, not a skip"
    );
    eprintln!("{test}: skipped, {what}");
}

/// all-MiniLM-L6-v2, for the tests of its own numbers (its similarities,
/// the fp64 reference): `None` where it is not here, with a line saying
/// `test` is skipped, or a failure in CI ([`missing`]).
pub fn minilm(test: &str) -> Option<std::path::PathBuf> {
    let dir = minilm_dir();
    if dir.is_none() {
        missing(
            test,
            "all-MiniLM-L6-v2 is not here (COEXEC_EMBED_MODEL, or scripts/fetch_model.sh's cache)",
        );
    }
    dir
}

/// The sentence encoder the route, pipeline and hostile-folder tests run
/// on: all-MiniLM-L6-v2 where it is here, else [`tiny_bert`]. What they
/// assert of it (its width, its vocabulary's ids) is read from its files.
pub struct EmbedModel {
    pub dir: std::path::PathBuf,
    /// Whether it is all-MiniLM-L6-v2 (not the tiny model), whose vectors
    /// mean something.
    pub minilm: bool,
    /// Its vectors' width (`hidden_size`).
    pub dim: usize,
    /// Its embedding matrix's rows (`vocab_size`).
    pub vocab_size: usize,
    vocab: serde_json::Value,
}

impl EmbedModel {
    /// The folder as a command-line argument.
    pub fn arg(&self) -> &str {
        self.dir.to_str().unwrap()
    }

    /// The id of `token` in its tokenizer.json's vocabulary.
    pub fn id(&self, token: &str) -> u64 {
        self.vocab[token]
            .as_u64()
            .unwrap_or_else(|| panic!("{token:?} is not in {}", self.dir.display()))
    }

    /// The ids of `tokens`.
    pub fn ids(&self, tokens: &[&str]) -> Vec<u64> {
        tokens.iter().map(|t| self.id(t)).collect()
    }
}

/// [`EmbedModel`] for `test`: all-MiniLM-L6-v2 where it is here, else the
/// tiny model (and a line saying so).
pub fn embed_model(test: &str) -> EmbedModel {
    let (dir, minilm) = match minilm_dir() {
        Some(d) => (d, true),
        None => {
            eprintln!("{test}: on tests/data/tiny-bert (all-MiniLM-L6-v2 is not here)");
            (tiny_bert(), false)
        }
    };
    let json = |file: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(dir.join(file)).unwrap()).unwrap()
    };
    let (config, tokenizer) = (json("config.json"), json("tokenizer.json"));
    let n = |field: &str| config[field].as_u64().unwrap() as usize;
    EmbedModel {
        minilm,
        dim: n("hidden_size"),
        vocab_size: n("vocab_size"),
        vocab: tokenizer["model"]["vocab"].clone(),
        dir,
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
