//! `coexec bench --plot`: the bench report as an SVG a reader can take in at
//! a glance.
//!
//! One row per workload, two panels:
//!
//! ```text
//!  ┌ matmul: time per run ─────────────────┐ ┌ matmul: split over successive runs ┐
//!  │ alone cpu     ████████████  2.10 s  ¦ │ │ ██ ██ ██ ██   stacked share per class │
//!  │ alone cuda:0  █████  0.80 s         ¦ │ │ ██ ██ ██ ██                           │
//!  │ hybrid E=0.94 ████ 0.62 s           ¦ │ │ ██ ██ ██ ██   ●──●──●  probe δ′       │
//!  │              T* (dashed) ───────────¦ │ │ 1c 2w 3w 4w                           │
//!  └───────────────────────────────────────┘ └───────────────────────────────────────┘
//! ```
//!
//! Left: each device class alone, each policy co-executed, and the ideal T*
//! (a red dashed line), in seconds. Right: per run of the learning check, the
//! share of items each class computed (stacked, in the class's colour from the
//! left panel) and the probe's imbalance δ′, so a reader sees the profiler
//! learn: the cold run's probe is off balance, the warm runs start balanced.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::report::{BenchReport, WorkloadBench};

/// Device classes, in order of first appearance.
const CLASS_COLOURS: [RGBColor; 6] = [
    RGBColor(76, 114, 176),
    RGBColor(85, 168, 104),
    RGBColor(129, 114, 179),
    RGBColor(100, 181, 205),
    RGBColor(204, 185, 116),
    RGBColor(140, 140, 140),
];
/// Co-executed runs.
const COEXEC_COLOUR: RGBColor = RGBColor(221, 132, 82);
/// The ideal T*.
const IDEAL_COLOUR: RGBColor = RGBColor(200, 30, 30);

const FONT: &str = "sans-serif";
const WIDTH: u32 = 1500;
const ROW_HEIGHT: u32 = 420;

/// Renders `report` to an SVG file at `path`: per workload, the times panel
/// and the learning panel side by side.
pub(crate) fn plot_bench(path: &Path, report: &BenchReport) -> Result<(), String> {
    if report.workloads.is_empty() {
        return Err("the bench report has no workloads to plot".into());
    }
    let rows = report.workloads.len();
    let height = 70 + ROW_HEIGHT * rows as u32;
    let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let mut title = format!(
        "coexec bench: {} on {}",
        report.devices, report.machine.cpu_model
    );
    if !report.machine.gpus.is_empty() {
        title.push_str(&format!(" + {}", report.machine.gpus.join(", ")));
    }
    let root = root.titled(&title, (FONT, 24)).map_err(draw_err)?;
    let panels = root.split_evenly((rows, 2));
    for (wl, pair) in report.workloads.iter().zip(panels.chunks(2)) {
        let colours = class_colours(wl);
        times_panel(&pair[0], wl, &colours)?;
        learning_panel(&pair[1], wl, &colours)?;
    }
    root.present()
        .map_err(|e| format!("{}: {e}", path.display()))
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// The series' legend box, the same on both panels.
fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font((FONT, 13))
        .draw()
        .map_err(draw_err)
}

fn draw_err<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> String {
    format!("drawing the plot: {e}")
}

/// The workload's device classes (alone runs, then any only seen co-executed)
/// with a colour each.
fn class_colours(wl: &WorkloadBench) -> HashMap<String, RGBColor> {
    let mut names: Vec<&str> = wl.alone.iter().map(|a| a.class.as_str()).collect();
    for c in wl.policies.iter().flat_map(|p| &p.classes) {
        if !names.contains(&c.name.as_str()) {
            names.push(&c.name);
        }
    }
    names
        .into_iter()
        .enumerate()
        .map(|(i, n)| (n.to_string(), CLASS_COLOURS[i % CLASS_COLOURS.len()]))
        .collect()
}

