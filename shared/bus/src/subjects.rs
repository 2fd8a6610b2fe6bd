//! Every subject name. The root (`fleet`, `radar`) is configuration so
//! parallel tests and several installations can share one NATS server.

use fleet_proto::v1::DeviceKey;

#[derive(Debug, Clone)]
pub struct Subjects {
    pub root: String,
    pub radar_root: String,
}

impl Subjects {
    pub fn new(root: &str, radar_root: &str) -> Self {
        Subjects {
            root: root.to_string(),
            radar_root: radar_root.to_string(),
        }
    }

    /// `<root>.obs.<source>.<partition>.<device-key>`, the partition token
    /// that of the source's queue (`<n>` or `s<n>`, see [`Queue`]).
    pub fn obs(&self, source: &str, partition: u32, key: &DeviceKey) -> String {
        format!(
            "{}.obs.{}.{}.{}",
            self.root,
            token(source),
            Queue::of(source).token(partition),
            device_token(key)
        )
    }
    /// Reads an observation subject: exactly
    /// `<root>.obs.<source>.<partition>.<device>` under this root, each
    /// token at its fixed position, the partition below `partitions`.
    pub fn parse_obs<'a>(
        &self,
        subject: &'a str,
        partitions: u32,
    ) -> Result<ObsSubject<'a>, SubjectError> {
        let rest = subject
            .strip_prefix(self.root.as_str())
            .and_then(|r| r.strip_prefix(".obs."))
            .ok_or(SubjectError::NotAnObservation)?;
        let mut tokens = rest.split('.');
        let (Some(source), Some(partition), Some(device), None) =
            (tokens.next(), tokens.next(), tokens.next(), tokens.next())
        else {
            return Err(SubjectError::Shape);
        };
        if source.is_empty() || device.is_empty() {
            return Err(SubjectError::Shape);
        }
        let (queue, number) = match partition.strip_prefix(SESSIONS_MARK) {
            Some(n) => (Queue::Sessions, n),
            None => (Queue::Reads, partition),
        };
        let partition: u32 = number
            .parse()
            .ok()
            .filter(|p: &u32| *p < partitions && number == p.to_string())
            .ok_or(SubjectError::Partition)?;
        // A source other than the gateway may not jump the reads' queue; a
        // gateway from before the session queues published to the reads'.
        if queue == Queue::Sessions && source != SESSIONS_SOURCE {
            return Err(SubjectError::Queue);
        }
        Ok(ObsSubject {
            source,
            partition,
            queue,
            device,
        })
    }
    pub fn obs_all(&self) -> String {
        format!("{}.obs.>", self.root)
    }
    pub fn obs_source(&self, source: &str) -> String {
        format!("{}.obs.{}.>", self.root, token(source))
    }
    /// One queue of one partition across sources: the filter of one hub
    /// consumer.
    pub fn obs_partition(&self, queue: Queue, partition: u32) -> String {
        format!("{}.obs.*.{}.>", self.root, queue.token(partition))
    }
    /// `<root>.status.<axis>.<site>.<device>`
    pub fn status(&self, axis: &str, site: &str, device: &str) -> String {
        format!(
            "{}.status.{}.{}.{}",
            self.root,
            token(axis),
            token(site),
            token(device)
        )
    }
    pub fn status_all(&self) -> String {
        format!("{}.status.>", self.root)
    }
    pub fn status_axis(&self, axis: &str) -> String {
        format!("{}.status.{}.>", self.root, token(axis))
    }
    /// `<root>.hub.cmd.<verb>` (core request/reply).
    pub fn hub_cmd(&self, verb: &str) -> String {
        format!("{}.hub.cmd.{}", self.root, token(verb))
    }
    pub fn hub_cmd_all(&self) -> String {
        format!("{}.hub.cmd.*", self.root)
    }
    /// `<root>.dlq.<stream>.<reason>`
    pub fn dlq(&self, stream: &str, reason: &str) -> String {
        format!("{}.dlq.{}.{}", self.root, token(stream), token(reason))
    }
    pub fn dlq_all(&self) -> String {
        format!("{}.dlq.>", self.root)
    }
    /// `<root>.job.<workflow>.<job>.<device>`: one device's work of a job
    /// on `JOBS`.
    pub fn job(&self, workflow: &str, job: &str, device: &str) -> String {
        format!(
            "{}.job.{}.{}.{}",
            self.root,
            token(workflow),
            token(job),
            token(device)
        )
    }
    pub fn job_all(&self) -> String {
        format!("{}.job.>", self.root)
    }
    /// `<radar root>.projection.v1.<site>.<device>`
    pub fn radar(&self, site: &str, device: &str) -> String {
        format!(
            "{}.projection.v1.{}.{}",
            self.radar_root,
            token(site),
            token(device)
        )
    }
    pub fn radar_all(&self) -> String {
        format!("{}.projection.v1.>", self.radar_root)
    }

    /// `<root>.placer.cmd.<verb>` (core request/reply to the placer).
    pub fn placer_cmd(&self, verb: &str) -> String {
        format!("{}.placer.cmd.{}", self.root, token(verb))
    }
    pub fn placer_cmd_all(&self) -> String {
        format!("{}.placer.cmd.*", self.root)
    }
    /// `<root>.placer.event.<kind>.<pool>.<allocation>` (the placer's own stream).
    pub fn placer_event(&self, kind: &str, pool: &str, allocation: &str) -> String {
        format!(
            "{}.placer.event.{}.{}.{}",
            self.root,
            token(kind),
            token(pool),
            token(allocation)
        )
    }
    pub fn placer_event_all(&self) -> String {
        format!("{}.placer.event.>", self.root)
    }
    /// `<root>.agent.join` (node agent -> gateway, request/reply).
    pub fn agent_join(&self) -> String {
        format!("{}.agent.join", self.root)
    }
    /// `<root>.agent.<device>.<verb>`: `open`, `heartbeat`, `close` (agent ->
    /// gateway, request/reply) and `cmd` (gateway -> agent, request/reply).
    pub fn agent(&self, device: &str, verb: &str) -> String {
        format!("{}.agent.{}.{}", self.root, token(device), token(verb))
    }
    /// Every device's `<verb>` subject: what the gateway subscribes to.
    pub fn agent_all(&self, verb: &str) -> String {
        format!("{}.agent.*.{}", self.root, token(verb))
    }
    /// `<root>.gateway.cmd.<verb>` (operators -> gateway, request/reply).
    pub fn gateway_cmd(&self, verb: &str) -> String {
        format!("{}.gateway.cmd.{}", self.root, token(verb))
    }
    pub fn gateway_cmd_all(&self) -> String {
        format!("{}.gateway.cmd.*", self.root)
    }
    /// `<root>.workflow.cmd.<verb>` (request/reply to the workflow service).
    pub fn workflow_cmd(&self, verb: &str) -> String {
        format!("{}.workflow.cmd.{}", self.root, token(verb))
    }
    pub fn workflow_cmd_all(&self) -> String {
        format!("{}.workflow.cmd.*", self.root)
    }
    /// `<root>.radar.cmd.<verb>` (request/reply to the radar service).
    pub fn radar_cmd(&self, verb: &str) -> String {
        format!("{}.radar.cmd.{}", self.root, token(verb))
    }
    pub fn radar_cmd_all(&self) -> String {
        format!("{}.radar.cmd.*", self.root)
    }
}

