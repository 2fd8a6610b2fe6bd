//! What the gateway does in bulk (`fleet_hub_client::batch`): the agents'
//! joins and session opens that arrive together (a rack powering on, a
//! fleet's agents starting), at most `gateway.batch_max` gathered for at
//! most `gateway.batch_linger`, with at most `gateway.batch_in_flight`
//! batches of each kind out at once, so a busy hub or database answers
//! larger batches instead of a longer queue of single requests.
//!
//! - Joins go to the hub as one `join_devices`; a batch of one is a plain
//!   `join`, and a hub that does not know `join_devices` (an older replica
//!   during a rolling upgrade answers it `INVALID_ARGUMENT`) gets the
//!   batch's joins one by one. The agents whose join the hub answered get
//!   their credentials in one statement.
//! - Session opens are one upsert (one commit for the batch, not one each).
//!
//! A statement that fails for the whole batch is run again for each item
//! alone, so a bad row (a device deleted meanwhile) fails only its own
//! request.

use fleet_hub_client::batch::{Limits, Lost};
use fleet_hub_client::{Batcher, HubCallError, HubClient};
use fleet_proto::{v1, ErrorCode};
use v1::hub_command::Command as C;

use sqlx::PgPool;

use crate::store::{self, SessionOpen};
use crate::{Config, GatewayError};

impl fleet_hub_client::batch::Lost for GatewayError {
    fn lost(why: String) -> Self {
        GatewayError::new(ErrorCode::Unavailable, why)
    }
}

fn limits(config: &Config) -> Limits {
    Limits {
        max: config.batch_max,
        linger: config.batch_linger,
        in_flight: config.batch_in_flight,
    }
}

/// A join the hub answered and the credential issued for it.
pub(crate) struct Issued {
    pub joined: v1::Joined,
    pub credential: String,
}

/// A join's answer: the hub's refusal (or no answer), else the
/// credential's issue.
pub(crate) type Answer = Result<Result<Issued, GatewayError>, HubCallError>;

pub(crate) type Joins = Batcher<v1::JoinDevice, Result<Issued, GatewayError>>;

pub(crate) fn joins(hub: HubClient, pool: PgPool, actor: String, config: &Config) -> Joins {
    Batcher::start(limits(config), move |joins: Vec<v1::JoinDevice>| {
        let (hub, pool, actor) = (hub.clone(), pool.clone(), actor.clone());
        async move { Ok(issue(&pool, send(&hub, &actor, joins).await?).await) }
    })
}

/// A credential for every join the hub answered with a device, in one
/// statement; when that fails as a whole (a device deleted meanwhile
/// fails its row), one statement each, so only that join fails.
async fn issue(pool: &PgPool, answers: Vec<Result<v1::Joined, HubCallError>>) -> Vec<Answer> {
    let granted = |j: &v1::Joined| {
        j.device
            .as_ref()
            .filter(|d| !d.id.is_empty() && d.identity_generation >= 1)
            .map(|d| (d.id.clone(), d.identity_generation))
    };
    let grants: Vec<(String, i64)> = answers
        .iter()
        .filter_map(|a| a.as_ref().ok().and_then(granted))
        .collect();
    let refs: Vec<(&str, i64)> = grants.iter().map(|(d, g)| (d.as_str(), *g)).collect();
    let mut secrets: Vec<Result<String, GatewayError>> =
        alone_on_failure(&refs, |g| store::issue_credentials(pool, g))
            .await
            .into_iter()
            .rev()
            .collect();
    answers
        .into_iter()
        .map(|a| {
            a.map(|joined| {
                if granted(&joined).is_none() {
                    return Err(GatewayError::new(
                        ErrorCode::Unavailable,
                        "the hub's join reply names no device",
                    ));
                }
                let credential = secrets.pop().unwrap_or_else(|| Err(no_credential()))?;
                Ok(Issued { joined, credential })
            })
        })
        .collect()
}

fn no_credential() -> GatewayError {
    GatewayError::new(ErrorCode::Unavailable, "no credential was issued")
}

pub(crate) type Opens = Batcher<SessionOpen, i64, GatewayError>;

