//! Capability `terminal`: the one write the live endpoint takes, an exec
//! into a pod as the hub's argocd-server asks it for its web terminal
//! ([`exec::parse`]; WebSocket `v5.channel.k8s.io` only, [`exec::check_upgrade`]).
//! The endpoint answers the upgrade once the cluster's agent has opened the
//! exec (the agent execs only into pods of Applications it applied, and
//! refuses with a Kubernetes Status otherwise), then relays each binary
//! message both ways as it is, by credits ([`TERMINAL_WINDOW`] frames
//! beyond what the other side took). A session ends when either side
//! closes, after `--terminal-idle-timeout` without a frame, and after
//! `--terminal-max-duration`; at most `--terminal-sessions-per-cluster`
//! run at once per cluster. Its opening and its end are logged and
//! recorded as Events on the hub Application (argocd-server does not tell
//! the cluster who asked: its own log line `terminal session starting`
//! names the user).

use std::sync::Arc;
use std::time::Duration;

use argocd_pull_core::live::Refusal;
use argocd_pull_core::live::exec::{self, Exec};
use argocd_pull_core::route::HubRef;
use argocd_pull_proto::limits::TERMINAL_WINDOW;
use argocd_pull_proto::v1::ObjectKey;
use argocd_pull_proto::validate::terminal::{FROM_HUB, frame_ok};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use futures::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::{Role, frame::coding::CloseCode};

use super::{Endpoint, authorized, refusal, unavailable};
use crate::transport::grpc::cluster::ClusterState;
use crate::transport::grpc::cluster::live::Unavailable;
use crate::transport::grpc::cluster::terminal::{FromAgent, Refused};

/// How many terminal sessions, and for how long each.
#[derive(Clone)]
pub struct Bounds {
    pub per_cluster: usize,
    pub idle: Duration,
    pub max: Duration,
    pub recorder: Recorder,
}

impl Bounds {
    pub fn new(client: kube::Client, per_cluster: usize, idle: Duration, max: Duration) -> Self {
        let reporter = Reporter {
            controller: "argocd-pull-hub-controller".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            per_cluster,
            idle,
            max,
            recorder: Recorder::new(client, reporter),
        }
    }
}

/// The output frames taken before they are granted back to the agent.
const CREDIT_BATCH: u32 = TERMINAL_WINDOW / 4;

/// What one session is, for its log lines and Events.
struct Audit {
    cluster: String,
    exec: Exec,
    /// The copy's key on the cluster, as the agent named it.
    key: ObjectKey,
    /// The hub Application it was delivered for, when the cluster is
    /// granted that key for that uid.
    hub_app: Option<(HubRef, String)>,
}

/// Answers the exec of `path` (`/api/v1/namespaces/<ns>/pods/<pod>/exec`)
/// on `cluster`: `101` and the session, or a refusal (the answer label of
/// `argocd_pull_hub_grpc_live_reads_total` with it).
pub(super) async fn serve(
    endpoint: &Endpoint,
    cluster: &str,
    path: &str,
    mut request: Request,
) -> (&'static str, Response) {
    let refused = |r: &Refusal| ("refused", refusal(r));
    if let Err(r) = authorized(endpoint, request.headers()) {
        return refused(&r);
    }
    let query = request.uri().query().unwrap_or("");
    let checked = exec::parse(request.method().as_str(), path, query)
        .and_then(|e| upgrade_headers(request.headers()).map(|key| (e, key)));
    let (exec, key) = match checked {
        Ok(c) => c,
        Err(r) => {
            tracing::info!(%cluster, %path, code = r.code, reason = %r.message, "refused a terminal");
            return refused(&r);
        }
    };
    let Some(cs) = endpoint.hub.find_cluster(cluster) else {
        return refused(&unavailable(cluster, Unavailable::NoAgent));
    };
    let bounds = &endpoint.terminal;
    let opened = cs.terminal_open(&exec, (bounds.idle, bounds.max), bounds.per_cluster);
    let (id, mut events) = match opened {
        Ok(opened) => opened,
        Err(why) => return refused(&off(cluster, why)),
    };
    let (app, hub_uid, window) = match opening(endpoint, &cs, cluster, &exec, id, &mut events).await
    {
        Ok(opened) => opened,
        Err((by, r)) => return (by, refusal(&r)),
    };
    let hub_app = endpoint
        .hub
        .granted_to(cluster, &app, Some(&hub_uid))
        .then(|| endpoint.hub.owner(cluster, &app))
        .flatten()
        .map(|r| (r, hub_uid));
    let audit = Audit {
        cluster: cluster.to_string(),
        exec,
        key: app,
        hub_app,
    };
    let upgrade = hyper::upgrade::on(&mut request);
    let bounds = bounds.clone();
    tokio::spawn(async move {
        let upgraded = match upgrade.await {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(cluster = %audit.cluster, error = %e, "a terminal's upgrade failed");
                cs.terminal_close(id, 502, "the user's upgrade failed");
                return;
            }
        };
        let config = argocd_pull_runtime::websocket::config();
        let io = TokioIo::new(upgraded);
        let ws = WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await;
        let opened = opened_note(&audit);
        record(&bounds, &audit, "TerminalOpened", &opened).await;
        let started = Instant::now();
        let (code, reason) = relay(&cs, id, ws, events, window, &bounds).await;
        let note = closed_note(&audit, code, &reason, started.elapsed());
        record(&bounds, &audit, "TerminalClosed", &note).await;
    });
    ("cluster", switching(&key))
}

