//! Timelines of traced runs, as Chrome trace-event JSON.
//!
//! Build the runtime with [`Builder::trace`](crate::Builder::trace) (or set
//! [`JobOptions::trace`](crate::JobOptions) per job) and every chunk lands in
//! its [`RunReport::chunks`]. [`write_chrome_trace`] turns those reports into a
//! file that <https://ui.perfetto.dev> and `chrome://tracing` open:
//!
//! ```text
//!  cpu        cpu:0     [probe][ static ............ ][dyn][dyn]
//!             cpu:1     [probe][ static ............ ][dyn]
//!  sim        sim/0     [probe][ static ..................... ][d]
//!  runs       synthetic [ run 0 ................................... ]
//! ```
//!
//! One process per device class (`pid` = class index, named after the class),
//! one thread per worker (`tid` = worker index, named `cpu:0`, `cuda:0/s1`,
//! `sim/0`), one complete (`X`) event per chunk: `name` the kernel, `cat` the
//! phase, `ts`/`dur` in µs since the runtime started, `args` the items, the
//! range `[lo, hi)`, the phase, the policy and the run's index. A last process,
//! `runs` (`pid` = number of classes), holds one `X` event per run (`cat`
//! `"run"`) spanning admission to the last chunk's end, so job boundaries show
//! above the workers.

use std::io::Write;
use std::path::Path;

use coexec_actors::{ClassInfo, DeviceKind, RunReport};
use serde_json::{Value, json};

use crate::Error;

/// The `cat` of the per-run span events (chunk events carry their phase).
pub(crate) const RUN_CATEGORY: &str = "run";

/// The trace-event JSON of `runs` on a runtime with `classes`
/// ([`Runtime::classes`](crate::Runtime::classes)).
///
/// Workers are numbered class by class in class order, as the runtime numbers
/// them; a chunk whose worker is beyond the classes' workers (reports from a
/// runtime with other devices) lands in a process named `?`.
///
/// ```
/// use coexec::kernels::Synthetic;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), coexec::Error> {
/// let rt = coexec::Runtime::builder().devices("cpu:2")?.in_memory_profiles().trace(true).start().await?;
/// let done = rt.run(Synthetic::new(5_000, 20)).await?;
/// let trace = coexec::trace::chrome_trace(&[done.report.clone()], rt.classes());
/// let chunks = trace["traceEvents"]
///     .as_array()
///     .unwrap()
///     .iter()
///     .filter(|e| e["ph"] == "X" && e["cat"] != "run")
///     .count();
/// assert_eq!(chunks, done.report.chunks.len());
/// rt.shutdown().await;
/// # Ok(()) }
/// ```
pub fn chrome_trace(runs: &[RunReport], classes: &[ClassInfo]) -> Value {
    // Worker index → (pid, thread name), in the runtime's numbering.
    let workers: Vec<(usize, String)> = classes
        .iter()
        .flat_map(|c| (0..c.workers).map(move |k| (c.index, worker_name(c, k))))
        .collect();
    let stray = classes.iter().map(|c| c.index + 1).max().unwrap_or(0);
    let runs_pid = stray + 1;

    let mut events = Vec::new();
    for c in classes {
        events.push(meta(c.index, 0, "process_name", json!({ "name": c.name })));
        events.push(meta(
            c.index,
            0,
            "process_sort_index",
            json!({ "sort_index": c.index }),
        ));
    }
    for (w, (pid, name)) in workers.iter().enumerate() {
        events.push(meta(*pid, w, "thread_name", json!({ "name": name })));
        events.push(meta(
            *pid,
            w,
            "thread_sort_index",
            json!({ "sort_index": w }),
        ));
    }
    let mut strays: Vec<usize> = runs
        .iter()
        .flat_map(|r| r.chunks.iter().map(|c| c.worker))
        .filter(|&w| w >= workers.len())
        .collect();
    strays.sort_unstable();
    strays.dedup();
    if !strays.is_empty() {
        events.push(meta(stray, 0, "process_name", json!({ "name": "?" })));
        for &w in &strays {
            events.push(meta(
                stray,
                w,
                "thread_name",
                json!({ "name": format!("worker {w}") }),
            ));
        }
    }
    if !runs.is_empty() {
        events.push(meta(runs_pid, 0, "process_name", json!({ "name": "runs" })));
        events.push(meta(
            runs_pid,
            0,
            "process_sort_index",
            json!({ "sort_index": runs_pid }),
        ));
        events.push(meta(runs_pid, 0, "thread_name", json!({ "name": "jobs" })));
    }

    for (i, run) in runs.iter().enumerate() {
        events.push(json!({
            "ph": "X",
            "name": run.kernel,
            "cat": RUN_CATEGORY,
            "pid": runs_pid,
            "tid": 0,
            "ts": us(run.started_s),
            "dur": us(run.makespan_s),
            "args": {
                "run": i,
                "policy": run.policy,
                "items": run.items,
                "imbalance": run.imbalance,
                "split": run.split,
                "retries": run.retries,
            },
        }));
        for c in &run.chunks {
            let pid = workers.get(c.worker).map_or(stray, |(pid, _)| *pid);
            let phase = c.phase.as_str();
            events.push(json!({
                "ph": "X",
                "name": run.kernel,
                "cat": phase,
                "pid": pid,
                "tid": c.worker,
                "ts": us(run.started_s + c.start),
                // A chunk's clock never runs backwards, but a zero or negative
                // width would hide it in the viewer.
                "dur": us((c.end - c.start).max(0.0)),
                "args": {
                    "items": c.hi.saturating_sub(c.lo),
                    "lo": c.lo,
                    "hi": c.hi,
                    "phase": phase,
                    "policy": run.policy,
                    "run": i,
                },
            }));
        }
    }
    json!({ "traceEvents": events, "displayTimeUnit": "ms" })
}