/// The `<verb>` of a command subject `<root>.<service>.cmd.<verb>` (its
/// last token; empty for an empty subject).
pub fn command_verb(subject: &str) -> &str {
    subject.rsplit('.').next().unwrap_or("")
}

/// The three tokens of an observation subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObsSubject<'a> {
    pub source: &'a str,
    pub partition: u32,
    pub queue: Queue,
    pub device: &'a str,
}

/// The source whose observations go to the session queues.
pub const SESSIONS_SOURCE: &str = "gateway";
/// What a session queue's partition token starts with.
const SESSIONS_MARK: &str = "s";

/// The two queues of a partition, each consumed by a hub consumer of its
/// own (`hub-p<n>`, `hub-s<n>`). The gateway's observations (sessions
/// opened, heartbeating and closed, its GPU-count check) go to the session
/// queue, partition token `s<n>`; every connector's to the reads' queue,
/// token `<n>`. The hub takes a lane's session queues into a batch first,
/// so connectivity and liveness follow the agents while the connectors'
/// reads wait in a backlog (when NetBox imports a fleet, six sources' first
/// reads arrive within a minute; after an outage, everything published
/// meanwhile). A session's heartbeats go with its opens and closes: behind
/// a backlog older than `freshness.unreachable_after` they made the sweeper
/// call live devices `unreachable` (docs/dev-harness.md). Order holds per
/// device and source, as before: a device's observations of one source are
/// all in one queue of one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queue {
    Reads,
    Sessions,
}

impl Queue {
    pub const ALL: [Queue; 2] = [Queue::Reads, Queue::Sessions];

    /// The queue a source publishes to.
    pub fn of(source: &str) -> Queue {
        if source == SESSIONS_SOURCE {
            Queue::Sessions
        } else {
            Queue::Reads
        }
    }

