//! Simulated node agents for the gateway the mesh runs: one
//! [`fleet_agent_sim::SimAgent`] per device the scenario gave an agent,
//! speaking the real agent protocol over NATS. Each machine's hardware
//! identifiers are generated from its number, its system serial the one
//! NetBox lists. An agent joins once NetBox brought its device in (the
//! harness reads `devices`; it writes nothing there): the hub claims that
//! device for the agent's key by site, name and serial, and later joins
//! re-join it in place. The agent then opens a session and heartbeats; the scenario closes and
//! reopens sessions now and then (agent restarts), and the agents report
//! what they did back to the engine, whose ground truth for
//! `connectivity` follows from that.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_agent_sim::{SimAgent, SimSpec};
use fleet_bus::Subjects;
use fleet_domain::hardware::{hardware_key, HardwareIds};
use fleet_domain::Trust;
use futures::StreamExt;
use sqlx::PgPool;

use crate::dev::engine::GPUS_PER_DEVICE;
use crate::dev::servers::Shared;

/// Workers the agents are spread over.
const WORKERS: usize = 16;
/// Heartbeats, opens and closes one worker has in flight at once: a
/// worker's agents joining one after another took minutes at 100,000
/// agents, and held back the heartbeats of the others past
/// `unreachable_after`.
const IN_FLIGHT: usize = 8;
/// Joins one worker starts per pass (half a second), all at once and beside
/// the heartbeats rather than ahead of them: 1,024/s over the 16 workers at
/// most. Real agents join when they boot, not in a queue; the gateway
/// gathers the joins that arrive together into one hub command, so the
/// more arrive at once, the fewer commands they cost.
const JOINS_PER_PASS: usize = 32;
/// Heartbeat interval: 10 s up to 2,000 agents, 20 s up to 20,000, then
/// one second per 1,000 agents (100 s at 100,000): every heartbeat is a
/// gateway request and a hub observation, and this keeps them near 1,000/s.
/// `fleet dev` sets `freshness.unreachable_after` to three intervals
/// ([`unreachable_after`]), as production would for its agents' interval.
pub fn heartbeat_interval(agents: usize) -> Duration {
    Duration::from_secs(match agents {
        0..=2000 => 10,
        2001..=20_000 => 20,
        n => (n as u64).div_ceil(1000),
    })
}

/// `freshness.unreachable_after` for agents heartbeating every `heartbeat`:
/// three missed heartbeats, and never below the default 60 s.
pub fn unreachable_after(heartbeat: Duration) -> Duration {
    (heartbeat * 3).max(Duration::from_secs(60))
}

pub struct Agents {
    pub scenario: Shared,
    pub pool: PgPool,
    pub nats: async_nats::Client,
    pub subjects: Subjects,
    pub paused: Arc<AtomicBool>,
    /// Workers in a round (a pause waits for none).
    pub busy: Arc<AtomicUsize>,
    pub heartbeat: Duration,
}

enum State {
    /// Not joined yet; the next attempt not before this instant.
    Unjoined(Instant),
    /// NetBox brought its device in: the join may go.
    Imported,
    Joined {
        open: bool,
        last: Instant,
    },
}

/// An agent's next move, if it has one now.
fn next_move(
    state: &State,
    want: bool,
    paused: bool,
    heartbeat: Duration,
    now: Instant,
) -> Option<Move> {
    match *state {
        State::Unjoined(_) => None,
        State::Imported => (!paused).then_some(Move::Join),
        // A session the scenario wants open is opened even while it is
        // paused: a pause that caught an agent between its close and its
        // reopen (a restart) had held it closed, and the fleet never
        // matched again (`agents_not_open` stayed above 0).
        State::Joined { open: false, .. } if want => Some(Move::Open),
        State::Joined { open: true, .. } if !want && !paused => Some(Move::Close),
        State::Joined { open: true, last } if now.duration_since(last) >= heartbeat => {
            Some(Move::Heartbeat)
        }
        State::Joined { .. } => None,
    }
}

