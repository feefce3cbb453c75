//! The stream answers every request exactly once: random arrivals, batch
//! limits, queue depths, deadlines, cancelled callers, and injected chunk
//! failures (transient ones the runtime retries, and poisoned inputs that fail
//! their whole batch).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use coexec::Runtime;
use coexec::kernels::{Chunk, DisjointBuf, Kernel, KernelError};
use coexec::stream::{Model, Stream, StreamConfig, StreamError};
use proptest::prelude::*;

#[derive(Debug, Clone, Copy)]
struct Req {
    id: u64,
    /// Every chunk holding it fails: its batch fails.
    poison: bool,
    /// The first chunk holding it fails once; the retry succeeds.
    flaky: bool,
}

fn answer(id: u64) -> u64 {
    id * 3 + 1
}

/// A request that neither fails nor is retried.
fn healthy(id: u64) -> Req {
    Req {
        id,
        poison: false,
        flaky: false,
    }
}

struct Tagged {
    reqs: Vec<Req>,
    out: DisjointBuf<u64>,
    tried: Mutex<HashSet<usize>>,
}

impl Kernel for Tagged {
    fn name(&self) -> &str {
        "tagged"
    }
    fn items(&self) -> usize {
        self.reqs.len()
    }
    fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
        let reqs = &self.reqs[chunk.range()];
        if reqs.iter().any(|r| r.poison) {
            return Err(KernelError::Failed(format!("poison at {}", chunk.lo())));
        }
        if reqs.iter().any(|r| r.flaky) && self.tried.lock().unwrap().insert(chunk.lo()) {
            return Err(KernelError::Failed(format!("flaky at {}", chunk.lo())));
        }
        std::thread::sleep(Duration::from_micros(20 * reqs.len() as u64));
        let out = self.out.chunk_mut(chunk);
        for (o, r) in out.iter_mut().zip(reqs) {
            *o = answer(r.id);
        }
        Ok(())
    }
}

/// Records the ids of every batch whose outputs it handed back.
#[derive(Default)]
struct TaggedModel {
    delivered: Arc<Mutex<Vec<u64>>>,
}

impl Model for TaggedModel {
    type Input = Req;
    type Output = u64;
    type Kernel = Tagged;
    fn build(&self, reqs: Vec<Req>) -> Result<Tagged, KernelError> {
        let out = DisjointBuf::new(reqs.len(), 1);
        Ok(Tagged {
            reqs,
            out,
            tried: Mutex::default(),
        })
    }
    fn outputs(&self, k: Tagged) -> Result<Vec<u64>, KernelError> {
        self.delivered
            .lock()
            .unwrap()
            .extend(k.reqs.iter().map(|r| r.id));
        Ok(k.out.into_vec())
    }
}

#[derive(Debug, Clone, Copy)]
enum Call {
    Infer,
    TryInfer,
    /// `infer_by` with a deadline this many µs away.
    Deadline(u64),
    /// Dropped after this many µs.
    Cancel(u64),
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        3 => Just(Call::Infer),
        3 => Just(Call::TryInfer),
        2 => (0u64..3000).prop_map(Call::Deadline),
        1 => (0u64..2000).prop_map(Call::Cancel),
    ]
}

