//! A traced run, written as a Chrome trace and read back: every chunk once,
//! one track per worker, phases named.

use std::collections::{BTreeMap, BTreeSet};

use coexec::kernels::Synthetic;
use serde_json::Value;

const ITEMS: usize = 20_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_file_holds_every_chunk_on_its_workers_track()
-> Result<(), Box<dyn std::error::Error>> {
    let rt = coexec::Runtime::builder()
        .devices("cpu:2,sim:1@2")?
        .in_memory_profiles()
        .trace(true)
        .build()?;
    // Two runs: the second starts from what the first taught the profiler,
    // and the trace must keep them apart.
    let mut reports = Vec::new();
    for _ in 0..2 {
        let mut done = rt.run(Synthetic::new(ITEMS, 50)).await?;
        done.kernel.verify()?;
        assert!(
            !done.report.chunks.is_empty(),
            "tracing is on, so the report lists its chunks"
        );
        reports.push(done.report);
    }

    let dir = std::env::temp_dir().join(format!("coexec-trace-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("run.trace.json");
    coexec::trace::write_chrome_trace(&path, &reports, rt.classes())?;
    let trace: Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    std::fs::remove_dir_all(&dir)?;

    assert_eq!(trace["displayTimeUnit"], "ms");
    let events = trace["traceEvents"]
        .as_array()
        .ok_or("traceEvents is not an array")?;

    // The runtime's workers: numbered class by class, in class order.
    let mut want_tracks = BTreeMap::new();
    let mut w = 0u64;
    for c in rt.classes() {
        for _ in 0..c.workers {
            want_tracks.insert(w, c.index as u64);
            w += 1;
        }
    }
    assert_eq!(want_tracks.len(), 3);
    let tracks: BTreeMap<u64, u64> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name" && e["args"]["name"] != "jobs")
        .map(|e| {
            (
                e["tid"].as_u64().unwrap_or(u64::MAX),
                e["pid"].as_u64().unwrap_or(u64::MAX),
            )
        })
        .collect();
    assert_eq!(
        tracks, want_tracks,
        "one named track per worker, under its class"
    );
    let names: BTreeSet<&str> = events
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .filter_map(|e| e["args"]["name"].as_str())
        .collect();
    for name in ["cpu:0", "cpu:1", "sim/0"] {
        assert!(names.contains(name), "no track named {name}: {names:?}");
    }

    let chunks: Vec<&Value> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] != "run")
        .collect();
    assert_eq!(
        chunks.len(),
        reports.iter().map(|r| r.chunks.len()).sum::<usize>()
    );
    for (i, report) in reports.iter().enumerate() {
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for e in chunks.iter().filter(|e| e["args"]["run"] == i) {
            let phase = e["cat"].as_str().ok_or("chunk without a category")?;
            assert!(
                ["probe", "static", "dynamic", "retry"].contains(&phase),
                "unknown phase {phase}"
            );
            assert_eq!(e["args"]["phase"], phase);
            assert_eq!(e["name"], "synthetic");
            let tid = e["tid"].as_u64().ok_or("chunk without a tid")?;
            assert_eq!(
                want_tracks.get(&tid),
                e["pid"].as_u64().as_ref(),
                "chunk on worker {tid} under the wrong class"
            );
            let (lo, hi) = (
                e["args"]["lo"].as_u64().ok_or("no lo")?,
                e["args"]["hi"].as_u64().ok_or("no hi")?,
            );
            assert_eq!(e["args"]["items"].as_u64(), Some(hi - lo));
            let ts = e["ts"].as_f64().ok_or("no ts")?;
            let dur = e["dur"].as_f64().ok_or("no dur")?;
            assert!(dur >= 0.0);
            // Inside its run, in µs since the runtime started.
            let (start, end) = (
                report.started_s * 1e6,
                (report.started_s + report.makespan_s) * 1e6,
            );
            assert!(
                ts >= start - 1.0 && ts + dur <= end + 1.0,
                "chunk [{ts}, {}] outside its run [{start}, {end}]",
                ts + dur
            );
            ranges.push((lo, hi));
        }
        ranges.sort_unstable();
        let mut next = 0;
        for (lo, hi) in ranges {
            assert!(lo < hi, "empty chunk [{lo}, {hi})");
            assert_eq!(lo, next, "run {i}: chunks leave a gap or overlap at {next}");
            next = hi;
        }
        assert_eq!(next, ITEMS as u64, "run {i}: chunks stop short of the end");
    }
    // Runs are apart in time: the second starts after the first ended.
    assert!(reports[1].started_s >= reports[0].started_s + reports[0].makespan_s - 1e-6);
    rt.shutdown().await;
    Ok(())
}
