//! The one task supervisor every service runs its long-lived tasks under:
//! it waits for the shutdown signal, then gives the tasks `grace` to finish
//! what they hold (a batch, an answer, an outbox flush) before aborting
//! what is left. A task that panics is reported, and the service exits with
//! an error once the others are drained.

use std::time::Duration;

use tokio::task::JoinSet;

use crate::Shutdown;

/// Runs until shutdown, then drains `tasks` within `grace`.
pub async fn supervise(
    service: &str,
    mut tasks: JoinSet<()>,
    mut shutdown: Shutdown,
    grace: Duration,
) -> anyhow::Result<()> {
    let mut panicked = 0usize;
    loop {
        tokio::select! {
            _ = shutdown.wait() => break,
            next = tasks.join_next() => match next {
                None => break,
                Some(Err(e)) if e.is_panic() => {
                    tracing::error!(service, error = %e, "a task panicked; the service stops");
                    panicked += 1;
                    break;
                }
                Some(_) => tracing::warn!(service, "a task ended before shutdown"),
            }
        }
    }
    let drained = tokio::time::timeout(grace, async {
        let mut n = 0;
        while let Some(r) = tasks.join_next().await {
            if matches!(&r, Err(e) if e.is_panic()) {
                n += 1;
            }
        }
        n
    })
    .await;
    match drained {
        Ok(n) => panicked += n,
        Err(_) => {
            tracing::warn!(
                service,
                grace_secs = grace.as_secs(),
                "shutdown grace period over; aborting the tasks still running (their unacked work is redelivered)"
            );
            tasks.abort_all();
        }
    }
    anyhow::ensure!(panicked == 0, "{service}: {panicked} task(s) panicked");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tasks_finish_within_the_grace_and_stragglers_are_aborted() {
        let (trigger, shutdown) = Shutdown::new();
        let mut tasks = JoinSet::new();
        let mut s = shutdown.clone();
        tasks.spawn(async move { s.wait().await });
        // One that never stops on its own.
        tasks.spawn(std::future::pending::<()>());
        trigger.trigger();
        let started = std::time::Instant::now();
        supervise("test", tasks, shutdown, Duration::from_millis(200))
            .await
            .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(200));
    }

    #[tokio::test]
    async fn a_panicking_task_is_an_error() {
        let (_trigger, shutdown) = Shutdown::new();
        let mut tasks = JoinSet::new();
        tasks.spawn(async { panic!("boom") });
        let e = supervise("test", tasks, shutdown, Duration::from_millis(50))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("1 task(s) panicked"), "{e}");
    }
}