fn runtime() -> Arc<Runtime> {
    Arc::new(
        Runtime::builder()
            .devices("cpu:1,sim:1@0.5")
            .unwrap()
            .in_memory_profiles()
            .build()
            .unwrap(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn every_request_answered_exactly_once(
        max_batch in 1usize..9,
        max_wait_us in 0u64..2000,
        queue in 1usize..12,
        in_flight in 1usize..3,
        reqs in proptest::collection::vec(
            (0u64..400, call(), proptest::bool::weighted(0.05), proptest::bool::weighted(0.1)),
            1..40,
        ),
    ) {
        let rt = runtime();
        let tokio = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let model = TaggedModel::default();
        let delivered = model.delivered.clone();
        let n = reqs.len();
        let (answers, after) = tokio.block_on(async {
            let cfg = StreamConfig::new()
                .max_batch(max_batch)
                .max_wait(Duration::from_micros(max_wait_us))
                .queue(queue)
                .in_flight(in_flight);
            let stream = Stream::start(rt.clone(), model, cfg).unwrap();
            let start = Instant::now();
            let mut tasks = Vec::new();
            for (i, &(at_us, call, poison, flaky)) in reqs.iter().enumerate() {
                let s = stream.clone();
                let req = Req { id: i as u64, poison, flaky };
                tasks.push(tokio::spawn(async move {
                    tokio::time::sleep_until((start + Duration::from_micros(at_us)).into()).await;
                    let r = match call {
                        Call::Infer => s.infer(req).await,
                        Call::TryInfer => match s.try_infer(req) {
                            Ok(p) => p.await,
                            Err(rejected) => {
                                // The input comes back, and it is this request's.
                                let (back, e) = rejected.into_parts();
                                assert_eq!(back.id, i as u64);
                                Err(e)
                            }
                        },
                        Call::Deadline(us) => s.infer_by(req, Instant::now() + Duration::from_micros(us)).await,
                        Call::Cancel(us) => {
                            let _ = tokio::time::timeout(Duration::from_micros(us), s.infer(req)).await;
                            return None;
                        }
                    };
                    Some(r)
                }));
            }
            let mut answers = Vec::new();
            for t in tasks {
                answers.push(tokio::time::timeout(Duration::from_secs(30), t).await.expect("answered").unwrap());
            }
            tokio::time::timeout(Duration::from_secs(30), stream.shutdown()).await.expect("drains");
            let after = stream.infer(healthy(9999)).await;
            (answers, after)
        });
        prop_assert!(matches!(after, Err(StreamError::Closed)), "{after:?}");
        let delivered = delivered.lock().unwrap().clone();
        let mut seen = HashMap::new();
        for id in &delivered {
            *seen.entry(*id).or_insert(0) += 1;
        }
        prop_assert!(seen.values().all(|&c| c == 1), "an input delivered twice: {delivered:?}");
        prop_assert_eq!(answers.len(), n);
        for (i, a) in answers.iter().enumerate() {
            let (_, call, poison, _) = reqs[i];
            let Some(a) = a else { continue };
            match a {
                Ok(v) => {
                    prop_assert_eq!(*v, answer(i as u64), "request {} got another's output", i);
                    prop_assert!(!poison);
                    prop_assert!(seen.contains_key(&(i as u64)));
                }
                Err(StreamError::Overloaded { .. }) => prop_assert!(matches!(call, Call::TryInfer)),
                Err(StreamError::DeadlinePassed) => prop_assert!(matches!(call, Call::Deadline(_))),
                Err(StreamError::Failed(_)) => {}
                Err(e) => prop_assert!(false, "request {i}: unexpected {e}"),
            }
            // A plain `infer` of a healthy input in a batch without poison succeeds.
            if matches!(call, Call::Infer) && !reqs.iter().any(|r| r.2) {
                prop_assert!(a.is_ok(), "request {i}: {a:?}");
            }
        }
        drop(tokio);
    }
}

/// A full queue answers `try_infer` with `Overloaded` at once, and everything
/// accepted is still answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_is_overloaded_and_drains_on_shutdown() {
    let cfg = StreamConfig::new()
        .max_batch(1)
        .max_wait(Duration::ZERO)
        .queue(2)
        .in_flight(1);
    let stream = Stream::start(runtime(), TaggedModel::default(), cfg).unwrap();
    let mut pending = Vec::new();
    let mut overloaded = 0;
    for id in 0..50 {
        match stream.try_infer(healthy(id)) {
            Ok(p) => pending.push((id, p)),
            Err(rejected) => match rejected.into_parts() {
                (back, StreamError::Overloaded { capacity }) => {
                    assert_eq!(capacity, 2);
                    // The caller gets its input back, to retry or reroute.
                    assert_eq!(back.id, id);
                    overloaded += 1;
                }
                (_, e) => panic!("{e}"),
            },
        }
    }
    assert!(overloaded > 0, "50 at once into a queue of 2");
    let shutdown = stream.clone();
    let drained = tokio::spawn(async move { shutdown.shutdown().await });
    for (id, p) in pending {
        assert_eq!(p.await.unwrap(), answer(id));
    }
    drained.await.unwrap();
    // Shut down: `Closed`, and the input again comes back.
    let closed = stream.try_infer(healthy(77)).unwrap_err();
    assert!(matches!(closed.error(), StreamError::Closed), "{closed:?}");
    assert_eq!(closed.into_input().id, 77);
    // A deadline already past: `DeadlinePassed`, input back, nothing queued.
    let late = stream
        .try_infer_by(healthy(78), Instant::now())
        .unwrap_err();
    assert!(
        matches!(late.error(), StreamError::DeadlinePassed),
        "{late:?}"
    );
    assert_eq!(late.into_input().id, 78);
}

/// `Pending::timed`: a lone request waits out `max_wait` in the queue (its
/// batch does not fill), and its queue and inference times lie within the
/// time its caller saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_answer_says_where_its_time_went() {
    let wait = Duration::from_millis(20);
    let cfg = StreamConfig::new().max_batch(8).max_wait(wait);
    let stream = Stream::start(runtime(), TaggedModel::default(), cfg).unwrap();
    let t0 = Instant::now();
    let pending = stream.try_infer(healthy(5)).unwrap();
    let (out, served) = pending.timed().await.unwrap();
    let seen = t0.elapsed();
    assert_eq!(out, answer(5));
    assert!(served.queued >= wait, "{served:?}");
    assert!(
        served.queued + served.inference <= seen,
        "{served:?} in {seen:?}"
    );
    stream.shutdown().await;
}

