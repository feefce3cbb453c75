//! sentence-transformers' modules: what turns the encoder's token vectors
//! into the model's embedding, in `modules.json`'s order — the pooling
//! (`1_Pooling`), then any `Dense` layers and `Normalize` — and the prompts
//! of `config_sentence_transformers.json`.
//!
//! A module the service does not compute is refused when the folder is
//! loaded, naming it: skipping one would serve vectors the model never
//! gives (a `2_Dense` ignored serves the encoder's width instead of the
//! projection's).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use coexec_kernels::KernelError;
use coexec_kernels::tensors::{read, read_f32, tensor_err};

use crate::folder::{Dim, config_err, read_json};

/// How a sequence's token vectors become one embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Pooling {
    /// The mean over the sequence's tokens (all-MiniLM-L6-v2's).
    Mean,
    /// The first token's (`[CLS]`) vector.
    Cls,
    /// The largest value of each dimension over the tokens.
    Max,
    /// The sum over the tokens divided by the square root of their count.
    MeanSqrtLen,
    /// The last token's vector.
    LastToken,
    /// SPLADE (sentence-transformers' `SpladePooling`, `max` of `relu`):
    /// the masked-language-model head's logits over the vocabulary, per
    /// word the largest `log(1 + relu(logit))` over the tokens: a vector as
    /// wide as the vocabulary, mostly zeros.
    Splade,
}

impl Pooling {
    /// Its name in TEI's `/info` and `--pooling` (`mean`, `cls`, `max`,
    /// `mean_sqrt_len`, `last_token`).
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Max => "max",
            Pooling::MeanSqrtLen => "mean_sqrt_len",
            Pooling::LastToken => "last_token",
            Pooling::Splade => "splade",
        }
    }

    /// The pooled vector of one sequence's token vectors (`rows`, `len ×
    /// H` back to back) into `out` (`H`).
    pub(crate) fn pool(self, rows: &[f32], out: &mut [f32]) {
        let h = out.len();
        let len = rows.len() / h;
        match self {
            // Never reached: the encoder's SPLADE head pools its logits
            // (they are not its token vectors).
            Pooling::Splade => unreachable!("SPLADE is pooled by the encoder's head"),
            Pooling::Cls => out.copy_from_slice(&rows[..h]),
            Pooling::LastToken => out.copy_from_slice(&rows[(len - 1) * h..]),
            Pooling::Max => {
                out.copy_from_slice(&rows[..h]);
                for row in rows.chunks_exact(h).skip(1) {
                    for (a, &b) in out.iter_mut().zip(row) {
                        *a = a.max(b);
                    }
                }
            }
            Pooling::Mean | Pooling::MeanSqrtLen => {
                out.fill(0.0);
                for row in rows.chunks_exact(h) {
                    for (a, b) in out.iter_mut().zip(row) {
                        *a += b;
                    }
                }
                let div = if self == Pooling::Mean {
                    len as f32
                } else {
                    (len as f32).sqrt()
                };
                let inv = 1.0 / div;
                out.iter_mut().for_each(|v| *v *= inv);
            }
        }
    }
}

/// A `Dense` module's activation (`activation_function`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DenseActivation {
    /// `torch.nn.modules.linear.Identity`.
    Identity,
    /// `torch.nn.modules.activation.Tanh` (sentence-transformers' default).
    Tanh,
    /// `torch.nn.modules.activation.ReLU`.
    Relu,
    /// `torch.nn.modules.activation.Sigmoid`.
    Sigmoid,
}

/// A `Dense` module: `y = act(x·Wᵀ + b)`, `W` row-major `[out, in]`.
#[derive(Debug)]
pub(crate) struct Dense {
    w: Box<[f32]>,
    b: Option<Box<[f32]>>,
    inp: usize,
    out: usize,
    act: DenseActivation,
}

/// What follows the pooling, in `modules.json`'s order.
#[derive(Debug)]
pub(crate) enum Step {
    Dense(Dense),
    Normalize,
}

/// The modules after the encoder: its pooling, what follows it, and the
/// prompts texts may be given.
#[derive(Debug)]
pub(crate) struct Modules {
    pub(crate) pooling: Pooling,
    /// `SpladePooling`'s `embedding_dimension` (the vocabulary it pools)
    /// and the file that gives it.
    pub(crate) splade_width: Option<(usize, std::path::PathBuf)>,
    pub(crate) steps: Vec<Step>,
    /// The named prompts (`config_sentence_transformers.json`'s `prompts`).
    pub(crate) prompts: BTreeMap<String, String>,
    /// The prompt applied when a request names none (`default_prompt_name`,
    /// as sentence-transformers' `encode` applies it).
    pub(crate) default_prompt: Option<String>,
}

