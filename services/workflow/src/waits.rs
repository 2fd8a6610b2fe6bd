//! What the workflows wait on that the hub derives (`validation`,
//! `available`): the workflow service subscribes to `STATUS` (spec
//! `consumers.md`, "workflow") instead of polling the database. A STATUS
//! event only wakes the device's run, which then decides on a fresh read;
//! a wake-up that comes before the run waits is kept (a stored permit), and
//! a backstop re-reads now and then in case the consumer is away.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_consume::{StatusConsumer, StatusEvent};
use fleet_runtime::Shutdown;
use tokio::sync::Notify;

use crate::Workflow;

/// How long a wait goes without a STATUS event before the run reads again.
pub(crate) const BACKSTOP: Duration = Duration::from_secs(30);

/// The runs waiting on a device, by device id.
#[derive(Default)]
pub(crate) struct Waits {
    by_device: Mutex<HashMap<String, Arc<Notify>>>,
}

impl Waits {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Notify>>> {
        self.by_device.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A run of `device` starts listening (before its first read, so no
    /// event between its read and its wait is lost).
    pub fn register(&self, device: &str) -> Arc<Notify> {
        self.map()
            .entry(device.to_string())
            .or_insert_with(|| Arc::new(Notify::new()))
            .clone()
    }

    /// The run is over.
    pub fn forget(&self, device: &str) {
        self.map().remove(device);
    }

    fn wake(&self, device: &str) -> bool {
        match self.map().get(device) {
            Some(n) => {
                n.notify_one();
                true
            }
            None => false,
        }
    }
}

impl Workflow {
    /// Wakes the runs of the devices whose operational status changed,
    /// until shutdown.
    pub(crate) async fn status_loop(self: Arc<Self>, shutdown: Shutdown) {
        let c = StatusConsumer::axis(
            &self.deps.streams,
            &self.deps.subjects,
            "workflow",
            "operational",
            Duration::from_secs(30),
            256,
        );
        let (js, subjects) = (self.deps.js.clone(), self.deps.subjects.clone());
        let w = self.clone();
        c.run(js, subjects, shutdown, move |events: Vec<StatusEvent>| {
            let w = w.clone();
            async move {
                for e in &events {
                    if w.waits.wake(&e.event.device_id) {
                        w.metrics.woken.inc();
                    }
                }
                Ok::<(), std::convert::Infallible>(())
            }
        })
        .await
    }
}