/// `try_infer_many` queues all of a call's inputs or none of them: with many
/// callers racing for a small queue, no input of a refused call reaches the
/// model, each comes back to its caller, and every admitted input is
/// answered once, with its own output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_infer_many_queues_all_of_a_call_or_none() {
    let model = TaggedModel::default();
    let delivered = model.delivered.clone();
    let cfg = StreamConfig::new()
        .max_batch(2)
        .max_wait(Duration::ZERO)
        .queue(5)
        .in_flight(1);
    let stream = Stream::start(runtime(), model, cfg).unwrap();
    let mut tasks = Vec::new();
    for call in 0..64u64 {
        // Every eighth call asks for more places than the queue has.
        let n = if call % 8 == 7 { 6 } else { 3 };
        let ids: Vec<u64> = (0..n).map(|k| call * 10 + k).collect();
        let s = stream.clone();
        tasks.push(tokio::spawn(async move {
            let reqs = ids.iter().map(|&id| healthy(id)).collect();
            match s.try_infer_many(reqs) {
                Ok(pending) => {
                    let mut got = Vec::new();
                    for p in pending {
                        got.push(p.await.unwrap());
                    }
                    assert_eq!(got, ids.iter().map(|&id| answer(id)).collect::<Vec<_>>());
                    Some(ids)
                }
                Err(rejected) => {
                    let why = rejected.error();
                    assert!(
                        if n > 5 {
                            matches!(
                                why,
                                StreamError::TooMany {
                                    inputs: 6,
                                    capacity: 5
                                }
                            )
                        } else {
                            matches!(why, StreamError::Overloaded { capacity: 5 })
                        },
                        "{rejected:?}"
                    );
                    let back: Vec<u64> = rejected.into_input().iter().map(|r| r.id).collect();
                    assert_eq!(back, ids, "a refused call gets all its inputs back");
                    None
                }
            }
        }));
    }
    let mut admitted = Vec::new();
    let mut refused_that_could_fit = 0;
    for (call, t) in tasks.into_iter().enumerate() {
        let got = tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("answered")
            .unwrap();
        match got {
            Some(ids) => {
                assert_ne!(call % 8, 7, "6 inputs admitted into a queue of 5");
                admitted.extend(ids);
            }
            None if call % 8 != 7 => refused_that_could_fit += 1,
            None => {}
        }
    }
    tokio::time::timeout(Duration::from_secs(30), stream.shutdown())
        .await
        .expect("drains");
    // 192 inputs at once into a queue of 5: the race happened.
    assert!(refused_that_could_fit > 0, "no call of 3 was refused");
    let mut delivered = delivered.lock().unwrap().clone();
    delivered.sort_unstable();
    admitted.sort_unstable();
    assert_eq!(
        delivered, admitted,
        "the model saw exactly the admitted calls' inputs, each once"
    );
}

