//! Pure arithmetic of the benchmark: reading Prometheus text, and the median
//! with min and max over repeated runs. No clients, so it is unit-tested.

use std::collections::BTreeMap;

/// The sum of every sample of `name` (Prometheus text format) whose label set
/// passes `keep`; `None` when there is no such sample.
pub fn metric_sum(body: &str, name: &str, keep: impl Fn(&str) -> bool) -> Option<f64> {
    let mut sum = None;
    for (labels, value) in samples(body, name) {
        if keep(labels) {
            *sum.get_or_insert(0.0) += value;
        }
    }
    sum
}

/// Every sample of `name`: its label set (without braces) and value.
fn samples<'a>(body: &'a str, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    body.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?;
        let (labels, value) = if let Some(r) = rest.strip_prefix('{') {
            let end = r.find('}')?;
            (&r[..end], &r[end + 1..])
        } else if rest.starts_with(' ') {
            ("", rest)
        } else {
            return None;
        };
        let value = value.split_whitespace().next()?.parse::<f64>().ok()?;
        Some((labels, value))
    })
}

/// The value of label `key` in a label set such as `a="1",b="2"`.
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    labels.split("\",").find_map(|kv| {
        let (k, v) = kv.split_once("=\"")?;
        (k.trim_start_matches(',') == key).then(|| v.trim_end_matches('"'))
    })
}

/// The HTTP method a Kubernetes API verb is sent with, so that our
/// per-verb counter and client-go's per-method one can share a row.
pub fn method_of(verb: &str) -> &'static str {
    match verb.to_ascii_lowercase().as_str() {
        "get" | "list" | "watch" => "GET",
        "create" | "post" => "POST",
        "update" | "put" => "PUT",
        "patch" => "PATCH",
        "delete" | "deletecollection" => "DELETE",
        _ => "other",
    }
}

/// Where a controller counts its API requests.
pub enum RequestMetric {
    /// Ours: `argocd_pull_hub_api_requests_total{verb,resource,code}`.
    Ours,
    /// client-go, as controller-runtime exports it:
    /// `rest_client_requests_total{code,host,method}`.
    ClientGo,
}

/// Requests by HTTP method; `None` when the controller exports no such metric.
pub fn requests_by_method(body: &str, which: RequestMetric) -> Option<BTreeMap<String, f64>> {
    let (name, key) = match which {
        RequestMetric::Ours => ("argocd_pull_hub_api_requests_total", "verb"),
        RequestMetric::ClientGo => ("rest_client_requests_total", "method"),
    };
    let mut out: Option<BTreeMap<String, f64>> = None;
    for (labels, value) in samples(body, name) {
        let method = method_of(label(labels, key).unwrap_or("other"));
        *out.get_or_insert_with(BTreeMap::new)
            .entry(method.to_string())
            .or_default() += value;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_the_samples_it_keeps() {
        let body = "# HELP x\n\
            controller_runtime_reconcile_total{controller=\"application\",result=\"success\"} 10\n\
            controller_runtime_reconcile_total{controller=\"application\",result=\"error\"} 2\n\
            controller_runtime_reconcile_total{controller=\"managedcluster\",result=\"success\"} 50\n\
            controller_runtime_reconcile_total{controller=\"manifestwork\",result=\"requeue\"} 3\n\
            controller_runtime_reconcile_time_seconds_count 99\n\
            argocd_pull_hub_application_reconciles_total 7\n";
        let not_clusters = |l: &str| !l.contains("managedcluster");
        assert_eq!(
            metric_sum(body, "controller_runtime_reconcile_total", not_clusters),
            Some(15.0)
        );
        assert_eq!(
            metric_sum(body, "argocd_pull_hub_application_reconciles_total", |_| {
                true
            }),
            Some(7.0)
        );
        assert_eq!(metric_sum(body, "absent_total", |_| true), None);
    }

    #[test]
    fn counts_requests_by_method_for_both_metrics() {
        let ours = "argocd_pull_hub_api_requests_total{verb=\"list\",resource=\"applications\",code=\"200\"} 3\n\
            argocd_pull_hub_api_requests_total{verb=\"watch\",resource=\"applications\",code=\"200\"} 2\n\
            argocd_pull_hub_api_requests_total{verb=\"patch\",resource=\"applications\",code=\"200\"} 10\n\
            argocd_pull_hub_api_requests_total{verb=\"patch\",resource=\"manifestworks\",code=\"409\"} 1\n";
        let got = requests_by_method(ours, RequestMetric::Ours).unwrap();
        assert_eq!(got["GET"], 5.0);
        assert_eq!(got["PATCH"], 11.0);
        let upstream = "rest_client_requests_total{code=\"200\",host=\"127.0.0.1:6443\",method=\"GET\"} 40\n\
            rest_client_requests_total{code=\"201\",host=\"127.0.0.1:6443\",method=\"POST\"} 7\n\
            rest_client_requests_total{code=\"200\",host=\"127.0.0.1:6443\",method=\"PUT\"} 5\n";
        let got = requests_by_method(upstream, RequestMetric::ClientGo).unwrap();
        assert_eq!(got["GET"], 40.0);
        assert_eq!(got["POST"], 7.0);
        assert_eq!(got["PUT"], 5.0);
        assert!(requests_by_method(upstream, RequestMetric::Ours).is_none());
    }
}
