//! The in-flight gauge counts exactly how many tracked requests overlap,
//! which is what lets corral's tests prove a concurrency limit holds.

mod common;

use std::time::Duration;

use common::{docker_via, proxy, Sandbox, TestResult};
use corral_faultproxy::{Action, Matcher, Rule};
use futures_util::stream::{self, StreamExt, TryStreamExt};

/// Long enough that requests sent together overlap even on a busy machine.
const DELAY: Duration = Duration::from_millis(500);

/// Sends 6 delayed pings, `at_once` at a time, and returns the gauge.
async fn pings(at_once: usize) -> Result<corral_faultproxy::TrackedStats, common::BoxError> {
    let proxy = proxy("gauge")?;
    let docker = docker_via(proxy.socket_path())?;
    proxy.set_tracked(vec![Matcher::new("GET", "/_ping")])?;
    proxy.set_rules(vec![Rule::new(
        Matcher::new("GET", "/_ping"),
        Action::delay(DELAY),
    )])?;

    let answers: Vec<String> = stream::iter(0..6)
        .map(|_| docker.ping())
        .buffer_unordered(at_once)
        .try_collect()
        .await?;
    assert!(answers.iter().all(|a| a == "OK"), "{answers:?}");

    let stats = proxy.stats();
    let gauge = stats
        .tracked(Some("GET"), "/_ping")
        .ok_or("no gauge for GET /_ping")?
        .clone();
    assert_eq!(gauge.in_flight, 0, "{gauge:?}");
    assert_eq!(gauge.total, 6, "{gauge:?}");
    // Untracked requests never touch the gauge.
    docker.version().await?;
    assert_eq!(proxy.stats().tracked[0].total, 6);
    Ok(gauge)
}

#[tokio::test]
async fn six_concurrent_delayed_requests_are_six_in_flight() -> TestResult {
    assert_eq!(pings(6).await?.max_in_flight, 6);
    Ok(())
}

#[tokio::test]
async fn two_at_a_time_is_two_in_flight() -> TestResult {
    assert_eq!(pings(2).await?.max_in_flight, 2);
    Ok(())
}

/// The real use: concurrent container starts, then a reset between phases.
#[tokio::test]
async fn concurrent_container_starts_are_counted() -> TestResult {
    let proxy = proxy("starts")?;
    let docker = docker_via(proxy.socket_path())?;
    let sandbox = Sandbox::new("starts")?;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(sandbox.create(&docker, &["sleep", "300"]).await?);
    }
    proxy.set_tracked(vec![Matcher::new("POST", "/containers/*/start")])?;
    proxy.set_rules(vec![Rule::new(
        Matcher::new("POST", "/containers/*/start"),
        Action::delay(DELAY),
    )])?;

    futures_util::future::try_join_all(ids.iter().map(|id| docker.start_container(id, None)))
        .await?;
    let gauge = proxy.stats().tracked[0].clone();
    assert_eq!(
        (gauge.max_in_flight, gauge.total, gauge.in_flight),
        (3, 3, 0)
    );

    proxy.reset_stats();
    let gauge = proxy.stats().tracked[0].clone();
    assert_eq!((gauge.max_in_flight, gauge.total), (0, 0));
    for id in &ids {
        docker
            .kill_container(id, None::<bollard::query_parameters::KillContainerOptions>)
            .await?;
        docker.start_container(id, None).await?;
    }
    let gauge = proxy.stats().tracked[0].clone();
    assert_eq!((gauge.max_in_flight, gauge.total), (1, 3));
    Ok(())
}
