//! Jobs of zero items: over at admission, the kernel always comes back.

use coexec::Runtime;
use coexec::kernels::{Empty, Synthetic};

/// A job finished at admission kept a handle on its
/// kernel, so `run` failed about half the time on a multi-thread runtime
/// ("still shared after its run"). Every one of these runs must succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_of_zero_items_3000_times_never_fails() {
    let rt = Runtime::builder()
        .devices("cpu:2")
        .unwrap()
        .in_memory_profiles()
        .build()
        .unwrap();
    let mut failures = 0;
    for _ in 0..3000 {
        match rt.run(Empty::new(0)).await {
            Ok(done) => assert_eq!(done.report.items, 0),
            Err(e) => {
                eprintln!("{e}");
                failures += 1;
            }
        }
    }
    rt.shutdown().await;
    assert_eq!(failures, 0, "failures out of 3000");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_items_on_every_policy_and_device_mix() {
    for devices in ["cpu:1", "cpu:2,sim:1@3", "sim:2@2"] {
        let rt = Runtime::builder()
            .devices(devices)
            .unwrap()
            .in_memory_profiles()
            .build()
            .unwrap();
        for name in coexec::policy::names() {
            let opts = coexec::JobOptions::new().policy(coexec::policy::by_name(name).unwrap());
            match rt.run_with(Synthetic::new(0, 10), opts).await {
                Ok(mut done) => {
                    assert_eq!(done.report.items, 0);
                    done.kernel.verify().unwrap();
                }
                // A policy may refuse the device mix (accel-only on CPUs);
                // never an internal error.
                Err(e) => assert!(
                    !matches!(e, coexec::Error::Internal(_)),
                    "{devices} {}: {e}",
                    name
                ),
            }
        }
        rt.shutdown().await;
    }
}
