//! The rows requests carry and the labels answers are checked against.
//!
//! The file is the digits model's held-back test split
//! (`examples/models/digits_test.safetensors`): `x` f32 `[rows, features]`,
//! `y` i64 `[rows]` (true labels) and, optionally, `pred` i64 `[rows]` (the
//! training script's own predictions, which a correct server reproduces row
//! for row, so any difference points at a crossed-up answer).

use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};

/// Why the data file cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DataError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {detail}", path.display())]
    Format { path: PathBuf, detail: String },
    #[error("{}: tensor `{name}`: {detail}", path.display())]
    Tensor {
        path: PathBuf,
        name: String,
        detail: String,
    },
}

/// Rows pre-encoded as JSON, with their labels.
#[derive(Debug)]
pub(crate) struct Dataset {
    /// Each row as a JSON array, ready to splice into a request body.
    rows_json: Vec<String>,
    /// True label of each row.
    pub(crate) labels: Vec<i64>,
    /// The reference model's label of each row, when the file has one.
    pub(crate) predicted: Option<Vec<i64>>,
    /// Texts for an embedding service (`--texts`), not rows: no labels.
    texts: bool,
}

impl Dataset {
    /// Reads and checks `path`.
    pub(crate) fn load(path: &Path) -> Result<Self, DataError> {
        let bytes = std::fs::read(path).map_err(|source| DataError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(path, &bytes)
    }

    pub(crate) fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Self, DataError> {
        let st = SafeTensors::deserialize(bytes).map_err(|e| DataError::Format {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
        let tensor_err = |name: &str, detail: String| DataError::Tensor {
            path: path.to_path_buf(),
            name: name.to_string(),
            detail,
        };
        let x = st.tensor("x").map_err(|e| tensor_err("x", e.to_string()))?;
        let (rows, features) = match (x.dtype(), x.shape()) {
            (Dtype::F32, &[r, f]) if r > 0 && f > 0 => (r, f),
            (d, s) => {
                return Err(tensor_err(
                    "x",
                    format!("expected non-empty F32 [rows, features], got {d:?} {s:?}"),
                ));
            }
        };
        let x: Vec<f32> = x
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let labels_of = |name: &str| -> Result<Vec<i64>, DataError> {
            let t = st
                .tensor(name)
                .map_err(|e| tensor_err(name, e.to_string()))?;
            if t.dtype() != Dtype::I64 || t.shape() != [rows] {
                return Err(tensor_err(
                    name,
                    format!(
                        "expected I64 [{rows}] (one per row of `x`), got {:?} {:?}",
                        t.dtype(),
                        t.shape()
                    ),
                ));
            }
            Ok(t.data()
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
                .collect())
        };
        let labels = labels_of("y")?;
        let predicted = match st.tensor("pred") {
            Ok(_) => Some(labels_of("pred")?),
            Err(_) => None,
        };
        let rows_json = x
            .chunks_exact(features)
            .map(|r| {
                serde_json::to_string(r).map_err(|e| tensor_err("x", format!("not JSON: {e}")))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            rows_json,
            labels,
            predicted,
            texts: false,
        })
    }

    /// The texts of a JSON Lines file (each line a string or an object with
    /// a `text` field), for an embedding service's `/embed`.
    pub(crate) fn texts(path: &Path) -> Result<Self, DataError> {
        let text = std::fs::read_to_string(path).map_err(|source| DataError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut rows_json = Vec::new();
        for (n, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let bad = |detail: String| DataError::Format {
                path: path.to_path_buf(),
                detail: format!("line {}: {detail}", n + 1),
            };
            let t = match serde_json::from_str::<serde_json::Value>(line) {
                Ok(serde_json::Value::String(t)) => t,
                Ok(serde_json::Value::Object(o)) => match o.get("text") {
                    Some(serde_json::Value::String(t)) => t.clone(),
                    _ => return Err(bad("no string field `text`".into())),
                },
                Ok(_) => return Err(bad("neither a string nor an object".into())),
                Err(e) => return Err(bad(format!("not JSON: {e}"))),
            };
            rows_json.push(serde_json::Value::String(t).to_string());
        }
        if rows_json.is_empty() {
            return Err(DataError::Format {
                path: path.to_path_buf(),
                detail: "no texts".into(),
            });
        }
        Ok(Self {
            rows_json,
            labels: Vec::new(),
            predicted: None,
            texts: true,
        })
    }

    /// Whether these are texts (`--texts`), not labelled rows.
    pub(crate) fn is_texts(&self) -> bool {
        self.texts
    }

    /// Number of rows (or texts).
    pub(crate) fn rows(&self) -> usize {
        self.rows_json.len()
    }

    /// The rows request `index` carries: `per_request` consecutive rows,
    /// wrapping around the file, so successive requests walk the whole set.
    pub(crate) fn rows_for(&self, index: u64, per_request: usize) -> Vec<usize> {
        let n = self.rows() as u64;
        let first = index.wrapping_mul(per_request as u64);
        (0..per_request as u64)
            .map(|k| (first.wrapping_add(k) % n) as usize)
            .collect()
    }

    /// `{"inputs": [[...], ...]}` for these rows.
    pub(crate) fn body(&self, rows: &[usize]) -> String {
        let mut s = String::with_capacity(16 + rows.len() * (self.rows_json[0].len() + 1));
        s.push_str("{\"inputs\":[");
        for (k, &r) in rows.iter().enumerate() {
            if k > 0 {
                s.push(',');
            }
            s.push_str(&self.rows_json[r]);
        }
        s.push_str("]}");
        s
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use safetensors::tensor::TensorView;

    /// A safetensors file with `x` (row r filled with r), `y` and maybe `pred`.
    pub(crate) fn file(rows: usize, features: usize, pred: bool) -> Vec<u8> {
        let x: Vec<u8> = (0..rows * features)
            .flat_map(|i| ((i / features) as f32).to_le_bytes())
            .collect();
        let y: Vec<u8> = (0..rows as i64)
            .flat_map(|r| (r % 10).to_le_bytes())
            .collect();
        let mut views = vec![
            (
                "x",
                TensorView::new(Dtype::F32, vec![rows, features], &x).unwrap(),
            ),
            ("y", TensorView::new(Dtype::I64, vec![rows], &y).unwrap()),
        ];
        if pred {
            views.push(("pred", TensorView::new(Dtype::I64, vec![rows], &y).unwrap()));
        }
        safetensors::serialize(views, None).unwrap()
    }

    #[test]
    fn loads_rows_labels_and_predictions() {
        let d = Dataset::from_bytes(Path::new("t"), &file(12, 3, true)).unwrap();
        assert_eq!(d.rows(), 12);
        assert_eq!(d.labels[11], 1);
        assert_eq!(d.predicted.as_deref(), Some(&d.labels[..]));
        assert_eq!(
            d.body(&[2, 0]),
            r#"{"inputs":[[2.0,2.0,2.0],[0.0,0.0,0.0]]}"#
        );
        let d = Dataset::from_bytes(Path::new("t"), &file(4, 2, false)).unwrap();
        assert!(d.predicted.is_none());
    }

    #[test]
    fn loads_the_digits_test_split() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../examples/models/digits_test.safetensors");
        let d = Dataset::load(&path).unwrap();
        assert_eq!(d.rows(), 360);
        assert!(d.labels.iter().all(|l| (0..10).contains(l)));
        let p = d.predicted.as_ref().unwrap();
        let agree = p.iter().zip(&d.labels).filter(|(a, b)| a == b).count();
        // The model's 353 of 360 (examples/models/digits_mlp.json).
        assert_eq!(agree, 353);
        let body: serde_json::Value = serde_json::from_str(&d.body(&[0, 1])).unwrap();
        assert_eq!(body["inputs"][1].as_array().unwrap().len(), 64);
    }

    #[test]
    fn rows_walk_the_set_and_wrap() {
        let d = Dataset::from_bytes(Path::new("t"), &file(5, 1, false)).unwrap();
        assert_eq!(d.rows_for(0, 1), vec![0]);
        assert_eq!(d.rows_for(6, 1), vec![1]);
        assert_eq!(d.rows_for(1, 3), vec![3, 4, 0]);
    }

    #[test]
    fn errors_name_file_and_tensor() {
        let e = Dataset::from_bytes(Path::new("f.st"), b"junk").unwrap_err();
        assert!(e.to_string().starts_with("f.st: "), "{e}");
        let x = [0u8; 8];
        let bad = safetensors::serialize(
            [("x", TensorView::new(Dtype::F32, vec![2, 1], &x).unwrap())],
            None,
        )
        .unwrap();
        let e = Dataset::from_bytes(Path::new("f.st"), &bad).unwrap_err();
        assert!(e.to_string().contains("tensor `y`"), "{e}");
        let e = Dataset::load(Path::new("/nonexistent/d.st")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/d.st"), "{e}");
    }
}