/// The agent's answer to session `id`'s opening: the copy it belongs to,
/// its hub uid and the input window; or who refused, and the refusal.
async fn opening(
    endpoint: &Endpoint,
    cs: &ClusterState,
    cluster: &str,
    exec: &Exec,
    id: u64,
    events: &mut mpsc::Receiver<FromAgent>,
) -> Result<(ObjectKey, String, u32), (&'static str, Refusal)> {
    let failed = |code, message: String| Err(("failed", Refusal::new(code, message)));
    match tokio::time::timeout(endpoint.timeout, events.recv()).await {
        Ok(Some(FromAgent::Opened {
            key,
            hub_uid,
            window,
        })) => Ok((key, hub_uid, window)),
        Ok(Some(FromAgent::Closed { code, reason })) => {
            tracing::info!(%cluster, namespace = %exec.namespace, pod = %exec.pod, code, %reason, "the agent refused a terminal");
            let code = u16::try_from(code).unwrap_or(502);
            Err((
                "cluster",
                Refusal::new(code, format!("cluster {cluster}: {reason}")),
            ))
        }
        Ok(Some(_)) | Ok(None) => {
            cs.terminal_close(id, 502, "the agent answered out of turn");
            failed(
                503,
                format!("the agent of cluster {cluster} went before it opened the terminal"),
            )
        }
        Err(_) => {
            cs.terminal_close(id, 504, "not opened in time");
            let within = endpoint.timeout;
            failed(
                504,
                format!(
                    "the agent of cluster {cluster} did not open the terminal within {within:?}"
                ),
            )
        }
    }
}

/// The `Sec-WebSocket-Key` of an upgrade to [`exec::PROTOCOL`], or why the
/// request is not one.
fn upgrade_headers(headers: &HeaderMap) -> Result<String, Refusal> {
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    let protocols: Vec<&str> = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    exec::check_upgrade(
        text(header::UPGRADE),
        text(header::SEC_WEBSOCKET_VERSION),
        &protocols,
    )?;
    text(header::SEC_WEBSOCKET_KEY)
        .map(str::to_string)
        .ok_or_else(|| Refusal::new(400, "a WebSocket upgrade needs Sec-WebSocket-Key"))
}

fn switching(key: &str) -> Response {
    let mut response = Response::new(axum::body::Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = response.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(exec::PROTOCOL),
    );
    let accept = argocd_pull_runtime::websocket::derive_accept_key(key.as_bytes());
    h.insert(
        header::SEC_WEBSOCKET_ACCEPT,
        HeaderValue::from_str(&accept).expect("base64 is a valid header value"),
    );
    response
}

/// Why a terminal of `cluster` cannot open, in words for the UI.
fn off(cluster: &str, why: Refused) -> Refusal {
    match why {
        Refused::NoAgent => unavailable(cluster, Unavailable::NoAgent),
        Refused::Off(version) => Refusal::new(
            501,
            format!(
                "the web terminal of cluster {cluster} is off: its argocd-pull-agent ({version}) runs without --terminal (the addon variable TERMINAL=true of the cluster's AddOnDeploymentConfig turns it on, with the agent's exec rights)"
            ),
        ),
        Refused::Busy(limit) => Refusal::new(
            429,
            format!(
                "{limit} terminals of cluster {cluster} are open, as many as the hub-controller's --terminal-sessions-per-cluster allows: close one"
            ),
        ),
    }
}

