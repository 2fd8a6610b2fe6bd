//! One shutdown signal every long-lived task takes.

use tokio::sync::watch;

#[derive(Clone)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
}

#[derive(Clone)]
pub struct ShutdownTrigger {
    tx: std::sync::Arc<watch::Sender<bool>>,
}

impl ShutdownTrigger {
    pub fn trigger(&self) {
        let _ = self.tx.send(true);
    }
}

impl Shutdown {
    pub fn new() -> (ShutdownTrigger, Shutdown) {
        let (tx, rx) = watch::channel(false);
        (
            ShutdownTrigger {
                tx: std::sync::Arc::new(tx),
            },
            Shutdown { rx },
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
        *self.rx.borrow()
    }

    pub async fn wait(&mut self) {
        let _ = self.rx.wait_for(|v| *v).await;
    }

    /// A future that resolves on shutdown, for code that takes any future
    /// as its stop signal (`fleet_bus::serve`).
    pub fn stopped(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut s = self.clone();
        async move { s.wait().await }
    }
}
