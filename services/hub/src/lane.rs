//! A lane's two inputs, one per [`Queue`]: the fetchers of its partitions'
//! session queues and of their reads' queues send into them, and a batch
//! takes what the session queues sent first. While the hub works through
//! the connectors' reads (a fleet's first reads are a backlog of several
//! hundred thousand observations), the gateway's session events are thus
//! applied within a batch or two of being fetched instead of behind it.

use fleet_bus::Queue;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// The sending halves, for a lane's fetchers.
#[derive(Debug)]
pub struct Senders<T> {
    sessions: mpsc::Sender<T>,
    reads: mpsc::Sender<T>,
}

impl<T> Senders<T> {
    pub fn of(&self, queue: Queue) -> mpsc::Sender<T> {
        match queue {
            Queue::Sessions => self.sessions.clone(),
            Queue::Reads => self.reads.clone(),
        }
    }
}

/// The receiving halves, for the lane.
#[derive(Debug)]
pub struct Inputs<T> {
    sessions: mpsc::Receiver<T>,
    reads: mpsc::Receiver<T>,
}

/// A lane's inputs, each holding up to `capacity` items.
pub fn channel<T>(capacity: usize) -> (Senders<T>, Inputs<T>) {
    let (sessions, sessions_rx) = mpsc::channel(capacity.max(1));
    let (reads, reads_rx) = mpsc::channel(capacity.max(1));
    (
        Senders { sessions, reads },
        Inputs {
            sessions: sessions_rx,
            reads: reads_rx,
        },
    )
}

impl<T> Inputs<T> {
    /// The next batch: waits for a first item, then takes up to `max`,
    /// session items before read items, waiting for more until the
    /// `deadline` the first item gives, asked once, as the first item is
    /// taken. Each input's items keep their order. `None` once both inputs
    /// are closed and empty.
    pub async fn batch(
        &mut self,
        max: usize,
        deadline: impl FnOnce(&T) -> Instant,
    ) -> Option<Vec<T>> {
        let first = tokio::select! {
            biased;
            Some(i) = self.sessions.recv() => i,
            Some(i) = self.reads.recv() => i,
            else => return None,
        };
        let until = deadline(&first);
        let mut items = vec![first];
        while items.len() < max {
            if let Ok(i) = self.sessions.try_recv() {
                items.push(i);
                continue;
            }
            match self.reads.try_recv() {
                Ok(i) => items.push(i),
                Err(mpsc::error::TryRecvError::Empty | mpsc::error::TryRecvError::Disconnected) => {
                    let next = tokio::time::timeout_at(until, async {
                        tokio::select! {
                            biased;
                            Some(i) = self.sessions.recv() => Some(i),
                            Some(i) = self.reads.recv() => Some(i),
                            else => None,
                        }
                    })
                    .await;
                    match next {
                        Ok(Some(i)) => items.push(i),
                        Ok(None) | Err(_) => break,
                    }
                }
            }
        }
        Some(items)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn soon(_: &(Queue, u32)) -> Instant {
        Instant::now() + Duration::from_millis(20)
    }

    #[tokio::test]
    async fn session_items_go_first_and_each_input_keeps_its_order() {
        let (tx, mut rx) = channel(100);
        for n in 0..10 {
            tx.of(Queue::Reads).send((Queue::Reads, n)).await.unwrap();
        }
        for n in 0..3 {
            tx.of(Queue::Sessions)
                .send((Queue::Sessions, n))
                .await
                .unwrap();
        }
        let batch = rx.batch(5, soon).await.unwrap();
        assert_eq!(
            batch,
            vec![
                (Queue::Sessions, 0),
                (Queue::Sessions, 1),
                (Queue::Sessions, 2),
                (Queue::Reads, 0),
                (Queue::Reads, 1),
            ]
        );
        // A session item that arrives while reads wait still goes first.
        tx.of(Queue::Sessions)
            .send((Queue::Sessions, 3))
            .await
            .unwrap();
        let batch = rx.batch(3, soon).await.unwrap();
        assert_eq!(
            batch,
            vec![(Queue::Sessions, 3), (Queue::Reads, 2), (Queue::Reads, 3)]
        );
    }

    #[tokio::test]
    async fn a_batch_closes_at_the_deadline_and_the_lane_ends_when_both_inputs_do() {
        let (tx, mut rx) = channel(100);
        tx.of(Queue::Reads).send((Queue::Reads, 0)).await.unwrap();
        // Not full, nothing more comes: it closes at the first item's deadline.
        assert_eq!(rx.batch(5, soon).await.unwrap(), vec![(Queue::Reads, 0)]);
        let sessions = tx.of(Queue::Sessions);
        drop(tx);
        sessions.send((Queue::Sessions, 0)).await.unwrap();
        drop(sessions);
        // The reads' input is closed: what the other holds is still taken.
        assert_eq!(rx.batch(5, soon).await.unwrap(), vec![(Queue::Sessions, 0)]);
        assert_eq!(rx.batch(5, soon).await, None);
    }

    /// The hub's `wait` stage runs from the moment the deadline is asked
    /// for, so it must be asked as the first item is taken, not while an
    /// idle lane waits for one.
    #[tokio::test]
    async fn the_deadline_is_asked_as_the_first_item_is_taken() {
        let (tx, mut rx) = channel(100);
        let idle = Duration::from_millis(30);
        let sent = tokio::spawn(async move {
            tokio::time::sleep(idle).await;
            tx.of(Queue::Reads).send((Queue::Reads, 7)).await.unwrap();
            tx
        });
        let started = Instant::now();
        let mut asked = None;
        let batch = rx
            .batch(5, |first| {
                asked = Some((*first, Instant::now()));
                Instant::now()
            })
            .await
            .unwrap();
        assert_eq!(batch, vec![(Queue::Reads, 7)]);
        let (first, at) = asked.expect("asked once");
        assert_eq!(first, (Queue::Reads, 7));
        assert!(at - started >= idle, "asked before the item existed");
        drop(sent.await.unwrap());
    }
}
