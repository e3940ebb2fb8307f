//! A pool of blocking worker threads, each owning an ONNX Runtime session, fed by one bounded
//! queue. The cpu tier is one (CPU execution provider); the gpu tier's `onnx` backend is another
//! (CUDA execution provider, or CPU where there is no GPU).
//!
//! Model work never runs on the async runtime's threads (as in the TGI router): the request
//! task enqueues a job with a oneshot reply channel and awaits it until its deadline. A full
//! queue sheds at once (`TierError::Overloaded`) so the cascade falls back to rules instead
//! of queueing. A worker batches dynamically ([`next_batch`]): up to `max_batch` jobs, waiting at
//! most `max_queue_delay_us` after the first for more to join; a batch is padded to its longest
//! sequence, not to the model's maximum.
//!
//! Overload degrades on purpose, not by timeout: the pool publishes its service-time estimates
//! ([`ServiceTime`]) so routing can refuse a job whose expected queue wait and service do not fit
//! its remaining deadline ([`OnnxPool::queue_wait_us`]), and a worker never starts a job that
//! would finish after its caller gave up ([`doomed`]): that job is answered at once with
//! `TierError::Doomed` and the cascade moves on.

use super::backend::{ModelTier, Prepared, TierInput, TierLoad};
use super::model::{ModelAssets, ModelInfo, SessionOptions};
use super::parallel::{self, Part, Parts};
use super::service::{doomed, queue_wait_us, ServiceTime};
use super::windows::{Encoded, TokenCounter, Tokens};
use super::ModelConfig;
use super::ModelVerdict;
use crate::tier::TierError;
use crossbeam_channel::{select, Receiver, Sender, TrySendError};
use futures_util::future::BoxFuture;
use ort::environment::Environment;
use ort::session::builder::PrepackedWeights;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

struct Job {
    text: Arc<str>,
    prepared: Prepared,
    enqueued: Instant,
    deadline: Instant,
    reply: oneshot::Sender<Result<ModelVerdict, TierError>>,
}

pub struct OnnxPool {
    tx: Sender<Job>,
    /// For counting tokens on the request path.
    counter: TokenCounter,
    capacity: usize,
    in_flight: Arc<AtomicUsize>,
    workers_alive: Arc<AtomicUsize>,
    service: Arc<ServiceTime>,
    texts_split: Arc<AtomicU64>,
    info: ModelInfo,
    #[cfg(test)]
    stall: Arc<tests::Stall>,
}

/// Holds one count of a counter until dropped, by return or by panic: a worker alive (until its
/// thread ends), a worker busy (while it holds work).
struct Held<C: std::ops::Deref<Target = AtomicUsize>>(C);

impl<C: std::ops::Deref<Target = AtomicUsize>> Held<C> {
    fn new(count: C) -> Held<C> {
        count.fetch_add(1, Ordering::Relaxed);
        Held(count)
    }
}