/// The class names that `LearningRun::split` is indexed by: the classes of a
/// co-executed run when they line up, else the alone runs'.
fn split_names(wl: &WorkloadBench, len: usize) -> Vec<String> {
    let from_policy = wl
        .policies
        .iter()
        .map(|p| p.classes.iter().map(|c| c.name.clone()).collect::<Vec<_>>());
    let from_alone = std::iter::once(wl.alone.iter().map(|a| a.class.clone()).collect::<Vec<_>>());
    from_policy
        .chain(from_alone)
        .find(|names| names.len() == len)
        .unwrap_or_else(|| (0..len).map(|i| format!("class {i}")).collect())
}

fn finite(x: f64) -> Option<f64> {
    (x.is_finite() && x >= 0.0).then_some(x)
}

/// Left panel: horizontal bars in seconds, the alone runs on top, then the
/// policies, with T* as a dashed line across them.
fn times_panel(
    area: &Area<'_>,
    wl: &WorkloadBench,
    colours: &HashMap<String, RGBColor>,
) -> Result<(), String> {
    struct Bar {
        label: String,
        seconds: f64,
        colour: RGBColor,
        /// Not measured: the speed model's prediction (drawn pale).
        predicted: bool,
    }
    let mut bars: Vec<Bar> = wl
        .alone
        .iter()
        .filter_map(|a| {
            Some(Bar {
                label: if a.predicted {
                    format!("{} alone (predicted)", a.class)
                } else {
                    format!("{} alone", a.class)
                },
                seconds: finite(a.median_s)?,
                colour: colours.get(&a.class).copied().unwrap_or(CLASS_COLOURS[0]),
                predicted: a.predicted,
            })
        })
        .collect();
    let n_alone = bars.len();
    bars.extend(wl.policies.iter().filter_map(|p| {
        Some(Bar {
            label: format!("{}  E={:.2}", p.policy, p.efficiency),
            seconds: finite(p.makespan_s)?,
            colour: COEXEC_COLOUR,
            predicted: false,
        })
    }));
    let ideal = finite(wl.ideal_s).filter(|&t| t > 0.0);
    let n_bars = bars.len().max(1);
    // The legend gets rows of its own under the bars, so it never hides one:
    // enough empty rows for its entries at this panel's height.
    let mut alone_colours: Vec<RGBColor> = Vec::new();
    for b in bars.iter().take(n_alone) {
        if !alone_colours.contains(&b.colour) {
            alone_colours.push(b.colour);
        }
    }
    let entries =
        alone_colours.len() + usize::from(bars.len() > n_alone) + usize::from(ideal.is_some());
    let legend_px = 18.0 * entries as f64 + 24.0;
    let plot_px = area.dim_in_pixel().1 as f64 - 100.0;
    let spare = if plot_px > 2.0 * legend_px {
        (legend_px * n_bars as f64 / (plot_px - legend_px)).ceil() as usize
    } else {
        n_bars
    };
    let n = n_bars + spare.max(1);
    let longest = bars
        .iter()
        .map(|b| b.seconds)
        .chain(ideal)
        .fold(0.0, f64::max);
    let x_max = if longest > 0.0 { longest * 1.25 } else { 1.0 };

    let caption = format!(
        "{}: time per run ({} items{})",
        wl.name,
        wl.items,
        params(wl)
    );
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(170)
        .build_cartesian_2d(
            0.0..x_max,
            Slots {
                n,
                first: n - bars.len(),
            },
        )
        .map_err(draw_err)?;
    // Bars are drawn top-down: bar i sits in slot n-1-i; the legend's rows
    // are the lowest slots.
    let labels: Vec<String> = std::iter::repeat_n(String::new(), n - bars.len())
        .chain(bars.iter().rev().map(|b| b.label.clone()))
        .collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("seconds (median of the repeats)")
        .x_label_formatter(&|x| format!("{x:.*}", axis_decimals(x_max)))
        .y_label_formatter(&|y| labels.get(slot_of(*y)).cloned().unwrap_or_default())
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .draw()
        .map_err(draw_err)?;

    let rect = |i: usize, b: &Bar| {
        let row = (n - 1 - i) as f64;
        let style = if b.predicted {
            b.colour.mix(0.35).filled()
        } else {
            b.colour.filled()
        };
        Rectangle::new([(0.0, row + 0.12), (b.seconds, row + 0.88)], style)
    };
    // One legend entry per class alone, one for the co-executed runs.
    let mut seen = Vec::new();
    for (i, b) in bars.iter().enumerate().take(n_alone) {
        let series = chart
            .draw_series(std::iter::once(rect(i, b)))
            .map_err(draw_err)?;
        if !seen.contains(&b.colour) {
            seen.push(b.colour);
            let c = b.colour;
            series
                .label(b.label.clone())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
        }
    }
    if bars.len() > n_alone {
        chart
            .draw_series(
                bars.iter()
                    .enumerate()
                    .skip(n_alone)
                    .map(|(i, b)| rect(i, b)),
            )
            .map_err(draw_err)?
            .label("co-executed (policy, efficiency E = T*/T)")
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], COEXEC_COLOUR.filled()));
    }
    let value_style =
        TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            Text::new(
                format!(" {}", duration(b.seconds)),
                (b.seconds, (n - 1 - i) as f64 + 0.5),
                value_style.clone(),
            )
        }))
        .map_err(draw_err)?;
    if let Some(t) = ideal {
        chart
            .draw_series(DashedLineSeries::new(
                [(t, (n - bars.len()) as f64), (t, n as f64)],
                8,
                5,
                IDEAL_COLOUR.stroke_width(2),
            ))
            .map_err(draw_err)?
            .label(format!("T* = 1/Σ(1/T_alone) = {}", duration(t)))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 14, y)], IDEAL_COLOUR.stroke_width(2)));
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)
}

