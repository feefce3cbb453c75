use super::*;
use safetensors::Dtype;
use safetensors::tensor::TensorView;

/// A safetensors file of f32 tensors `(name, shape, values)`.
fn file(tensors: &[(&str, Vec<usize>, Vec<f32>)]) -> Vec<u8> {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((n, s, _), b)| {
            (
                n.to_string(),
                TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize(views, None).unwrap()
}

/// A tiny model: 2 inputs, `h` hidden, 3 classes, weights from `f(layer, i)`.
fn tiny(h: usize) -> Vec<(&'static str, Vec<usize>, Vec<f32>)> {
    let v = |layer: usize, n: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7 + layer * 3) % 11) as f32 / 11.0 - 0.4)
            .collect()
    };
    vec![
        ("fc1.weight", vec![h, 2], v(1, h * 2)),
        ("fc1.bias", vec![h], v(2, h)),
        ("fc2.weight", vec![h, h], v(3, h * h)),
        ("fc2.bias", vec![h], v(4, h)),
        ("fc3.weight", vec![3, h], v(5, 3 * h)),
        ("fc3.bias", vec![3], v(6, 3)),
    ]
}

fn weights(h: usize) -> Arc<MlpWeights> {
    Arc::new(MlpWeights::from_bytes(&file(&tiny(h)), Path::new("tiny.safetensors")).unwrap())
}

/// The forward pass written out loop by loop, as the reference.
fn naive(w: &MlpWeights, x: &[f32]) -> Vec<f32> {
    let mut a = x.to_vec();
    for (l, layer) in w.layers.iter().enumerate() {
        let mut y: Vec<f32> = (0..layer.out)
            .map(|o| {
                layer.b[o]
                    + (0..layer.inp)
                        .map(|k| a[k] * layer.w[o * layer.inp + k])
                        .sum::<f32>()
            })
            .collect();
        if l + 1 < w.layers.len() {
            y.iter_mut().for_each(|v| *v = v.max(0.0));
        }
        a = y;
    }
    softmax(&mut a);
    a
}

#[test]
fn forward_equals_the_naive_loops_for_any_split() {
    let w = weights(37);
    let rows = 300; // more than two tiles
    let x: Vec<f32> = (0..rows * 2).map(|i| (i % 17) as f32 / 17.0).collect();
    let mut k = Mlp::new(w.clone(), x.clone()).unwrap();
    // Both sides of GEMV_ROWS: 1 and 7 rows (one GEMV per row), 8 rows (a
    // GEMM), and 134 rows (a 128-row GEMM tile, then a 6-row GEMV tail).
    for c in [0..1, 1..8, 8..16, 16..150, 150..299, 299..300] {
        crate::with_chunk(&mut k, c, |k, c| k.run_cpu(c)).unwrap();
    }
    let probs = k.into_probs();
    for (r, row) in x.chunks_exact(2).enumerate() {
        let want = naive(&w, row);
        let got = &probs[r * 3..r * 3 + 3];
        for (g, e) in got.iter().zip(&want) {
            assert!((g - e).abs() < 1e-5, "row {r}: {got:?} vs {want:?}");
        }
        assert!((got.iter().sum::<f32>() - 1.0).abs() < 1e-5);
    }
}

fn load_err(tensors: &[(&str, Vec<usize>, Vec<f32>)]) -> String {
    MlpWeights::from_bytes(&file(tensors), Path::new("bad.safetensors"))
        .unwrap_err()
        .to_string()
}

/// Finite weights near `f32::MAX` overflow on any input: refused at load,
/// naming the file, not served to answer every request with a 400.
#[test]
fn weights_that_overflow_on_any_input_are_refused_at_load() {
    let mut t = tiny(4);
    t[2].2.fill(3.0e38);
    let e = load_err(&t);
    assert!(
        e.contains("bad.safetensors") && e.contains("not finite") && e.contains("fc1..fc3"),
        "{e}"
    );
    // Large but sane weights load.
    let mut t = tiny(4);
    t[2].2.iter_mut().for_each(|w| *w *= 1.0e3);
    MlpWeights::from_bytes(&file(&t), Path::new("big.safetensors")).expect("loads");
}

#[test]
fn malformed_files_name_the_file_and_tensor() {
    let mut t = tiny(4);
    t.retain(|(n, _, _)| *n != "fc2.bias");
    let e = load_err(&t);
    assert!(e.contains("bad.safetensors") && e.contains("fc2.bias") && e.contains("missing"));

    let mut t = tiny(4);
    t[2] = ("fc2.weight", vec![4, 5], vec![0.0; 20]);
    let e = load_err(&t);
    assert!(e.contains("fc2.weight") && e.contains("[4, 5]"), "{e}");

    let mut t = tiny(4);
    t[5].2[1] = f32::NAN;
    assert!(load_err(&t).contains("fc3.bias"));

    let e = MlpWeights::from_bytes(b"not a safetensors file", Path::new("junk.bin"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("junk.bin"), "{e}");
}

#[test]
fn wrong_dtype_is_refused() {
    let mut bytes = Vec::new();
    let data = vec![0u8; 8 * 2];
    let view = TensorView::new(Dtype::F64, vec![1, 2], &data).unwrap();
    bytes.extend(safetensors::serialize([("fc1.weight", view)], None).unwrap());
    let e = MlpWeights::from_bytes(&bytes, Path::new("f64.safetensors"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("fc1.weight") && e.contains("F64"), "{e}");
}

#[test]
fn ragged_batch_is_refused() {
    assert!(Mlp::new(weights(3), vec![0.0; 5]).is_err());
    assert_eq!(Mlp::new(weights(3), vec![]).unwrap().rows(), 0);
}

/// A model of the given widths, weights from a fixed pattern.
fn shaped(widths: &[usize]) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let v = |seed: usize, n: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7 + seed * 3) % 13) as f32 / 13.0 - 0.45)
            .collect()
    };
    let mut t = Vec::new();
    for (k, pair) in widths.windows(2).enumerate() {
        let (inp, out) = (pair[0], pair[1]);
        t.push((
            format!("fc{}.weight", k + 1),
            vec![out, inp],
            v(2 * k, out * inp),
        ));
        t.push((format!("fc{}.bias", k + 1), vec![out], v(2 * k + 1, out)));
    }
    t
}

