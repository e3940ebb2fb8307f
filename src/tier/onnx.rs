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

use super::model::{ModelAssets, ModelInfo, SessionOptions};
use super::windows::{Encoded, TokenCounter, Tokens};
use super::ModelConfig;
use super::ModelVerdict;
use crate::tier::TierError;
use crossbeam_channel::{Receiver, Sender, TrySendError};
use ort::environment::Environment;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

struct Job {
    text: Arc<str>,
    /// The model's input when the complexity rater already made it (tokenised once).
    encoded: Option<Encoded>,
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
    info: ModelInfo,
}

/// Counts a worker as alive until its thread ends, by return or by panic.
struct AliveGuard(Arc<AtomicUsize>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl OnnxPool {
    /// Loads the model from `config.dir` and starts `config.sessions` workers named `{name}-{i}`.
    pub fn start(env: &Environment, config: &ModelConfig, name: &str) -> anyhow::Result<OnnxPool> {
        let assets = ModelAssets::load(&config.dir)?.with_windows(config.windows)?;
        let options = SessionOptions::from(config);
        let (tx, rx) = crossbeam_channel::bounded::<Job>(config.queue_capacity);
        let in_flight = Arc::new(AtomicUsize::new(0));
        let workers_alive = Arc::new(AtomicUsize::new(0));
        for i in 0..config.sessions {
            let classifier = assets.classifier(env, options)?;
            let rx = rx.clone();
            let in_flight = Arc::clone(&in_flight);
            let (max_batch, delay) = (config.max_batch, std::time::Duration::from_micros(config.max_queue_delay_us));
            workers_alive.fetch_add(1, Ordering::Relaxed);
            let alive = AliveGuard(Arc::clone(&workers_alive));
            std::thread::Builder::new().name(format!("{name}-{i}")).spawn(move || {
                let _alive = alive;
                worker(classifier, rx, max_batch, delay, in_flight)
            })?;
        }
        tracing::info!(pool = name, model = %assets.info.name, sha256 = %assets.info.sha256, temperature = assets.info.temperature,
            provider = ?config.provider, sessions = config.sessions, intra_threads = config.intra_threads, "onnx pool ready");
        let counter = assets.token_counter();
        Ok(OnnxPool { tx, counter, capacity: config.queue_capacity, in_flight, workers_alive, info: assets.info })
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

    /// Requests a worker is running now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Classifies `text` (from `encoding` when this pool's [`OnnxPool::tokens`] made one), giving
    /// up at `deadline`.
    ///
    /// Errors: `Overloaded` when the queue is full, `DeadlineExceeded` when the deadline passes
    /// first, `Inference` when tokenisation or ONNX Runtime fails.
    pub async fn classify(
        &self,
        text: Arc<str>,
        encoded: Option<Encoded>,
        deadline: tokio::time::Instant,
    ) -> Result<ModelVerdict, TierError> {
        let (reply, rx) = oneshot::channel();
        let enqueued = Instant::now();
        let job = Job { text, encoded, enqueued, deadline: deadline.into_std(), reply };
        self.tx.try_send(job).map_err(|e| match e {
            TrySendError::Full(_) => TierError::Overloaded { capacity: self.capacity },
            TrySendError::Disconnected(_) => TierError::Unavailable("inference workers have stopped".into()),
        })?;
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(TierError::Inference("the worker dropped the request".into())),
            Err(_) => Err(TierError::DeadlineExceeded { waited_us: enqueued.elapsed().as_micros() as u64 }),
        }
    }
}

/// Forms the next batch (the dynamic batcher, after Triton's): the first job waiting, then more
/// until `max_batch` are taken or the first has waited `max_queue_delay`, whichever comes first.
/// With a delay of zero only jobs already waiting join. `None` when the pool is gone.
fn next_batch(rx: &Receiver<Job>, max_batch: usize, max_queue_delay: std::time::Duration) -> Option<Vec<Job>> {
    let first = rx.recv().ok()?;
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
    Some(jobs)
}

fn worker(
    mut classifier: super::model::Classifier,
    rx: Receiver<Job>,
    max_batch: usize,
    max_queue_delay: std::time::Duration,
    in_flight: Arc<AtomicUsize>,
) {
    // Ends when the last sender (the OnnxPool) is dropped.
    while let Some(jobs) = next_batch(&rx, max_batch, max_queue_delay) {
        let now = Instant::now();
        // A job whose caller has gone (deadline passed) would be wasted work.
        let (live, dead): (Vec<Job>, Vec<Job>) =
            jobs.into_iter().partition(|j| j.deadline > now && !j.reply.is_closed());
        for job in dead {
            let waited_us = job.enqueued.elapsed().as_micros() as u64;
            let _ = job.reply.send(Err(TierError::DeadlineExceeded { waited_us }));
        }
        if live.is_empty() {
            continue;
        }
        in_flight.fetch_add(live.len(), Ordering::Relaxed);
        let started = Instant::now();
        let mut ready = Vec::with_capacity(live.len());
        let mut encodings = Vec::with_capacity(live.len());
        for mut job in live {
            match job.encoded.take().map(Ok).unwrap_or_else(|| classifier.encode(&job.text)) {
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
        let result = classifier.classify_encoded(&encodings);
        let infer_us = started.elapsed().as_micros() as u64;
        in_flight.fetch_sub(live.len(), Ordering::Relaxed);
        let batch_size = live.len();
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