/// Holds every chunk in its kernel until opened.
#[derive(Default)]
struct Gate {
    entered: AtomicBool,
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn pass(&self) {
        self.entered.store(true, Ordering::SeqCst);
        let open = self.open.lock().unwrap();
        // Bounded, so a failing test cannot hang the run.
        let _ = self
            .opened
            .wait_timeout_while(open, Duration::from_secs(30), |open| !*open)
            .unwrap();
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }

    async fn entered(&self) {
        let t = Instant::now();
        while !self.entered.load(Ordering::SeqCst) {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "no chunk reached the kernel"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

struct GatedKernel(Tagged, Arc<Gate>);

impl Kernel for GatedKernel {
    fn name(&self) -> &str {
        "gated"
    }
    fn items(&self) -> usize {
        self.0.items()
    }
    fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
        self.1.pass();
        self.0.run_cpu(chunk)
    }
}

struct Gated(TaggedModel, Arc<Gate>);

impl Model for Gated {
    type Input = Req;
    type Output = u64;
    type Kernel = GatedKernel;
    fn build(&self, reqs: Vec<Req>) -> Result<GatedKernel, KernelError> {
        Ok(GatedKernel(self.0.build(reqs)?, self.1.clone()))
    }
    fn outputs(&self, k: GatedKernel) -> Result<Vec<u64>, KernelError> {
        self.0.outputs(k.0)
    }
}

/// With the only batch slot held by a batch stuck in its kernel, the queue's
/// places can be counted: `try_infer_many` takes all the places a call needs
/// or none, tells a call too large to ever fit from a full queue, and a
/// closed stream from both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_infer_many_takes_every_place_it_needs_or_none() {
    let gate = Arc::new(Gate::default());
    let model = Gated(TaggedModel::default(), gate.clone());
    let delivered = model.0.delivered.clone();
    let cfg = StreamConfig::new()
        .max_batch(8)
        .max_wait(Duration::ZERO)
        .queue(5)
        .in_flight(1);
    let stream = Stream::start(runtime(), model, cfg).unwrap();
    let ids = |reqs: Vec<Req>| reqs.iter().map(|r| r.id).collect::<Vec<_>>();
    let first = stream.try_infer(healthy(0)).unwrap();
    gate.entered().await;
    assert_eq!(stream.queued(), 0);

    let a = stream
        .try_infer_many(vec![healthy(1), healthy(2), healthy(3)])
        .unwrap();
    assert_eq!(stream.queued(), 3);
    let full = stream
        .try_infer_many(vec![healthy(4), healthy(5), healthy(6)])
        .unwrap_err();
    assert!(
        matches!(full.error(), StreamError::Overloaded { capacity: 5 }),
        "{full:?}"
    );
    assert_eq!(ids(full.into_input()), [4, 5, 6]);
    assert_eq!(stream.queued(), 3, "a refused call takes no place");
    let huge = stream
        .try_infer_many((10..16).map(healthy).collect())
        .unwrap_err();
    assert!(
        matches!(
            huge.error(),
            StreamError::TooMany {
                inputs: 6,
                capacity: 5
            }
        ),
        "{huge:?}"
    );
    assert_eq!(ids(huge.into_input()), [10, 11, 12, 13, 14, 15]);
    let late = stream
        .try_infer_many_by(vec![healthy(7)], Instant::now())
        .unwrap_err();
    assert!(
        matches!(late.error(), StreamError::DeadlinePassed),
        "{late:?}"
    );
    assert!(stream.try_infer_many(Vec::new()).unwrap().is_empty());
    let b = stream.try_infer_many(vec![healthy(8), healthy(9)]).unwrap();
    assert_eq!(stream.queued(), 5);

    gate.open();
    assert_eq!(first.await.unwrap(), answer(0));
    for (p, id) in a
        .into_iter()
        .zip([1, 2, 3])
        .chain(b.into_iter().zip([8, 9]))
    {
        assert_eq!(p.await.unwrap(), answer(id));
    }
    tokio::time::timeout(Duration::from_secs(30), stream.shutdown())
        .await
        .expect("drains");
    // Closed wins over a call that could never fit, and over no inputs.
    let closed = stream
        .try_infer_many((10..16).map(healthy).collect())
        .unwrap_err();
    assert!(matches!(closed.error(), StreamError::Closed), "{closed:?}");
    let closed = stream.try_infer_many(Vec::new()).unwrap_err();
    assert!(matches!(closed.error(), StreamError::Closed), "{closed:?}");
    let mut delivered = delivered.lock().unwrap().clone();
    delivered.sort_unstable();
    assert_eq!(delivered, [0, 1, 2, 3, 8, 9]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_limits_are_refused() {
    for cfg in [
        StreamConfig::new().max_batch(0),
        StreamConfig::new().queue(0),
        StreamConfig::new().in_flight(0),
        // Past the limit (before, a `max_wait` this long overflowed the
        // batch's close time and the batcher died with requests queued).
        StreamConfig::new().max_wait(StreamConfig::MAX_WAIT_LIMIT + Duration::from_micros(1)),
        StreamConfig::new().max_wait(Duration::from_micros(u64::MAX)),
        // Past what tokio's channel and semaphore can count: before, the
        // queue's panicked in `start` and the in-flight one killed the
        // batcher after `start` returned `Ok`, every request then `Closed`.
        StreamConfig::new().queue(usize::MAX),
        StreamConfig::new().in_flight(usize::MAX),
        StreamConfig::new().queue(StreamConfig::MAX_QUEUE + 1),
        StreamConfig::new().in_flight(StreamConfig::MAX_IN_FLIGHT + 1),
    ] {
        assert!(Stream::start(runtime(), TaggedModel::default(), cfg).is_err());
    }
}

/// A shutdown sends the batch that is forming at once: it does not wait out
/// `max_wait` (before, a 10 s `max_wait` held the shutdown, and the answer,
/// for 10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_does_not_wait_out_a_forming_batch() {
    let cfg = StreamConfig::new()
        .max_batch(64)
        .max_wait(StreamConfig::MAX_WAIT_LIMIT);
    let stream = Stream::start(runtime(), TaggedModel::default(), cfg).unwrap();
    let p = stream.try_infer(healthy(7)).unwrap();
    // The batch has its first request and waits for more.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(3), async {
        let (answer_got, ()) = tokio::join!(p, stream.shutdown());
        assert_eq!(answer_got.unwrap(), answer(7));
    })
    .await
    .unwrap_or_else(|_| panic!("shutdown still waiting after {:?}", t.elapsed()));
}

