//! One shutdown signal every long-lived task takes: a
//! `tokio_util::sync::CancellationToken`, with the trigger kept apart from
//! the tasks that only wait on it.

use tokio_util::sync::CancellationToken;

#[derive(Clone)]
pub struct Shutdown {
    token: CancellationToken,
}

#[derive(Clone)]
pub struct ShutdownTrigger {
    token: CancellationToken,
}

impl ShutdownTrigger {
    pub fn trigger(&self) {
        self.token.cancel();
    }
}

impl Shutdown {
    pub fn new() -> (ShutdownTrigger, Shutdown) {
        let token = CancellationToken::new();
        (
            ShutdownTrigger {
                token: token.clone(),
            },
            Shutdown { token },
        )
    }

    /// A signal that never fires unless triggered, plus SIGINT/SIGTERM.
    pub fn from_signals() -> (ShutdownTrigger, Shutdown) {
        let (trigger, shutdown) = Shutdown::new();
        let t = trigger.clone();
        tokio::spawn(async move {
            let ctrl_c = tokio::signal::ctrl_c();
            #[cfg(unix)]
            {
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                        .expect("SIGTERM handler installs");
                tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
            }
            #[cfg(not(unix))]
            let _ = ctrl_c.await;
            tracing::info!("shutdown signal received");
            t.trigger();
        });
        (trigger, shutdown)
    }

    pub fn is_triggered(&self) -> bool {
        self.token.is_cancelled()
    }

    pub async fn wait(&mut self) {
        self.token.cancelled().await
    }

    /// A future that resolves on shutdown, for code that takes any future
    /// as its stop signal (`fleet_bus::serve`).
    pub fn stopped(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.token.clone().cancelled_owned()
    }

    /// The token itself, for code that takes a `CancellationToken`.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_clone_sees_the_trigger() {
        let (trigger, shutdown) = Shutdown::new();
        let mut waiter = shutdown.clone();
        assert!(!shutdown.is_triggered());
        let waited = tokio::spawn(async move { waiter.wait().await });
        trigger.trigger();
        waited.await.unwrap();
        assert!(shutdown.is_triggered());
        shutdown.stopped().await;
    }
}
