//! Pure: Argo CD's AppProject rules, checked on the hub before delivery.
//!
//! The hub's copy of a pull-model Application is dormant: the hub's Argo CD
//! never looks at it, so nothing there refuses an Application its project
//! does not allow. These are the checks Argo CD v3 makes (its AppProject
//! types and `util/argo`), in its order, with its wording:
//!
//! 1. the project exists;
//! 2. the Application's namespace may use it: the control-plane namespace
//!    (the hub's Argo CD namespace) always, another only when one of the
//!    project's `spec.sourceNamespaces` matches it (glob, or `/regexp/`);
//! 3. every source repository (`spec.source`, each of `spec.sources`, the
//!    hydrator's dry source) matches `spec.sourceRepos` (URL globs with `/`
//!    as separator, compared normalized; a `!` entry that matches denies);
//! 4. the destination resolves to a cluster and matches `spec.destinations`
//!    (see [`Destination`]), and no `!` entry excludes it.
//!
//! What "destination" means in the pull model: the cluster's own Argo CD
//! decides, with the delivered copy and the project as that cluster gets it
//! ([`destinations_on_cluster`]); the hub answers as it will. The delivered
//! copy names its destination as the routing annotations say (`server:
//! https://kubernetes.default.svc` without them); the cluster's Argo CD
//! resolves a name or server to one of its clusters before matching, as
//! Argo CD always does, so `in-cluster` and `https://kubernetes.default.svc`
//! are the same cluster and `server: '*'` allows it by either. The project
//! it gets keeps only the entries that apply to the ManagedCluster itself
//! (a `name` entry matching the ManagedCluster's name, a `server` entry
//! matching its in-cluster server), rewritten to that cluster's view of
//! itself: so only the cluster itself can be allowed there. The hub knows
//! of a cluster's Argo CD only the in-cluster every Argo CD has; any other
//! name or server is one only that Argo CD can resolve, and the hub refuses
//! it ([`Refusal::Elsewhere`]): allowing it would deliver the project (and
//! its credentials) for an Application the cluster then refuses, and a
//! tenant writes the annotations. The `server` or `name` the user wrote on
//! the hub copy is not used: it is rewritten on delivery.

use argocd_pull_apis::argocd::{Application, ProjectDestination, ProjectSpec, source_repos};
use argocd_pull_apis::keys;

use super::glob;
use super::target::Target;

/// The server every Argo CD knows its own cluster by.
pub const IN_CLUSTER_SERVER: &str = crate::render::delivered::IN_CLUSTER;
/// The name every Argo CD knows its own cluster by.
pub const IN_CLUSTER_NAME: &str = "in-cluster";

/// The destination of a delivered copy, as the cluster's Argo CD reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Destination {
    /// `spec.destination.name` of the delivered copy: the
    /// `destination-name` annotation.
    pub name: Option<String>,
    /// `spec.destination.server` of the delivered copy: the
    /// `destination-server` annotation, else the in-cluster server.
    pub server: Option<String>,
    /// The hub copy's `spec.destination.namespace` (it travels unchanged).
    pub namespace: String,
}

impl Destination {
    /// Whether the cluster's Argo CD resolves it to its own cluster, as
    /// Argo CD's `GetDestinationServer` does (a server without its trailing
    /// `/`; a name by its cluster's name). `false` also for what only that
    /// Argo CD could resolve: the hub does not know its other clusters.
    pub fn is_the_cluster_itself(&self) -> bool {
        match (&self.name, &self.server) {
            (Some(name), None) => name == IN_CLUSTER_NAME,
            (None, Some(server)) => server.trim_end_matches('/') == IN_CLUSTER_SERVER,
            _ => false,
        }
    }

    /// How Argo CD names it in a refusal: the name when named, else the
    /// server it resolved.
    fn shown(&self) -> String {
        match (&self.name, &self.server) {
            (Some(name), _) => name.clone(),
            (None, Some(server)) => server.trim_end_matches('/').to_string(),
            (None, None) => String::new(),
        }
    }
}

/// The destination of `app` as its delivered copy names it.
pub fn destination(app: &Application) -> Destination {
    let annotation = |k: &str| {
        app.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(k))
            .filter(|v| !v.is_empty())
            .cloned()
    };
    // As `render::delivered` writes it: a name wins over a server.
    let (name, server) = match (
        annotation(keys::DESTINATION_NAME),
        annotation(keys::DESTINATION_SERVER),
    ) {
        (Some(name), _) => (Some(name), None),
        (None, server) => (None, Some(server.unwrap_or(IN_CLUSTER_SERVER.into()))),
    };
    let namespace = app
        .data
        .get("spec")
        .and_then(|s| s.get("destination"))
        .and_then(|d| d.get("namespace"))
        .and_then(|n| n.as_str())
        .unwrap_or_default()
        .to_string();
    Destination {
        name,
        server,
        namespace,
    }
}

