//! The one write the live endpoint takes: an exec into a pod, as
//! argocd-server's web terminal asks it (client-go's WebSocket executor,
//! `GET /api/v1/namespaces/<ns>/pods/<pod>/exec?command=...&container=...
//! &stdin=true&stdout=true&stderr=true&tty=true`, upgraded to the
//! `v5.channel.k8s.io` subprotocol). Pure: what is asked, or why it is
//! refused.

use super::Refusal;

/// The subprotocol the endpoint speaks, and asks of the cluster.
pub const PROTOCOL: &str = "v5.channel.k8s.io";

/// At most this many words of a command, each at most
/// [`MAX_COMMAND_WORD`] bytes (argocd-server sends one: a shell).
pub const MAX_COMMAND_WORDS: usize = 8;
pub const MAX_COMMAND_WORD: usize = 256;

/// One exec, as asked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Exec {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub command: Vec<String>,
    pub tty: bool,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
}

/// Whether `path` (without its query, with its leading `/`) is a pod's
/// exec: the namespace and the pod.
pub fn exec_path(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/api/v1/namespaces/")?;
    let mut parts = rest.split('/');
    match (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) {
        (Some(ns), Some("pods"), Some(pod), Some("exec"), None) => Some((ns, pod)),
        _ => None,
    }
}

/// The exec `method` `path` `query` asks for, or why the endpoint refuses
/// it before anything reaches a cluster.
pub fn parse(method: &str, path: &str, query: &str) -> Result<Exec, Refusal> {
    let Some((namespace, pod)) = exec_path(path) else {
        return Err(Refusal::forbidden(format!(
            "{path} is not a pod's exec, the one write the live endpoint takes"
        )));
    };
    if method != "GET" {
        return Err(Refusal::new(
            405,
            format!(
                "an exec is served over WebSocket ({PROTOCOL}), which starts with GET, not {method}"
            ),
        ));
    }
    let name_ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    if !name_ok(namespace) || !name_ok(pod) {
        return Err(Refusal::new(
            400,
            "the namespace or pod is not a valid name",
        ));
    }
    let mut exec = Exec {
        namespace: namespace.into(),
        pod: pod.into(),
        ..Default::default()
    };
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        let on = value == "true" || value == "1";
        match key.as_ref() {
            "command" => exec.command.push(value.into_owned()),
            "container" => exec.container = value.into_owned(),
            "tty" => exec.tty = on,
            "stdin" => exec.stdin = on,
            "stdout" => exec.stdout = on,
            "stderr" => exec.stderr = on,
            other => {
                return Err(Refusal::new(
                    400,
                    format!(
                        "an exec takes command, container, tty, stdin, stdout and stderr, not {other}"
                    ),
                ));
            }
        }
    }
    if exec.command.is_empty()
        || exec.command.len() > MAX_COMMAND_WORDS
        || exec
            .command
            .iter()
            .any(|w| w.is_empty() || w.len() > MAX_COMMAND_WORD)
    {
        return Err(Refusal::new(
            400,
            format!(
                "an exec needs a command of 1 to {MAX_COMMAND_WORDS} words of at most {MAX_COMMAND_WORD} bytes"
            ),
        ));
    }
    if !name_ok(&exec.container) {
        return Err(Refusal::new(400, "an exec needs a valid container name"));
    }
    Ok(exec)
}

/// Why the upgrade request's headers (`upgrade`, `Sec-WebSocket-Version`,
/// `Sec-WebSocket-Protocol`, each as given) cannot be served; `Ok` when
/// they ask for a WebSocket of [`PROTOCOL`].
pub fn check_upgrade(
    upgrade: Option<&str>,
    version: Option<&str>,
    protocols: &[&str],
) -> Result<(), Refusal> {
    let websocket = upgrade.is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
    if !websocket {
        return Err(Refusal::forbidden(format!(
            "the live endpoint serves an exec only over WebSocket ({PROTOCOL}), not {}",
            upgrade.unwrap_or("without an upgrade")
        )));
    }
    if version != Some("13") {
        return Err(Refusal::new(400, "WebSocket version 13 is needed"));
    }
    let offered = protocols
        .iter()
        .flat_map(|p| p.split(','))
        .any(|p| p.trim() == PROTOCOL);
    if !offered {
        return Err(Refusal::new(
            400,
            format!("the live endpoint speaks {PROTOCOL} only; the client offered {protocols:?}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARGOCD: &str = "command=sh&container=main&stderr=true&stdin=true&stdout=true&tty=true";

    #[test]
    fn argocd_servers_exec_is_taken() {
        let e = parse("GET", "/api/v1/namespaces/gb/pods/web-1/exec", ARGOCD).unwrap();
        assert_eq!(e.namespace, "gb");
        assert_eq!(e.pod, "web-1");
        assert_eq!(e.container, "main");
        assert_eq!(e.command, ["sh"]);
        assert!(e.tty && e.stdin && e.stdout && e.stderr);
    }

    #[test]
    fn anything_else_is_refused() {
        let code = |m: &str, p: &str, q: &str| parse(m, p, q).unwrap_err().code;
        let exec = "/api/v1/namespaces/gb/pods/web-1/exec";
        // SPDY's POST: the endpoint speaks WebSocket only.
        assert_eq!(code("POST", exec, ARGOCD), 405);
        assert_eq!(
            code("GET", "/api/v1/namespaces/gb/pods/web-1/attach", ARGOCD),
            403
        );
        assert_eq!(
            code("GET", "/api/v1/namespaces/gb/pods/web-1/exec/x", ARGOCD),
            403
        );
        assert_eq!(
            code("GET", "/api/v1/namespaces/GB/pods/web-1/exec", ARGOCD),
            400
        );
        assert_eq!(
            code("GET", exec, "container=main&stdin=true"),
            400,
            "no command"
        );
        assert_eq!(code("GET", exec, "command=sh"), 400, "no container");
        assert_eq!(code("GET", exec, "command=sh&container=c&input=1"), 400);
        let long = format!("command={}&container=c", "a".repeat(MAX_COMMAND_WORD + 1));
        assert_eq!(code("GET", exec, &long), 400);
    }

    #[test]
    fn the_upgrade_is_a_websocket_of_v5() {
        let v5 = ["v5.channel.k8s.io, v4.channel.k8s.io"];
        assert!(check_upgrade(Some("websocket"), Some("13"), &v5).is_ok());
        assert_eq!(
            check_upgrade(Some("SPDY/3.1"), None, &[]).unwrap_err().code,
            403
        );
        assert_eq!(check_upgrade(None, None, &[]).unwrap_err().code, 403);
        let v4 = ["v4.channel.k8s.io"];
        assert_eq!(
            check_upgrade(Some("websocket"), Some("13"), &v4)
                .unwrap_err()
                .code,
            400
        );
    }
}
