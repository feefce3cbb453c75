use super::*;
use coexec_kernels::Synthetic;

/// Runs `f` on a fresh tokio runtime, failing after `limit` instead of
/// hanging.
fn within<T: Send + 'static>(
    limit: Duration,
    f: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("tokio");
        let _ = tx.send(rt.block_on(f));
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("did not finish within {limit:?}"))
}

#[test]
fn when_the_actor_system_dies_callers_and_drain_hear_at_once() {
    within(Duration::from_secs(20), async {
        let cfg = EngineConfig {
            devices: Some("cpu:1".parse().expect("spec")),
            profile_dir: ProfileDir::InMemory,
            ..Default::default()
        };
        let mut engine = Engine::start(cfg).expect("start");
        let system = engine.system.take().expect("system");
        let thread = engine.system_thread.take().expect("thread");
        // A job that would take minutes, in flight when the system dies.
        let long = engine.submit(
            Arc::new(Synthetic::new(2_000, 20_000_000)),
            JobOptions::default(),
        );
        let killer = async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            system.stop();
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        };
        let (r, ()) = tokio::join!(long, killer);
        assert!(matches!(r, Err(ActorError::Shutdown)), "{r:?}");
        let r = engine
            .submit(Arc::new(Synthetic::new(10, 1)), JobOptions::default())
            .await;
        assert!(matches!(r, Err(ActorError::Shutdown)), "{r:?}");
        engine.drain().await;
    });
}
