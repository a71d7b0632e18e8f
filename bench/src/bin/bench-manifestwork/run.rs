//! One run: one controller, N Applications, on the shared hub. Creates the
//! load, plays the OCM work agent, watches what the controller writes, and
//! cleans up so that the next run starts from the same hub.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use argocd_pull_apis::argocd::application_resource;
use argocd_pull_bench::work_agent::{SeenWork, feed_back, manifestwork_resource};
use futures::{StreamExt, TryStreamExt, stream};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testenv::{Cluster, paths};

use crate::controller::{Controller, count_error_lines};
use crate::hub::{Progress, application, team_namespace, wait_for, watch_apps, watch_works};
use crate::{Args, Impl, cases};

/// Marks every object the benchmark creates, with the run it belongs to.
pub const RUN_LABEL: &str = "bench.argocd-pull.io/run";

/// What one run measured. `None`: not measured (timed out, not reachable).
#[derive(Default, Debug)]
pub struct Figures {
    /// Why the run did not happen, if it did not.
    pub skipped: Option<String>,
    pub create: Option<Duration>,
    pub works: Option<Duration>,
    pub works_seen: usize,
    pub feedback_written: Option<Duration>,
    pub status: Option<Duration>,
    pub status_seen: usize,
    pub reconciles: Option<f64>,
    /// Of `reconciles`, those before the first feedback write.
    pub delivery_reconciles: Option<f64>,
    pub reconcile_errors: Option<f64>,
    /// Writes by the controller seen through the watches (events minus the
    /// benchmark's own writes): on Applications and on ManifestWorks.
    pub app_writes: usize,
    pub work_writes: usize,
    /// Of `app_writes`, those from the first feedback write on (status).
    pub status_writes: usize,
    /// The controller's API requests over its whole life, by HTTP method;
    /// `None`: it exports no request counter.
    pub requests: Option<BTreeMap<String, f64>>,
    pub peak_rss_kib: Option<u64>,
    /// Resident set once converged and settled.
    pub end_rss_kib: Option<u64>,
    pub cpu: Option<Duration>,
    pub log_errors: Option<usize>,
    /// The catch-up phase, the controller alone on the hub: its writes to
    /// Applications and the time from the first to the last.
    pub alone: Option<(usize, Duration)>,
    /// What the controller got right in the correctness cases.
    pub cases: Option<cases::Outcome>,
}

pub const REVISION: &str = "0123456789abcdef0123456789abcdef01234567";
/// The revision of the second feedback (the catch-up phase).
pub const REVISION_2: &str = "89abcdef0123456789abcdef0123456789abcdef";