/// One entry of `modules.json`.
#[derive(Deserialize)]
struct ModuleJson {
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

/// `1_Pooling/config.json`: one `pooling_mode` (sentence-transformers 6),
/// or a flag per mode (earlier versions).
#[derive(Deserialize)]
struct PoolingJson {
    pooling_mode: Option<String>,
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pooling_mode_weightedmean_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
    include_prompt: Option<bool>,
}

/// `SpladePooling`'s `config.json`.
#[derive(Deserialize)]
struct SpladeJson {
    pooling_strategy: Option<String>,
    activation_function: Option<String>,
    #[serde(alias = "word_embedding_dimension")]
    embedding_dimension: Option<Dim>,
}

/// A `Dense` module's `config.json`.
#[derive(Deserialize)]
struct DenseJson {
    in_features: Dim,
    out_features: Dim,
    #[serde(default = "yes")]
    bias: bool,
    activation_function: Option<String>,
}

fn yes() -> bool {
    true
}

/// `config_sentence_transformers.json`.
#[derive(Deserialize)]
struct StJson {
    #[serde(default)]
    prompts: BTreeMap<String, String>,
    default_prompt_name: Option<String>,
}

impl Modules {
    /// A sequence classifier's head (Hugging Face's, in the model's own
    /// weights): the first token's vector through `steps`. Prompts are not
    /// a classifier's.
    pub(crate) fn classifier(steps: Vec<Dense>) -> Self {
        Self {
            pooling: Pooling::Cls,
            splade_width: None,
            steps: steps.into_iter().map(Step::Dense).collect(),
            prompts: BTreeMap::new(),
            default_prompt: None,
        }
    }

    /// The modules of the folder `dir`: `modules.json` where it exists
    /// (else the encoder and `1_Pooling`, or mean pooling without it), and
    /// the prompts. Errors name the file and the field or module.
    pub(crate) fn load(dir: &Path) -> Result<Self, KernelError> {
        let list_path = dir.join("modules.json");
        let list: Vec<ModuleJson> = match read_json(&list_path)? {
            Some(l) => l,
            None => vec![
                ModuleJson {
                    path: String::new(),
                    kind: "Transformer".into(),
                },
                ModuleJson {
                    path: "1_Pooling".into(),
                    kind: "Pooling".into(),
                },
            ],
        };
        let mut pooling = None;
        let mut splade_width = None;
        let mut steps = Vec::new();
        let mut include_prompt = true;
        for (i, m) in list.iter().enumerate() {
            // `sentence_transformers.models.Pooling`, and its older spelling
            // `sentence_transformers.models.pooling.Pooling`.
            let kind = m.kind.rsplit('.').next().unwrap_or_default();
            let refuse = |why: String| {
                config_err(
                    &list_path,
                    "type",
                    format!("module {i} ({}): {why}", m.kind),
                )
            };
            match (i, kind) {
                (0, "Transformer" | "MLMTransformer") if m.path.is_empty() => {}
                (0, "Transformer" | "MLMTransformer") => {
                    return Err(refuse(format!(
                        "the encoder in {:?}: served from the folder itself only",
                        m.path
                    )));
                }
                (0, _) => return Err(refuse("the first module must be the Transformer".into())),
                (_, "Pooling") if pooling.is_none() && steps.is_empty() => {
                    let (p, inc) = read_pooling(&dir.join(&m.path).join("config.json"))?;
                    pooling = Some(p);
                    include_prompt = inc;
                }
                (_, "SpladePooling") if pooling.is_none() && steps.is_empty() => {
                    let path = dir.join(&m.path).join("config.json");
                    let c = read_json::<SpladeJson>(&path)?.unwrap_or(SpladeJson {
                        pooling_strategy: None,
                        activation_function: None,
                        embedding_dimension: None,
                    });
                    for (field, value, served) in [
                        ("pooling_strategy", c.pooling_strategy, "max"),
                        ("activation_function", c.activation_function, "relu"),
                    ] {
                        if let Some(v) = value
                            && v != served
                        {
                            return Err(config_err(
                                &path,
                                field,
                                format!("{v:?}; SPLADE is served with {served:?} (TEI's)"),
                            ));
                        }
                    }
                    splade_width = c.embedding_dimension.map(|d| (d.0, path.clone()));
                    pooling = Some(Pooling::Splade);
                }
                (_, "Dense") if pooling.is_some() && pooling != Some(Pooling::Splade) => {
                    steps.push(Step::Dense(Dense::load(&dir.join(&m.path))?));
                }
                (_, "Normalize") if pooling.is_some() && pooling != Some(Pooling::Splade) => {
                    steps.push(Step::Normalize)
                }
                (_, "Pooling" | "SpladePooling" | "Dense" | "Normalize") => {
                    return Err(refuse(
                        "out of place: the Transformer, one Pooling, then Dense and Normalize \
                         (none after SpladePooling)"
                            .into(),
                    ));
                }
                _ => return Err(refuse("not a module the service computes".into())),
            }
        }
        // Without a pooling module, a folder saved by transformers alone.
        let pooling = match pooling {
            Some(p) => p,
            None if list.len() <= 1 => Pooling::Mean,
            None => return Err(config_err(&list_path, "type", "no Pooling module")),
        };
        let st_path = dir.join("config_sentence_transformers.json");
        let st = read_json::<StJson>(&st_path)?.unwrap_or(StJson {
            prompts: BTreeMap::new(),
            default_prompt_name: None,
        });
        if let Some(name) = &st.default_prompt_name
            && !st.prompts.contains_key(name)
        {
            return Err(config_err(
                &st_path,
                "default_prompt_name",
                format!("{name:?} is not one of the prompts {:?}", st.prompts.keys()),
            ));
        }
        if !include_prompt && st.prompts.values().any(|p| !p.is_empty()) {
            return Err(config_err(
                &dir.join("1_Pooling/config.json"),
                "include_prompt",
                "false: pooling without the prompt's tokens is not served",
            ));
        }
        Ok(Self {
            pooling,
            splade_width,
            steps,
            prompts: st.prompts,
            default_prompt: st.default_prompt_name,
        })
    }

