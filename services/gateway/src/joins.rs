//! Agents' joins gathered into batched hub commands: the joins that
//! arrive together (a rack powering on, a fleet's agents starting) go to
//! the hub as one `join_devices` (`fleet_hub_client::batch`), at most
//! `gateway.join_batch_in_flight` batches at once, so a busy hub answers
//! larger batches instead of a longer queue of single joins. A batch of
//! one is a plain `join`. A hub that does not know `join_devices` (an
//! older replica during a rolling upgrade answers it `INVALID_ARGUMENT`)
//! gets the batch's joins one by one.

use fleet_hub_client::batch::Limits;
use fleet_hub_client::{Batcher, HubCallError, HubClient};
use fleet_proto::{v1, ErrorCode};
use v1::hub_command::Command as C;

use crate::Config;

pub(crate) type Joins = Batcher<v1::JoinDevice, v1::Joined>;

pub(crate) fn start(hub: HubClient, actor: String, config: &Config) -> Joins {
    let limits = Limits {
        max: config.join_batch_max,
        linger: config.join_batch_linger,
        in_flight: config.join_batch_in_flight,
    };
    Batcher::start(limits, move |joins: Vec<v1::JoinDevice>| {
        let (hub, actor) = (hub.clone(), actor.clone());
        async move { send(&hub, &actor, joins).await }
    })
}

type Answers = Result<Vec<Result<v1::Joined, HubCallError>>, HubCallError>;

async fn send(hub: &HubClient, actor: &str, mut joins: Vec<v1::JoinDevice>) -> Answers {
    if joins.len() == 1 {
        let j = joins.pop().map(C::Join);
        return Ok(vec![one(hub, actor, j).await]);
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
                out.push(one(hub, actor, Some(C::Join(j))).await);
            }
            Ok(out)
        }
        Err(e) => Err(e),
    }
}

async fn one(hub: &HubClient, actor: &str, join: Option<C>) -> Result<v1::Joined, HubCallError> {
    let join = join.ok_or_else(|| HubCallError::BadReply("no join to send".into()))?;
    hub.call(actor, 0, join).await?.joined()
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