/// Right panel: per learning run, the stacked share per class and the probe
/// imbalance δ′.
fn learning_panel(
    area: &Area<'_>,
    wl: &WorkloadBench,
    colours: &HashMap<String, RGBColor>,
) -> Result<(), String> {
    // Three cold/warm pairs fit with readable labels; the medians over all
    // pairs are in the printed table and the JSON.
    const SHOWN: usize = 6;
    let runs = &wl.learning[..wl.learning.len().min(SHOWN)];
    let caption = if runs.len() < wl.learning.len() {
        format!(
            "{}: split over successive runs (first {} of {} pairs)",
            wl.name,
            runs.len() / 2,
            wl.learning.len() / 2
        )
    } else {
        format!("{}: split over successive runs", wl.name)
    };
    if runs.is_empty() {
        let area = area.titled(&caption, (FONT, 18)).map_err(draw_err)?;
        let (w, h) = area.dim_in_pixel();
        area.draw(&Text::new(
            "no learning runs in this report",
            (w as i32 / 2, h as i32 / 2),
            TextStyle::from((FONT, 15).into_font()).pos(Pos::new(HPos::Center, VPos::Center)),
        ))
        .map_err(draw_err)?;
        return Ok(());
    }
    let classes = runs.iter().map(|r| r.split.len()).max().unwrap_or(0);
    let names = split_names(wl, classes);
    let n = runs.len();
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(slots(n), 0.0..1.45)
        .map_err(draw_err)?;
    let run_labels: Vec<String> = runs
        .iter()
        .map(|r| format!("run {} ({})", r.run, r.probe))
        .collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc("run of the learning check (probe cold or warm)")
        .y_desc("share of items · probe imbalance δ′")
        .x_label_formatter(&|x| run_labels.get(slot_of(*x)).cloned().unwrap_or_default())
        .y_labels(8)
        .y_label_formatter(&|y| {
            if *y <= 1.0 + 1e-9 {
                format!("{y:.1}")
            } else {
                String::new()
            }
        })
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .draw()
        .map_err(draw_err)?;

    for (k, name) in names.iter().enumerate() {
        let colour = colours
            .get(name)
            .copied()
            .unwrap_or(CLASS_COLOURS[k % CLASS_COLOURS.len()]);
        let bars = runs.iter().enumerate().filter_map(|(i, r)| {
            let below: f64 = r.split.iter().take(k).filter_map(|s| finite(*s)).sum();
            let share = finite(*r.split.get(k)?)?;
            let x = i as f64;
            Some(Rectangle::new(
                [(x + 0.15, below), (x + 0.85, below + share)],
                colour.filled(),
            ))
        });
        chart
            .draw_series(bars)
            .map_err(draw_err)?
            .label(format!("{name} share"))
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], colour.filled()));
    }
    let points: Vec<(f64, f64)> = runs
        .iter()
        .enumerate()
        .filter_map(|(i, r)| Some((i as f64 + 0.5, finite(r.probe_imbalance)?.min(1.0))))
        .collect();
    chart
        .draw_series(LineSeries::new(points.clone(), BLACK.stroke_width(2)))
        .map_err(draw_err)?
        .label("probe imbalance δ′")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 14, y)], BLACK.stroke_width(2)));
    chart
        .draw_series(points.iter().map(|p| Circle::new(*p, 4, BLACK.filled())))
        .map_err(draw_err)?;
    let note_style =
        TextStyle::from((FONT, 12).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
    chart
        .draw_series(runs.iter().enumerate().map(|(i, r)| {
            let re = if r.replanned { ", re-planned" } else { "" };
            Text::new(
                format!("{}, E={:.2}{re}", duration(r.makespan_s), r.efficiency),
                (i as f64 + 0.5, 1.03),
                note_style.clone(),
            )
        }))
        .map_err(draw_err)?;
    legend(&mut chart, SeriesLabelPosition::UpperRight)
}

