//! Asks gathered into batched hub commands: callers that each want one
//! thing of the hub at about the same time (the workflow's impairment
//! holds, the gateway's agent joins) ask a [`Batcher`], and one command
//! carries every ask that arrived within `linger` of the first, up to
//! `max`, in one hub transaction instead of one each. At most `in_flight`
//! batches are out at once: while all are, new asks wait and go together
//! in the next batch, so a slower hub gets larger batches rather than a
//! longer queue of small ones. Each ask gets its own answer. The batches
//! may be anything a service does better in bulk: a hub command, one
//! statement of the service's own (the gateway's session opens).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::HubCallError;

/// The error a batch's asks get when no answer came: the batcher stopped,
/// or the batch answered a different number of results than it had asks.
pub trait Lost: Clone + Send + 'static {
    fn lost(why: String) -> Self;
}

impl Lost for HubCallError {
    fn lost(why: String) -> Self {
        HubCallError::Transport(why)
    }
}

/// How asks are gathered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Asks in one batch at the most.
    pub max: usize,
    /// How long a batch waits for more asks after its first.
    pub linger: Duration,
    /// Batches out at once at the most.
    pub in_flight: usize,
}

struct Ask<T, R, E> {
    item: T,
    reply: oneshot::Sender<Result<R, E>>,
}

/// A handle to a running batcher; it stops when the last handle is dropped.
pub struct Batcher<T, R, E = HubCallError> {
    tx: mpsc::Sender<Ask<T, R, E>>,
}

impl<T, R, E> Clone for Batcher<T, R, E> {
    fn clone(&self) -> Self {
        Batcher {
            tx: self.tx.clone(),
        }
    }
}

impl<T: Send + 'static, R: Send + 'static, E: Lost> Batcher<T, R, E> {
    /// Starts the batcher. `send` gets a batch's items in the order they
    /// were asked and answers one result per item in that order, or one
    /// error for the whole batch (every ask of it gets that error).
    pub fn start<F, Fut>(limits: Limits, send: F) -> Self
    where
        F: Fn(Vec<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<Result<R, E>>, E>> + Send + 'static,
    {
        let limits = Limits {
            max: limits.max.max(1),
            linger: limits.linger,
            in_flight: limits.in_flight.max(1),
        };
        let (tx, rx) = mpsc::channel(limits.max * limits.in_flight * 2);
        tokio::spawn(gather(rx, limits, Arc::new(send)));
        Batcher { tx }
    }

    /// Asks for one item and waits for its own answer.
    pub async fn ask(&self, item: T) -> Result<R, E> {
        let (reply, answer) = oneshot::channel();
        let gone = || E::lost("the batcher stopped".into());
        self.tx
            .send(Ask { item, reply })
            .await
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

async fn gather<T, R, E, F, Fut>(mut rx: mpsc::Receiver<Ask<T, R, E>>, limits: Limits, send: Arc<F>)
where
    T: Send + 'static,
    R: Send + 'static,
    E: Lost,
    F: Fn(Vec<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<Result<R, E>>, E>> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(limits.in_flight));
    loop {
        // A free slot first: while every batch is out, asks gather.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        let mut batch = vec![first];
        let until = tokio::time::Instant::now() + limits.linger;
        while batch.len() < limits.max {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(a)) => batch.push(a),
                _ => break,
            }
        }
        let send = send.clone();
        tokio::spawn(async move {
            let (items, replies): (Vec<T>, Vec<_>) =
                batch.into_iter().map(|a| (a.item, a.reply)).unzip();
            let asked = items.len();
            let outcome = send(items).await;
            drop(slot);
            match outcome {
                Ok(results) if results.len() == asked => {
                    for (r, reply) in results.into_iter().zip(replies) {
                        let _ = reply.send(r);
                    }
                }
                Ok(results) => {
                    let e = E::lost(format!("{} results for a batch of {asked}", results.len()));
                    for reply in replies {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
                Err(e) => {
                    for reply in replies {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    fn limits(max: usize, in_flight: usize) -> Limits {
        Limits {
            max,
            linger: Duration::from_millis(20),
            in_flight,
        }
    }

    #[tokio::test]
    async fn asks_together_go_in_one_batch_and_each_gets_its_own_answer() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let seen = sizes.clone();
        let b: Batcher<u32, u32> = Batcher::start(limits(100, 1), move |items: Vec<u32>| {
            seen.lock().unwrap().push(items.len());
            async move {
                Ok(items
                    .into_iter()
                    .map(|i| {
                        if i.is_multiple_of(2) {
                            Ok(i * 10)
                        } else {
                            Err(HubCallError::BadReply(format!("odd {i}")))
                        }
                    })
                    .collect())
            }
        });
        let answers = futures_join(&b, 0..10).await;
        for (i, a) in answers.into_iter().enumerate() {
            let i = i as u32;
            if i.is_multiple_of(2) {
                assert_eq!(a, Ok(i * 10));
            } else {
                assert_eq!(a, Err(HubCallError::BadReply(format!("odd {i}"))));
            }
        }
        assert_eq!(*sizes.lock().unwrap(), vec![10]);
    }

    #[tokio::test]
    async fn a_batch_is_at_most_max_and_in_flight_bounds_the_batches_out() {
        let out = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let (o, m, s) = (out.clone(), most.clone(), sizes.clone());
        let b: Batcher<u32, u32> = Batcher::start(limits(4, 2), move |items: Vec<u32>| {
            s.lock().unwrap().push(items.len());
            let now = o.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(now, Ordering::SeqCst);
            let o = o.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(30)).await;
                o.fetch_sub(1, Ordering::SeqCst);
                Ok(items.into_iter().map(Ok).collect())
            }
        });
        let answers = futures_join(&b, 0..20).await;
        assert_eq!(answers, (0..20).map(Ok).collect::<Vec<_>>());
        let sizes = sizes.lock().unwrap().clone();
        assert!(sizes.iter().all(|&n| (1..=4).contains(&n)), "{sizes:?}");
        assert_eq!(sizes.iter().sum::<usize>(), 20);
        assert_eq!(most.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_failed_or_miscounted_batch_answers_every_ask_with_an_error() {
        let b: Batcher<u32, u32> = Batcher::start(limits(10, 1), |_items: Vec<u32>| async {
            Err(HubCallError::NotRunning)
        });
        assert_eq!(
            futures_join(&b, 0..3).await,
            vec![Err(HubCallError::NotRunning); 3]
        );
        let b: Batcher<u32, u32> =
            Batcher::start(limits(10, 1), |_items: Vec<u32>| async { Ok(vec![Ok(1)]) });
        for a in futures_join(&b, 0..3).await {
            assert!(matches!(a, Err(HubCallError::Transport(_))), "{a:?}");
        }
    }

    /// Asks every item at once and answers in the items' order.
    async fn futures_join(
        b: &Batcher<u32, u32>,
        items: std::ops::Range<u32>,
    ) -> Vec<Result<u32, HubCallError>> {
        let tasks: Vec<_> = items
            .map(|i| {
                let b = b.clone();
                tokio::spawn(async move { b.ask(i).await })
            })
            .collect();
        let mut out = vec![];
        for t in tasks {
            out.push(t.await.expect("ask task"));
        }
        out
    }
}