/// Session opens, one upsert a batch; the epochs in order. A device twice
/// in a batch (an agent re-opening at once) goes in a statement after the
/// first.
pub(crate) fn opens(pool: PgPool, gateway_id: String, config: &Config) -> Opens {
    Batcher::start(limits(config), move |opens: Vec<SessionOpen>| {
        let (pool, gateway_id) = (pool.clone(), gateway_id.clone());
        async move {
            let mut out: Vec<Option<Result<i64, GatewayError>>> =
                opens.iter().map(|_| None).collect();
            let mut left: Vec<usize> = (0..opens.len()).collect();
            while !left.is_empty() {
                let mut seen = std::collections::HashSet::new();
                let (now, later): (Vec<usize>, Vec<usize>) = left
                    .into_iter()
                    .partition(|&i| seen.insert(opens[i].device_id.clone()));
                let round: Vec<SessionOpen> = now.iter().map(|&i| opens[i].clone()).collect();
                let epochs =
                    alone_on_failure(&round, |o| store::open_sessions(&pool, &gateway_id, o)).await;
                for (i, e) in now.into_iter().zip(epochs) {
                    out[i] = Some(e);
                }
                left = later;
            }
            Ok(out
                .into_iter()
                .map(|e| {
                    e.unwrap_or_else(|| Err(GatewayError::lost("no session was opened".into())))
                })
                .collect())
        }
    })
}

/// The hub's answer to each join of a batch, or to the batch as a whole.
type HubAnswers = Result<Vec<Result<v1::Joined, HubCallError>>, HubCallError>;

async fn send(hub: &HubClient, actor: &str, mut joins: Vec<v1::JoinDevice>) -> HubAnswers {
    if joins.len() == 1 {
        if let Some(j) = joins.pop() {
            return Ok(vec![one(hub, actor, j).await]);
        }
    }
    let asked = C::JoinDevices(v1::JoinDevices {
        joins: joins.clone(),
    });
    match hub.call(actor, 0, asked).await.and_then(|a| a.joins()) {
        Ok(results) => Ok(results.into_iter().map(result).collect()),
        Err(HubCallError::Refused {
            code: ErrorCode::InvalidArgument,
            message,
        }) => {
            tracing::info!(%message, joins = joins.len(), "the hub refused a batch of joins; sending them one by one");
            let mut out = vec![];
            for j in joins {
                out.push(one(hub, actor, j).await);
            }
            Ok(out)
        }
        Err(e) => Err(e),
    }
}

async fn one(
    hub: &HubClient,
    actor: &str,
    join: v1::JoinDevice,
) -> Result<v1::Joined, HubCallError> {
    hub.call(actor, 0, C::Join(join)).await?.joined()
}

fn result(r: v1::JoinResult) -> Result<v1::Joined, HubCallError> {
    match (r.joined, r.error) {
        (_, Some(e)) => Err(HubCallError::refused(e)),
        (Some(j), None) => Ok(j),
        (None, None) => Err(HubCallError::BadReply(
            "a join result with neither a device nor an error".into(),
        )),
    }
}

