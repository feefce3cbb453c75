//! The workloads the CLI runs, built from its arguments.

use std::path::PathBuf;
use std::sync::Arc;

use coexec::kernels::workloads::{
    KmeansConfig, KmeansData, KmeansJob, MatmulJob, MatmulProblem, NbodyJob, NbodyProblem, OneShot,
    PathfinderJob, PathfinderProblem, Workload,
};
use coexec::kernels::workloads::{busy_ns_per_round, check_bytes};
use coexec::kernels::{Empty, KernelError, Synthetic};
use coexec::{JobOptions, RunReport, Runtime};
use serde_json::{Value, json};

/// Workload parameters shared by `run` and `bench`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct WorkloadArgs {
    /// Items (synthetic, empty); matrices (matmul); columns (pathfinder); bodies (nbody).
    #[arg(long)]
    pub(crate) size: Option<usize>,
    /// synthetic: busy rounds per item.
    #[arg(long, default_value_t = 1000)]
    pub(crate) work: u32,
    /// matmul: number of products.
    #[arg(long)]
    pub(crate) count: Option<usize>,
    /// matmul: matrix dimension.
    #[arg(long, default_value_t = 100)]
    pub(crate) dim: usize,
    /// kmeans: input file in Rodinia's format (plain or .xz).
    #[arg(long)]
    pub(crate) file: Option<PathBuf>,
    /// kmeans: generate this many points of kdd_cup's shape (its 34
    /// features, Gaussian blobs) instead of reading a file: a step long
    /// enough for a big GPU.
    #[arg(long, conflicts_with = "file")]
    pub(crate) points: Option<usize>,
    /// kmeans: clusters.
    #[arg(long, default_value_t = 5)]
    pub(crate) clusters: usize,
    /// kmeans: convergence threshold on changed memberships.
    #[arg(long, default_value_t = 0.001)]
    pub(crate) threshold: f32,
    /// pathfinder: columns.
    #[arg(long)]
    pub(crate) cols: Option<usize>,
    /// pathfinder: rows.
    #[arg(long)]
    pub(crate) rows: Option<usize>,
    /// pathfinder: rows advanced per run (pyramid height).
    #[arg(long)]
    pub(crate) pyramid: Option<usize>,
    /// nbody: bodies.
    #[arg(long)]
    pub(crate) bodies: Option<usize>,
    /// nbody: time steps.
    #[arg(long)]
    pub(crate) steps: Option<usize>,
}

/// The names `run` and `bench` accept.
pub(crate) const NAMES: &[&str] = &[
    "synthetic",
    "empty",
    "matmul",
    "kmeans",
    "pathfinder",
    "nbody",
];

/// The four benchmarks of the method's paper.
pub(crate) const BENCHMARKS: &[&str] = &["matmul", "kmeans", "pathfinder", "nbody"];

/// The default kmeans input: Rodinia's kdd_cup next to the repository.
pub(crate) fn default_kmeans_file() -> PathBuf {
    match std::env::var_os("COEXEC_KMEANS_DATA") {
        Some(d) => PathBuf::from(d).join("kdd_cup.xz"),
        None => PathBuf::from("../shared/data/rodinia-kmeans/kdd_cup.xz"),
    }
}

/// What a generated kmeans input of `points` points is, and why it was
/// used: kdd_cup's size stands in for a missing file, any other was asked
/// for (`--points`).
pub(crate) fn generated_kmeans_note(points: usize) -> String {
    let why = if points == KmeansData::KDD_POINTS {
        format!("no Rodinia kdd_cup at {}", default_kmeans_file().display())
    } else {
        "--points".to_string()
    };
    format!(
        "kdd_cup's shape, {points}×{}, {} Gaussian blobs, seed {:#x}; {why}",
        KmeansData::KDD_FEATURES,
        KmeansData::GENERATED_BLOBS,
        KmeansData::GENERATED_SEED,
    )
}

/// A workload ready to run any number of times (inputs built once).
pub(crate) enum Prepared {
    Synthetic { items: usize, work: u32 },
    Empty { items: usize },
    Matmul(MatmulProblem),
    Kmeans(Arc<KmeansData>, KmeansConfig),
    Pathfinder(PathfinderJob),
    Nbody(NbodyProblem),
}

