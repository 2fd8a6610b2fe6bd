//! Partition leases (migrations 0017 and 0018, docs/scaling.md "Partition leases"):
//! hub replicas share the observation partitions without static
//! assignment. Every round (a third of `hub.lease_ttl`) a replica
//! heartbeats (which renews every lease it holds), checks which it still
//! holds, and follows `fleet_domain::lease::plan`
//! to hand back what is above its share or claim free and expired leases
//! up to it; a claimed partition gets a fetcher, a lost one loses it.
//!
//! A lease lives as long as its replica's heartbeat (`hub_replicas`). A
//! replica that dies stops heartbeating: its leases expire after
//! `hub.lease_ttl` and the survivors claim them at their next round, so a
//! takeover takes at most `lease_ttl` plus one round. Safety holds without
//! any clock but PostgreSQL's: every batch reads its partitions' lease rows
//! FOR SHARE in its own transaction and commits only if they still carry
//! this replica's epochs ([`Hub::fence`]), and a claim changes the row,
//! which waits for that batch and makes any later one fail.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use fleet_bus::Queue;
use fleet_domain::lease;
use fleet_runtime::Shutdown;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::observations::Item;
use crate::Hub;

/// The partitions of a batch whose lease this replica no longer holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("partition leases lost: {0:?}")]
pub struct Fenced(pub Vec<u32>);

/// What one round changed.
#[derive(Debug, Default)]
struct Round {
    claimed: Vec<(u32, u64)>,
    lost: Vec<u32>,
    released: Vec<u32>,
}

impl Hub {
    /// The lease epoch this replica holds `partition` under, 0 if none.
    pub(crate) fn lease_epoch(&self, partition: u32) -> u64 {
        self.leases
            .get(partition as usize)
            .map(|e| e.load(Ordering::Acquire))
            .unwrap_or(0)
    }

    fn held(&self) -> Vec<(u32, u64)> {
        (0..self.common.nats.partitions)
            .filter_map(|p| Some((p, self.lease_epoch(p))).filter(|(_, e)| *e != 0))
            .collect()
    }

    /// Stops consuming a partition: its fetcher ends and what the lanes
    /// hold of it is dropped unacked, for the next owner to get again in
    /// stream order.
    fn let_go(&self, partition: u32) {
        if let Some(e) = self.leases.get(partition as usize) {
            e.store(0, Ordering::Release);
        }
        self.rewind(partition);
    }

    /// Checks, inside a batch's transaction, that this replica still holds
    /// every partition of the batch under the epoch it claimed it with; the
    /// rows stay share-locked until the transaction ends, so no claim can
    /// change them before it commits.
    pub(crate) async fn fence(
        &self,
        tx: &mut sqlx::PgConnection,
        partitions: &BTreeSet<u32>,
    ) -> Result<Result<(), Fenced>, sqlx::Error> {
        let wanted: Vec<i32> = partitions.iter().map(|p| *p as i32).collect();
        let rows: Vec<(i32, i64)> = sqlx::query_as(
            "SELECT partition, epoch FROM hub_partition_leases
              WHERE replica = $1 AND partition = ANY($2) FOR SHARE",
        )
        .bind(&self.replica)
        .bind(&wanted)
        .fetch_all(&mut *tx)
        .await?;
        let stored: HashMap<u32, u64> = rows
            .into_iter()
            .map(|(p, e)| (p as u32, e as u64))
            .collect();
        let lost: Vec<u32> = partitions
            .iter()
            .copied()
            .filter(|p| {
                let mine = self.lease_epoch(*p);
                mine == 0 || stored.get(p) != Some(&mine)
            })
            .collect();
        Ok(if lost.is_empty() {
            Ok(())
        } else {
            Err(Fenced(lost))
        })
    }

    /// A batch was fenced: the lost partitions stop here, the others of the
    /// batch (rolled back with it) are rewound.
    pub(crate) fn fenced(&self, lost: &[u32], batch: &BTreeSet<u32>) {
        tracing::warn!(
            ?lost,
            "a batch's partition leases were taken over; it is rolled back"
        );
        for p in batch {
            if lost.contains(p) {
                self.let_go(*p);
            } else {
                self.rewind(*p);
            }
        }
        self.metrics.lease_lost.inc_by(lost.len() as u64);
    }

