//! The live views: the reads of a managed cluster's Kubernetes API that the
//! hub's argocd-server makes for a pulled Application (a resource's live
//! manifest, its events, a pod's log), as the hub's live endpoint receives
//! them and the agent serves them. Pure: what a path asks for, whether it
//! is allowed at all, whose share of the reads it takes, which Application
//! an object belongs to ([`tracking`]), and the Kubernetes `Status` a
//! refusal is answered with.
//!
//! Only reads of single objects are served (never a list, a watch or a
//! write); the events of one object; one pod's log. Anything else is a 403
//! whose message says that argocd-pull serves reads only.

use serde_json::{Value, json};

pub mod exec;
pub mod tracking;

/// How many owner references the agent follows from an object to one an
/// Application manages (a Pod, its ReplicaSet, its Deployment is two).
pub const MAX_OWNER_HOPS: usize = 5;

/// How long the agent follows one pod's log (`follow=true`) before it
/// ends the stream, as the API server's own request timeout would: a
/// reader left open does not hold one of the cluster's live reads for
/// ever. Argo CD's UI and CLI start a new follow when they want more.
pub const MAX_FOLLOW: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// The query parameters of a pod's log that are passed on; any other is
/// dropped (`insecureSkipTLSVerifyBackend` above all).
pub const LOG_PARAMS: &[&str] = &[
    "container",
    "follow",
    "previous",
    "sinceSeconds",
    "sinceTime",
    "timestamps",
    "tailLines",
    "limitBytes",
];

/// What one request of argocd-server asks the cluster for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Read {
    /// `/version`, `/api`, `/apis`, `/api/v1`, `/apis/<group>` or
    /// `/apis/<group>/<version>`: what the API serves, which the dynamic
    /// client reads before a get. The path as asked, without its query.
    Discovery(String),
    /// One object.
    Get(Target),
    /// The events of one object in `namespace`: `involvedObject.name`
    /// and its uid, which argocd-server takes from the tree (never empty:
    /// an empty uid would match the events of any object of that name).
    Events {
        namespace: String,
        name: String,
        uid: String,
    },
    /// One pod's log; `query` holds only [`LOG_PARAMS`], in the order
    /// asked, encoded again.
    Logs {
        namespace: String,
        pod: String,
        query: String,
        follow: bool,
    },
}

/// One object of the cluster's API, as a path names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Empty for the core group.
    pub group: String,
    pub version: String,
    /// The plural resource name (`configmaps`).
    pub resource: String,
    /// `None` for a cluster-scoped object.
    pub namespace: Option<String>,
    pub name: String,
}

impl Target {
    /// The object's path in the Kubernetes API.
    pub fn path(&self) -> String {
        let mut p = if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        };
        if let Some(ns) = &self.namespace {
            p.push_str(&format!("/namespaces/{ns}"));
        }
        p.push_str(&format!("/{}/{}", self.resource, self.name));
        p
    }
}

/// Whose share of a cluster's live reads one read takes: the reads of one
/// namespace of the cluster (where an Application's resources are, and
/// what separates tenants on a cluster: argocd-server's request names
/// neither the Application nor the user), followed logs apart from every
/// other read, so that follows left open never hold back a LIVE MANIFEST.
/// Cluster-scoped objects are one more share, and discovery (which every
/// read of argocd-server needs first) one of its own.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Share {
    pub scope: Scope,
    pub follow: bool,
}

/// Where the reads of a [`Share`] are.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    Namespace(String),
    ClusterScoped,
    Discovery,
}

impl std::fmt::Display for Share {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = if self.follow {
            "followed logs"
        } else {
            "live reads"
        };
        match &self.scope {
            Scope::Namespace(ns) => write!(f, "{what} in namespace {ns}"),
            Scope::ClusterScoped => write!(f, "{what} of cluster-scoped objects"),
            Scope::Discovery => write!(f, "discovery reads"),
        }
    }
}

impl Read {
    /// The share this read is counted against.
    pub fn share(&self) -> Share {
        let ns = |n: &str| Scope::Namespace(n.to_string());
        let (scope, follow) = match self {
            Read::Discovery(_) => (Scope::Discovery, false),
            Read::Get(t) => match &t.namespace {
                Some(n) => (ns(n), false),
                None => (Scope::ClusterScoped, false),
            },
            Read::Events { namespace, .. } => (ns(namespace), false),
            Read::Logs {
                namespace, follow, ..
            } => (ns(namespace), *follow),
        };
        Share { scope, follow }
    }
}