/// Why a project does not allow an Application. The messages are Argo CD's,
/// followed by what to change.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "Application referencing project {project} which does not exist: create AppProject {project:?} in namespace {control_plane:?} of the hub, or set spec.project to an existing project"
    )]
    Missing {
        project: String,
        control_plane: String,
    },
    #[error(
        "application '{app}' in namespace '{namespace}' is not allowed to use project {project}: only Applications in namespace {control_plane:?} may use a project whose spec.sourceNamespaces does not match their namespace; add {namespace:?} (or a glob matching it) to spec.sourceNamespaces of AppProject {project:?}, or use a project that lists it"
    )]
    Namespace {
        app: String,
        namespace: String,
        project: String,
        control_plane: String,
    },
    #[error(
        "application repo {repo} is not permitted in project '{project}': add it to spec.sourceRepos of AppProject {project:?} (and make sure no '!' entry denies it)"
    )]
    Repo { repo: String, project: String },
    #[error(
        "application destination {field} {value:?} is not ManagedCluster {cluster:?} itself: the cluster's Argo CD resolves it against its own clusters, which the hub does not know, and AppProject {project:?} as that cluster gets it allows only the cluster itself; remove annotation {annotation} to deploy in the cluster (or set it to {itself:?})"
    )]
    Elsewhere {
        field: &'static str,
        value: String,
        cluster: String,
        project: String,
        annotation: &'static str,
        itself: &'static str,
    },
    #[error(
        "application destination server '{server}' and namespace '{namespace}' do not match any of the allowed destinations in project '{project}': the destination is ManagedCluster {cluster:?} (a spec.destinations entry matches it by name {cluster:?} or by server {IN_CLUSTER_SERVER:?}) and namespace {namespace:?}; allow it in spec.destinations of AppProject {project:?}"
    )]
    Destination {
        server: String,
        namespace: String,
        project: String,
        cluster: String,
    },
}

impl Refusal {
    fn elsewhere(dest: &Destination, cluster: &str, project: &str) -> Self {
        let (field, annotation, itself) = match &dest.name {
            Some(_) => ("name", keys::DESTINATION_NAME, IN_CLUSTER_NAME),
            None => ("server", keys::DESTINATION_SERVER, IN_CLUSTER_SERVER),
        };
        Refusal::Elsewhere {
            field,
            value: dest
                .name
                .clone()
                .or(dest.server.clone())
                .unwrap_or_default(),
            cluster: cluster.into(),
            project: project.into(),
            annotation,
            itself,
        }
    }
}

/// Checks `app`, delivered to `target`, against `project` (named `name`,
/// `None` when it does not exist); `control_plane` is the hub's Argo CD
/// namespace.
pub fn check(
    app: &Application,
    target: &Target,
    name: &str,
    project: Option<&ProjectSpec>,
    control_plane: &str,
) -> Result<(), Refusal> {
    let Some(project) = project else {
        return Err(Refusal::Missing {
            project: name.into(),
            control_plane: control_plane.into(),
        });
    };
    let namespace = app.metadata.namespace.as_deref().unwrap_or_default();
    if !namespace_permitted(project, namespace, control_plane) {
        return Err(Refusal::Namespace {
            app: app.metadata.name.clone().unwrap_or_default(),
            namespace: namespace.into(),
            project: name.into(),
            control_plane: control_plane.into(),
        });
    }
    for repo in source_repos(app) {
        if !source_permitted(project, repo) {
            return Err(Refusal::Repo {
                repo: repo.into(),
                project: name.into(),
            });
        }
    }
    let dest = destination(app);
    if !dest.is_the_cluster_itself() {
        return Err(Refusal::elsewhere(&dest, &target.cluster, name));
    }
    if !cluster_itself_permitted(project, &target.cluster, &dest.namespace) {
        return Err(Refusal::Destination {
            server: dest.shown(),
            namespace: dest.namespace.clone(),
            project: name.into(),
            cluster: target.cluster.clone(),
        });
    }
    Ok(())
}