    /// One round against the lease table, in one transaction.
    async fn lease_round(&self) -> Result<Round, sqlx::Error> {
        let ttl = self.config.lease_ttl.as_secs_f64();
        let partitions = self.common.nats.partitions;
        let mut tx = self.deps.pool.begin().await?;
        // The heartbeat carries the replica's sweep settings; `started_at`
        // is when the replica came with the settings it has, so the
        // sweepers know which settings are the newest (`take_sweep_turn`).
        sqlx::query(
            "INSERT INTO hub_replicas (replica, expires_at, deadlines)
             VALUES ($1, now() + make_interval(secs => $2), $3)
             ON CONFLICT (replica) DO UPDATE SET expires_at = EXCLUDED.expires_at,
                 deadlines = EXCLUDED.deadlines,
                 started_at = CASE WHEN hub_replicas.deadlines IS DISTINCT FROM EXCLUDED.deadlines
                                     OR hub_replicas.expires_at <= now()
                                   THEN now() ELSE hub_replicas.started_at END",
        )
        .bind(&self.replica)
        .bind(ttl)
        .bind(&self.sweep_settings)
        .execute(&mut *tx)
        .await?;
        // A lease lives as long as its replica's heartbeat: renewing it
        // writes nothing to the lease row, which every batch of its
        // partition holds FOR SHARE. (Renewing each lease row did: the
        // update waited for the lanes' batches and the next batches for it,
        // a stall of up to 200 ms every round.)
        let held = self.held();
        let (ps, es): (Vec<i32>, Vec<i64>) =
            held.iter().map(|(p, e)| (*p as i32, *e as i64)).unzip();
        let renewed: Vec<i32> = sqlx::query_scalar(
            "SELECT l.partition FROM hub_partition_leases l
               JOIN UNNEST($2::int[], $3::bigint[]) AS h(partition, epoch)
                 ON l.partition = h.partition AND l.epoch = h.epoch
              WHERE l.replica = $1",
        )
        .bind(&self.replica)
        .bind(&ps)
        .bind(&es)
        .fetch_all(&mut *tx)
        .await?;
        let renewed: BTreeSet<u32> = renewed.into_iter().map(|p| p as u32).collect();
        let mut round = Round {
            lost: held
                .iter()
                .map(|(p, _)| *p)
                .filter(|p| !renewed.contains(p))
                .collect(),
            ..Round::default()
        };
        // Replicas that died long ago (a SIGKILL leaves its row) are
        // forgotten; an expired row never counts as live anyway.
        sqlx::query("DELETE FROM hub_replicas WHERE expires_at < now() - interval '1 hour'")
            .execute(&mut *tx)
            .await?;
        let live: i64 =
            sqlx::query_scalar("SELECT count(*) FROM hub_replicas WHERE expires_at > now()")
                .fetch_one(&mut *tx)
                .await?;
        let claimable: Vec<i32> = sqlx::query_scalar(
            "SELECT p FROM generate_series(0, $1 - 1) AS p
              WHERE NOT EXISTS (SELECT 1 FROM hub_partition_leases l
                                  JOIN hub_replicas r ON r.replica = l.replica
                                 WHERE l.partition = p AND r.expires_at > now()
                                   AND l.replica <> $2)",
        )
        .bind(partitions as i32)
        .bind(&self.replica)
        .fetch_all(&mut *tx)
        .await?;
        let claimable: BTreeSet<u32> = claimable.into_iter().map(|p| p as u32).collect();
        let plan = lease::plan(partitions, live.max(1) as usize, &renewed, &claimable);
        if !plan.release.is_empty() {
            let release: Vec<i32> = plan.release.iter().map(|p| *p as i32).collect();
            // The fetchers stop first, so nothing new of these partitions
            // is applied; a batch in flight holds the rows until it commits.
            for p in &plan.release {
                self.let_go(*p);
            }
            sqlx::query(
                "DELETE FROM hub_partition_leases WHERE replica = $1 AND partition = ANY($2)",
            )
            .bind(&self.replica)
            .bind(&release)
            .execute(&mut *tx)
            .await?;
            round.released = plan.release;
        }
        if !plan.claim.is_empty() {
            let claim: Vec<i32> = plan.claim.iter().map(|p| *p as i32).collect();
            let claimed: Vec<(i32, i64)> = sqlx::query_as(
                "INSERT INTO hub_partition_leases AS l (partition, replica, epoch)
                 SELECT p, $2, 1 FROM UNNEST($1::int[]) AS p
                 ON CONFLICT (partition) DO UPDATE
                    SET replica = EXCLUDED.replica, epoch = l.epoch + 1
                  WHERE l.replica = EXCLUDED.replica
                     OR NOT EXISTS (SELECT 1 FROM hub_replicas r
                                     WHERE r.replica = l.replica AND r.expires_at > now())
              RETURNING partition, epoch",
            )
            .bind(&claim)
            .bind(&self.replica)
            .fetch_all(&mut *tx)
            .await?;
            round.claimed = claimed
                .into_iter()
                .map(|(p, e)| (p as u32, e as u64))
                .collect();
        }
        tx.commit().await?;
        Ok(round)
    }