    /// Width of the embedding out of the modules, from the encoder's
    /// `hidden`.
    pub(crate) fn out_dim(&self, hidden: usize) -> usize {
        self.steps.iter().fold(hidden, |d, s| match s {
            Step::Dense(l) => l.out,
            Step::Normalize => d,
        })
    }

    /// Checks each Dense module's input width against what reaches it.
    pub(crate) fn check_widths(&self, dir: &Path, hidden: usize) -> Result<(), KernelError> {
        let mut d = hidden;
        for s in &self.steps {
            if let Step::Dense(l) = s {
                if l.inp != d {
                    return Err(config_err(
                        &dir.join("modules.json"),
                        "in_features",
                        format!("a Dense module takes {} values; {d} reach it", l.inp),
                    ));
                }
                d = l.out;
            }
        }
        Ok(())
    }

    /// Applies the steps after the pooling to one pooled vector, `v`
    /// (`hidden` long), giving the embedding.
    pub(crate) fn apply(&self, v: Vec<f32>) -> Vec<f32> {
        let mut v = v;
        for s in &self.steps {
            match s {
                Step::Dense(l) => v = l.forward(&v),
                Step::Normalize => crate::normalize(&mut v),
            }
        }
        v
    }
}

/// The pooling `path` names, and its `include_prompt`; mean where the file
/// does not exist.
fn read_pooling(path: &Path) -> Result<(Pooling, bool), KernelError> {
    let Some(mut p) = read_json::<PoolingJson>(path)? else {
        return Ok((Pooling::Mean, true));
    };
    if let Some(mode) = p.pooling_mode.take() {
        let flag = match mode.as_str() {
            "mean" => &mut p.pooling_mode_mean_tokens,
            "cls" => &mut p.pooling_mode_cls_token,
            "max" => &mut p.pooling_mode_max_tokens,
            "mean_sqrt_len_tokens" => &mut p.pooling_mode_mean_sqrt_len_tokens,
            "weightedmean" => &mut p.pooling_mode_weightedmean_tokens,
            "lasttoken" => &mut p.pooling_mode_lasttoken,
            other => {
                return Err(config_err(
                    path,
                    "pooling_mode",
                    format!("{other:?} is not a pooling mode sentence-transformers names"),
                ));
            }
        };
        *flag = true;
    }
    let modes = [
        (
            p.pooling_mode_mean_tokens,
            "pooling_mode_mean_tokens",
            Some(Pooling::Mean),
        ),
        (
            p.pooling_mode_cls_token,
            "pooling_mode_cls_token",
            Some(Pooling::Cls),
        ),
        (
            p.pooling_mode_max_tokens,
            "pooling_mode_max_tokens",
            Some(Pooling::Max),
        ),
        (
            p.pooling_mode_mean_sqrt_len_tokens,
            "pooling_mode_mean_sqrt_len_tokens",
            Some(Pooling::MeanSqrtLen),
        ),
        (
            p.pooling_mode_weightedmean_tokens,
            "pooling_mode_weightedmean_tokens",
            None,
        ),
        (
            p.pooling_mode_lasttoken,
            "pooling_mode_lasttoken",
            Some(Pooling::LastToken),
        ),
    ];
    let on: Vec<_> = modes.iter().filter(|m| m.0).collect();
    let pooling = match on.as_slice() {
        [(_, _, Some(p))] => *p,
        [(_, field, None)] => {
            return Err(config_err(
                path,
                field,
                "not served: the service pools by mean, cls, max, mean_sqrt_len or last token",
            ));
        }
        [] => {
            return Err(config_err(
                path,
                "pooling_mode_mean_tokens",
                "no pooling mode is true",
            ));
        }
        [(_, first, _), ..] => {
            let names: Vec<&str> = on.iter().map(|m| m.1).collect();
            return Err(config_err(
                path,
                first,
                format!(
                    "{names:?} are all true; one pooling mode is served, not their concatenation"
                ),
            ));
        }
    };
    Ok((pooling, p.include_prompt.unwrap_or(true)))
}

impl Dense {
    /// `act(x·Wᵀ + b)` of the given weights (`w` `[out, inp]`): a
    /// classifier head's layers.
    pub(crate) fn new(
        w: Box<[f32]>,
        b: Box<[f32]>,
        (inp, out): (usize, usize),
        act: DenseActivation,
    ) -> Self {
        Self {
            w,
            b: Some(b),
            inp,
            out,
            act,
        }
    }