/// Every live device's site and name, read at most every two seconds for
/// all the workers: each worker reading them for itself every pass, while
/// NetBox's import ran, was 32 reads of up to 100,000 rows a second.
/// Matched here: a join against the agents' names was planned on a devices
/// table still being imported (a nested loop over 100,000 rows per name),
/// and at 100,000 devices eight of them held the whole pool for minutes.
#[derive(Default)]
struct Names(tokio::sync::Mutex<Option<(Instant, Arc<SitesAndNames>)>>);

/// Site -> the names of its live devices.
type SitesAndNames = BTreeMap<String, BTreeSet<String>>;

impl Names {
    const FRESH_FOR: Duration = Duration::from_secs(2);

    async fn read(&self, pool: &PgPool) -> Option<Arc<SitesAndNames>> {
        let mut held = self.0.lock().await;
        if let Some((at, names)) = held.as_ref() {
            if at.elapsed() < Self::FRESH_FOR {
                return Some(names.clone());
            }
        }
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT site_id, name FROM devices WHERE deleted_at IS NULL")
                .fetch_all(pool)
                .await
                .map_err(|e| tracing::warn!(error = %e, "simulated agents: reading which devices NetBox brought in"))
                .ok()?;
        let mut names = SitesAndNames::new();
        for (site, name) in rows {
            names.entry(site).or_default().insert(name);
        }
        let names = Arc::new(names);
        *held = Some((Instant::now(), names.clone()));
        Some(names)
    }
}

/// What an agent does next.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Move {
    Join,
    Open,
    Close,
    Heartbeat,
}

struct One {
    index: usize,
    site: String,
    name: String,
    agent: SimAgent,
    state: State,
}

/// The machine behind device `index`, with the device's name as host name
/// and NetBox's serial as its system serial.
pub fn spec(index: usize, name: &str, serial: &str) -> SimSpec {
    let mut s = SimSpec::numbered("fleet-dev", index, GPUS_PER_DEVICE as u32);
    s.hostname = name.to_string();
    s.hardware.system_serial = serial.to_string();
    s
}

/// Its hardware key as the gateway computes it.
pub fn key_of(s: &SimSpec) -> Option<String> {
    let h = &s.hardware;
    let k = hardware_key(&HardwareIds {
        system_serial: h.system_serial.clone(),
        board_serial: h.board_serial.clone(),
        bmc_mac: h.bmc_mac.clone(),
        nic_macs: h.nic_macs.clone(),
        tpm_ek_hash: h.tpm_ek_hash.clone(),
    })?;
    k.trusted.then_some(k.key)
}

impl Agents {
    /// Issues a join token per site and runs the agents until aborted.
    pub async fn run(self) -> anyhow::Result<()> {
        let sites = self
            .scenario
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .sites
            .clone();
        let mut tokens = BTreeMap::new();
        for s in &sites {
            // The token names the site's pool: the gateway checks each
            // agent's inventory against the pool's hardware profile and
            // adopts the device (`adopting` -> `adopted`) when it matches.
            let t = fleet_gateway::store::issue_join_token(
                &self.pool,
                s,
                Some(&crate::dev::dev_pool(s)),
                Trust::Platform,
                None,
                "fleet dev: simulated agents",
                None,
            )
            .await?;
            tokens.insert(s.clone(), t);
        }
        let mut shards: Vec<Vec<One>> = (0..WORKERS).map(|_| Vec::new()).collect();
        {
            let s = self.scenario.lock().unwrap_or_else(|e| e.into_inner());
            for d in s.devices.iter().filter(|d| d.has_agent) {
                let spec = spec(d.index, &d.name, &d.serial);
                // An untrusted key never claims the NetBox device.
                if key_of(&spec).is_none() {
                    continue;
                }
                shards[d.index % WORKERS].push(One {
                    index: d.index,
                    site: d.site.clone(),
                    name: d.name.clone(),
                    agent: {
                        let mut a = SimAgent::new(self.nats.clone(), self.subjects.clone(), spec);
                        a.heartbeat_interval = self.heartbeat;
                        a
                    },
                    state: State::Unjoined(Instant::now()),
                });
            }
        }
        let me = Arc::new(self);
        let tokens = Arc::new(tokens);
        let names = Arc::new(Names::default());
        let mut set = tokio::task::JoinSet::new();
        for shard in shards.into_iter().filter(|s| !s.is_empty()) {
            set.spawn(me.clone().worker(shard, tokens.clone(), names.clone()));
        }
        while set.join_next().await.is_some() {}
        Ok(())
    }

