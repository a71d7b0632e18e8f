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
//! 4. the destination matches `spec.destinations` (see [`Destination`]),
//!    and no `!` entry excludes it.
//!
//! What "destination" means in the pull model: the namespace is the hub
//! copy's `spec.destination.namespace` as written (it travels unchanged);
//! the cluster is the OCM ManagedCluster the Application is delivered to,
//! matched by `name` entries against the ManagedCluster's name (what the
//! hub's Argo CD cluster Secret of that cluster is named), and by `server`
//! entries against the server the delivered copy names (what the cluster's
//! own Argo CD deploys to: `https://kubernetes.default.svc` unless the
//! `destination-server` annotation says otherwise). The `server` or `name`
//! the user wrote on the hub copy is not used: it is rewritten on delivery,
//! so it would let a tenant pick whatever the project allows.

use argocd_pull_apis::argocd::{Application, ProjectDestination, ProjectSpec, source_repos};
use argocd_pull_apis::keys;

use super::glob;
use super::target::Target;

/// Where an Application deploys, as project destinations see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Destination {
    /// The cluster's name: the ManagedCluster's when the delivered copy
    /// deploys in the cluster itself, the `destination-name` annotation's
    /// when it names another, empty when the `destination-server`
    /// annotation names another (then only `server` entries can allow it:
    /// a tenant writes the annotations, so an entry naming the
    /// ManagedCluster must not let a copy deploy anywhere else).
    pub name: String,
    /// The server the delivered copy names; `None` when it names the
    /// destination by name (the `destination-name` annotation).
    pub server: Option<String>,
    /// The hub copy's `spec.destination.namespace`.
    pub namespace: String,
}

/// The destination of `app` delivered to `target`.
pub fn destination(app: &Application, target: &Target) -> Destination {
    let annotation = |k: &str| {
        app.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(k))
            .filter(|v| !v.is_empty())
    };
    let in_cluster = crate::render::delivered::IN_CLUSTER;
    let (name, server) = match (
        annotation(keys::DESTINATION_NAME),
        annotation(keys::DESTINATION_SERVER),
    ) {
        (Some(name), _) => (name.clone(), None),
        (None, Some(s)) if s != in_cluster => (String::new(), Some(s.clone())),
        (None, _) => (target.cluster.clone(), Some(in_cluster.to_string())),
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
        "application destination server '{server}' and namespace '{namespace}' do not match any of the allowed destinations in project '{project}': the destination is ManagedCluster {cluster:?} (a spec.destinations entry matches it by name {cluster:?}{by_server}) and namespace {namespace:?}; allow it in spec.destinations of AppProject {project:?}"
    )]
    Destination {
        server: String,
        namespace: String,
        project: String,
        cluster: String,
        /// `or by server "..."`, when the delivered copy names a server.
        by_server: String,
    },
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
    let dest = destination(app, target);
    if !destination_permitted(project, &dest) {
        return Err(Refusal::Destination {
            // As Argo CD shows it: the name when named, else the server.
            server: dest.server.clone().unwrap_or_else(|| dest.name.clone()),
            namespace: dest.namespace.clone(),
            project: name.into(),
            cluster: dest.name.clone(),
            by_server: dest
                .server
                .map(|s| format!(" or by server {s:?}"))
                .unwrap_or_default(),
        });
    }
    Ok(())
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