fn load_shaped(t: &[(String, Vec<usize>, Vec<f32>)]) -> Result<MlpWeights, KernelError> {
    let t: Vec<(&str, Vec<usize>, Vec<f32>)> = t
        .iter()
        .map(|(n, s, v)| (n.as_str(), s.clone(), v.clone()))
        .collect();
    MlpWeights::from_bytes(&file(&t), Path::new("shaped.safetensors"))
}

/// Depth and widths come from the file: one layer (logistic regression),
/// and four of uneven widths, each equal to the loops written out.
#[test]
fn any_depth_and_widths_equal_the_naive_loops() {
    for widths in [vec![5, 3], vec![13, 40, 7, 90, 3], vec![2, 200, 2]] {
        let w = Arc::new(load_shaped(&shaped(&widths)).unwrap());
        assert_eq!(w.widths(), widths);
        assert_eq!(w.depth(), widths.len() - 1);
        let (inp, c) = (widths[0], *widths.last().unwrap());
        let rows = 140;
        let x: Vec<f32> = (0..rows * inp).map(|i| (i % 19) as f32 / 19.0).collect();
        let mut k = Mlp::new(w.clone(), x.clone()).unwrap();
        for ch in [0..3, 3..140] {
            crate::with_chunk(&mut k, ch, |k, c| k.run_cpu(c)).unwrap();
        }
        assert!(
            k.profile_key().ends_with(
                &widths
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join("x")
            )
        );
        let probs = k.into_probs();
        for (r, row) in x.chunks_exact(inp).enumerate() {
            let want = naive(&w, row);
            for (g, e) in probs[r * c..(r + 1) * c].iter().zip(&want) {
                assert!((g - e).abs() < 1e-5, "{widths:?} row {r}: {g} vs {e}");
            }
        }
    }
}

/// A gap in the numbering, a tensor that is no layer, a layer whose input
/// is not the previous one's output, and a one-class output are refused,
/// naming the file and the tensor.
#[test]
fn files_that_are_no_mlp_are_refused_clearly() {
    let mut t = shaped(&[4, 6, 5, 3]);
    t.retain(|(n, _, _)| !n.starts_with("fc2."));
    let e = load_shaped(&t).unwrap_err().to_string();
    assert!(
        e.contains("shaped.safetensors") && e.contains("fc3.weight"),
        "{e}"
    );

    let mut t = shaped(&[4, 6, 3]);
    t.push(("x".into(), vec![2], vec![0.0; 2]));
    let e = load_shaped(&t).unwrap_err().to_string();
    assert!(e.contains("`x`") || e.contains("\"x\""), "{e}");
    assert!(e.contains("not a layer"), "{e}");

    let mut t = shaped(&[4, 6, 3]);
    t[2] = ("fc2.weight".into(), vec![3, 5], vec![0.0; 15]);
    let e = load_shaped(&t).unwrap_err().to_string();
    assert!(e.contains("fc2.weight") && e.contains("[3, 5]"), "{e}");

    let e = load_shaped(&shaped(&[4, 6, 1])).unwrap_err().to_string();
    assert!(e.contains("fc2.weight") && e.contains("class"), "{e}");
}

#[test]
fn argmax_takes_the_first_of_ties() {
    assert_eq!(argmax(&[]), None);
    assert_eq!(argmax(&[1.0, 3.0, 3.0]), Some(1));
}

/// A very wide hidden layer runs fewer rows a tile: the two activation
/// buffers stay within 64 MiB (a 1 → 4 000 000 → 2 model took 2 GB for a
/// 128-row batch), and the rows still come out as the loops compute them.
#[test]
fn a_wide_layer_keeps_its_scratch_within_bounds() {
    use super::tile_rows;
    let scratch = |rows, widest| 2 * tile_rows(rows, widest) * widest * 4;
    assert_eq!(tile_rows(128, 1024), Mlp::TILE_ROWS);
    assert_eq!(tile_rows(5, 1024), 5);
    assert!(scratch(128, 4_000_000) <= 64 << 20);
    assert_eq!(tile_rows(128, 4_000_000), 2);
    // Wider than the bound holds for one row: one row a tile.
    assert_eq!(tile_rows(128, 100_000_000), 1);
    // 300 000 units: 27 rows a tile, so 140 rows take six tiles.
    let widths = [3, 300_000, 2];
    assert_eq!(tile_rows(140, widths[1]), 27);
    let w = Arc::new(load_shaped(&shaped(&widths)).unwrap());
    let rows = 140;
    let x: Vec<f32> = (0..rows * 3).map(|i| (i % 19) as f32 / 19.0).collect();
    let mut k = Mlp::new(w.clone(), x.clone()).unwrap();
    crate::with_chunk(&mut k, 0..rows, |k, c| k.run_cpu(c)).unwrap();
    let probs = k.into_probs();
    for (r, row) in x.chunks_exact(3).enumerate() {
        let want = naive(&w, row);
        for (g, e) in probs[r * 2..(r + 1) * 2].iter().zip(&want) {
            assert!((g - e).abs() < 1e-4, "row {r}: {g} vs {e}");
        }
    }
}