/// Writes [`chrome_trace`] to `path` (open it in <https://ui.perfetto.dev> or
/// `chrome://tracing`).
///
/// ```no_run
/// # fn demo(rt: &coexec::Runtime, reports: &[coexec::RunReport]) -> Result<(), coexec::Error> {
/// coexec::trace::write_chrome_trace("run.trace.json".as_ref(), reports, rt.classes())?;
/// # Ok(()) }
/// ```
pub fn write_chrome_trace(
    path: &Path,
    runs: &[RunReport],
    classes: &[ClassInfo],
) -> Result<(), Error> {
    let io = |source| Error::Io {
        path: path.display().to_string(),
        source,
    };
    let file = std::fs::File::create(path).map_err(io)?;
    let mut out = std::io::BufWriter::new(file);
    serde_json::to_writer(&mut out, &chrome_trace(runs, classes)).map_err(|e| io(e.into()))?;
    out.flush().map_err(io)
}

/// A worker's track name: `cpu:0`, `cuda:0/s1`, `sim/0`.
fn worker_name(class: &ClassInfo, k: usize) -> String {
    match class.kind {
        DeviceKind::Cpu => format!("{}:{k}", class.name),
        DeviceKind::Cuda { .. } => format!("{}/s{k}", class.name),
        DeviceKind::Sim { .. } => format!("{}/{k}", class.name),
        _ => format!("{}/{k}", class.name),
    }
}

fn meta(pid: usize, tid: usize, name: &str, args: Value) -> Value {
    json!({ "ph": "M", "name": name, "pid": pid, "tid": tid, "args": args })
}