    /// The partition token of partition `n` in this queue.
    pub fn token(self, n: u32) -> String {
        match self {
            Queue::Reads => n.to_string(),
            Queue::Sessions => format!("{SESSIONS_MARK}{n}"),
        }
    }

    /// The durable name of the hub consumer of partition `n` in this queue.
    pub fn consumer(self, n: u32) -> String {
        match self {
            Queue::Reads => format!("hub-p{n}"),
            Queue::Sessions => format!("hub-s{n}"),
        }
    }
}

/// Why a subject is not an observation subject of `spec/mesh.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SubjectError {
    #[error("not under <root>.obs.")]
    NotAnObservation,
    #[error("not <root>.obs.<source>.<partition>.<device>")]
    Shape,
    #[error("the partition token is not a partition of this mesh")]
    Partition,
    #[error("only the gateway publishes to a session queue (partition token s<n>)")]
    Queue,
}

/// A subject token: anything but `[A-Za-z0-9_-]` becomes `_`, so a host
/// name with dots or an IP address cannot add tokens.
pub fn token(s: &str) -> String {
    if s.is_empty() {
        return "_".into();
    }
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The device part of an observation subject: `<kind>-<key>`; routing only,
/// the payload carries the exact key.
pub fn device_token(key: &DeviceKey) -> String {
    token(&format!("{}-{}", key.kind, key.key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_have_fixed_token_counts() {
        let s = Subjects::new("t1.fleet", "t1.radar");
        let key = DeviceKey {
            site: "s".into(),
            kind: "bmc_address".into(),
            key: "10.0.0.7".into(),
        };
        assert_eq!(
            s.obs("slurm", 3, &key),
            "t1.fleet.obs.slurm.3.bmc_address-10_0_0_7"
        );
        assert_eq!(
            s.status("operational", "lon1", "dev_01"),
            "t1.fleet.status.operational.lon1.dev_01"
        );
        assert_eq!(s.obs_partition(Queue::Reads, 3), "t1.fleet.obs.*.3.>");
        assert_eq!(s.obs_partition(Queue::Sessions, 3), "t1.fleet.obs.*.s3.>");
        assert_eq!(
            s.obs("gateway", 3, &key),
            "t1.fleet.obs.gateway.s3.bmc_address-10_0_0_7"
        );
        assert_eq!(token("a.b *>"), "a_b___");
        assert_eq!(command_verb(&s.placer_cmd("allocate")), "allocate");
    }

    #[test]
    fn observation_subjects_are_read_at_fixed_positions() {
        let s = Subjects::new("t1.fleet", "t1.radar");
        assert_eq!(
            s.parse_obs("t1.fleet.obs.slurm.3.name-gpu01", 16),
            Ok(ObsSubject {
                source: "slurm",
                partition: 3,
                queue: Queue::Reads,
                device: "name-gpu01"
            })
        );
        assert_eq!(
            s.parse_obs("t1.fleet.obs.gateway.s3.name-gpu01", 16),
            Ok(ObsSubject {
                source: "gateway",
                partition: 3,
                queue: Queue::Sessions,
                device: "name-gpu01"
            })
        );
        // A gateway from before the session queues.
        assert_eq!(
            s.parse_obs("t1.fleet.obs.gateway.3.name-gpu01", 16)
                .map(|o| o.queue),
            Ok(Queue::Reads)
        );
        // Only the gateway's observations jump the reads' queue.
        assert_eq!(
            s.parse_obs("t1.fleet.obs.slurm.s3.name-gpu01", 16),
            Err(SubjectError::Queue)
        );
        assert_eq!(
            s.parse_obs("t1.fleet.obs.gateway.s16.d", 16),
            Err(SubjectError::Partition)
        );
        assert_eq!(
            s.parse_obs("t1.fleet.obs.gateway.ss3.d", 16),
            Err(SubjectError::Partition)
        );
        // connector-slurm's permission `obs.slurm.>` let it append another
        // source's subject; the tail no longer decides the source.
        assert_eq!(
            s.parse_obs("t1.fleet.obs.slurm.3.openstack.0.name-gpu01", 16),
            Err(SubjectError::Shape)
        );
        assert_eq!(
            s.parse_obs("t1.fleet.obs.slurm.3", 16),
            Err(SubjectError::Shape)
        );
        assert_eq!(
            s.parse_obs("t1.fleet.obs.slurm.16.d", 16),
            Err(SubjectError::Partition)
        );
        assert_eq!(
            s.parse_obs("t1.fleet.obs.slurm.03.d", 16),
            Err(SubjectError::Partition)
        );
        assert_eq!(
            s.parse_obs("t2.fleet.obs.slurm.3.d", 16),
            Err(SubjectError::NotAnObservation)
        );
    }
}