/// A refused read: the HTTP code and the Kubernetes `Status` it is
/// answered with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub code: u16,
    pub message: String,
}

impl Refusal {
    pub fn new(code: u16, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// 403: argocd-pull serves reads only.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, message)
    }

    /// The answer's body: a Kubernetes `Status`, which every client of the
    /// API (argocd-server's too) shows by its message.
    pub fn status_json(&self) -> Vec<u8> {
        status_json(self.code, &self.message)
    }
}

/// A Kubernetes `Status` of `code` with `message`.
pub fn status_json(code: u16, message: &str) -> Vec<u8> {
    let reason = match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        413 => "RequestEntityTooLarge",
        414 => "RequestURITooLong",
        429 => "TooManyRequests",
        501 => "NotImplemented",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    };
    serde_json::to_vec(&json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    }))
    .expect("a Value always serializes")
}

const READS_ONLY: &str = "argocd-pull serves the hub's Argo CD reads only: a live object, its events, a pod's log, and discovery";

/// What `method` on `path_and_query` (the path after the endpoint's
/// `/clusters/<cluster>` prefix) asks for, or why it is refused.
pub fn parse(method: &str, path_and_query: &str) -> Result<Read, Refusal> {
    if method != "GET" {
        return Err(Refusal::new(
            405,
            format!("{method} is not served: {READS_ONLY}"),
        ));
    }
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let params: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let param = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    if param("watch").is_some_and(|w| w != "false" && w != "0") {
        return Err(Refusal::forbidden(format!(
            "a watch is not served: {READS_ONLY}"
        )));
    }
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    if segments.iter().any(|s| !valid_segment(s)) {
        return Err(Refusal::new(
            400,
            format!("{path} is not a path of the Kubernetes API"),
        ));
    }
    // (group, version, the rest)
    let (group, version, rest): (&str, &str, &[&str]) = match segments.as_slice() {
        ["version"] | ["api"] | ["apis"] | ["api", "v1"] | ["apis", _] | ["apis", _, _] => {
            return Ok(Read::Discovery(path.trim_end_matches('/').to_string()));
        }
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(Refusal::forbidden(format!("{path}: {READS_ONLY}"))),
    };
    let target = |namespace: Option<&str>, resource: &str, name: &str| Target {
        group: group.to_string(),
        version: version.to_string(),
        resource: resource.to_string(),
        namespace: namespace.map(str::to_string),
        name: name.to_string(),
    };
    match rest {
        ["namespaces", ns, "events"] if group.is_empty() => {
            events(ns, param("fieldSelector").unwrap_or(""))
        }
        ["namespaces", ns, "pods", pod, "log"] if group.is_empty() => {
            let kept: Vec<&(String, String)> = params
                .iter()
                .filter(|(k, _)| LOG_PARAMS.contains(&k.as_str()))
                .collect();
            let follow = param("follow").is_some_and(|f| f == "true" || f == "1");
            Ok(Read::Logs {
                namespace: ns.to_string(),
                pod: pod.to_string(),
                query: form_urlencoded::Serializer::new(String::new())
                    .extend_pairs(kept)
                    .finish(),
                follow,
            })
        }
        // `namespaces/<name>` is the Namespace object itself.
        ["namespaces", ns, resource, name] => Ok(Read::Get(target(Some(ns), resource, name))),
        [resource, name] => Ok(Read::Get(target(None, resource, name))),
        _ => Err(Refusal::forbidden(format!(
            "{path}: a list, a subresource or a path of no single object is not served; {READS_ONLY}"
        ))),
    }
}

/// A path segment the API server could take: no dots alone, no empty
/// segment inside, nothing to escape.
fn valid_segment(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:".contains(&b))
}