/// An axis of `n` slots of width 1, labelled at their centres: slot `i`
/// spans `[i, i + 1)`. (plotters' segmented integer axis has one slot too
/// many, and collapses when there is a single one.)
struct Slots {
    n: usize,
    /// Slots below this one carry no label and no tick (the legend's rows).
    first: usize,
}

impl Ranged for Slots {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let n = self.n.max(1) as f64;
        limit.0 + ((limit.1 - limit.0) as f64 * v / n).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, _hint: H) -> Vec<f64> {
        (self.first..self.n).map(|i| i as f64 + 0.5).collect()
    }

    fn range(&self) -> Range<f64> {
        0.0..self.n.max(1) as f64
    }
}

fn slots(n: usize) -> Slots {
    Slots { n, first: 0 }
}

fn slot_of(x: f64) -> usize {
    x.max(0.0).floor() as usize
}

/// Decimals that tell an axis's ticks apart up to `max` seconds: a few
/// digits past the first significant one.
fn axis_decimals(max: f64) -> usize {
    if max > 0.0 && max.is_finite() {
        (2.0 - max.log10().floor()).clamp(0.0, 9.0) as usize
    } else {
        3
    }
}

/// A time for a label, in s or ms with three significant digits or so.
fn duration(s: f64) -> String {
    match s {
        s if s >= 1.0 => format!("{s:.3} s"),
        s if s >= 0.1 => format!("{:.0} ms", s * 1e3),
        s if s >= 0.01 => format!("{:.1} ms", s * 1e3),
        s if s >= 0.001 => format!("{:.2} ms", s * 1e3),
        s => format!("{:.3} ms", s * 1e3),
    }
}

