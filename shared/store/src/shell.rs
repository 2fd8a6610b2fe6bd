//! The shell every database service (the hub, the placer, the gateway,
//! Radar, the workflow service) runs in, written once: its ops server
//! (`/healthz`; `/readyz` while NATS and PostgreSQL answer; `/metrics`), its
//! responders through the mesh's one responder with their metrics
//! registered, its long-lived tasks under the one supervisor, and the
//! ordered stop: the tasks drain within the grace period, then the outbox
//! relay flushes what they committed, then NATS.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_bus::{Limits, Responder, ResponderMetrics, Route};
use fleet_runtime::Shutdown;
use prometheus_client::registry::Registry;
use sqlx::PgPool;
use tokio::task::{JoinHandle, JoinSet};

/// Where a service's ops server listens, and under which key its
/// configuration names the address (for the error when it cannot bind).
pub struct Ops<'a> {
    pub listen: &'a str,
    pub key: &'static str,
    pub registry: Arc<Mutex<Registry>>,
}

pub struct Shell {
    service: &'static str,
    nats: async_nats::Client,
    shutdown: Shutdown,
    answers: ResponderMetrics,
    tasks: JoinSet<()>,
    relay: Option<(JoinHandle<()>, Box<dyn FnOnce() + Send>)>,
}

impl Shell {
    /// Serves the ops endpoints; returns the shell and their bound address.
    pub async fn start(
        service: &'static str,
        ops: Ops<'_>,
        nats: &async_nats::Client,
        pool: &PgPool,
        shutdown: &Shutdown,
    ) -> anyhow::Result<(Shell, SocketAddr)> {
        let addr = fleet_runtime::http::serve_ops(
            ops.listen,
            ops.key,
            ops.registry.clone(),
            nats.clone(),
            crate::ready_check(pool.clone()),
            shutdown.clone(),
        )
        .await?;
        let answers = ResponderMetrics::default();
        answers.register(&mut ops.registry.lock().unwrap_or_else(|p| p.into_inner()));
        let shell = Shell {
            service,
            nats: nats.clone(),
            shutdown: shutdown.clone(),
            answers,
            tasks: JoinSet::new(),
            relay: None,
        };
        Ok((shell, addr))
    }

    /// The service's shutdown signal, for the tasks it spawns.
    pub fn shutdown(&self) -> Shutdown {
        self.shutdown.clone()
    }

    /// Answers `route` through the one responder until shutdown.
    pub fn respond<R: Responder>(&mut self, responder: Arc<R>, route: Route, limits: Limits) {
        self.tasks.spawn(fleet_bus::serve(
            self.nats.clone(),
            responder,
            route,
            limits,
            self.answers.clone(),
            self.shutdown.stopped(),
        ));
    }

    /// A long-lived task; it ends on the shutdown signal it was given.
    pub fn spawn(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        self.tasks.spawn(task);
    }

    /// The outbox relay: it runs beside the tasks and stops last, once
    /// `wake` has asked it for a final round of what they committed.
    pub fn relay(
        &mut self,
        relay: impl Future<Output = ()> + Send + 'static,
        wake: impl FnOnce() + Send + 'static,
    ) {
        self.relay = Some((tokio::spawn(relay), Box::new(wake)));
    }

    /// Runs until shutdown, then stops in order within `grace`.
    pub async fn run(self, grace: Duration) -> anyhow::Result<()> {
        let service = self.service;
        let stopped = fleet_runtime::supervise(service, self.tasks, self.shutdown, grace).await;
        if let Some((relay, wake)) = self.relay {
            wake();
            if tokio::time::timeout(grace, relay).await.is_err() {
                tracing::warn!(
                    service,
                    grace_secs = grace.as_secs(),
                    "the outbox relay did not finish within the grace period; the rest is published at the next start"
                );
            }
        }
        // A NATS that is gone must not hold the process either.
        let _ = tokio::time::timeout(grace, self.nats.flush()).await;
        tracing::info!(service, "stopped");
        stopped
    }
}