/// Limits against typos that would ask for terabytes.
const MAX_ITEMS: usize = 1 << 32;

/// A default synthetic job takes the slowest class alone at most this many
/// times its target co-executed time.
const SLOWEST_ALONE: f64 = 20.0;

fn nonzero(what: &'static str, v: usize) -> Result<usize, KernelError> {
    if v == 0 {
        Err(KernelError::invalid(what, "must be at least 1"))
    } else if v > MAX_ITEMS {
        Err(KernelError::invalid(
            what,
            format!("{v} is absurdly large (max {MAX_ITEMS})"),
        ))
    } else {
        Ok(v)
    }
}

impl Prepared {
    /// Builds `name` from `a`; `bench` sizes apply when a size is not given.
    /// `speeds`: each device class's speed relative to one CPU worker, to
    /// size synthetic runs to about a target of ideal time.
    pub(crate) fn new(
        name: &str,
        a: &WorkloadArgs,
        bench: bool,
        speeds: &[f64],
    ) -> Result<Self, KernelError> {
        // A workload's own size flag, else `--size`, else its default for
        // `bench` or for `run`.
        let size = |flag: &'static str, own: Option<usize>, for_bench: usize, for_run: usize| {
            nonzero(
                flag,
                own.or(a.size)
                    .unwrap_or(if bench { for_bench } else { for_run }),
            )
        };
        Ok(match name {
            "synthetic" => {
                let items = match a.size {
                    Some(n) => nonzero("--size", n)?,
                    None => {
                        // About 0.6 s of ideal co-executed time (bench) or
                        // 0.2 s (run), but the slowest class alone at most
                        // SLOWEST_ALONE times that: a class thousands of
                        // times faster than the CPU would otherwise size a
                        // job the CPU alone takes hours over (and memory
                        // for billions of items).
                        let target = if bench { 0.6 } else { 0.2 };
                        let per_item = busy_ns_per_round() * 1e-9 * a.work.max(1) as f64;
                        let sum: f64 = speeds.iter().sum();
                        let slowest = speeds.iter().copied().fold(f64::INFINITY, f64::min);
                        let ideal = target * sum.max(1.0) / per_item;
                        let capped = SLOWEST_ALONE * target * slowest.max(1.0) / per_item;
                        (ideal.min(capped) as usize).clamp(1000, MAX_ITEMS)
                    }
                };
                // A u64 output and a u32 count per item, checked against
                // this machine and the process's limits.
                check_bytes("--size", &[items], 12)?;
                Prepared::Synthetic {
                    items,
                    work: a.work,
                }
            }
            "empty" => Prepared::Empty {
                items: nonzero("--size", a.size.unwrap_or(1_000_000))?,
            },
            "matmul" => {
                let count = size("--count", a.count, 20_000, 2_000)?;
                Prepared::Matmul(MatmulProblem::new(count, nonzero("--dim", a.dim)?)?)
            }
            "kmeans" => {
                // A file given (--file, COEXEC_KMEANS_DATA) must be there;
                // Rodinia's kdd_cup beside the repository is preferred;
                // without it, an input of its shape is generated.
                let given = a.file.clone().or_else(|| {
                    std::env::var_os("COEXEC_KMEANS_DATA").map(|_| default_kmeans_file())
                });
                let path = given.clone().unwrap_or_else(default_kmeans_file);
                let data = match a.points {
                    Some(n) => KmeansData::generated(
                        nonzero("--points", n)?,
                        KmeansData::KDD_FEATURES,
                        KmeansData::GENERATED_SEED,
                    )?,
                    None if given.is_some() || path.exists() => KmeansData::read(&path)?,
                    None => KmeansData::generated_kdd_shape()?,
                };
                let cfg = KmeansConfig::new(a.clusters, a.threshold)?;
                if cfg.clusters > data.points() {
                    return Err(KernelError::Input {
                        path,
                        line: 0,
                        why: format!(
                            "{} clusters but only {} points",
                            cfg.clusters,
                            data.points()
                        ),
                    });
                }
                Prepared::Kmeans(Arc::new(data), cfg)
            }
            "pathfinder" => {
                let cols = size("--cols", a.cols, 1_000_000, 100_000)?;
                let rows = nonzero("--rows", a.rows.unwrap_or(if bench { 1000 } else { 100 }))?;
                let mut p = PathfinderProblem::new(cols, rows)?;
                if let Some(h) = a.pyramid {
                    p = p.with_pyramid(h)?;
                }
                Prepared::Pathfinder(PathfinderJob::new(p)?)
            }
            "nbody" => {
                let bodies = size("--bodies", a.bodies, 16_384, 4096)?;
                let steps = nonzero("--steps", a.steps.unwrap_or(if bench { 10 } else { 4 }))?;
                Prepared::Nbody(NbodyProblem::new(bodies, steps)?)
            }
            other => {
                return Err(KernelError::invalid(
                    "workload",
                    format!("unknown `{other}`; expected one of {}", NAMES.join(", ")),
                ));
            }
        })
    }

    /// Items per run.
    pub(crate) fn items(&self) -> usize {
        match self {
            Prepared::Synthetic { items, .. } | Prepared::Empty { items } => *items,
            Prepared::Matmul(p) => p.count(),
            Prepared::Kmeans(d, _) => d.points(),
            Prepared::Pathfinder(j) => j.problem().cols(),
            Prepared::Nbody(p) => p.bodies(),
        }
    }

    /// The input a kmeans run uses (a file, or generated), for the output.
    pub(crate) fn input(&self) -> Option<String> {
        match self {
            Prepared::Kmeans(d, _) => Some(match d.source() {
                Some(p) => format!("Rodinia file {}", p.display()),
                None => format!("generated ({})", generated_kmeans_note(d.points())),
            }),
            _ => None,
        }
    }

    /// Parameters as command-line flags.
    pub(crate) fn params(&self, a: &WorkloadArgs) -> String {
        match self {
            Prepared::Synthetic { items, work } => format!("--size {items} --work {work}"),
            Prepared::Empty { items } => format!("--size {items}"),
            Prepared::Matmul(p) => format!("--count {} --dim {}", p.count(), p.dim()),
            Prepared::Kmeans(d, c) => format!(
                "{} --clusters {} --threshold {}",
                match d.source() {
                    Some(p) => format!("--file {}", p.display()),
                    None => format!("--points {}", d.points()),
                },
                c.clusters,
                a.threshold
            ),
            Prepared::Pathfinder(j) => {
                let p = j.problem();
                format!(
                    "--cols {} --rows {} --pyramid {}",
                    p.cols(),
                    p.rows(),
                    p.pyramid()
                )
            }
            Prepared::Nbody(p) => format!("--bodies {} --steps {}", p.bodies(), p.steps()),
        }
    }

    /// Runs once on `rt`: the result as JSON, every run's report, and the
    /// wall seconds of the job itself (from its built inputs to its output).
    pub(crate) async fn run(&self, rt: &Runtime, opts: JobOptions) -> Result<Ran, coexec::Error> {
        Ok(match self {
            Prepared::Synthetic { items, work } => {
                let (k, reports, wall_s, inputs_s) = drive(
                    rt,
                    || Ok(OneShot::new(Synthetic::try_new(*items, *work)?)),
                    opts,
                )
                .await?;
                let verified = k
                    .map(|mut k| k.verify())
                    .unwrap_or_else(|| Err("no kernel came back".into()));
                if let Err(e) = verified {
                    return Err(coexec::Error::Kernel(KernelError::invalid(
                        "synthetic result",
                        e,
                    )));
                }
                Ran {
                    result: json!({ "verified": true }),
                    reports,
                    wall_s,
                    inputs_s,
                }
            }
            Prepared::Empty { items } => {
                let (_, reports, wall_s, inputs_s) =
                    drive(rt, || Ok(OneShot::new(Empty::new(*items))), opts).await?;
                Ran {
                    result: json!({}),
                    reports,
                    wall_s,
                    inputs_s,
                }
            }
            Prepared::Matmul(p) => {
                let (out, reports, wall_s, inputs_s) =
                    drive(rt, || MatmulJob::new(*p), opts).await?;
                Ran {
                    result: json!({ "checksum": out.checksum() }),
                    reports,
                    wall_s,
                    inputs_s,
                }
            }
            Prepared::Kmeans(d, c) => {
                let (out, reports, wall_s, inputs_s) =
                    drive(rt, || KmeansJob::new(d.clone(), *c), opts).await?;
                Ran {
                    result: serde_json::to_value(&out).unwrap_or(Value::Null),
                    reports,
                    wall_s,
                    inputs_s,
                }
            }
            Prepared::Pathfinder(j) => {
                let (out, reports, wall_s, inputs_s) = drive(rt, || j.restart(), opts).await?;
                let result = json!({ "sha256": out.sha256_hex(), "row_text": out.rodinia_text() });
                Ran {
                    result,
                    reports,
                    wall_s,
                    inputs_s,
                }
            }
            Prepared::Nbody(p) => {
                let (out, reports, wall_s, inputs_s) =
                    drive(rt, || NbodyJob::new(*p), opts).await?;
                let b = &out.bodies;
                Ran {
                    result: json!({ "bodies": b.len(), "checksum": bodies_checksum(b) }),
                    reports,
                    wall_s,
                    inputs_s,
                }
            }
        })
    }

    /// Runs once on a rayon pool (the baseline): the wall seconds of the job
    /// itself, timed exactly as [`Prepared::run`] times coexec's.
    pub(crate) fn run_rayon(&self, pool: &rayon::ThreadPool) -> Result<f64, KernelError> {
        Ok(match self {
            Prepared::Synthetic { items, work } => {
                rayon_timed(pool, OneShot::new(Synthetic::try_new(*items, *work)?))?
            }
            Prepared::Empty { items } => rayon_timed(pool, OneShot::new(Empty::new(*items)))?,
            Prepared::Matmul(p) => rayon_timed(pool, MatmulJob::new(*p)?)?,
            Prepared::Kmeans(d, c) => rayon_timed(pool, KmeansJob::new(d.clone(), *c)?)?,
            Prepared::Pathfinder(j) => rayon_timed(pool, j.restart()?)?,
            Prepared::Nbody(p) => rayon_timed(pool, NbodyJob::new(*p)?)?,
        })
    }
}