/// The events of one object: argocd-server asks with the field selector
/// `involvedObject.name=..,involvedObject.namespace=..,involvedObject.uid=..`.
fn events(namespace: &str, selector: &str) -> Result<Read, Refusal> {
    let (mut name, mut uid) = (None, None);
    for term in selector.split(',').filter(|t| !t.is_empty()) {
        let Some((field, value)) = term.split_once('=') else {
            return Err(Refusal::forbidden(format!(
                "the field selector term {term:?} is not served: only involvedObject.name, .namespace and .uid, with ="
            )));
        };
        let value = value.trim_start_matches('=');
        if !value.is_empty() && !valid_segment(value) {
            return Err(Refusal::new(
                400,
                format!("{value:?} is not a name or uid of the Kubernetes API"),
            ));
        }
        match field {
            "involvedObject.name" => name = Some(value.to_string()),
            "involvedObject.uid" => uid = Some(value.to_string()),
            "involvedObject.namespace" if value == namespace => {}
            _ => {
                return Err(Refusal::forbidden(format!(
                    "the field selector term {term:?} is not served: only involvedObject.name, .namespace (the path's) and .uid"
                )));
            }
        }
    }
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        return Err(Refusal::forbidden(format!(
            "a list of events is served only for one object (fieldSelector=involvedObject.name=...); {READS_ONLY}"
        )));
    };
    match uid.filter(|u| !u.is_empty()) {
        Some(uid) => Ok(Read::Events {
            namespace: namespace.to_string(),
            name,
            uid,
        }),
        None => Err(Refusal::forbidden(format!(
            "events are not served without the uid of their object (fieldSelector=...,involvedObject.uid=<uid>): they would be those of any object named {name}; argocd-server sends the uid of a node of the Application's tree, and a node without one opens no live view"
        ))),
    }
}

/// An object as an Application's `status.resources` lists it: group (empty
/// for the core group), kind, namespace (empty when cluster-scoped), name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceRef {
    pub group: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

impl ResourceRef {
    /// From an object's `apiVersion`, `kind`, namespace and name.
    pub fn new(api_version: &str, kind: &str, namespace: &str, name: &str) -> Self {
        Self {
            group: group_of(api_version).to_string(),
            kind: kind.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    /// The object `obj` (a Kubernetes object as JSON).
    pub fn of(obj: &Value) -> Option<Self> {
        let s = |p: &str| obj.pointer(p).and_then(Value::as_str);
        Some(Self::new(
            s("/apiVersion")?,
            s("/kind")?,
            s("/metadata/namespace").unwrap_or(""),
            s("/metadata/name")?,
        ))
    }
}

impl std::fmt::Display for ResourceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.group.is_empty() {
            self.kind.clone()
        } else {
            format!("{}.{}", self.kind, self.group)
        };
        if self.namespace.is_empty() {
            write!(f, "{kind} {}", self.name)
        } else {
            write!(f, "{kind} {}/{}", self.namespace, self.name)
        }
    }
}

/// The group of an `apiVersion` (`apps/v1` -> `apps`, `v1` -> ``).
pub fn group_of(api_version: &str) -> &str {
    api_version.split_once('/').map(|(g, _)| g).unwrap_or("")
}

/// The owners `obj` names in its `ownerReferences`, in `obj`'s namespace
/// (an owner is in the same namespace, or cluster-scoped; both are tried
/// by the reader, which looks each up through the API).
pub fn owners(obj: &Value) -> Vec<ResourceRef> {
    let namespace = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|o| {
            Some(ResourceRef::new(
                o.get("apiVersion")?.as_str()?,
                o.get("kind")?.as_str()?,
                namespace,
                o.get("name")?.as_str()?,
            ))
        })
        .collect()
}