/// Seconds to the trace's microseconds.
fn us(s: f64) -> f64 {
    s * 1e6
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use coexec_actors::{ChunkRecord, Phase};

    use super::*;

    fn class(index: usize, name: &str, kind: DeviceKind, workers: usize) -> ClassInfo {
        // Only the runtime makes a ClassInfo: take a resolved one and reshape it.
        let cpu: coexec_actors::DeviceList = "cpu:1".parse().expect("spec");
        let mut c = coexec_actors::resolve(Some(&cpu))
            .expect("one CPU worker resolves")
            .0
            .remove(0);
        c.index = index;
        c.name = name.into();
        c.profile_key = name.into();
        c.kind = kind;
        c.workers = workers;
        c
    }

    fn classes() -> Vec<ClassInfo> {
        vec![
            class(0, "cpu", DeviceKind::Cpu, 2),
            class(
                1,
                "sim",
                DeviceKind::Sim {
                    speed: 2.0,
                    latency: Duration::ZERO,
                },
                1,
            ),
            class(2, "cuda:0", DeviceKind::Cuda { id: 0 }, 2),
        ]
    }

    fn chunk(
        worker: usize,
        lo: usize,
        hi: usize,
        start: f64,
        end: f64,
        phase: Phase,
    ) -> ChunkRecord {
        ChunkRecord::new(worker, lo..hi, start, end, phase)
    }

    fn run(started_s: f64, chunks: Vec<ChunkRecord>) -> RunReport {
        let mut r = RunReport::default();
        r.kernel = "synthetic".into();
        r.policy = "hybrid".into();
        r.items = chunks.iter().map(|c| c.hi - c.lo).sum();
        r.started_s = started_s;
        r.makespan_s = chunks.iter().map(|c| c.end).fold(0.0, f64::max);
        r.imbalance = 0.1;
        r.split = vec![0.5, 0.5];
        r.chunks = chunks;
        r
    }

    fn events(v: &Value) -> &Vec<Value> {
        v["traceEvents"]
            .as_array()
            .expect("traceEvents is an array")
    }

    fn thread_names(v: &Value) -> Vec<(u64, u64, String)> {
        events(v)
            .iter()
            .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
            .map(|e| {
                (
                    e["pid"].as_u64().unwrap(),
                    e["tid"].as_u64().unwrap(),
                    e["args"]["name"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn workers_map_to_their_class_in_class_order() {
        let t = chrome_trace(&[], &classes());
        let names = thread_names(&t);
        assert_eq!(
            names,
            vec![
                (0, 0, "cpu:0".to_string()),
                (0, 1, "cpu:1".to_string()),
                (1, 2, "sim/0".to_string()),
                (2, 3, "cuda:0/s0".to_string()),
                (2, 4, "cuda:0/s1".to_string()),
            ]
        );
        let procs: Vec<(u64, &str)> = events(&t)
            .iter()
            .filter(|e| e["name"] == "process_name")
            .map(|e| {
                (
                    e["pid"].as_u64().unwrap(),
                    e["args"]["name"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(procs, vec![(0, "cpu"), (1, "sim"), (2, "cuda:0")]);
        assert_eq!(t["displayTimeUnit"], "ms");
    }

    #[test]
    fn one_complete_event_per_chunk_at_absolute_microseconds() {
        let r0 = run(
            1.0,
            vec![
                chunk(0, 0, 10, 0.0, 0.25, Phase::Probe),
                chunk(2, 10, 30, 0.001, 0.5, Phase::Static),
                chunk(4, 30, 32, 0.5, 0.5, Phase::Dynamic),
            ],
        );
        let r1 = run(3.0, vec![chunk(1, 0, 7, 0.125, 0.375, Phase::Retry)]);
        let t = chrome_trace(&[r0, r1], &classes());
        let chunks: Vec<&Value> = events(&t)
            .iter()
            .filter(|e| e["ph"] == "X" && e["cat"] != RUN_CATEGORY)
            .collect();
        assert_eq!(chunks.len(), 4);

        let e = chunks[1];
        assert_eq!((e["pid"].as_u64(), e["tid"].as_u64()), (Some(1), Some(2)));
        assert_eq!(e["name"], "synthetic");
        assert_eq!(e["cat"], "static");
        assert!((e["ts"].as_f64().unwrap() - 1_001_000.0).abs() < 1e-6);
        assert!((e["dur"].as_f64().unwrap() - 499_000.0).abs() < 1e-6);
        assert_eq!(e["args"]["items"], 20);
        assert_eq!(
            (e["args"]["lo"].as_u64(), e["args"]["hi"].as_u64()),
            (Some(10), Some(30))
        );
        assert_eq!(e["args"]["phase"], "static");
        assert_eq!(e["args"]["policy"], "hybrid");
        assert_eq!(e["args"]["run"], 0);

        let e = chunks[2];
        assert_eq!((e["pid"].as_u64(), e["tid"].as_u64()), (Some(2), Some(4)));
        assert_eq!(e["dur"].as_f64(), Some(0.0));

        let e = chunks[3];
        assert_eq!((e["pid"].as_u64(), e["tid"].as_u64()), (Some(0), Some(1)));
        assert_eq!(e["cat"], "retry");
        assert_eq!(e["args"]["run"], 1);
        assert!((e["ts"].as_f64().unwrap() - 3_125_000.0).abs() < 1e-6);

        let spans: Vec<&Value> = events(&t)
            .iter()
            .filter(|e| e["cat"] == RUN_CATEGORY)
            .collect();
        assert_eq!(spans.len(), 2);
        assert!((spans[1]["ts"].as_f64().unwrap() - 3e6).abs() < 1e-6);
        assert!((spans[0]["dur"].as_f64().unwrap() - 0.5e6).abs() < 1e-6);
        // The run track is its own process, after every class.
        assert!(spans.iter().all(|s| s["pid"].as_u64() > Some(2)));
    }

    #[test]
    fn a_worker_outside_the_classes_gets_a_stray_track() {
        let t = chrome_trace(
            &[run(0.0, vec![chunk(9, 0, 4, 0.0, 0.1, Phase::Dynamic)])],
            &classes(),
        );
        let x = events(&t).iter().find(|e| e["cat"] == "dynamic").unwrap();
        let pid = x["pid"].as_u64().unwrap();
        assert!(pid > 2);
        assert!(thread_names(&t).contains(&(pid, 9, "worker 9".to_string())));
    }

    #[test]
    fn writes_a_file_that_parses_back() {
        let dir = std::env::temp_dir().join(format!("coexec-trace-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.json");
        let r = run(0.5, vec![chunk(0, 0, 3, 0.0, 0.1, Phase::Static)]);
        write_chrome_trace(&path, std::slice::from_ref(&r), &classes()).unwrap();
        let back: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(back, chrome_trace(&[r], &classes()));
        std::fs::remove_dir_all(&dir).unwrap();

        let err = write_chrome_trace(&dir.join("missing/t.json"), &[], &classes()).unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err:?}");
    }
}
