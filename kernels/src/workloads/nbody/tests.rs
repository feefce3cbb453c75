use super::super::run_sequential;
use super::super::testutil::{run_workload_split, splits};
use super::*;

/// The shell state as this crate drew it before, one value after the other.
fn shell_one_thread(n: usize, seed: u64) -> Bodies {
    let scale = 1.54f32;
    let vscale = scale * 8.0;
    let (inner, outer) = (2.5 * scale, 4.0 * scale);
    let mut k = 0u64;
    let mut u = || {
        k += 1;
        unit_f32(stream(seed, 3, k - 1))
    };
    let mut b = Bodies {
        x: Vec::with_capacity(n),
        y: Vec::with_capacity(n),
        z: Vec::with_capacity(n),
        m: vec![1.0; n],
        vx: Vec::with_capacity(n),
        vy: Vec::with_capacity(n),
        vz: Vec::with_capacity(n),
    };
    while b.x.len() < n {
        let q = [u() * 2.0 - 1.0, u() * 2.0 - 1.0, u() * 2.0 - 1.0];
        let len = (q[0] * q[0] + q[1] * q[1] + q[2] * q[2]).sqrt();
        if !(1e-6..=1.0).contains(&len) {
            continue;
        }
        let q = [q[0] / len, q[1] / len, q[2] / len];
        let p = [
            q[0] * (inner + (outer - inner) * u()),
            q[1] * (inner + (outer - inner) * u()),
            q[2] * (inner + (outer - inner) * u()),
        ];
        let mut axis = [0.0f32, 0.0, 1.0];
        if 1.0 - q[2] < 1e-6 {
            let l = (q[1] * q[1] + q[0] * q[0]).sqrt().max(f32::MIN_POSITIVE);
            axis = [q[1] / l, q[0] / l, 0.0];
        }
        let v = [
            p[1] * axis[2] - p[2] * axis[1],
            p[2] * axis[0] - p[0] * axis[2],
            p[0] * axis[1] - p[1] * axis[0],
        ];
        b.x.push(p[0]);
        b.y.push(p[1]);
        b.z.push(p[2]);
        b.vx.push(v[0] * vscale);
        b.vy.push(v[1] * vscale);
        b.vz.push(v[2] * vscale);
    }
    b
}
#[test]
fn parallel_shell_equals_the_one_thread_draws() {
    for (n, seed) in [
        (0, 1),
        (1, 1),
        (2, 7),
        (1000, 3),
        (100_000, NbodyProblem::DEFAULT_SEED),
    ] {
        let (a, b) = (Bodies::shell(n, seed), shell_one_thread(n, seed));
        for (x, y) in [(&a.x, &b.x), (&a.y, &b.y), (&a.z, &b.z), (&a.m, &b.m)]
            .into_iter()
            .chain([(&a.vx, &b.vx), (&a.vy, &b.vy), (&a.vz, &b.vz)])
        {
            assert_eq!(x.len(), n);
            assert!(x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()));
        }
    }
}

use proptest::prelude::*;

/// NVIDIA's CPU reference, transcribed: float4 AoS, one body at a time.
fn reference_f32(b: &Bodies, steps: usize) -> Vec<[f32; 6]> {
    let n = b.len();
    let mut pos: Vec<[f32; 4]> = (0..n).map(|i| [b.x[i], b.y[i], b.z[i], b.m[i]]).collect();
    let mut vel: Vec<[f32; 3]> = (0..n).map(|i| [b.vx[i], b.vy[i], b.vz[i]]).collect();
    for _ in 0..steps {
        let mut force = vec![[0.0f32; 3]; n];
        for i in 0..n {
            let mut acc = [0.0f32; 3];
            for j in 0..n {
                let r = [
                    pos[j][0] - pos[i][0],
                    pos[j][1] - pos[i][1],
                    pos[j][2] - pos[i][2],
                ];
                let mut d2 = r[0] * r[0] + r[1] * r[1] + r[2] * r[2];
                d2 += NbodyProblem::EPS2;
                let inv = 1.0f32 / ((d2 as f64).sqrt() as f32);
                let s = pos[j][3] * (inv * inv * inv);
                for k in 0..3 {
                    acc[k] += r[k] * s;
                }
            }
            force[i] = acc;
        }
        for i in 0..n {
            for k in 0..3 {
                vel[i][k] += (force[i][k] * pos[i][3]) * NbodyProblem::DT;
                vel[i][k] *= NbodyProblem::DAMPING;
                pos[i][k] += vel[i][k] * NbodyProblem::DT;
            }
        }
    }
    (0..n)
        .map(|i| {
            [
                pos[i][0], pos[i][1], pos[i][2], vel[i][0], vel[i][1], vel[i][2],
            ]
        })
        .collect()
}

