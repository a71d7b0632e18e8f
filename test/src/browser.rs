//! Headless Chromium (Debian's `chromium`, installed by `make tools`) driven
//! over the DevTools protocol, so that a test can use a web UI as a person
//! does: open a page, type into its fields, click, read what the page shows
//! and take a screenshot.
//!
//! Chromium runs with a fresh profile in a folder of its own, every
//! background service off, and listens for DevTools on a loopback port it
//! picks itself (`--remote-debugging-port=0`, read back from its
//! `DevToolsActivePort` file). Killed when the [`Browser`] is dropped, or by
//! its reaper when the test process dies.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::process::Group;
use crate::{Error, Result, paths};

const START_TIMEOUT: Duration = Duration::from_secs(30);
/// One DevTools call (a navigation returns before the page has loaded).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A headless Chromium.
pub struct Browser {
    dir: PathBuf,
    devtools: std::net::SocketAddr,
    group: Mutex<Group>,
}

impl Browser {
    /// Starts Chromium on `about:blank` with a window of `width` x `height`
    /// (what a screenshot shows); returns once its DevTools port answers.
    pub async fn start(width: u32, height: u32) -> Result<Self> {
        let chromium = which("chromium").ok_or_else(|| Error::Command {
            command: "chromium".into(),
            output: "Debian's chromium is not installed: run `make tools` as root, or `apt-get install -y chromium`".into(),
        })?;
        let base = paths::run_dir();
        std::fs::create_dir_all(&base)?;
        let dir = tempfile::Builder::new()
            .prefix("chromium-")
            .tempdir_in(&base)?
            .keep();
        let profile = dir.join("profile");
        let keep = std::env::var_os("ARGOCD_PULL_KEEP_DATA").is_some();
        let mut group = Group::new(dir.clone(), keep)?;
        let mut cmd = std::process::Command::new(chromium);
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
        ])
        .arg(format!("--window-size={width},{height}"))
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("about:blank");
        group.spawn("chromium", cmd)?;
        let port_file = profile.join("DevToolsActivePort");
        let deadline = Instant::now() + START_TIMEOUT;
        let port = loop {
            if let Some(port) = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|s| s.lines().next().and_then(|l| l.trim().parse::<u16>().ok()))
            {
                break port;
            }
            if let Some(e) = group.exited(Some("chromium")) {
                return Err(e);
            }
            if Instant::now() > deadline {
                return Err(Error::Exited {
                    name: "chromium",
                    log: format!(
                        "no DevTools port after {START_TIMEOUT:?}:\n{}",
                        group.log_tail("chromium", 30)
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        Ok(Self {
            dir,
            devtools: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            group: Mutex::new(group),
        })
    }

    /// The page Chromium opened at start.
    pub async fn page(&self) -> Result<Page> {
        let (code, body) = devtools_get(self.devtools, "/json/list").await?;
        let targets: Value = serde_json::from_str(&body).map_err(|e| Error::Command {
            command: format!("GET http://{}/json/list", self.devtools),
            output: format!("{code} {e}: {body}"),
        })?;
        let url = targets
            .as_array()
            .into_iter()
            .flatten()
            .find(|t| t["type"] == "page")
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .ok_or_else(|| Error::Command {
                command: format!("GET http://{}/json/list", self.devtools),
                output: format!("no page among the targets: {body}"),
            })?
            .to_string();
        let (ws, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .map_err(|e| Error::Command {
                command: format!("DevTools WebSocket {url}"),
                output: e.to_string(),
            })?;
        let mut page = Page { ws, next_id: 0 };
        page.call("Page.enable", json!({})).await?;
        page.call("Runtime.enable", json!({})).await?;
        Ok(page)
    }

    /// The last lines Chromium logged.
    pub fn log_tail(&self, lines: usize) -> String {
        self.group
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .log_tail("chromium", lines)
    }

    /// Its folder (profile and log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// One page (tab) of a [`Browser`].
pub struct Page {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_id: u64,
}

impl Page {
    /// Calls DevTools method `method` and returns its result; events that
    /// arrive meanwhile are dropped.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value> {
        self.next_id += 1;
        let id = self.next_id;
        let failed = |output: String| Error::Command {
            command: format!("DevTools {method}"),
            output,
        };
        let request = json!({ "id": id, "method": method, "params": params }).to_string();
        self.ws
            .send(Message::text(request))
            .await
            .map_err(|e| failed(e.to_string()))?;
        let reply = tokio::time::timeout(CALL_TIMEOUT, async {
            while let Some(msg) = self.ws.next().await {
                let msg = msg.map_err(|e| failed(e.to_string()))?;
                let Message::Text(text) = msg else { continue };
                let v: Value = serde_json::from_str(&text).map_err(|e| failed(e.to_string()))?;
                if v["id"] == id {
                    return Ok(v);
                }
            }
            Err(failed("the DevTools connection closed".into()))
        })
        .await
        .map_err(|_| failed(format!("no answer within {CALL_TIMEOUT:?}")))??;
        if let Some(e) = reply.get("error") {
            return Err(failed(e.to_string()));
        }
        Ok(reply["result"].clone())
    }

    /// Opens `url`.
    pub async fn navigate(&mut self, url: &str) -> Result<()> {
        let r = self.call("Page.navigate", json!({ "url": url })).await?;
        if let Some(e) = r.get("errorText") {
            return Err(Error::Command {
                command: format!("open {url}"),
                output: e.to_string(),
            });
        }
        Ok(())
    }

    /// The value of JavaScript expression `expr` in the page (a promise is
    /// awaited).
    pub async fn eval(&mut self, expr: &str) -> Result<Value> {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({ "expression": expr, "returnByValue": true, "awaitPromise": true }),
            )
            .await?;
        if let Some(e) = r.get("exceptionDetails") {
            return Err(Error::Command {
                command: format!("evaluate {expr}"),
                output: e.to_string(),
            });
        }
        Ok(r["result"]["value"].clone())
    }

    /// Polls `expr` until it yields something other than `null`, `false`
    /// or `""`, and returns that; on timeout fails with `what` and the
    /// page's text.
    pub async fn wait_for(&mut self, what: &str, expr: &str, within: Duration) -> Result<Value> {
        let deadline = Instant::now() + within;
        loop {
            let v = self.eval(expr).await.unwrap_or(Value::Null);
            if !(v.is_null() || v == false || v == "") {
                return Ok(v);
            }
            if Instant::now() > deadline {
                let text = self.text().await.unwrap_or_default();
                return Err(Error::Command {
                    command: format!("waiting for {what}"),
                    output: format!("not within {within:?}; the page shows:\n{text}"),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The text the page shows (`document.body.innerText`).
    pub async fn text(&mut self) -> Result<String> {
        Ok(self
            .eval("document.body ? document.body.innerText : ''")
            .await?
            .as_str()
            .unwrap_or_default()
            .to_string())
    }

    /// Focuses the element `selector` finds and types `text` into it, as
    /// a keyboard would.
    pub async fn type_into(&mut self, selector: &str, text: &str) -> Result<()> {
        self.on_element(selector, "focus", &format!("type into {selector}"))
            .await?;
        self.call("Input.insertText", json!({ "text": text }))
            .await?;
        Ok(())
    }

    /// Clicks the element `selector` finds.
    pub async fn click(&mut self, selector: &str) -> Result<()> {
        self.on_element(selector, "click", &format!("click {selector}"))
            .await
    }

    /// Calls `method` (`focus`, `click`) on the element `selector` finds;
    /// an error names `what` was tried when there is no such element.
    async fn on_element(&mut self, selector: &str, method: &str, what: &str) -> Result<()> {
        let found = self
            .eval(&format!(
                "(() => {{ const e = document.querySelector({s}); if (!e) return false; e.{method}(); return true; }})()",
                s = serde_json::to_string(selector).expect("a string serializes")
            ))
            .await?;
        if found != true {
            return Err(Error::Command {
                command: what.to_string(),
                output: format!("no such element; the page shows:\n{}", self.text().await?),
            });
        }
        Ok(())
    }

    /// Saves what the window shows as a PNG at `path`.
    pub async fn screenshot(&mut self, path: &Path) -> Result<()> {
        let r = self
            .call("Page.captureScreenshot", json!({ "format": "png" }))
            .await?;
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().unwrap_or_default())
            .map_err(|e| Error::Command {
                command: "Page.captureScreenshot".into(),
                output: e.to_string(),
            })?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, png)?;
        Ok(())
    }
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// A GET of Chromium's DevTools HTTP endpoint. It keeps the connection open
/// whatever the request says, so the body is read by its Content-Length.
async fn devtools_get(addr: std::net::SocketAddr, path: &str) -> Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let failed = |output: String| Error::Command {
        command: format!("GET http://{addr}{path}"),
        output,
    };
    let read = async {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        loop {
            let n = s.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                if body.len() >= length {
                    let code = head.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
                    return Ok::<_, std::io::Error>((code, body.to_string()));
                }
            }
        }
        Ok((0, String::from_utf8_lossy(&buf).into_owned()))
    };
    tokio::time::timeout(CALL_TIMEOUT, read)
        .await
        .map_err(|_| failed(format!("no answer within {CALL_TIMEOUT:?}")))?
        .map_err(|e| failed(e.to_string()))
}