    async fn worker(
        self: Arc<Self>,
        mut agents: Vec<One>,
        tokens: Arc<BTreeMap<String, String>>,
        names: Arc<Names>,
    ) {
        let mut every = tokio::time::interval(Duration::from_millis(500));
        loop {
            every.tick().await;
            self.busy.fetch_add(1, Ordering::SeqCst);
            let paused = self.paused.load(Ordering::SeqCst);
            let wanted: Vec<bool> = {
                let s = self.scenario.lock().unwrap_or_else(|e| e.into_inner());
                agents
                    .iter()
                    .map(|a| s.devices[a.index].agent_wanted)
                    .collect()
            };
            if !paused {
                self.imported(&mut agents, &names).await;
            }
            // A pause freezes what changes connectivity; heartbeats go on.
            // Only the agents with a move due get a future: building one
            // for each of a worker's 6,250 agents every pass, most with
            // nothing due, was the process's top cost at 100,000. Joins
            // come in a bounded stream of their own, so the heartbeats of
            // the agents already in never wait behind a pass of joins; up
            // to IN_FLIGHT other moves run at once and a finished one makes
            // room for the next (rounds that each waited for their slowest
            // move held seven heartbeats behind each join).
            let now = Instant::now();
            let mut room = JOINS_PER_PASS;
            let (mut joins, mut others) = (Vec::new(), Vec::new());
            for (a, want) in agents.iter_mut().zip(wanted) {
                match next_move(&a.state, want, paused, self.heartbeat, now) {
                    Some(Move::Join) if room > 0 => {
                        room -= 1;
                        joins.push(self.act(a, Move::Join, want, &tokens));
                    }
                    Some(Move::Join) | None => {}
                    Some(m) => others.push(self.act(a, m, want, &tokens)),
                }
            }
            let mut moved = futures::stream::select(
                futures::stream::iter(joins).buffer_unordered(JOINS_PER_PASS),
                futures::stream::iter(others).buffer_unordered(IN_FLIGHT),
            );
            // The engine learns of each session as it moves, not at the end
            // of a pass that takes minutes while 100,000 agents join.
            while let Some(m) = moved.next().await {
                if let Some((index, open)) = m {
                    let mut s = self.scenario.lock().unwrap_or_else(|e| e.into_inner());
                    s.agent_session(index, open);
                }
            }
            self.busy.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Opens a session; `Some(true)` when it did.
    async fn open(&self, a: &mut One) -> Option<bool> {
        match a.agent.open().await {
            Ok(_) => {
                a.state = State::Joined {
                    open: true,
                    last: Instant::now(),
                };
                Some(true)
            }
            Err(e) => {
                tracing::debug!(device = %a.name, error = %e, "simulated agent could not open");
                None
            }
        }
    }

    /// Makes `m`; `Some((index, open))` when the agent's session opened or
    /// closed.
    async fn act(
        &self,
        a: &mut One,
        m: Move,
        want: bool,
        tokens: &BTreeMap<String, String>,
    ) -> Option<(usize, bool)> {
        let now = Instant::now();
        let open = match m {
            Move::Join => match self.join(a, tokens).await {
                Ok(()) => {
                    a.state = State::Joined {
                        open: false,
                        last: now,
                    };
                    // Open at once rather than a pass later.
                    if want {
                        self.open(a).await
                    } else {
                        None
                    }
                }
                Err(e) => {
                    tracing::debug!(device = %a.name, error = %e, "simulated agent not joined yet");
                    a.state = State::Unjoined(now + Duration::from_secs(2));
                    None
                }
            },
            Move::Open => self.open(a).await,
            Move::Close => {
                let _ = a.agent.close().await;
                a.state = State::Joined {
                    open: false,
                    last: now,
                };
                Some(false)
            }
            Move::Heartbeat => match a.agent.heartbeat().await {
                Ok(()) => {
                    a.state = State::Joined {
                        open: true,
                        last: now,
                    };
                    None
                }
                Err(e) if e.code == fleet_proto::ErrorCode::Unavailable.as_str_name() => None,
                Err(e) => {
                    // The gateway closed the session (a revoked identity).
                    tracing::info!(device = %a.name, error = %e, "simulated agent session ended");
                    a.state = State::Unjoined(now + Duration::from_secs(2));
                    Some(false)
                }
            },
        }?;
        Some((a.index, open))
    }

    /// Moves the agents waiting to join whose NetBox devices are in by now
    /// to [`State::Imported`]: a join before that would create a second
    /// device of the same name, which NetBox's import is then refused.
    async fn imported(&self, agents: &mut [One], names: &Names) {
        let now = Instant::now();
        let due: Vec<usize> = agents
            .iter()
            .enumerate()
            .filter(|(_, a)| matches!(a.state, State::Unjoined(t) if now >= t))
            .map(|(k, _)| k)
            .collect();
        if due.is_empty() {
            return;
        }
        let Some(imported) = names.read(&self.pool).await else {
            return;
        };
        for k in due {
            let a = &mut agents[k];
            a.state = if imported.get(&a.site).is_some_and(|n| n.contains(&a.name)) {
                State::Imported
            } else {
                State::Unjoined(now + Duration::from_secs(2))
            };
        }
    }

    /// Joins: the hub claims the NetBox device for the key (the first join)
    /// or re-joins it in place.
    async fn join(&self, a: &mut One, tokens: &BTreeMap<String, String>) -> anyhow::Result<()> {
        let token = tokens
            .get(&a.site)
            .ok_or_else(|| anyhow::anyhow!("no join token for site {}", a.site))?;
        let r = a.agent.join(token).await?;
        anyhow::ensure!(
            r.rejoined || r.claimed,
            "the join made a new device {} instead of joining the NetBox one",
            r.device_id
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEAT: Duration = Duration::from_secs(10);

    fn joined(open: bool, ago: Duration, now: Instant) -> State {
        State::Joined {
            open,
            last: now - ago,
        }
    }

    #[test]
    fn only_an_agent_with_something_due_moves() {
        let now = Instant::now();
        let fresh = Duration::from_secs(1);
        // (state, wanted open, paused, expected move)
        let cases = [
            (State::Unjoined(now), true, false, None),
            (State::Imported, true, false, Some(Move::Join)),
            (State::Imported, true, true, None),
            (joined(false, fresh, now), true, false, Some(Move::Open)),
            // A wanted session opens even while paused (an agent caught
            // mid-restart).
            (joined(false, fresh, now), true, true, Some(Move::Open)),
            (joined(false, fresh, now), false, false, None),
            (joined(true, fresh, now), false, false, Some(Move::Close)),
            // A pause holds the close, the heartbeats go on.
            (joined(true, fresh, now), false, true, None),
            (joined(true, BEAT, now), false, true, Some(Move::Heartbeat)),
            (joined(true, BEAT, now), true, false, Some(Move::Heartbeat)),
            (joined(true, fresh, now), true, false, None),
        ];
        for (k, (state, want, paused, expected)) in cases.iter().enumerate() {
            assert_eq!(
                next_move(state, *want, *paused, BEAT, now),
                *expected,
                "case {k}"
            );
        }
    }
}