/// Whether `project`, as ManagedCluster `cluster` gets it
/// ([`destinations_on_cluster`]), lets that cluster's Argo CD deploy in
/// its own cluster, in `namespace`: the one destination the hub allows.
pub fn cluster_itself_permitted(project: &ProjectSpec, cluster: &str, namespace: &str) -> bool {
    let on_cluster = destinations_on_cluster(project, cluster, Some(IN_CLUSTER_SERVER));
    destination_matched(&on_cluster, IN_CLUSTER_NAME, IN_CLUSTER_SERVER, namespace)
}

/// Argo CD's `IsAppNamespacePermitted`.
pub fn namespace_permitted(project: &ProjectSpec, namespace: &str, control_plane: &str) -> bool {
    if namespace.is_empty() || namespace == control_plane {
        return true;
    }
    project.source_namespaces.iter().any(|p| {
        match p
            .strip_prefix('/')
            .and_then(|r| r.strip_suffix('/'))
            .filter(|_| p.len() >= 2)
        {
            Some(re) => regex_matches(re, namespace) || glob::matches(p, namespace, &[]),
            None => glob::matches(p, namespace, &[]),
        }
    })
}

/// A `/regexp/` entry (unanchored, as Argo CD's); one that does not compile
/// or is too large matches nothing.
fn regex_matches(re: &str, text: &str) -> bool {
    regex::RegexBuilder::new(re)
        .size_limit(1 << 20)
        .build()
        .is_ok_and(|r| r.is_match(text))
}

/// Argo CD's `IsSourcePermitted`: some entry matches and no `!` entry
/// denies. As in Argo CD, a deny entry `!x` counts as matching every URL
/// but x: a list with one allows everything else.
pub fn source_permitted(project: &ProjectSpec, repo: &str) -> bool {
    let url = normalize_repo(repo);
    let mut any = false;
    for entry in &project.source_repos {
        let (deny, pattern) = match entry.strip_prefix('!') {
            Some(p) => (true, normalize_repo(p)),
            None => (false, normalize_repo(entry)),
        };
        let matched = if deny {
            !glob::matches(&pattern, &url, &['/'])
        } else {
            pattern == "*" || glob::matches(&pattern, &url, &['/'])
        };
        if matched {
            any = true;
        } else if deny {
            return false;
        }
    }
    any
}

/// A repository URL as Argo CD compares it: trimmed, lower case, SCP-like
/// SSH (`git@host:path`) as `git@host/path`, without a `.git` suffix.
pub fn normalize_repo(url: &str) -> String {
    let mut u = url.trim().to_lowercase();
    if !u.contains("://")
        && let Some((user_host, path)) = u.split_once(':')
        && user_host.contains('@')
        && !path.starts_with('/')
    {
        u = format!("{user_host}/{path}");
    }
    if let Some(s) = u.strip_prefix("ssh://") {
        u = s.to_string();
    }
    u.strip_suffix(".git").map(str::to_string).unwrap_or(u)
}

/// Argo CD's `isDestinationMatched` for the cluster `name` at `server`:
/// some entry allows it and no `!` entry excludes it.
pub fn destination_matched(
    destinations: &[ProjectDestination],
    name: &str,
    server: &str,
    namespace: &str,
) -> bool {
    let mut any = false;
    for item in destinations {
        let m = item_matches(item, name, server, namespace);
        // Argo CD's three cases, its precedence kept: a deny entry on the
        // name denies whatever the namespace; one on the server only where
        // the namespace matches; one on the namespace only where the
        // server matches.
        if (m.server || m.name) && m.namespace {
            any = true;
        } else if (!m.name && is_deny(&item.name))
            || (!m.server && is_deny(&item.server) && m.namespace)
            || (!m.namespace && is_deny(&item.namespace) && m.server)
        {
            return false;
        }
    }
    any
}

/// Which fields of a destinations entry match, as Argo CD computes them.
struct Matched {
    name: bool,
    server: bool,
    namespace: bool,
}

fn item_matches(item: &ProjectDestination, name: &str, server: &str, namespace: &str) -> Matched {
    Matched {
        name: !name.is_empty() && matches_allowing_negation(&item.name, name),
        server: !server.is_empty() && matches_allowing_negation(&item.server, server),
        namespace: matches_allowing_negation(&item.namespace, namespace),
    }
}

fn is_deny(p: &str) -> bool {
    p.starts_with('!')
}

/// Argo CD's `globMatch` with negation: `!p` matches what `p` does not.
fn matches_allowing_negation(pattern: &str, text: &str) -> bool {
    match pattern.strip_prefix('!') {
        Some(p) => !glob::matches(p, text, &[]),
        None => pattern == "*" || glob::matches(pattern, text, &[]),
    }
}