/// Argo CD's `isDestinationMatched`: some entry allows it and no `!` entry
/// excludes it.
pub fn destination_permitted(project: &ProjectSpec, dest: &Destination) -> bool {
    let mut any = false;
    for item in &project.destinations {
        let name_matched =
            !dest.name.is_empty() && matches_allowing_negation(&item.name, &dest.name);
        let server_matched = dest
            .server
            .as_deref()
            .is_some_and(|s| !s.is_empty() && matches_allowing_negation(&item.server, s));
        let namespace_matched = matches_allowing_negation(&item.namespace, &dest.namespace);
        // Argo CD's three cases, its precedence kept: a deny entry on the
        // name denies whatever the namespace; one on the server only where
        // the namespace matches; one on the namespace only where the
        // server matches.
        if (server_matched || name_matched) && namespace_matched {
            any = true;
        } else if (!name_matched && is_deny(&item.name))
            || (!server_matched && is_deny(&item.server) && namespace_matched)
            || (!namespace_matched && is_deny(&item.namespace) && server_matched)
        {
            return false;
        }
    }
    any
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

/// The destinations of `project` that apply on a cluster whose destination
/// is `dest` (ignoring namespaces), rewritten for that cluster's own Argo
/// CD: there the cluster is `in-cluster`, `https://kubernetes.default.svc`.
/// Deny entries that apply to it stay deny entries.
pub fn destinations_on_cluster(
    project: &ProjectSpec,
    cluster: &str,
    server: Option<&str>,
) -> Vec<ProjectDestination> {
    let applies = |item: &ProjectDestination| {
        let by_name = !item.name.is_empty() && matches_allowing_negation(&item.name, cluster);
        let by_server = server
            .is_some_and(|s| !item.server.is_empty() && matches_allowing_negation(&item.server, s));
        by_name || by_server
    };
    project
        .destinations
        .iter()
        .filter(|item| applies(item))
        .map(|item| ProjectDestination {
            name: "in-cluster".into(),
            server: crate::render::delivered::IN_CLUSTER.into(),
            namespace: item.namespace.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::app;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> ProjectSpec {
        serde_json::from_value(v).unwrap()
    }

    fn dest(name: &str, server: Option<&str>, namespace: &str) -> Destination {
        Destination {
            name: name.into(),
            server: server.map(Into::into),
            namespace: namespace.into(),
        }
    }

    const IN: Option<&str> = Some("https://kubernetes.default.svc");

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
        // (project, destination, permitted)
        let cases = [
            (&aaa, dest("c1", IN, "aaa-web"), true),
            (&aaa, dest("c1", IN, "kube-system"), false),
            (&named, dest("dev-1", IN, "x"), true),
            (&named, dest("prod-1", IN, "x"), false),
            (&named, dest("dev-1", None, "x"), true),
            (&deny_ns, dest("c1", IN, "web"), true),
            (&deny_ns, dest("c1", IN, "kube-system"), false),
            (&deny_cluster, dest("dev-1", IN, "web"), true),
            (&deny_cluster, dest("prod-1", IN, "web"), false),
            (&in_cluster_only, dest("any", IN, "app"), true),
            (
                &in_cluster_only,
                dest("any", Some("https://other"), "app"),
                false,
            ),
            (&in_cluster_only, dest("any", None, "app"), false),
            (&spec(json!({})), dest("c1", IN, "x"), false),
        ];
        for (i, (p, d, want)) in cases.into_iter().enumerate() {
            assert_eq!(destination_permitted(p, &d), want, "case {i}: {d:?}");
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

    #[test]
    fn the_server_written_on_the_hub_copy_does_not_count() {
        let p =
            spec(json!({ "destinations": [{ "server": "https://allowed", "namespace": "*" }] }));
        let mut written = app(json!({ "spec": {
            "destination": { "server": "https://allowed", "namespace": "x" } } }));
        assert_eq!(destination(&written, &target()).server, IN.map(Into::into));
        assert!(!destination_permitted(
            &p,
            &destination(&written, &target())
        ));
        // The annotation is what the delivered copy names.
        written
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(keys::DESTINATION_SERVER.into(), "https://allowed".into());
        assert!(destination_permitted(&p, &destination(&written, &target())));
    }

    #[test]
    fn an_entry_naming_the_managed_cluster_allows_only_the_cluster_itself() {
        let p = spec(json!({ "destinations": [{ "name": "cluster1", "namespace": "*" }] }));
        let mut a = app(json!({ "spec": { "destination": { "namespace": "x" } } }));
        assert!(destination_permitted(&p, &destination(&a, &target())));
        let annotate = |a: &mut Application, k: &str, v: &str| {
            let ann = a.metadata.annotations.get_or_insert_default();
            ann.clear();
            ann.insert(k.into(), v.into());
        };
        // The tenant's annotations send the copy elsewhere: the entry
        // naming the ManagedCluster does not allow that.
        annotate(&mut a, keys::DESTINATION_SERVER, "https://prod-ext:6443");
        assert!(!destination_permitted(&p, &destination(&a, &target())));
        annotate(&mut a, keys::DESTINATION_NAME, "other");
        assert!(!destination_permitted(&p, &destination(&a, &target())));
        // Naming the cluster itself by its server is still the cluster.
        annotate(&mut a, keys::DESTINATION_SERVER, IN.unwrap());
        assert!(destination_permitted(&p, &destination(&a, &target())));
    }

    #[test]
    fn destinations_are_rewritten_for_the_clusters_own_argo_cd() {
        let p = spec(json!({ "destinations": [
            { "name": "cluster1", "namespace": "a" },
            { "name": "cluster2", "namespace": "b" },
            { "server": "*", "namespace": "!kube-system" }] }));
        let on = destinations_on_cluster(&p, "cluster1", IN);
        let ns: Vec<&str> = on.iter().map(|d| d.namespace.as_str()).collect();
        assert_eq!(ns, ["a", "!kube-system"]);
        assert!(on.iter().all(|d| d.name == "in-cluster"));
    }
}
