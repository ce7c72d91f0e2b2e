//! The encoder worker behind `/v1/embeddings`, `/v1/score`, `/v1/rerank` and
//! `/v1/classify`: one thread owns the model; requests that arrive while it
//! works are batched into its next steps.

use std::sync::mpsc;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::{EmbedError, Embedder, EncoderText, Head};

/// One request's texts and where their outputs go.
struct Job {
    texts: Vec<EncoderText>,
    reply: oneshot::Sender<Result<Vec<Vec<f32>>, Arc<EmbedError>>>,
}

/// A handle to the worker; cheap to clone.
#[derive(Clone)]
pub struct EmbedderHandle {
    jobs: mpsc::Sender<Job>,
    max_tokens: usize,
    dimensions: Option<usize>,
    head: Arc<Head>,
}

/// The worker thread.
pub struct EmbedderThread(std::thread::JoinHandle<()>);

impl EmbedderThread {
    /// Waits for the worker to stop; every handle must be dropped first.
    pub fn join(self) {
        if self.0.join().is_err() {
            tracing::error!("the embedding thread panicked");
        }
    }
}

/// Starts the worker for `embedder`; it stops when every handle is dropped.
pub fn spawn(embedder: Embedder) -> (EmbedderHandle, EmbedderThread) {
    let (jobs, receiver) = mpsc::channel();
    let handle = EmbedderHandle {
        jobs,
        max_tokens: embedder.max_tokens(),
        dimensions: embedder.dimensions(),
        head: Arc::new(embedder.head().clone()),
    };
    let thread = std::thread::Builder::new()
        .name("kiln-embedder".to_owned())
        .spawn(move || run(&embedder, &receiver))
        .expect("the embedding thread starts");
    (handle, EmbedderThread(thread))
}

impl EmbedderHandle {
    /// The longest text accepted, in tokens.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// The length of each output, when the graph's width is static.
    pub fn dimensions(&self) -> Option<usize> {
        self.dimensions
    }

    /// What the model's output is made into.
    pub fn head(&self) -> &Head {
        &self.head
    }

    /// The outputs of `texts` (each checked by the caller with
    /// [`super::check_text`]): embeddings, or class logits.
    pub async fn run(&self, texts: Vec<EncoderText>) -> Result<Vec<Vec<f32>>, Arc<EmbedError>> {
        let (reply, answer) = oneshot::channel();
        let stopped = || Arc::new(EmbedError::Stopped);
        self.jobs
            .send(Job { texts, reply })
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// Takes a job, then every job already waiting (up to the step's token
/// budget), and embeds their texts together.
fn run(embedder: &Embedder, receiver: &mpsc::Receiver<Job>) {
    while let Ok(first) = receiver.recv() {
        let length = |texts: &[EncoderText]| texts.iter().map(|t| t.tokens.len()).sum::<usize>();
        let mut tokens = length(&first.texts);
        let mut jobs = vec![first];
        while tokens < embedder.batch_tokens() {
            match receiver.try_recv() {
                Ok(job) => {
                    tokens += length(&job.texts);
                    jobs.push(job);
                }
                Err(_) => break,
            }
        }
        let texts: Vec<EncoderText> = jobs.iter().flat_map(|j| j.texts.iter().cloned()).collect();
        match embedder.run(&texts) {
            Ok(embeddings) => {
                let mut embeddings = embeddings.into_iter();
                for job in jobs {
                    let mine = embeddings.by_ref().take(job.texts.len()).collect();
                    // A client that left no longer waits: nothing to do.
                    let _ = job.reply.send(Ok(mine));
                }
            }
            Err(error) => {
                tracing::error!("encoder step failed: {error}");
                let error = Arc::new(error);
                for job in jobs {
                    let _ = job.reply.send(Err(error.clone()));
                }
            }
        }
    }
}