/// The same physics in f64, for an accuracy check.
fn reference_f64(b: &Bodies, steps: usize) -> Vec<[f64; 3]> {
    let n = b.len();
    let mut p: Vec<[f64; 3]> = (0..n)
        .map(|i| [b.x[i] as f64, b.y[i] as f64, b.z[i] as f64])
        .collect();
    let mut v: Vec<[f64; 3]> = (0..n)
        .map(|i| [b.vx[i] as f64, b.vy[i] as f64, b.vz[i] as f64])
        .collect();
    for _ in 0..steps {
        let mut a = vec![[0.0f64; 3]; n];
        for i in 0..n {
            for j in 0..n {
                let r: [f64; 3] = std::array::from_fn(|k| p[j][k] - p[i][k]);
                let d2 = r[0] * r[0] + r[1] * r[1] + r[2] * r[2] + NbodyProblem::EPS2 as f64;
                let s = 1.0 / (d2.sqrt() * d2);
                for k in 0..3 {
                    a[i][k] += r[k] * s;
                }
            }
        }
        for i in 0..n {
            for k in 0..3 {
                v[i][k] += a[i][k] * NbodyProblem::DT as f64;
                p[i][k] += v[i][k] * NbodyProblem::DT as f64;
            }
        }
    }
    p
}

#[test]
fn bit_identical_to_nvidia_cpu_order() {
    let p = NbodyProblem::new(45, 3).unwrap().with_seed(11);
    let init = Bodies::shell(45, 11);
    let want = reference_f32(&init, 3);
    let got = run_sequential(NbodyJob::new(p).unwrap()).unwrap().bodies;
    for (i, w) in want.iter().enumerate() {
        let g = [
            got.x[i], got.y[i], got.z[i], got.vx[i], got.vy[i], got.vz[i],
        ];
        for k in 0..6 {
            assert_eq!(g[k].to_bits(), w[k].to_bits(), "body {i} component {k}");
        }
    }
}

#[test]
fn close_to_f64_physics() {
    // Positions of magnitude ~5 after 3 steps: f32 sums of 60 terms err far
    // below 1e-4 absolute.
    let p = NbodyProblem::new(60, 3).unwrap();
    let want = reference_f64(&Bodies::shell(60, p.seed), 3);
    let got = run_sequential(NbodyJob::new(p).unwrap()).unwrap().bodies;
    for (i, w) in want.iter().enumerate() {
        for (g, w) in [got.x[i], got.y[i], got.z[i]].iter().zip(w) {
            assert!((*g as f64 - w).abs() < 1e-4, "body {i}: {g} vs {w}");
        }
    }
}

#[test]
fn shell_is_a_shell() {
    let b = Bodies::shell(500, 1);
    for i in 0..b.len() {
        let r = (b.x[i].powi(2) + b.y[i].powi(2) + b.z[i].powi(2)).sqrt();
        assert!(r > 0.0 && r < 4.0 * 1.54 * 1.8, "body {i} at radius {r}");
        assert_eq!(b.m[i], 1.0);
    }
}

#[test]
fn refuses_bad_sizes() {
    assert!(NbodyProblem::new(0, 1).is_err());
    assert!(NbodyProblem::new(10, 0).is_err());
    assert!(NbodyProblem::new(usize::MAX, 1).is_err());
    let p = NbodyProblem::new(4, 1).unwrap();
    assert!(NbodyJob::from_bodies(p, Bodies::shell(3, 1)).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    #[test]
    fn any_split_is_bit_identical((cuts, seed) in splits(10)) {
        let p = NbodyProblem::new(77, 2).unwrap();
        let whole = run_sequential(NbodyJob::new(p).unwrap()).unwrap();
        let split = run_workload_split(NbodyJob::new(p).unwrap(), &cuts, seed).unwrap();
        let bits = |b: &Bodies| -> Vec<u32> {
            [&b.x, &b.y, &b.z, &b.vx, &b.vy, &b.vz].iter().flat_map(|v| v.iter().map(|f| f.to_bits())).collect()
        };
        prop_assert_eq!(bits(&whole.bodies), bits(&split.bodies));
    }
}