/// Relays session `id` between the user's WebSocket and the agent until
/// one side ends it or a bound does: how it ended (an HTTP status and
/// why). The agent is told unless it ended it.
async fn relay<S>(
    cs: &Arc<ClusterState>,
    id: u64,
    ws: WebSocketStream<S>,
    mut from_agent: mpsc::Receiver<FromAgent>,
    mut credit: u32,
    bounds: &Bounds,
) -> (u32, String)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut sink, mut source) = ws.split();
    let deadline = Instant::now() + bounds.max;
    let mut last = Instant::now();
    let mut taken = 0u32;
    let (code, reason, agent_ended) = loop {
        tokio::select! {
            m = source.next(), if credit > 0 => match m {
                Some(Ok(Message::Binary(frame))) => {
                    if let Err(e) = frame_ok(&frame, FROM_HUB) {
                        break (400, format!("the user sent a frame the terminal does not take: {e}"), false);
                    }
                    credit -= 1;
                    last = Instant::now();
                    cs.terminal_data(id, frame.to_vec());
                }
                Some(Ok(Message::Text(_))) => break (400, format!("the user sent a text message; {} is binary", exec::PROTOCOL), false),
                Some(Ok(Message::Close(_))) | None => break (200, "the user closed the terminal".into(), false),
                Some(Ok(_)) => {}
                Some(Err(e)) => break (200, format!("the user's connection ended: {e}"), false),
            },
            event = from_agent.recv() => match event {
                Some(FromAgent::Data(frame)) => {
                    last = Instant::now();
                    if sink.send(Message::Binary(frame.into())).await.is_err() {
                        break (200, "the user's connection ended".into(), false);
                    }
                    taken += 1;
                    if taken >= CREDIT_BATCH {
                        cs.terminal_credit(id, taken);
                        taken = 0;
                    }
                }
                Some(FromAgent::Credit(n)) => credit = credit.saturating_add(n).min(TERMINAL_WINDOW),
                Some(FromAgent::Closed { code, reason }) => break (code, reason, true),
                Some(FromAgent::Opened { .. }) => {}
                None => break (502, "the agent's stream ended".into(), true),
            },
            () = tokio::time::sleep_until(last + bounds.idle) => {
                break (408, format!("no input or output for {:?} (--terminal-idle-timeout)", bounds.idle), false);
            }
            () = tokio::time::sleep_until(deadline) => {
                break (408, format!("open for {:?}, the most a terminal stays (--terminal-max-duration)", bounds.max), false);
            }
        }
    };
    if !agent_ended {
        cs.terminal_close(id, code, &reason);
    }
    let close = CloseFrame {
        code: if code == 200 {
            CloseCode::Normal
        } else {
            CloseCode::Policy
        },
        reason: reason.chars().take(120).collect::<String>().into(),
    };
    // A user's Close is answered by tungstenite itself; either way the
    // closing handshake is flushed before the connection goes.
    let _ = sink.send(Message::Close(Some(close))).await;
    let _ = sink.close().await;
    (code, reason)
}

fn opened_note(a: &Audit) -> String {
    format!(
        "a web terminal opened in pod {}/{} container {} of cluster {} ({:?}); argocd-server does not tell the cluster who: its log line `terminal session starting` names the user",
        a.exec.namespace, a.exec.pod, a.exec.container, a.cluster, a.exec.command
    )
}

fn closed_note(a: &Audit, code: u32, reason: &str, took: Duration) -> String {
    format!(
        "the web terminal in pod {}/{} container {} of cluster {} closed after {}s ({code}: {reason})",
        a.exec.namespace,
        a.exec.pod,
        a.exec.container,
        a.cluster,
        took.as_secs()
    )
}

/// Logs `note` and records it on the hub Application the session's pod
/// belongs to, when the cluster is granted it (the agent says which; a
/// key it is not granted gets the log line alone).
async fn record(bounds: &Bounds, a: &Audit, reason: &str, note: &str) {
    let copy = format!("{}/{}", a.key.namespace, a.key.name);
    tracing::info!(
        cluster = %a.cluster,
        namespace = %a.exec.namespace,
        pod = %a.exec.pod,
        container = %a.exec.container,
        application = %copy,
        reason,
        "{note}"
    );
    let Some((app, uid)) = &a.hub_app else {
        tracing::warn!(cluster = %a.cluster, application = %copy, "the agent named a terminal's Application the cluster is not granted: no Event");
        return;
    };
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("argoproj.io/v1alpha1".into()),
        kind: Some("Application".into()),
        namespace: Some(app.namespace.clone()),
        name: Some(app.name.clone()),
        uid: Some(uid.clone()),
        ..Default::default()
    };
    let event = Event {
        type_: EventType::Normal,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: "Terminal".into(),
        secondary: None,
    };
    if let Err(e) = bounds.recorder.publish(&event, &reference).await {
        tracing::warn!(error = %e, "could not publish a terminal's Event");
    }
}