/// What a [`Faulty`] model does wrong.
#[derive(Default)]
enum Fault {
    /// Panics on request 999 in `build` and on 998 in `outputs`.
    #[default]
    Panics,
    /// Gives one output too few.
    Short,
}

/// A [`TaggedModel`] with a fault of its own.
#[derive(Default)]
struct Faulty(TaggedModel, Fault);

impl Model for Faulty {
    type Input = Req;
    type Output = u64;
    type Kernel = Tagged;
    fn build(&self, reqs: Vec<Req>) -> Result<Tagged, KernelError> {
        if let Fault::Panics = self.1 {
            assert!(reqs.iter().all(|r| r.id != 999), "build refuses 999");
        }
        self.0.build(reqs)
    }
    fn outputs(&self, k: Tagged) -> Result<Vec<u64>, KernelError> {
        if let Fault::Panics = self.1 {
            assert!(k.reqs.iter().all(|r| r.id != 998), "outputs refuses 998");
        }
        let mut v = self.0.outputs(k)?;
        if let Fault::Short = self.1 {
            v.pop();
        }
        Ok(v)
    }
}

/// `?` takes a stream's error into `coexec::Error`.
async fn ask(stream: &Stream<Faulty>, id: u64) -> Result<u64, coexec::Error> {
    let req = healthy(id);
    Ok(stream.infer(req).await?)
}