impl<C: std::ops::Deref<Target = AtomicUsize>> Drop for Held<C> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl OnnxPool {
    /// Loads the model from `config.dir` and starts `config.sessions` workers named `{name}-{i}`.
    pub fn start(env: &Environment, config: &ModelConfig, name: &str) -> anyhow::Result<OnnxPool> {
        let assets = ModelAssets::load_windows(&config.dir, config.windows)?;
        let options = SessionOptions::from(config);
        let (tx, rx) = crossbeam_channel::bounded::<Job>(config.queue_capacity);
        let in_flight = Arc::new(AtomicUsize::new(0));
        let workers_alive = Arc::new(AtomicUsize::new(0));
        let service = Arc::new(ServiceTime::default());
        let parts = Parts::new();
        let busy = Arc::new(AtomicUsize::new(0));
        let texts_split = Arc::new(AtomicU64::new(0));
        #[cfg(test)]
        let stall = Arc::new(tests::Stall::default());
        // One copy of the packed weights for all of the pool's sessions (RSS, issue 26).
        let prepacked = PrepackedWeights::new();
        for i in 0..config.sessions {
            let classifier = assets.classifier(env, options, Some(&prepacked))?;
            let rx = rx.clone();
            let in_flight = Arc::clone(&in_flight);
            let service = Arc::clone(&service);
            let batching = Batching {
                max_batch: config.max_batch,
                delay: std::time::Duration::from_micros(config.max_queue_delay_us),
                parallel: config.windows.parallel,
                parts: parts.clone(),
                busy: Arc::clone(&busy),
                alive: Arc::clone(&workers_alive),
                texts_split: Arc::clone(&texts_split),
                #[cfg(test)]
                stall: Arc::clone(&stall),
            };
            let alive = Held::new(Arc::clone(&workers_alive));
            std::thread::Builder::new().name(format!("{name}-{i}")).spawn(move || {
                let _alive = alive;
                worker(classifier, rx, batching, in_flight, service)
            })?;
        }
        tracing::info!(pool = name, model = %assets.info.name, sha256 = %assets.info.sha256, manifest_sha256 = %assets.info.manifest_sha256, temperature = assets.info.temperature,
            provider = ?config.provider, sessions = config.sessions, intra_threads = config.intra_threads, "onnx pool ready");
        let counter = assets.token_counter();
        Ok(OnnxPool {
            tx,
            counter,
            capacity: config.queue_capacity,
            in_flight,
            workers_alive,
            service,
            texts_split,
            info: assets.info,
            #[cfg(test)]
            stall,
        })
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// Counts tokens with the model's tokenizer (see [`TokenCounter::count`]); the encoding, if
    /// any, is for [`OnnxPool::classify`].
    pub fn tokens(&self, text: &str, cap: usize) -> Tokens {
        self.counter.count(text, cap)
    }

    /// Requests waiting for a worker.
    pub fn queue_depth(&self) -> usize {
        self.tx.len()
    }

    /// Worker threads still running (a panicked worker is not).
    pub fn workers_alive(&self) -> usize {
        self.workers_alive.load(Ordering::Relaxed)
    }

    /// EWMA of a batch's service time, µs (see [`ServiceTime`]); `None` when unknown or stale.
    pub fn service_us(&self) -> Option<u64> {
        self.service.batch_us(Instant::now())
    }

    /// Expected wait, µs, of a job joining the queue now: depth × service time per job ÷ live
    /// workers (see [`queue_wait_us`]); `None` while the service time is unknown.
    pub fn queue_wait_us(&self) -> Option<u64> {
        queue_wait_us(self.queue_depth(), self.service.job_us(Instant::now()), self.workers_alive())
    }

    /// Texts whose windows ran on two sessions at once (`[model.windows] parallel`) since start.
    pub fn texts_split(&self) -> u64 {
        self.texts_split.load(Ordering::Relaxed)
    }

    /// Requests a worker is running now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Classifies `text` (from `prepared.encoded` when this pool's [`OnnxPool::tokens`] made one,
    /// detecting `prepared.lang` on the worker), giving up at `deadline`.
    ///
    /// Errors: `Overloaded` when the queue is full, `DeadlineExceeded` when the deadline passes
    /// first, `Inference` when tokenisation or ONNX Runtime fails.
    pub async fn classify(
        &self,
        text: Arc<str>,
        prepared: Prepared,
        deadline: tokio::time::Instant,
    ) -> Result<ModelVerdict, TierError> {
        let (reply, rx) = oneshot::channel();
        let enqueued = Instant::now();
        let job = Job { text, prepared, enqueued, deadline: deadline.into_std(), reply };
        self.tx.try_send(job).map_err(|e| match e {
            TrySendError::Full(_) => TierError::Overloaded { capacity: self.capacity },
            TrySendError::Disconnected(_) => TierError::Unavailable("inference workers have stopped".into()),
        })?;
        reply_by(rx, deadline, enqueued).await
    }
}

/// The worker's reply if it comes by `deadline` (read again after the wait: [`super::by_deadline`]),
/// else `DeadlineExceeded`.
async fn reply_by(
    rx: oneshot::Receiver<Result<ModelVerdict, TierError>>,
    deadline: tokio::time::Instant,
    enqueued: Instant,
) -> Result<ModelVerdict, TierError> {
    match super::by_deadline(deadline, rx).await {
        Some(Ok(result)) => result,
        Some(Err(_)) => Err(TierError::Inference("the worker dropped the request".into())),
        None => Err(TierError::DeadlineExceeded { waited_us: enqueued.elapsed().as_micros() as u64 }),
    }
}

/// What a worker takes next: half of another worker's long text, or a batch of jobs.
enum Work {
    Part(Part),
    Jobs(Vec<Job>),
}

/// Takes the next work: a waiting [`Part`] first, else the next batch (the dynamic batcher, after
/// Triton's): the first job waiting, then more until `max_batch` are taken or the first has waited
/// `max_queue_delay`, whichever comes first. With a delay of zero only jobs already waiting join.
/// `None` when the pool is gone.
fn next_work(
    rx: &Receiver<Job>,
    parts: &Receiver<Part>,
    max_batch: usize,
    max_queue_delay: std::time::Duration,
) -> Option<Work> {
    if let Ok(part) = parts.try_recv() {
        return Some(Work::Part(part));
    }
    let first = select! {
        recv(parts) -> part => return part.ok().map(Work::Part),
        recv(rx) -> job => job.ok()?,
    };
    let close_at = first.enqueued + max_queue_delay;
    let mut jobs = vec![first];
    while jobs.len() < max_batch {
        let next = match rx.try_recv() {
            Ok(job) => Ok(job),
            Err(_) if Instant::now() < close_at => rx.recv_deadline(close_at).map_err(|_| ()),
            Err(_) => Err(()),
        };
        match next {
            Ok(job) => jobs.push(job),
            Err(()) => break,
        }
    }
    Some(Work::Jobs(jobs))
}

/// How a worker forms batches (`[model] max_batch`, `max_queue_delay_us`).
struct Batching {
    max_batch: usize,
    delay: std::time::Duration,
    /// `[model.windows] parallel`: a long text alone may run half its windows on an idle worker.
    parallel: bool,
    parts: Parts,
    /// Workers running something now, and workers alive: one is idle while busy < alive.
    busy: Arc<AtomicUsize>,
    alive: Arc<AtomicUsize>,
    texts_split: Arc<AtomicU64>,
    /// Tests stall the workers with it (a fault the real pool cannot be made to show on cue).
    #[cfg(test)]
    stall: Arc<tests::Stall>,
}

/// Answers the jobs nobody will wait for at once and keeps the rest: a job whose caller has gone
/// or whose deadline has passed gets `DeadlineExceeded`; one whose remaining time is shorter
/// than the expected service time `expected_us` gets `Doomed` (it would finish for nobody).
fn triage(jobs: Vec<Job>, now: Instant, expected_us: Option<u64>) -> Vec<Job> {
    let mut live = Vec::with_capacity(jobs.len());
    for job in jobs {
        let waited_us = now.saturating_duration_since(job.enqueued).as_micros() as u64;
        if job.reply.is_closed() || job.deadline <= now {
            let _ = job.reply.send(Err(TierError::DeadlineExceeded { waited_us }));
        } else if doomed(job.deadline, now, expected_us) {
            let remaining_us = job.deadline.saturating_duration_since(now).as_micros() as u64;
            let expected_us = expected_us.unwrap_or(0);
            let _ = job.reply.send(Err(TierError::Doomed { remaining_us, expected_us }));
        } else {
            live.push(job);
        }
    }
    live
}

/// One inference for a batch's texts: the riskiest window of each. A text alone, with nobody
/// queued behind it and a worker idle, runs half its windows on that worker (`[model.windows]
/// parallel`): then the second half costs no one anything.
fn run_batch(
    classifier: &mut super::model::Classifier,
    batching: &Batching,
    rx: &Receiver<Job>,
    mut encodings: Vec<Encoded>,
) -> anyhow::Result<Vec<super::model::Output>> {
    let split = batching.parallel
        && encodings.len() == 1
        && encodings[0].windows.len() >= 2
        && rx.is_empty()
        && batching.busy.load(Ordering::Relaxed) < batching.alive.load(Ordering::Relaxed);
    match encodings.pop() {
        Some(text) if split => {
            batching.texts_split.fetch_add(1, Ordering::Relaxed);
            batching.parts.classify(classifier, text).map(|out| vec![out])
        }
        Some(text) => {
            encodings.push(text);
            classifier.classify_encoded(&encodings)
        }
        None => Ok(Vec::new()),
    }
}

fn worker(
    mut classifier: super::model::Classifier,
    rx: Receiver<Job>,
    batching: Batching,
    in_flight: Arc<AtomicUsize>,
    service: Arc<ServiceTime>,
) {
    // Ends when the last sender (the OnnxPool) is dropped.
    while let Some(work) = next_work(&rx, &batching.parts.rx, batching.max_batch, batching.delay) {
        #[cfg(test)]
        batching.stall.hold();
        let busy = Held::new(&*batching.busy);
        let jobs = match work {
            Work::Part(part) => {
                parallel::run(&mut classifier, part, || drop(busy));
                continue;
            }
            Work::Jobs(jobs) => jobs,
        };
        let now = Instant::now();
        let live = triage(jobs, now, service.batch_us(now));
        if live.is_empty() {
            continue;
        }
        in_flight.fetch_add(live.len(), Ordering::Relaxed);
        let started = Instant::now();
        let mut ready = Vec::with_capacity(live.len());
        let mut encodings = Vec::with_capacity(live.len());
        for mut job in live {
            if let Some(lang) = &job.prepared.lang {
                // Detected here, on the worker thread, so the request task only reads it.
                lang.get();
            }
            match classifier.assets().encode_reusing(&job.text, job.prepared.encoded.take()) {
                Ok(e) => {
                    encodings.push(e);
                    ready.push(job);
                }
                Err(e) => {
                    in_flight.fetch_sub(1, Ordering::Relaxed);
                    let _ = job.reply.send(Err(TierError::Inference(e.to_string())));
                }
            }
        }
        let live = ready;
        let result = run_batch(&mut classifier, &batching, &rx, encodings);
        drop(busy); // idle before the callers hear back: their next long text may split here
        let infer_us = started.elapsed().as_micros() as u64;
        in_flight.fetch_sub(live.len(), Ordering::Relaxed);
        let batch_size = live.len();
        if result.is_ok() && batch_size > 0 {
            service.record(infer_us, batch_size);
        }
        match result {
            Ok(outputs) => {
                for (job, out) in live.into_iter().zip(outputs) {
                    let _ = job.reply.send(Ok(ModelVerdict {
                        risk_score: out.risk_score,
                        confidence: out.confidence,
                        ood_score: Some(out.ood_score),
                        tokens: Some(out.tokens),
                        queue_us: started.duration_since(job.enqueued).as_micros() as u64,
                        infer_us,
                        batch_size,
                        endpoint: None,
                        window: out.window,
                        unread: out.unread,
                    }));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, batch_size, "inference failed");
                for job in live {
                    let _ = job.reply.send(Err(TierError::Inference(e.to_string())));
                }
            }
        }
    }
}

impl ModelTier for OnnxPool {
    fn classify<'a>(
        &'a self,
        input: TierInput<'a>,
        deadline: tokio::time::Instant,
    ) -> BoxFuture<'a, Result<ModelVerdict, TierError>> {
        let TierInput::Text { text, prepared, .. } = input;
        Box::pin(OnnxPool::classify(self, text, prepared, deadline))
    }

    fn model(&self) -> Option<&ModelInfo> {
        Some(self.info())
    }

    fn load(&self) -> TierLoad {
        TierLoad { queue_wait_us: self.queue_wait_us(), ..TierLoad::default() }
    }

    fn status(&self) -> serde_json::Value {
        serde_json::json!({ "model": self.info() })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::select::{cpu_eligibility, CpuLoad, GpuLoad, GpuMemory, LoadSnapshot};
    use std::sync::{Condvar, Mutex};
    use std::time::Duration;

    /// Holds every worker that has just taken a batch, as a stalled machine would.
    #[derive(Default)]
    pub(crate) struct Stall {
        paused: Mutex<bool>,
        resumed: Condvar,
    }

    impl Stall {
        pub(crate) fn hold(&self) {
            let mut paused = self.paused.lock().unwrap();
            while *paused {
                paused = self.resumed.wait(paused).unwrap();
            }
        }

        fn set(&self, paused: bool) {
            *self.paused.lock().unwrap() = paused;
            self.resumed.notify_all();
        }
    }

    fn job(deadline: Instant) -> (Job, oneshot::Receiver<Result<ModelVerdict, TierError>>) {
        let (reply, rx) = oneshot::channel();
        (Job { text: "x".into(), prepared: Prepared::default(), enqueued: Instant::now(), deadline, reply }, rx)
    }

    #[test]
    fn a_worker_skips_doomed_jobs_and_answers_them_at_once() {
        let now = Instant::now();
        let (late, mut late_rx) = job(now - Duration::from_millis(1));
        let (doomed, mut doomed_rx) = job(now + Duration::from_millis(2));
        let (fine, _fine_rx) = job(now + Duration::from_millis(50));
        let (gone, gone_rx) = job(now + Duration::from_millis(50));
        drop(gone_rx);
        let live = triage(vec![late, doomed, fine, gone], now, Some(5_000));
        assert_eq!(live.len(), 1, "only the job that can finish in time is started");
        assert!(matches!(late_rx.try_recv(), Ok(Err(TierError::DeadlineExceeded { .. }))));
        match doomed_rx.try_recv() {
            Ok(Err(TierError::Doomed { remaining_us, expected_us: 5_000 })) => assert!(remaining_us <= 2_000),
            other => panic!("want Doomed, got {other:?}"),
        }
        // Unknown service time: started (the estimate has to form somewhere).
        let (short, _rx) = job(now + Duration::from_millis(2));
        assert_eq!(triage(vec![short], now, None).len(), 1);
    }

    fn signals(pool: &OnnxPool) -> LoadSnapshot {
        LoadSnapshot {
            tenant: Default::default(),
            confirm: false,
            cpu: CpuLoad {
                utilization: None,
                queue_depth: pool.queue_depth(),
                in_flight: pool.in_flight(),
                service_us: pool.service_us(),
                queue_wait_us: pool.queue_wait_us(),
            },
            gpu: GpuLoad {
                unavailable: Some("none".into()),
                memory: GpuMemory::Unknown,
                utilization: None,
                in_flight: 0,
                p95_us: None,
                queue_wait_us: None,
                ewma_us: None,
                circuit: crate::breaker::CircuitState::Closed,
                kv_cache: crate::select::KvCache::NotExposed,
                was_below: Default::default(),
                endpoints_available: None,
            },
        }
    }

    const POLICY: &str = "[actions]\nreview_at = 0.3\nblock_at = 0.8\n[cascade]\nescalate_below = 0.9\naccept_below = 0.7\nood_above = 0.95\n\
                          [default]\naction = \"review\"\nscore = 0.5\n[cpu]\nmax_queue_depth = 100000\n";

    /// A stall with the real model: while the workers are held, the expected wait grows with the
    /// queue and admission refuses what cannot be served in time; once they run again, the jobs
    /// nobody waits for are answered without inference, the queue drains and the next request
    /// gets a model verdict (no latching).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn recovers_after_a_stall() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let env = crate::ort_lib::environment(None).unwrap();
        let config = ModelConfig { dir: root.join("models"), queue_capacity: 1024, ..ModelConfig::default() };
        let pool = Arc::new(OnnxPool::start(env, &config, "stall-test").unwrap());
        let policy =
            crate::policy::Policy::from_sources(&root.join("p"), &[(root.join("p/routing.toml"), POLICY.into())])
                .unwrap();
        let text: Arc<str> = "Your parcel is held at customs, pay the fee at this link today".into();
        let far = || tokio::time::Instant::now() + Duration::from_secs(10);
        for _ in 0..8 {
            pool.classify(Arc::clone(&text), Prepared::default(), far()).await.unwrap();
        }
        let service_us = pool.service_us().expect("a service estimate after 8 batches");

        pool.stall.set(true);
        let budget = Duration::from_millis(100);
        // Enough jobs that their expected wait exceeds the budget whatever the machine's speed.
        let n = (4 * budget.as_micros() as u64 / service_us.max(1)).clamp(32, 900) as usize;
        let mut waiting = Vec::new();
        for _ in 0..n {
            let (pool, text) = (Arc::clone(&pool), Arc::clone(&text));
            let deadline = tokio::time::Instant::now() + budget;
            waiting.push(tokio::spawn(async move { pool.classify(text, Prepared::default(), deadline).await }));
        }
        for _ in 0..1000 {
            if pool.queue_depth() + 8 >= n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let refused = cpu_eligibility(&policy, &signals(&pool), budget);
        assert!(
            matches!(
                refused,
                Err(crate::select::Ineligible::Deadline { .. } | crate::select::Ineligible::QueueWait { .. })
            ),
            "{} queued: {refused:?}",
            pool.queue_depth()
        );
        for w in waiting {
            assert!(w.await.unwrap().is_err(), "no verdict while stalled past the deadline");
        }

        pool.stall.set(false);
        for _ in 0..500 {
            if pool.queue_depth() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(pool.queue_depth(), 0, "the jobs nobody waits for leave the queue without inference");
        assert_eq!(cpu_eligibility(&policy, &signals(&pool), budget), Ok(()), "admitted again");
        let v = pool.classify(Arc::clone(&text), Prepared::default(), far()).await;
        assert!(v.is_ok(), "the model answers again: {v:?}");
    }
}