    /// Hands back every lease and the heartbeat, so that the next replica
    /// (or this one restarted) takes over at once instead of after expiry.
    async fn release_all(&self) -> Result<(), sqlx::Error> {
        let mut tx = self.deps.pool.begin().await?;
        sqlx::query("DELETE FROM hub_partition_leases WHERE replica = $1")
            .bind(&self.replica)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM hub_replicas WHERE replica = $1")
            .bind(&self.replica)
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    }

    /// Runs the rounds until shutdown; starts a fetcher for every partition
    /// claimed. On shutdown its fetchers stop, the lanes are let go, and the
    /// leases are handed back.
    pub(crate) async fn lease_loop(
        self: Arc<Self>,
        lanes: Vec<crate::lane::Senders<Item>>,
        mut lanes_done: mpsc::Receiver<()>,
        mut shutdown: Shutdown,
    ) {
        let every = (self.config.lease_ttl / 3).max(Duration::from_millis(100));
        let mut fetchers = JoinSet::new();
        loop {
            let started = std::time::Instant::now();
            match self.lease_round().await {
                Ok(round) => {
                    for p in &round.lost {
                        tracing::warn!(partition = p, "partition lease lost to another replica");
                        self.let_go(*p);
                    }
                    self.metrics.lease_lost.inc_by(round.lost.len() as u64);
                    if !round.released.is_empty() {
                        tracing::info!(partitions = ?round.released, "partition leases handed back");
                    }
                    for (p, epoch) in &round.claimed {
                        self.leases[*p as usize].store(*epoch, Ordering::Release);
                        let lane = &lanes[*p as usize % lanes.len()];
                        for queue in Queue::ALL {
                            fetchers.spawn(self.clone().fetch_partition(
                                *p,
                                queue,
                                *epoch,
                                lane.of(queue),
                                shutdown.clone(),
                            ));
                        }
                    }
                    if !round.claimed.is_empty() {
                        tracing::info!(partitions = ?round.claimed.iter().map(|c| c.0).collect::<Vec<_>>(), "partition leases claimed");
                    }
                    self.metrics.lease_held.set(self.held().len() as i64);
                    self.metrics
                        .lease_round_seconds
                        .observe(started.elapsed().as_secs_f64());
                }
                Err(e) => {
                    // Leases not renewed expire; the fence keeps a batch
                    // from committing on one that was taken meanwhile.
                    tracing::warn!(error = %e, "partition lease round failed; retrying");
                }
            }
            // Reap the fetchers that ended (lease lost or handed back).
            while fetchers.try_join_next().is_some() {}
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = shutdown.wait() => break,
            }
        }
        while fetchers.join_next().await.is_some() {}
        drop(lanes);
        // `None` once every lane ended; its senders are never used.
        let _ = lanes_done.recv().await;
        if let Err(e) = self.release_all().await {
            tracing::warn!(error = %e, "could not hand the partition leases back; they expire after hub.lease_ttl");
        }
    }
}
