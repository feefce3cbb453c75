//! The virtual machine against the lease it was calibrated on, and the
//! scheduler's promises on it.
#![cfg(test)]

use super::*;

const POLICIES: &[&str] = &[
    "cpu-only",
    "accel-only",
    "static",
    "static+dynamic",
    "hybrid",
];

#[test]
fn the_model_reproduces_the_h100_lease() {
    let cal = h100();
    let mut rows = Vec::new();
    for w in &cal.workloads {
        let m = Machine::fitted(w);
        let r = bench(&m, &w.name, w.items, w.runs, POLICIES, 3, 7);
        rows.push(format!(
            "{:<10} T cpu {:.4} ({:.4}) gpu {:.4} ({:.4}) | E hybrid {:.3} (lease {:.3}) static {:.4} (lease {}) hybrid {:.4} (lease {:.4})",
            w.name,
            r.alone[CPU].0,
            w.measured.t_cpu_s,
            r.alone[GPU].0,
            w.measured.t_gpu_s,
            r.e("hybrid"),
            w.measured.e_hybrid,
            r.policies["static"],
            w.measured.policies_s.get("static").map_or("-".into(), |t| format!("{t:.4}")),
            r.policies["hybrid"],
            w.measured.policies_s["hybrid"],
        ));
    }
    println!("{}", rows.join("\n"));
}

#[test]
#[ignore]
fn debug_runs() {
    let cal = h100();
    let name = std::env::var("VT_W").unwrap_or("nbody".into());
    let w = cal.workload(&name);
    let m = Machine::fitted(w);
    let mut s = Series::new(&w.name, 7);
    s.trace = true;
    let hybrid = by_name("hybrid").unwrap();
    for j in 0..4 {
        let (t, reps) = m.job(
            &mut s,
            &JobOptions::new().policy(hybrid.clone()),
            w.items,
            w.runs,
        );
        let fin = |c: usize| reps.iter().map(|r| r.classes[c].finish_s).sum::<f64>();
        let items = |c: usize| {
            reps.iter().map(|r| r.classes[c].items).sum::<usize>() as f64
                / (w.items * w.runs) as f64
        };
        println!(
            "job {j}: {t:.4}  cpu finish {:.4} ({:.3})  gpu finish {:.4} ({:.3})",
            fin(CPU),
            items(CPU),
            fin(GPU),
            items(GPU)
        );
        for r in reps.iter().take(6) {
            println!(
                "  {} probe {:?}",
                r.summary(),
                r.probe.as_ref().map(|p| (p.kind, p.imbalance, p.replanned))
            );
            for c in r
                .chunks
                .iter()
                .filter(|c| c.worker >= m.cpu.workers && std::env::var("VT_CHUNKS").is_ok())
            {
                println!(
                    "     w{} {:?} {}..{} ({}) {:.4}-{:.4}",
                    c.worker,
                    c.phase,
                    c.lo,
                    c.hi,
                    c.hi - c.lo,
                    c.start,
                    c.end
                );
            }
        }
    }
}

#[test]
#[ignore]
fn debug_seeds() {
    let cal = h100();
    for w in &cal.workloads {
        let m = Machine::fitted(w);
        let es: Vec<String> = (1..=6)
            .map(|seed| {
                let r = bench(&m, &w.name, w.items, w.runs, POLICIES, 3, seed);
                format!(
                    "{:.3}/{:.2}",
                    r.e("hybrid"),
                    r.policies["static"] / r.policies["hybrid"]
                )
            })
            .collect();
        println!(
            "{:<10} lease {:.3}: {}",
            w.name,
            w.measured.e_hybrid,
            es.join(" ")
        );
    }
}
