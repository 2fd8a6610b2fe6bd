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
use tokio::task::{JoinHandle, JoinSet};

use crate::Deps;

pub struct Shell {
    service: &'static str,
    nats: async_nats::Client,
    shutdown: Shutdown,
    answers: ResponderMetrics,
    tasks: JoinSet<()>,
    relay: Option<(JoinHandle<()>, Box<dyn FnOnce() + Send>)>,
}

impl Shell {
    /// Serves the ops endpoints on `listen` (named `<service>.listen` in
    /// the configuration, for the error when it cannot bind); returns the
    /// shell and their bound address.
    pub async fn start(
        service: &'static str,
        listen: &str,
        registry: Arc<Mutex<Registry>>,
        deps: &Deps,
        shutdown: &Shutdown,
    ) -> anyhow::Result<(Shell, SocketAddr)> {
        let addr = fleet_runtime::http::serve_ops(
            listen,
            &format!("{service}.listen"),
            registry.clone(),
            deps.nats.clone(),
            crate::ready_check(deps.pool.clone()),
            shutdown.clone(),
        )
        .await?;
        let answers = ResponderMetrics::default();
        answers.register(&mut registry.lock().unwrap_or_else(|p| p.into_inner()));
        let shell = Shell {
            service,
            nats: deps.nats.clone(),
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

    /// The service's commands, `<root>.<service>.cmd.>`: the route `cmd`,
    /// answered once across the replicas (the service's queue group).
    pub fn respond_commands<R: Responder>(
        &mut self,
        responder: Arc<R>,
        subject: String,
        limits: Limits,
    ) {
        let route = Route {
            name: "cmd",
            subject,
            queue: Some(self.service.into()),
        };
        self.respond(responder, route, limits);
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