    /// The Dense module in folder `dir`: `config.json` and
    /// `model.safetensors` (`linear.weight`, `linear.bias`).
    fn load(dir: &Path) -> Result<Self, KernelError> {
        let cfg_path = dir.join("config.json");
        let Some(c) = read_json::<DenseJson>(&cfg_path)? else {
            return Err(KernelError::Io {
                path: cfg_path,
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
            });
        };
        let act = match c
            .activation_function
            .as_deref()
            .unwrap_or("torch.nn.modules.activation.Tanh")
        {
            "torch.nn.modules.linear.Identity" => DenseActivation::Identity,
            "torch.nn.modules.activation.Tanh" => DenseActivation::Tanh,
            "torch.nn.modules.activation.ReLU" => DenseActivation::Relu,
            "torch.nn.modules.activation.Sigmoid" => DenseActivation::Sigmoid,
            other => {
                return Err(config_err(
                    &cfg_path,
                    "activation_function",
                    format!("{other:?}; served: Identity, Tanh, ReLU, Sigmoid"),
                ));
            }
        };
        let path = dir.join("model.safetensors");
        if !path.exists() && dir.join("pytorch_model.bin").exists() {
            return Err(tensor_err(
                &dir.join("pytorch_model.bin"),
                "",
                "only safetensors are read: convert it (sentence-transformers' save() writes model.safetensors)",
            ));
        }
        let bytes = read(&path)?;
        let st =
            safetensors::SafeTensors::deserialize(&bytes).map_err(|e| tensor_err(&path, "", e))?;
        let (inp, out) = (c.in_features.0, c.out_features.0);
        let w = read_f32(&st, &path, "linear.weight", &[Some(out), Some(inp)])?.data;
        let b = if c.bias {
            Some(read_f32(&st, &path, "linear.bias", &[Some(out)])?.data)
        } else {
            None
        };
        Ok(Self {
            w,
            b,
            inp,
            out,
            act,
        })
    }

    /// `act(x·Wᵀ + b)` of one vector, accumulated in f64 (one vector per
    /// text: its cost is far below the encoder's).
    fn forward(&self, x: &[f32]) -> Vec<f32> {
        self.w
            .chunks_exact(self.inp)
            .enumerate()
            .map(|(o, row)| {
                let mut s: f64 = row.iter().zip(x).map(|(&w, &v)| w as f64 * v as f64).sum();
                if let Some(b) = &self.b {
                    s += b[o] as f64;
                }
                let y = match self.act {
                    DenseActivation::Identity => s,
                    DenseActivation::Tanh => s.tanh(),
                    DenseActivation::Relu => s.max(0.0),
                    DenseActivation::Sigmoid => 1.0 / (1.0 + (-s).exp()),
                };
                y as f32
            })
            .collect()
    }
}