/// The destinations of `project` as the cluster `cluster` gets them: for
/// its own Argo CD, where it is `in-cluster` at `server` (its in-cluster
/// server). Each entry is rewritten so that Argo CD's rule answers there,
/// for the cluster itself, exactly as it answers on the hub's entries for
/// the ManagedCluster named `cluster` at `server`: a `name` entry is
/// matched against the ManagedCluster's name. A field that matches becomes
/// the cluster's own name or server, a `!` entry that does not match
/// becomes a `!` entry that does not match it either, and an entry that can
/// neither allow nor deny it is left out. So a project names ManagedClusters
/// in `name` entries, and no entry naming another cluster travels.
pub fn destinations_on_cluster(
    project: &ProjectSpec,
    cluster: &str,
    server: Option<&str>,
) -> Vec<ProjectDestination> {
    let server = server.unwrap_or(IN_CLUSTER_SERVER);
    project
        .destinations
        .iter()
        .filter_map(|item| on_cluster(item, cluster, server))
        .collect()
}

fn on_cluster(
    item: &ProjectDestination,
    cluster: &str,
    server: &str,
) -> Option<ProjectDestination> {
    let m = item_matches(item, cluster, server, "");
    let field = |matched: bool, pattern: &str, itself: &str| match (matched, is_deny(pattern)) {
        (true, _) => itself.to_string(),
        (false, true) => format!("!{itself}"),
        (false, false) => String::new(),
    };
    let name = field(m.name, &item.name, IN_CLUSTER_NAME);
    let server_field = field(m.server, &item.server, server);
    if name.is_empty() && server_field.is_empty() {
        return None;
    }
    // Naming the cluster by both is the same rule when no field is a `!`
    // entry (only those read an unmatched name or server), and is how
    // Argo CD shows its own cluster.
    let plain = !is_deny(&name) && !is_deny(&server_field) && !is_deny(&item.namespace);
    let (name, server_field) = if plain {
        (IN_CLUSTER_NAME.to_string(), server.to_string())
    } else {
        (name, server_field)
    };
    Some(ProjectDestination {
        name,
        server: server_field,
        namespace: item.namespace.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::app;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> ProjectSpec {
        serde_json::from_value(v).unwrap()
    }

    const IN: &str = IN_CLUSTER_SERVER;

    #[test]
    fn namespaces_need_the_control_plane_or_a_source_namespace() {
        let p = spec(json!({ "sourceNamespaces": ["aaa-*", "/^team-[0-9]+$/", "exact"] }));
        // (namespace, permitted)
        let cases = [
            ("argocd", true),
            ("", true),
            ("aaa-team", true),
            ("bbb-team", false),
            ("team-42", true),
            ("team-x", false),
            ("exact", true),
            ("exactly", false),
        ];
        for (ns, want) in cases {
            assert_eq!(namespace_permitted(&p, ns, "argocd"), want, "{ns}");
        }
        let default = spec(json!({ "sourceRepos": ["*"] }));
        assert!(namespace_permitted(&default, "argocd", "argocd"));
        assert!(!namespace_permitted(&default, "bbb-team", "argocd"));
        assert!(!namespace_permitted(&default, "argocd", "other-argocd"));
        // A regexp that does not compile matches nothing.
        let bad = spec(json!({ "sourceNamespaces": ["/(/"] }));
        assert!(!namespace_permitted(&bad, "x", "argocd"));
    }

    #[test]
    fn source_repos_are_url_globs_with_deny_entries() {
        let p = spec(
            json!({ "sourceRepos": ["https://github.com/org/*", "!https://github.com/org/secret"] }),
        );
        let cases = [
            ("https://github.com/org/app", true),
            ("https://github.com/org/app.git", true),
            ("HTTPS://GitHub.com/Org/App", true),
            ("https://github.com/org/secret", false),
            ("https://github.com/org/secret.git", false),
            // As in Argo CD, a `!` entry also allows all it does not deny.
            ("https://github.com/org/a/b", true),
            ("https://github.com/other/app", true),
        ];
        for (repo, want) in cases {
            assert_eq!(source_permitted(&p, repo), want, "{repo}");
        }
        let allow_only = spec(json!({ "sourceRepos": ["https://github.com/org/*"] }));
        assert!(source_permitted(&allow_only, "https://github.com/org/app"));
        assert!(!source_permitted(&allow_only, "https://github.com/org/a/b"));
        assert!(!source_permitted(
            &allow_only,
            "https://github.com/other/app"
        ));
        let any = spec(json!({ "sourceRepos": ["*"] }));
        assert!(source_permitted(&any, "git@github.com:org/app.git"));
        let none = spec(json!({}));
        assert!(!source_permitted(&none, "https://github.com/org/app"));
        let only_deny = spec(json!({ "sourceRepos": ["!https://evil/*"] }));
        assert!(source_permitted(&only_deny, "https://good/x"));
        assert!(!source_permitted(&only_deny, "https://evil/x"));
        let ssh = spec(json!({ "sourceRepos": ["git@github.com:org/*"] }));
        assert!(source_permitted(&ssh, "git@github.com:org/app.git"));
        assert!(!source_permitted(&ssh, "git@github.com:evil/app.git"));
    }

    #[test]
    fn destinations_match_by_name_or_server_and_namespace_with_denials() {
        let aaa = spec(json!({ "destinations": [{ "server": "*", "namespace": "aaa-*" }] }));
        let named = spec(json!({ "destinations": [{ "name": "dev-*", "namespace": "*" }] }));
        let deny_ns = spec(json!({ "destinations": [
            { "server": "*", "namespace": "*" },
            { "server": "*", "namespace": "!kube-system" }] }));
        let deny_cluster = spec(json!({ "destinations": [
            { "name": "*", "namespace": "*" },
            { "name": "!prod-*", "namespace": "*" }] }));
        let in_cluster_only = spec(json!({ "destinations": [
            { "server": "https://kubernetes.default.svc", "namespace": "app" }] }));
        // (project, cluster name, server, namespace, permitted)
        let cases = [
            (&aaa, "c1", IN, "aaa-web", true),
            (&aaa, "c1", IN, "kube-system", false),
            (&named, "dev-1", IN, "x", true),
            (&named, "prod-1", IN, "x", false),
            (&named, "dev-1", "", "x", true),
            (&deny_ns, "c1", IN, "web", true),
            (&deny_ns, "c1", IN, "kube-system", false),
            (&deny_cluster, "dev-1", IN, "web", true),
            (&deny_cluster, "prod-1", IN, "web", false),
            (&in_cluster_only, "any", IN, "app", true),
            (&in_cluster_only, "any", "https://other", "app", false),
            (&spec(json!({})), "c1", IN, "x", false),
        ];
        for (i, (p, name, server, ns, want)) in cases.into_iter().enumerate() {
            assert_eq!(
                destination_matched(&p.destinations, name, server, ns),
                want,
                "case {i}: {name} {server} {ns}"
            );
        }
    }

    fn target() -> Target {
        Target {
            cluster: "cluster1".into(),
            app_namespace: "aaa-team".into(),
        }
    }

    #[test]
    fn the_checks_come_in_argo_cds_order_with_its_words() {
        let a = |ns: &str, spec: serde_json::Value| {
            let mut a = app(json!({ "spec": spec }));
            a.metadata.namespace = Some(ns.into());
            a
        };
        let ok = json!({ "project": "p",
            "source": { "repoURL": "https://git/x" },
            "destination": { "server": "https://kubernetes.default.svc", "namespace": "aaa-web" } });
        let p = spec(
            json!({ "sourceNamespaces": ["aaa-*"], "sourceRepos": ["https://git/*"],
            "destinations": [{ "server": "*", "namespace": "aaa-*" }] }),
        );
        assert_eq!(
            check(
                &a("aaa-team", ok.clone()),
                &target(),
                "p",
                Some(&p),
                "argocd"
            ),
            Ok(())
        );
        let missing =
            check(&a("aaa-team", ok.clone()), &target(), "p", None, "argocd").unwrap_err();
        assert!(
            missing
                .to_string()
                .starts_with("Application referencing project p which does not exist"),
            "{missing}"
        );
        let ns = check(
            &a("bbb-team", ok.clone()),
            &target(),
            "p",
            Some(&p),
            "argocd",
        )
        .unwrap_err();
        assert!(
            ns.to_string().starts_with(
                "application 'guestbook' in namespace 'bbb-team' is not allowed to use project p"
            ),
            "{ns}"
        );
        let mut bad_repo = ok.clone();
        bad_repo["sources"] =
            json!([{ "repoURL": "https://git/x" }, { "repoURL": "https://evil/y" }]);
        let repo = check(&a("aaa-team", bad_repo), &target(), "p", Some(&p), "argocd").unwrap_err();
        assert!(
            repo.to_string()
                .starts_with("application repo https://evil/y is not permitted in project 'p'"),
            "{repo}"
        );
        let mut bad_dest = ok.clone();
        bad_dest["destination"]["namespace"] = json!("kube-system");
        let d = check(&a("aaa-team", bad_dest), &target(), "p", Some(&p), "argocd").unwrap_err();
        assert!(
            d.to_string().starts_with(
                "application destination server 'https://kubernetes.default.svc' and namespace 'kube-system' do not match any of the allowed destinations in project 'p'"
            ),
            "{d}"
        );
        assert!(d.to_string().contains("ManagedCluster \"cluster1\""), "{d}");
    }

    fn annotated(pairs: &[(&str, &str)], namespace: &str) -> Application {
        let mut a = app(json!({ "spec": {
            "destination": { "server": "https://written-by-the-tenant", "namespace": namespace } } }));
        a.metadata.namespace = Some("argocd".into());
        let ann = a.metadata.annotations.get_or_insert_default();
        ann.clear();
        for (k, v) in pairs {
            ann.insert((*k).into(), (*v).into());
        }
        a
    }

    fn allowed(p: &ProjectSpec, a: &Application) -> Result<(), Refusal> {
        check(a, &target(), "p", Some(p), "argocd")
    }

    #[test]
    fn the_destination_written_on_the_hub_copy_does_not_count() {
        let p = spec(json!({ "sourceRepos": ["*"],
            "destinations": [{ "server": "https://written-by-the-tenant", "namespace": "*" }] }));
        let a = annotated(&[], "x");
        assert_eq!(destination(&a).server.as_deref(), Some(IN));
        assert!(matches!(allowed(&p, &a), Err(Refusal::Destination { .. })));
    }

    #[test]
    fn a_name_or_server_is_resolved_to_the_cluster_before_matching() {
        let stock = spec(json!({ "sourceRepos": ["*"],
            "destinations": [{ "server": "*", "namespace": "*" }] }));
        let by_name = spec(json!({ "sourceRepos": ["*"],
            "destinations": [{ "name": "cluster1", "namespace": "*" }] }));
        for p in [&stock, &by_name] {
            for pairs in [
                vec![],
                vec![(keys::DESTINATION_NAME, "in-cluster")],
                vec![(keys::DESTINATION_SERVER, "https://kubernetes.default.svc/")],
            ] {
                assert_eq!(allowed(p, &annotated(&pairs, "x")), Ok(()), "{pairs:?}");
            }
        }
        // What only the cluster's Argo CD could resolve is refused, and the
        // refusal says which annotation to change.
        for (k, v) in [
            (keys::DESTINATION_NAME, "spoke-local"),
            (keys::DESTINATION_SERVER, "https://prod-ext:6443"),
        ] {
            let r = allowed(&stock, &annotated(&[(k, v)], "x")).unwrap_err();
            assert!(matches!(r, Refusal::Elsewhere { .. }), "{r}");
            assert!(r.to_string().contains(k), "{r}");
        }
    }

    #[test]
    fn destinations_are_rewritten_for_the_clusters_own_argo_cd() {
        let p = spec(json!({ "destinations": [
            { "name": "cluster1", "namespace": "a" },
            { "name": "cluster2", "namespace": "b" },
            { "server": "*", "namespace": "!kube-system" },
            { "name": "!prod-*", "namespace": "c" },
            { "name": "!cluster1", "namespace": "*" },
            { "server": "!https://kubernetes.default.svc", "namespace": "d" }] }));
        let on = destinations_on_cluster(&p, "cluster1", Some(IN));
        let entries: Vec<(&str, &str, &str)> = on
            .iter()
            .map(|d| (d.name.as_str(), d.server.as_str(), d.namespace.as_str()))
            .collect();
        assert_eq!(
            entries,
            [
                ("in-cluster", IN, "a"),
                ("", IN, "!kube-system"),
                ("in-cluster", IN, "c"),
                ("!in-cluster", "", "*"),
                ("", "!https://kubernetes.default.svc", "d"),
            ]
        );
        // The rewritten entries answer for the cluster itself as the hub's
        // do for the ManagedCluster.
        for ns in ["a", "b", "c", "d", "kube-system"] {
            assert_eq!(
                destination_matched(&on, IN_CLUSTER_NAME, IN, ns),
                destination_matched(&p.destinations, "cluster1", IN, ns),
                "{ns}"
            );
        }
    }
}
