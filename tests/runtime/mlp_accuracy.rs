//! The committed models (digits: 64 → 1024 → 1024 → 10; wine: 13 → 48 → 24
//! → 12 → 3, its depth and widths read from the file), run through the
//! runtime (CPU and `sim` classes splitting the batch), get the training
//! script's accuracy on the script's own test split, row for row.

use std::path::PathBuf;
use std::sync::Arc;

use coexec::kernels::workloads::{LabeledRows, Mlp, MlpWeights, argmax};

fn models() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/models")
}

/// `"correct": N` from the script's report, without a JSON dependency on the
/// format's details beyond that one field.
fn script_correct(name: &str) -> usize {
    let text = std::fs::read_to_string(models().join(format!("{name}_mlp.json"))).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["correct"].as_u64().expect("`correct` in the report") as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digits_forward_pass_matches_the_training_script() {
    matches_the_training_script("digits", &[64, 1024, 1024, 10]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wine_forward_pass_matches_the_training_script() {
    matches_the_training_script("wine", &[13, 48, 24, 12, 3]).await;
}

async fn matches_the_training_script(name: &str, widths: &[usize]) {
    let w = Arc::new(MlpWeights::load(models().join(format!("{name}_mlp.safetensors"))).unwrap());
    assert_eq!(w.widths(), widths);
    let t = LabeledRows::load(models().join(format!("{name}_test.safetensors"))).unwrap();
    assert_eq!(t.features, w.inputs());

    for devices in ["cpu:2", "cpu:1,sim:1@0.5"] {
        let rt = coexec::Runtime::builder()
            .devices(devices)
            .unwrap()
            .in_memory_profiles()
            .build()
            .unwrap();
        // Twice: the first run learns the speed models, the second runs on them.
        for _ in 0..2 {
            let done = rt
                .run(Mlp::new(w.clone(), t.x.clone()).unwrap())
                .await
                .unwrap();
            let probs = done.kernel.into_probs();
            let labels: Vec<i64> = probs
                .chunks_exact(w.classes())
                .map(|p| argmax(p).unwrap() as i64)
                .collect();
            let correct = labels.iter().zip(&t.labels).filter(|(a, b)| a == b).count();
            assert_eq!(correct, script_correct(name), "accuracy on {devices}");
            assert_eq!(labels, t.predicted, "per-row labels on {devices}");
            for (r, (got, want)) in probs
                .chunks_exact(w.classes())
                .zip(t.probs.chunks_exact(t.classes))
                .enumerate()
            {
                for (g, e) in got.iter().zip(want) {
                    assert!(
                        (g - e).abs() < 1e-4,
                        "row {r} on {devices}: {got:?} vs {want:?}"
                    );
                }
            }
        }
        rt.shutdown().await;
    }
}