/// A panic in the model fails its batch with the panic's message, and the
/// batch's place goes back to the placer. Before, the caller got `Closed`,
/// and the class the batch was placed on counted as running it for good:
/// with no model yet, it never got another batch (all later items ran on
/// the sim).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_model_fails_its_batch_and_frees_its_place() {
    let rt = Arc::new(
        Runtime::builder()
            .devices("cpu:1,sim:1@1")
            .unwrap()
            .in_memory_profiles()
            .build()
            .unwrap(),
    );
    let cfg = StreamConfig::new().max_batch(4).in_flight(1);
    let stream = Stream::start(rt.clone(), Faulty::default(), cfg).unwrap();
    for (id, said) in [
        (999, "in Model::build: build refuses 999"),
        (998, "in Model::outputs: outputs refuses 998"),
    ] {
        match ask(&stream, id).await {
            Err(coexec::Error::Stream(StreamError::Failed(e))) => match &*e {
                coexec::Error::Kernel(KernelError::Panicked(m)) => assert_eq!(m, said),
                other => panic!("request {id}: {other}"),
            },
            other => panic!("request {id}: {other:?}"),
        }
    }
    for id in 0..20 {
        assert_eq!(ask(&stream, id).await.unwrap(), answer(id));
    }
    let progress = rt.progress();
    assert!(
        progress.iter().all(|(_, items)| *items > 0),
        "every class gets batches after the panics: {progress:?}"
    );
    stream.shutdown().await;
    Arc::try_unwrap(rt)
        .map_err(|_| "the stream still holds the runtime after its shutdown")
        .unwrap()
        .shutdown()
        .await;
}