/// `run` over every item in one statement; when that fails, over each
/// item alone, so only the items that fail alone fail. One answer per
/// item, in order.
async fn alone_on_failure<'a, T, R, F, Fut>(items: &'a [T], run: F) -> Vec<Result<R, GatewayError>>
where
    F: Fn(&'a [T]) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<R>, sqlx::Error>>,
{
    if items.len() > 1 {
        match run(items).await {
            Ok(all) if all.len() == items.len() => return all.into_iter().map(Ok).collect(),
            Ok(all) => tracing::warn!(
                rows = all.len(),
                items = items.len(),
                "a batched statement answered the wrong number of rows; running each alone"
            ),
            Err(e) => {
                tracing::warn!(error = %e, items = items.len(), "a batched statement failed; running each alone")
            }
        }
    }
    let mut out = vec![];
    for one in items.chunks(1) {
        out.push(single(run(one).await));
    }
    out
}

fn single<R>(rows: Result<Vec<R>, sqlx::Error>) -> Result<R, GatewayError> {
    let mut rows = rows.map_err(GatewayError::from)?;
    match (rows.pop(), rows.is_empty()) {
        (Some(row), true) => Ok(row),
        _ => Err(GatewayError::lost(
            "a statement answered the wrong number of rows".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Inventory;
    use fleet_domain::Trust;
    use fleet_testkit::TestEnv;
    use std::time::Duration;

    fn joined(id: &str, generation: i64) -> Result<v1::Joined, HubCallError> {
        Ok(v1::Joined {
            device: Some(v1::DeviceChange {
                id: id.into(),
                identity_generation: generation,
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_answered_join_gets_its_own_credential_and_a_bad_row_fails_only_its_join() {
        let env = with_devices(&["dev_a", "dev_b"]).await;
        let answers = vec![
            joined("dev_a", 1),
            // No such device: its row fails the batch's statement.
            joined("dev_gone", 1),
            Err(HubCallError::NotRunning),
            joined("", 0),
            joined("dev_b", 3),
        ];
        let got = issue(&env.pool, answers).await;
        assert_eq!(got.len(), 5);
        let issued = |i: usize| match &got[i] {
            Ok(Ok(x)) => x,
            other => panic!("answer {i}: {:?}", other.as_ref().map(|r| r.as_ref().err())),
        };
        for (i, id, generation) in [(0, "dev_a", 1i64), (4, "dev_b", 3)] {
            let x = issued(i);
            assert_eq!(x.joined.device.as_ref().unwrap().id, id);
            let stored: (String, i64) = sqlx::query_as(
                "SELECT device_id, identity_generation FROM agent_credentials WHERE secret_sha256 = $1",
            )
            .bind(store::sha256_hex(&x.credential))
            .fetch_one(&env.pool)
            .await
            .unwrap();
            assert_eq!(stored, (id.to_string(), generation));
        }
        assert!(matches!(&got[1], Ok(Err(e)) if e.code == ErrorCode::Unavailable));
        assert!(matches!(&got[2], Err(HubCallError::NotRunning)));
        assert!(matches!(&got[3], Ok(Err(e)) if e.message.contains("names no device")));
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM agent_credentials")
            .fetch_one(&env.pool)
            .await
            .unwrap();
        assert_eq!(rows, 2, "one credential per answered device, nothing else");
        env.cleanup().await;
    }

    fn open(device: &str, hub_epoch: i64) -> SessionOpen {
        SessionOpen {
            device_id: device.into(),
            hub_epoch,
            identity_generation: 1,
            token_sha256: store::sha256_hex(&format!("{device}-{hub_epoch}")),
            site_id: "s1".into(),
            trust: Trust::Platform,
            inventory: Inventory::default(),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn opens_at_once_get_their_own_epochs_and_a_bad_row_fails_only_its_open() {
        let env = with_devices(&["dev_a", "dev_b"]).await;
        let config = Config {
            batch_linger: Duration::from_millis(300),
            ..Config::default()
        };
        let opens = opens(env.pool.clone(), "gw-test".into(), &config);
        // One batch: dev_a twice (the second opens after the first), a
        // device that does not exist, dev_b at the hub's epoch 7.
        let asks = [
            open("dev_a", 0),
            open("dev_a", 0),
            open("dev_gone", 0),
            open("dev_b", 7),
        ];
        let answers = futures::future::join_all(asks.into_iter().map(|o| {
            let opens = opens.clone();
            async move { opens.ask(o).await }
        }))
        .await;
        let mut a = vec![answers[0].clone().unwrap(), answers[1].clone().unwrap()];
        a.sort();
        assert_eq!(a, vec![1, 2], "{answers:?}");
        assert!(
            matches!(&answers[2], Err(e) if e.code == ErrorCode::Unavailable),
            "{answers:?}"
        );
        assert_eq!(answers[3], Ok(8));
        let stored: Vec<(String, i64, String)> = sqlx::query_as(
            "SELECT device_id, epoch, gateway_id FROM agent_sessions ORDER BY device_id",
        )
        .fetch_all(&env.pool)
        .await
        .unwrap();
        assert_eq!(
            stored,
            vec![
                ("dev_a".to_string(), 2, "gw-test".to_string()),
                ("dev_b".to_string(), 8, "gw-test".to_string())
            ]
        );
        env.cleanup().await;
    }

    /// A fresh environment with these device rows (site s1, adopting).
    async fn with_devices(ids: &[&str]) -> TestEnv {
        let env = TestEnv::new().await;
        for id in ids {
            sqlx::query(
                "INSERT INTO devices (id, name, site_id, provision_state) VALUES ($1, $1, 's1', 'adopting')",
            )
            .bind(id)
            .execute(&env.pool)
            .await
            .unwrap();
        }
        env
    }
}