#[allow(clippy::too_many_arguments)]
pub async fn one_run(
    hub: &Cluster,
    client: &kube::Client,
    args: &Args,
    which: Impl,
    bin: &Path,
    n: usize,
    run: usize,
    clusters: &[String],
) -> Result<Figures> {
    let timeout = Duration::from_secs(args.timeout);
    let mut figures = Figures::default();
    let team: Vec<String> = (0..args.namespaces)
        .map(|i| format!("bench-r{run}-team{i:02}"))
        .collect();
    for ns in &team {
        team_namespace(hub, client, ns, clusters).await?;
    }
    let team_set: HashSet<String> = team.iter().cloned().collect();
    let cases_ns = format!("bench-r{run}-cases");
    if args.cases > 0 {
        team_namespace(hub, client, &cases_ns, clusters).await?;
    }

    let logs = paths::run_dir().join("bench-logs");
    std::fs::create_dir_all(&logs)?;
    let log = logs.join(format!("run{run}-{}-{n}.log", which.label()));
    let mut controller = Controller::start(which, bin, hub.kubeconfig(), &log).await?;
    let before = controller.reconciles().await?;

    // Watch every ManifestWork and this run's Applications from here on.
    let progress = Arc::new(Progress::default());
    let watches = [
        tokio::spawn(watch_works(
            client.clone(),
            team_set.clone(),
            progress.clone(),
        )),
        tokio::spawn(watch_apps(client.clone(), run, progress.clone())),
    ];

    // The correctness cases run alongside the load, on the first cluster.
    let load_end = Arc::new(cases::LoadEnd::default());
    let case_task = (args.cases > 0).then(|| {
        tokio::spawn(cases::run(
            client.clone(),
            cases_ns.clone(),
            clusters[0].clone(),
            args.cases,
            run,
            load_end.clone(),
            Instant::now() + timeout,
        ))
    });

    // Phase 1: create the Applications; time until every work exists.
    let ar = application_resource();
    let t0 = Instant::now();
    stream::iter(0..n)
        .map(|i| {
            let ns = &team[i % team.len()];
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
            let app = application(
                &format!("app-{i:05}"),
                ns,
                &clusters[i % clusters.len()],
                run,
            );
            async move {
                api.create(&PostParams::default(), &app?).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(args.concurrency)
        .try_collect::<()>()
        .await?;
    figures.create = Some(t0.elapsed());
    let all_works = wait_for(&progress, t0 + timeout, &mut controller, |p| {
        p.works.lock().unwrap().len() >= n
    })
    .await?;
    figures.works_seen = progress.works.lock().unwrap().len();
    if all_works {
        figures.works = Some(t0.elapsed());
    }

    // Phase 2: the work agent feeds back every work's status; time until
    // every hub Application shows it.
    let works: Vec<SeenWork> = progress.works.lock().unwrap().values().cloned().collect();
    let delivered = controller.reconciles().await?;
    let app_events_before_feedback = progress.app_events.load(Ordering::Relaxed);
    let t1 = Instant::now();
    stream::iter(works.clone())
        .map(|w| feed_back(client.clone(), w, REVISION))
        .buffer_unordered(args.concurrency)
        .try_collect::<()>()
        .await?;
    figures.feedback_written = Some(t1.elapsed());
    let all_status = wait_for(&progress, t1 + timeout, &mut controller, |p| {
        p.converged.lock().unwrap().len() >= n
    })
    .await?;
    figures.status_seen = progress.converged.lock().unwrap().len();
    if all_status {
        figures.status = Some(t1.elapsed());
    }
    // The benchmark's feedback writes are not in the watch's count of
    // Application events, so everything after t1 is the controller's.
    figures.status_writes = progress
        .app_events
        .load(Ordering::Relaxed)
        .saturating_sub(app_events_before_feedback);
    load_end.finish();

    // Reconciles that come after convergence (loops) count too.
    let mut last = controller.reconciles().await?;
    let mut still = Instant::now();
    let settle_deadline = Instant::now() + Duration::from_secs(120);
    while still.elapsed() < Duration::from_secs(args.settle) && Instant::now() < settle_deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = controller.reconciles().await?;
        if now != last {
            last = now;
            still = Instant::now();
        }
    }
    figures.reconciles = match (last.total, before.total) {
        (Some(a), Some(b)) => Some(a - b),
        _ => None,
    };
    figures.delivery_reconciles = match (delivered.total, before.total) {
        (Some(a), Some(b)) => Some(a - b),
        _ => None,
    };
    figures.reconcile_errors = match (last.errors, before.errors) {
        (Some(a), Some(b)) => Some(a - b),
        _ => None,
    };
    // The benchmark wrote each Application once (create) and each work once
    // (feedback); every other event is a write of the controller's.
    figures.app_writes = progress
        .app_events
        .load(Ordering::Relaxed)
        .saturating_sub(n);
    figures.work_writes = progress
        .work_events
        .load(Ordering::Relaxed)
        .saturating_sub(n);
    if let Some(task) = case_task {
        figures.cases = match task.await {
            Ok(Ok(outcome)) => Some(outcome),
            Ok(Err(e)) => {
                tracing::warn!("correctness cases failed: {e:#}");
                None
            }
            Err(e) => {
                tracing::warn!("correctness cases panicked: {e}");
                None
            }
        };
    }
    figures.requests = controller.requests().await.ok().flatten();
    figures.peak_rss_kib = controller.rss_kib("VmHWM:");
    figures.end_rss_kib = controller.rss_kib("VmRSS:");
    figures.cpu = controller.cpu_time();
    controller.stop().await;
    figures.log_errors = count_error_lines(&log).ok();

    // Phase 3, the controller alone on the hub: while it is stopped, the
    // work agent feeds back a new revision for every work; started again,
    // it catches up with nothing else writing. Its writes per second from
    // the first to the last are what it takes of the API server alone.
    if all_status && !args.no_catch_up {
        stream::iter(works)
            .map(|w| feed_back(client.clone(), w, REVISION_2))
            .buffer_unordered(args.concurrency)
            .try_collect::<()>()
            .await?;
        *progress.catch_up_events.lock().unwrap() = Some((0, None, None));
        let log = logs.join(format!("run{run}-{}-{n}-alone.log", which.label()));
        let mut controller = Controller::start(which, bin, hub.kubeconfig(), &log).await?;
        let caught_up = wait_for(&progress, Instant::now() + timeout, &mut controller, |p| {
            p.caught_up.lock().unwrap().len() >= n
        })
        .await?;
        controller.stop().await;
        if let (true, Some((events, Some(first), Some(last)))) =
            (caught_up, progress.catch_up_events.lock().unwrap().take())
        {
            figures.alone = Some((events, last - first));
        }
    }
    for w in watches {
        w.abort();
    }

    let mut namespaces = team.clone();
    if args.cases > 0 {
        namespaces.push(cases_ns);
    }
    cleanup(client, &namespaces, clusters, timeout).await?;
    Ok(figures)
}

/// Removes the run's Applications and every ManifestWork, so that the next
/// run starts from the same hub state. The controller is stopped by then.
async fn cleanup(
    client: &kube::Client,
    team: &[String],
    clusters: &[String],
    timeout: Duration,
) -> Result<()> {
    let ar = application_resource();
    let mr = manifestwork_resource();
    let dp = DeleteParams::background();
    for ns in team {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
        api.delete_collection(&dp, &ListParams::default()).await?;
        // The controller is stopped: finalizers it (or a case) left would
        // keep these for the next controller to find.
        for app in api.list_metadata(&ListParams::default()).await?.items {
            if !app.finalizers().is_empty() {
                let clear = json!({ "metadata": { "finalizers": null } });
                api.patch(
                    &app.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(clear),
                )
                .await?;
            }
        }
    }
    for c in clusters {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), c, &mr);
        api.delete_collection(&dp, &ListParams::default()).await?;
    }
    let deadline = Instant::now() + timeout;
    let works: Api<DynamicObject> = Api::all_with(client.clone(), &mr);
    loop {
        let left = works.list_metadata(&ListParams::default().limit(1)).await?;
        if left.items.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            bail!("ManifestWorks were not deleted within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Each controller keeps its own Argo CD cluster Secrets; the next one
    // starts without the last one's.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), "argocd");
    secrets
        .delete_collection(&dp, &ListParams::default())
        .await?;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    for ns in team {
        namespaces.delete(ns, &dp).await?;
    }
    Ok(())
}