/// One run of a workload on coexec.
pub(crate) struct Ran {
    /// The result, as JSON.
    pub(crate) result: Value,
    /// Every run's report.
    pub(crate) reports: Vec<RunReport>,
    /// Wall seconds of the job, inputs already built.
    pub(crate) wall_s: f64,
    /// Wall seconds building the job's inputs before it (matmul's matrices,
    /// nbody's bodies; inputs built by [`Prepared::new`] are not counted).
    pub(crate) inputs_s: f64,
}

/// `rt.drive(build())`: the output, every run's report, the wall seconds
/// from the built workload to its output, and the seconds `build` took
/// (generating the job's inputs).
async fn drive<W: Workload + 'static>(
    rt: &Runtime,
    build: impl FnOnce() -> Result<W, KernelError>,
    opts: JobOptions,
) -> Result<(W::Output, Vec<RunReport>, f64, f64), coexec::Error> {
    let t = std::time::Instant::now();
    let w = build()?;
    let inputs_s = t.elapsed().as_secs_f64();
    let t = std::time::Instant::now();
    let (out, reports) = rt.drive(w, opts).await?;
    Ok((out, reports, t.elapsed().as_secs_f64(), inputs_s))
}

/// The rayon baseline on `w`, timed the same way.
fn rayon_timed<W: Workload>(pool: &rayon::ThreadPool, w: W) -> Result<f64, KernelError> {
    let t = std::time::Instant::now();
    coexec_kernels::baseline::run_rayon(pool, w)?;
    Ok(t.elapsed().as_secs_f64())
}

/// Sum of every position and velocity component, in f64: equal results give
/// equal sums.
fn bodies_checksum(b: &coexec::kernels::workloads::Bodies) -> f64 {
    [&b.x, &b.y, &b.z, &b.vx, &b.vy, &b.vz]
        .iter()
        .flat_map(|v| v.iter())
        .map(|&x| x as f64)
        .sum()
}