/// Whether a hub copy delivered to `cluster`, with `destination` (its
/// `spec.destination`), opens argocd-server's live views, which read the
/// destination's cluster Secret: only when that is argocd-pull's Secret of
/// `cluster` on the live endpoint (`name` the cluster's name, or `server`
/// its path there, `live_server`). Any other destination (the hub itself,
/// `https://kubernetes.default.svc`, or another cluster) would have
/// argocd-server read the wrong cluster with the node names of this one.
pub fn opens_live_views(destination: Option<&Value>, cluster: &str, live_server: &str) -> bool {
    let s = |f: &str| {
        destination
            .and_then(|d| d.get(f))
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    match (s("name"), s("server")) {
        (name, "") => name == cluster,
        ("", server) => crate::render::cluster_secret::same_server(server, live_server),
        _ => false,
    }
}

/// The answer when an object belongs to no Application the agent applied.
pub fn not_owned(object: &ResourceRef, cluster: &str) -> Refusal {
    Refusal::forbidden(format!(
        "{object} belongs to no Application argocd-pull applied on {cluster}: only what Argo CD applied for a pulled Application (its tracking annotation {} or label {} names the Application), and what that owns, is served (an Application delivered to {cluster} in a ManifestWork has no live views: they need the gRPC transport)",
        tracking::TRACKING_ID,
        tracking::INSTANCE_LABEL
    ))
}

/// A live object as it may leave the cluster: a Secret's values replaced
/// and its last-applied annotation removed.
pub fn redact(object: &mut Value) {
    let secret = object.get("kind").and_then(Value::as_str) == Some("Secret")
        && object.get("apiVersion").and_then(Value::as_str) == Some("v1");
    if secret {
        crate::status::tree::redact_secret_object(object);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(group: &str, version: &str, resource: &str, ns: Option<&str>, name: &str) -> Read {
        Read::Get(Target {
            group: group.into(),
            version: version.into(),
            resource: resource.into(),
            namespace: ns.map(Into::into),
            name: name.into(),
        })
    }

    #[test]
    fn single_objects_discovery_events_and_logs_are_reads() {
        let cases = [
            ("/version", Read::Discovery("/version".into())),
            ("/api", Read::Discovery("/api".into())),
            ("/api/v1?timeout=32s", Read::Discovery("/api/v1".into())),
            ("/apis/apps/v1", Read::Discovery("/apis/apps/v1".into())),
            (
                "/api/v1/namespaces/gb/configmaps/settings",
                get("", "v1", "configmaps", Some("gb"), "settings"),
            ),
            (
                "/apis/apps/v1/namespaces/gb/deployments/ui",
                get("apps", "v1", "deployments", Some("gb"), "ui"),
            ),
            (
                "/apis/rbac.authorization.k8s.io/v1/clusterroles/view",
                get(
                    "rbac.authorization.k8s.io",
                    "v1",
                    "clusterroles",
                    None,
                    "view",
                ),
            ),
            (
                "/api/v1/namespaces/gb",
                get("", "v1", "namespaces", None, "gb"),
            ),
            (
                "/api/v1/namespaces/gb/events?fieldSelector=involvedObject.name%3Dui%2CinvolvedObject.namespace%3Dgb%2CinvolvedObject.uid%3Du-1",
                Read::Events {
                    namespace: "gb".into(),
                    name: "ui".into(),
                    uid: "u-1".into(),
                },
            ),
            (
                "/api/v1/namespaces/gb/pods/ui-x/log?container=ui&follow=true&tailLines=10&insecureSkipTLSVerifyBackend=true",
                Read::Logs {
                    namespace: "gb".into(),
                    pod: "ui-x".into(),
                    query: "container=ui&follow=true&tailLines=10".into(),
                    follow: true,
                },
            ),
        ];
        for (path, want) in cases {
            assert_eq!(parse("GET", path), Ok(want), "{path}");
        }
        assert_eq!(
            get("", "v1", "configmaps", Some("gb"), "settings"),
            Read::Get(Target {
                group: String::new(),
                version: "v1".into(),
                resource: "configmaps".into(),
                namespace: Some("gb".into()),
                name: "settings".into()
            })
        );
    }

    #[test]
    fn writes_lists_watches_subresources_and_odd_paths_are_refused() {
        let refused = |method: &str, path: &str| match parse(method, path) {
            Err(r) => (r.code, r.message),
            Ok(read) => panic!("{method} {path} was served as {read:?}"),
        };
        assert_eq!(
            refused("PATCH", "/api/v1/namespaces/gb/configmaps/a").0,
            405
        );
        assert_eq!(refused("DELETE", "/api/v1/namespaces/gb/pods/a").0, 405);
        for path in [
            "/api/v1/namespaces/gb/configmaps",
            "/api/v1/secrets",
            "/api/v1/namespaces/gb/configmaps/a?watch=true",
            "/api/v1/namespaces/gb/pods/a/exec",
            "/api/v1/namespaces/gb/secrets/a/proxy",
            "/api/v1/namespaces/gb/events",
            "/api/v1/namespaces/gb/events?fieldSelector=type%3DWarning",
            "/api/v1/namespaces/gb/events?fieldSelector=involvedObject.name%3Da%2CinvolvedObject.namespace%3Dother",
            "/apis/apps/v1/namespaces/gb/pods/a/log",
            "/api/v1/namespaces/gb/events?fieldSelector=involvedObject.name%3D",
            // One object's events without its uid, or with an empty one:
            // those of any object of that name (another tenant's pod).
            "/api/v1/namespaces/gb/events?fieldSelector=involvedObject.name%3Dui%2CinvolvedObject.namespace%3Dgb",
            "/api/v1/namespaces/gb/events?fieldSelector=involvedObject.name%3Dui%2CinvolvedObject.namespace%3Dgb%2CinvolvedObject.uid%3D",
            "/healthz",
            "/",
        ] {
            let (code, message) = refused("GET", path);
            assert_eq!(code, 403, "{path}");
            assert!(
                message.contains("reads only") || message.contains("not served"),
                "{message}"
            );
        }
        assert_eq!(refused("GET", "/api/v1/namespaces/../secrets/a").0, 400);
        assert_eq!(refused("GET", "/api/v1/namespaces/gb//a").0, 400);
        // A value that would add a term of its own to the cluster's query.
        assert_eq!(
            refused(
                "GET",
                "/api/v1/namespaces/gb/events?fieldSelector=involvedObject.name%3Da%5C%2Cx"
            )
            .0,
            400
        );
    }

    #[test]
    fn follows_are_shared_apart_and_reads_by_namespace() {
        let share = |path: &str| parse("GET", path).unwrap().share();
        let ns = |n: &str, follow: bool| Share {
            scope: Scope::Namespace(n.into()),
            follow,
        };
        assert_eq!(
            share("/api/v1/namespaces/gb/pods/p/log?follow=true"),
            ns("gb", true)
        );
        assert_eq!(
            share("/api/v1/namespaces/gb/pods/p/log?tailLines=3"),
            ns("gb", false)
        );
        assert_eq!(share("/api/v1/namespaces/gb/configmaps/c"), ns("gb", false));
        assert_eq!(
            share(
                "/api/v1/namespaces/gb/events?fieldSelector=involvedObject.name%3Dc%2CinvolvedObject.uid%3Du"
            ),
            ns("gb", false)
        );
        let of = |scope: Scope| Share {
            scope,
            follow: false,
        };
        assert_eq!(share("/api/v1"), of(Scope::Discovery));
        assert_eq!(share("/apis/apps/v1"), of(Scope::Discovery));
        assert_eq!(share("/api/v1/namespaces/gb"), of(Scope::ClusterScoped));
        assert_eq!(
            share("/apis/rbac.authorization.k8s.io/v1/clusterroles/view"),
            of(Scope::ClusterScoped)
        );
        assert_eq!(ns("gb", true).to_string(), "followed logs in namespace gb");
    }

    #[test]
    fn a_refusal_is_a_kubernetes_status() {
        let s: Value = serde_json::from_slice(&Refusal::forbidden("no").status_json()).unwrap();
        assert_eq!(s["kind"], "Status");
        assert_eq!(s["code"], 403);
        assert_eq!(s["reason"], "Forbidden");
        assert_eq!(s["message"], "no");
    }

    #[test]
    fn owners_are_read_from_the_objects() {
        let pod = json!({ "apiVersion": "v1", "kind": "Pod", "metadata": {
            "namespace": "gb", "name": "ui-5d-x",
            "ownerReferences": [{ "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "ui-5d", "uid": "r" }]
        }});
        assert_eq!(
            ResourceRef::of(&pod),
            Some(ResourceRef::new("v1", "Pod", "gb", "ui-5d-x"))
        );
        assert_eq!(
            owners(&pod),
            vec![ResourceRef::new("apps/v1", "ReplicaSet", "gb", "ui-5d")]
        );
        assert_eq!(
            ResourceRef::new("apps/v1", "ReplicaSet", "gb", "ui-5d").to_string(),
            "ReplicaSet.apps gb/ui-5d"
        );
    }

    #[test]
    fn only_a_copy_aimed_at_its_own_clusters_secret_opens_live_views() {
        let live = "https://live.hub:8444/clusters/c1";
        let d = |v: Value| opens_live_views(Some(&v), "c1", live);
        assert!(d(json!({ "name": "c1", "namespace": "gb" })));
        assert!(d(json!({ "server": "https://live.hub:8444/clusters/c1/" })));
        assert!(!d(json!({ "name": "c2" })));
        assert!(!d(json!({ "server": "https://kubernetes.default.svc" })));
        assert!(!d(json!({ "server": "https://live.hub:8444/clusters/c2" })));
        assert!(!d(json!({ "name": "c1", "server": live })));
        assert!(!opens_live_views(None, "c1", live));
    }

    #[test]
    fn a_live_secret_leaves_without_its_values() {
        let mut s = json!({ "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "db", "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{\"data\":{\"p\":\"aHVudGVy\"}}", "keep": "me" } },
            "data": { "p": "aHVudGVy" }, "stringData": { "q": "hunter" } });
        redact(&mut s);
        assert_eq!(s["data"]["p"], crate::status::tree::REDACTED);
        assert_eq!(s["stringData"]["q"], crate::status::tree::REDACTED);
        assert_eq!(s["metadata"]["annotations"], json!({ "keep": "me" }));
        let mut cm = json!({ "apiVersion": "v1", "kind": "ConfigMap", "data": { "p": "v" } });
        redact(&mut cm);
        assert_eq!(cm["data"]["p"], "v");
    }
}
