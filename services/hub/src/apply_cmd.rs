//! `apply_snapshot`: one source's full snapshot over request/reply, for
//! `POST /api/v1/device-conditions/apply/`. The same decoding, ordering and
//! derivation as the NATS path, in one transaction, and the caller learns
//! what happened (applied, stale or duplicate) and what is now stored.

use crate::store::devices;
use chrono::Utc;
use fleet_domain::state::Outcome;
use fleet_domain::DomainError;
use fleet_proto::v1;

use super::{invalid, CommandError};
use crate::decode;
use crate::reply;
use crate::work::Work;
use crate::Hub;
use fleet_proto::v1::hub_reply::Record;

impl Hub {
    pub(crate) async fn apply_snapshot_command(
        &self,
        s: v1::ConditionSnapshot,
        expected_version: i64,
    ) -> Result<v1::HubReply, CommandError> {
        let now = Utc::now();
        let (key, snap) = decode::snapshot(&s, now)?;
        let mut tx = self.deps.pool.begin().await?;
        let found =
            devices::resolve(&mut tx, key.kind, &[(key.site.clone(), key.key.clone())]).await?;
        let Some(id) = found.into_iter().next().map(|(_, id)| id) else {
            // The NATS path's semantics: a key that resolves to no device is
            // kept as an unresolved observation, and the reply says so.
            let payload = fleet_proto::Message::encode_to_vec(&s);
            devices::record_unresolved(
                &mut tx,
                &[devices::Unresolved {
                    source: snap.source.as_str(),
                    site: &key.site,
                    key_kind: key.kind.as_str(),
                    key: &key.key,
                    observed_at: snap.observed_at,
                    payload: &payload,
                }],
            )
            .await?;
            tx.commit().await?;
            return Ok(reply::ok(
                Record::Snapshot(v1::SnapshotApplied {
                    outcome: "unresolved".into(),
                    device: None,
                    conditions: vec![],
                }),
                0,
            ));
        };
        let mut work = Work::lock(&mut tx, std::slice::from_ref(&id)).await?;
        let claim: Vec<(String, i64)> = snap
            .netbox_id_claim()
            .map(|n| (id.clone(), n))
            .into_iter()
            .collect();
        let snap = if work.refused_netbox_ids(&mut tx, &claim).await?.is_empty() {
            snap
        } else {
            snap.keeping_netbox_id()
        };
        let state = work
            .device(&id, &format!("source:{}", snap.source), None)
            .ok_or_else(|| DomainError::NotFound(format!("device {id}")))?;
        if expected_version > 0 {
            fleet_domain::commands::check_version(&state.record, expected_version)?;
        }
        let (outcome, notes) = state.apply_snapshot(&snap, now);
        if notes.handover_breach {
            tracing::error!(device_id = %id, "HandoverBreach: custody entry with no verified front-end VRF flip on record");
        }
        let work = self.commit_work(tx, work, now).await?;
        let t = work
            .devices
            .get(&id)
            .ok_or_else(|| invalid(format!("device {id} vanished")))?;
        let conditions = t
            .after
            .conditions
            .values()
            .filter(|row| row.source == snap.source)
            .map(|row| reply::condition(&id, row, t.after.is_stale(row, now, &self.deadlines.ttls)))
            .collect();
        let outcome = match outcome {
            Outcome::Applied => "applied",
            Outcome::Stale => "stale",
            Outcome::Duplicate => "duplicate",
        };
        Ok(reply::ok(
            Record::Snapshot(v1::SnapshotApplied {
                outcome: outcome.into(),
                device: Some(reply::device(&t.after)),
                conditions,
            }),
            t.after.record.version,
        ))
    }
}
