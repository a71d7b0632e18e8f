//! What a request to the API server is, for the request metrics: the verb
//! as Kubernetes names it (get, list, watch, create, update, patch, delete,
//! deletecollection) and the resource (with its subresource, e.g.
//! `manifestworks/status`). Pure: tested on paths alone.

use http::Method;

/// The verb and resource of a request to `path?query` with `method`.
pub fn classify(method: &Method, path: &str, query: Option<&str>) -> (&'static str, String) {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // /api/v1/... or /apis/<group>/<version>/...
    let rest: &[&str] = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return (verb(method, true, query), "other".into()),
    };
    // namespaces/<ns>/<resource>[/<name>[/<sub>]] or <resource>[/<name>[/<sub>]]
    let rest = match rest {
        ["namespaces", _ns, tail @ ..] if !tail.is_empty() => tail,
        _ => rest,
    };
    let (resource, named) = match rest {
        [] => ("other".to_string(), false),
        [resource] => (resource.to_string(), false),
        [resource, _name] => (resource.to_string(), true),
        [resource, _name, sub, ..] => (format!("{resource}/{sub}"), true),
    };
    (verb(method, named, query), resource)
}

fn verb(method: &Method, named: bool, query: Option<&str>) -> &'static str {
    let watch = query.is_some_and(|q| {
        q.split('&')
            .any(|kv| kv == "watch=true" || kv == "watch=1" || kv == "watch")
    });
    match *method {
        Method::GET if watch => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_verbs_and_resources_from_paths() {
        let cases: &[(Method, &str, Option<&str>, &str, &str)] = &[
            (
                Method::GET,
                "/apis/argoproj.io/v1alpha1/applications",
                Some("labelSelector=x&watch=true&resourceVersion=5"),
                "watch",
                "applications",
            ),
            (
                Method::GET,
                "/apis/argoproj.io/v1alpha1/applications",
                Some("labelSelector=x"),
                "list",
                "applications",
            ),
            (
                Method::GET,
                "/apis/argoproj.io/v1alpha1/namespaces/team/applications/guestbook",
                None,
                "get",
                "applications",
            ),
            (
                Method::PATCH,
                "/apis/argoproj.io/v1alpha1/namespaces/team/applications/guestbook",
                None,
                "patch",
                "applications",
            ),
            (
                Method::PATCH,
                "/apis/work.open-cluster-management.io/v1/namespaces/c1/manifestworks/w/status",
                None,
                "patch",
                "manifestworks/status",
            ),
            (
                Method::POST,
                "/api/v1/namespaces/argocd/events",
                None,
                "create",
                "events",
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/argocd/secrets/s",
                None,
                "delete",
                "secrets",
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/argocd/secrets",
                None,
                "deletecollection",
                "secrets",
            ),
            (
                Method::GET,
                "/api/v1/namespaces",
                None,
                "list",
                "namespaces",
            ),
            (
                Method::GET,
                "/api/v1/namespaces/a",
                None,
                "get",
                "namespaces",
            ),
            (
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/x/leases/l",
                None,
                "update",
                "leases",
            ),
            (Method::GET, "/version", None, "get", "other"),
        ];
        for (method, path, query, verb, resource) in cases {
            assert_eq!(
                classify(method, path, *query),
                (*verb, resource.to_string()),
                "{method} {path}"
            );
        }
    }
}
