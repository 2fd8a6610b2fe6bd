//! The test harness itself: a test that fails still leaves nothing behind.

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_test_leaves_no_database_and_no_stream() {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let failed = tokio::spawn(async move {
        let env = TestEnv::new().await;
        let _ = tx.send((env.db_name.clone(), env.common.nats.stream_prefix.clone()));
        panic!("a test that fails before its cleanup");
    })
    .await;
    assert!(failed.is_err(), "the task panicked");
    let (db, prefix) = rx.await.unwrap();
    let admin = fleet_store::connect(&admin_url(), 1).await.unwrap();
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&db)
            .fetch_one(&admin)
            .await
            .unwrap();
    assert!(!exists, "database {db} left behind");
    let js = async_nats::jetstream::new(async_nats::connect(nats_url()).await.unwrap());
    let mut names = js.stream_names();
    while let Some(Ok(name)) = futures::StreamExt::next(&mut names).await {
        assert!(!name.starts_with(&prefix), "stream {name} left behind");
    }
}
