//! The embedding worker behind `/v1/embeddings`: one thread owns the model;
//! requests that arrive while it works are batched into its next steps.

use std::sync::mpsc;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::{EmbedError, Embedder};

/// One request's texts and where its embeddings go.
struct Job {
    texts: Vec<Vec<u32>>,
    reply: oneshot::Sender<Result<Vec<Vec<f32>>, Arc<EmbedError>>>,
}

/// A handle to the worker; cheap to clone.
#[derive(Clone)]
pub struct EmbedderHandle {
    jobs: mpsc::Sender<Job>,
    max_tokens: usize,
    dimensions: Option<usize>,
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

    /// The length of each embedding, when the graph's width is static.
    pub fn dimensions(&self) -> Option<usize> {
        self.dimensions
    }

    /// The embeddings of `texts` (each checked by the caller with
    /// [`super::check_text`]).
    pub async fn embed(&self, texts: Vec<Vec<u32>>) -> Result<Vec<Vec<f32>>, Arc<EmbedError>> {
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
        let mut tokens: usize = first.texts.iter().map(Vec::len).sum();
        let mut jobs = vec![first];
        while tokens < embedder.batch_tokens() {
            match receiver.try_recv() {
                Ok(job) => {
                    tokens += job.texts.iter().map(Vec::len).sum::<usize>();
                    jobs.push(job);
                }
                Err(_) => break,
            }
        }
        let texts: Vec<Vec<u32>> = jobs.iter().flat_map(|j| j.texts.iter().cloned()).collect();
        match embedder.embed(&texts) {
            Ok(embeddings) => {
                let mut embeddings = embeddings.into_iter();
                for job in jobs {
                    let mine = embeddings.by_ref().take(job.texts.len()).collect();
                    // A client that left no longer waits: nothing to do.
                    let _ = job.reply.send(Ok(mine));
                }
            }
            Err(error) => {
                tracing::error!("embedding step failed: {error}");
                let error = Arc::new(error);
                for job in jobs {
                    let _ = job.reply.send(Err(error.clone()));
                }
            }
        }
    }
}