fn params(wl: &WorkloadBench) -> String {
    if wl.params.is_empty() {
        String::new()
    } else {
        format!(", {}", wl.params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{AloneResult, ClassResult, LearningRun, Machine, PolicyResult};

    fn report() -> BenchReport {
        let class = |name: &str, share: f64| ClassResult {
            name: name.into(),
            items: (share * 1000.0) as usize,
            finish_s: 0.4,
            share,
        };
        let policy = |name: &str, t: f64| PolicyResult {
            policy: name.into(),
            makespan_s: t,
            runs_s: vec![t],
            ci_s: None,
            efficiency_ci: None,
            speedup_ci: None,
            ideal_s: 0.375,
            efficiency: 0.375 / t,
            speedup_vs_best: 0.5 / t,
            imbalance: 0.05,
            classes: vec![class("cpu", 0.25), class("sim", 0.75)],
            vs_oracle: None,
        };
        let learn = |run: usize, probe: &str, d: f64, cpu: f64| LearningRun {
            run,
            probe: probe.into(),
            probe_imbalance: d,
            replanned: run == 1,
            makespan_s: 0.4,
            efficiency: 0.9,
            split: vec![cpu, 1.0 - cpu],
        };
        BenchReport {
            machine: Machine {
                cpu_model: "Test CPU".into(),
                cores: 2,
                gpus: vec![],
                date: "2025-01-01T00:00:00Z".into(),
            },
            command: "coexec bench".into(),
            devices: "cpu:2,sim:1@3".into(),
            repeat: 3,
            pairs: 1,
            workloads: vec![WorkloadBench {
                name: "plotted_workload".into(),
                items: 1000,
                params: "--n 1000".into(),
                inputs_s: 0.0,
                host_pinning: Default::default(),
                alone: vec![
                    AloneResult {
                        class: "cpu".into(),
                        median_s: 1.5,
                        runs_s: vec![],
                        ci_s: None,
                        predicted: true,
                    },
                    AloneResult {
                        class: "sim".into(),
                        median_s: 0.5,
                        runs_s: vec![0.5],
                        ci_s: None,
                        predicted: false,
                    },
                ],
                ideal_s: 0.375,
                best_class: "sim".into(),
                best_alone_s: 0.5,
                policies: vec![policy("hybrid", 0.4), policy("dynamic", 0.45)],
                learning: vec![
                    learn(1, "cold", 0.6, 0.5),
                    learn(2, "warm", 0.08, 0.26),
                    learn(3, "warm", 0.03, 0.25),
                ],
                baseline: None,
                oracle: None,
            }],
            overhead: None,
        }
    }

    fn temp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("coexec-plot-{}-{name}", std::process::id()))
    }

    #[test]
    fn renders_every_part_of_a_workload() {
        let path = temp("bench.svg");
        plot_bench(&path, &report()).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(
            svg.trim_start().starts_with("<svg"),
            "{}",
            &svg[..svg.len().min(200)]
        );
        for needle in [
            "plotted_workload: time per run",
            "plotted_workload: split over successive runs",
            "cpu alone (predicted)",
            "sim alone",
            "hybrid  E=0.94",
            "dynamic  E=0.83",
            "T* = 1/Σ(1/T_alone) = 375 ms",
            "run 1 (cold)",
            "run 3 (warm)",
            "probe imbalance δ′",
            "sim share",
            "Test CPU",
        ] {
            assert!(svg.contains(needle), "the plot lacks {needle:?}");
        }
        // T* is drawn in its own colour.
        assert!(svg.contains("#C81E1E"), "no T* line in the plot");
    }

    #[test]
    fn a_workload_without_learning_runs_still_renders() {
        let mut r = report();
        r.workloads[0].learning.clear();
        r.workloads[0].ideal_s = f64::NAN;
        let path = temp("nolearn.svg");
        plot_bench(&path, &r).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(svg.contains("no learning runs in this report"));
        assert!(!svg.contains("T* ="), "a NaN T* is not drawn");
    }

    #[test]
    fn labels_keep_three_significant_digits() {
        assert_eq!(duration(2.5), "2.500 s");
        assert_eq!(duration(0.1552), "155 ms");
        assert_eq!(duration(0.0425), "42.5 ms");
        assert_eq!(duration(0.0032), "3.20 ms");
        assert_eq!(duration(0.000812), "0.812 ms");
        assert_eq!(axis_decimals(0.2), 3);
        assert_eq!(axis_decimals(0.0017), 5);
        assert_eq!(axis_decimals(12.0), 1);
    }

    #[test]
    fn an_empty_report_is_an_error_not_an_empty_picture() {
        let mut r = report();
        r.workloads.clear();
        let path = temp("empty.svg");
        assert!(plot_bench(&path, &r).is_err());
        assert!(!path.exists());
    }
}