/// A model that gives the wrong number of outputs fails its whole batch (no
/// caller gets another's output), with an error that names `Model::outputs`;
/// and an `on_batch` observer that panics loses no answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_output_count_fails_the_batch_and_an_observer_panic_loses_nothing() {
    let cfg = StreamConfig::new()
        .max_batch(4)
        .max_wait(Duration::from_millis(20));
    let stream =
        Stream::start(runtime(), Faulty(TaggedModel::default(), Fault::Short), cfg).unwrap();
    let pending: Vec<_> = (0..4)
        .map(|id| stream.try_infer(healthy(id)).unwrap())
        .collect();
    for p in pending {
        match p.await {
            Err(StreamError::Failed(e)) => {
                assert!(e.to_string().contains("Model::outputs gave"), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }
    stream.shutdown().await;

    let seen = Arc::new(Mutex::new(0usize));
    let counted = seen.clone();
    let cfg = StreamConfig::new().max_batch(1).on_batch(move |_| {
        *counted.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        panic!("observer fails");
    });
    let stream = Stream::start(runtime(), TaggedModel::default(), cfg).unwrap();
    for id in 0..5 {
        assert_eq!(stream.infer(healthy(id)).await.unwrap(), answer(id));
    }
    stream.shutdown().await;
    assert_eq!(*seen.lock().unwrap_or_else(|e| e.into_inner()), 5);
}

/// An input the model refuses (`Model::check_input`: a row of the wrong
/// width for an MLP) is refused alone at admission, and the request that
/// would have shared its batch gets its answer. Before, the row was queued
/// and `build` failed the whole batch, the good row with it. A panic in
/// the check is a failure of that call, not of the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_input_fails_alone_at_admission() {
    use coexec::kernels::workloads::{LabeledRows, MlpWeights};
    use coexec::stream::MlpModel;
    let models = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/models");
    let w = Arc::new(MlpWeights::load(models.join("wine_mlp.safetensors")).unwrap());
    let t = LabeledRows::load(models.join("wine_test.safetensors")).unwrap();
    let rt = Arc::new(
        Runtime::builder()
            .devices("cpu:1")
            .unwrap()
            .in_memory_profiles()
            .build()
            .unwrap(),
    );
    // A long wait: a good and a bad row sent together would share a batch.
    let cfg = StreamConfig::new()
        .max_batch(8)
        .max_wait(Duration::from_millis(50));
    let stream = Stream::start(rt.clone(), MlpModel::new(w), cfg).unwrap();
    let good = t.x[..t.features].to_vec();
    let (a, b) = tokio::join!(stream.infer(good.clone()), stream.infer(vec![0.5; 64]));
    assert_eq!(a.unwrap().label as i64, t.predicted[0]);
    match b {
        Err(StreamError::Invalid { index: 0, why }) => {
            assert!(why.contains("takes 13"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    let mut bad = good.clone();
    bad[3] = f32::NAN;
    let rejected = stream
        .try_infer_many(vec![good.clone(), bad])
        .expect_err("one refused input refuses the call");
    assert!(
        matches!(rejected.error(), StreamError::Invalid { index: 1, .. }),
        "{:?}",
        rejected.error()
    );
    assert_eq!(rejected.into_input().len(), 2, "both inputs given back");
    assert_eq!(stream.queued(), 0, "nothing queued");
    stream.shutdown().await;

    // A check that panics: that call fails, the stream goes on.
    #[derive(Default)]
    struct PanickyCheck(TaggedModel);
    impl Model for PanickyCheck {
        type Input = Req;
        type Output = u64;
        type Kernel = Tagged;
        fn build(&self, reqs: Vec<Req>) -> Result<Tagged, KernelError> {
            self.0.build(reqs)
        }
        fn outputs(&self, k: Tagged) -> Result<Vec<u64>, KernelError> {
            self.0.outputs(k)
        }
        fn check_input(&self, r: &Req) -> Result<(), String> {
            assert!(r.id != 7, "check refuses to look at 7");
            Ok(())
        }
    }
    let cfg = StreamConfig::new();
    let stream = Stream::start(rt.clone(), PanickyCheck::default(), cfg).unwrap();
    match stream.infer(healthy(7)).await {
        Err(StreamError::Failed(e)) => assert!(e.to_string().contains("look at 7"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(stream.infer(healthy(8)).await.unwrap(), answer(8));
    stream.shutdown().await;
}

/// Answers `answer(id)` as `f32`, NaN for id 13 (as an encoder whose
/// arithmetic overflowed for one text), and refuses an output that is not
/// finite; its check panics on an answer of 43 (id 14).
#[derive(Default)]
struct Overflowing(TaggedModel);

impl Model for Overflowing {
    type Input = Req;
    type Output = f32;
    type Kernel = Tagged;
    fn build(&self, reqs: Vec<Req>) -> Result<Tagged, KernelError> {
        self.0.build(reqs)
    }
    fn outputs(&self, k: Tagged) -> Result<Vec<f32>, KernelError> {
        let outs = self.0.outputs(k)?;
        Ok(outs
            .into_iter()
            .map(|o| if o == answer(13) { f32::NAN } else { o as f32 })
            .collect())
    }
    fn check_output(&self, v: &f32) -> Result<(), String> {
        assert!(*v != answer(14) as f32, "check refuses to look at 43");
        if v.is_finite() {
            Ok(())
        } else {
            Err(format!("{v} is not finite"))
        }
    }
}

/// An output the model refuses (`Model::check_output`: a NaN vector) fails
/// its own request only, with `StreamError::Output`; the requests of its
/// batch get their answers, and so does a panic in the check, which fails
/// its request alone. Before, the NaN was answered as an output (a 200 of
/// `null`s over HTTP).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_output_fails_its_own_request_only() {
    let rt = runtime();
    // A long wait: the calls below share one batch.
    let cfg = StreamConfig::new()
        .max_batch(16)
        .max_wait(Duration::from_millis(100));
    let stream = Stream::start(rt, Overflowing::default(), cfg).unwrap();
    let [a, b, c, d]: [_; 4] = stream
        .try_infer_many([1, 13, 2, 14].map(healthy).to_vec())
        .unwrap()
        .try_into()
        .unwrap();
    let (alone, a, b, c, d) = tokio::join!(stream.infer(healthy(3)), a, b, c, d);
    assert_eq!(alone.unwrap(), answer(3) as f32);
    assert_eq!(a.unwrap(), answer(1) as f32);
    match b {
        Err(StreamError::Output { why }) => assert!(why.contains("NaN is not finite"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(c.unwrap(), answer(2) as f32);
    match d {
        Err(StreamError::Failed(e)) => assert!(e.to_string().contains("look at 43"), "{e}"),
        other => panic!("{other:?}"),
    }
    stream.shutdown().await;
}
