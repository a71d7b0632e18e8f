//! The processes of a test cluster, and a reaper that cleans them up however
//! the test process ends.
//!
//! A `Drop` impl is not enough: clusters shared by all the tests of one
//! binary live in statics, which are never dropped, and a test process can be
//! killed outright. So each cluster starts a tiny `sh` reaper in its own
//! process group, tells it the PID of every child it starts, and keeps the
//! write end of its stdin. When the test process goes away for any reason,
//! the kernel closes that pipe, the reaper reads end-of-file, kills the
//! children and removes the data folder.

use std::fs::File;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

const REAPER: &str = r#"
pids=""
while read -r line; do
  if [ "$line" = "-" ]; then pids=""; else pids="$pids $line"; fi
done
if [ -n "$pids" ]; then kill -KILL $pids 2>/dev/null; fi
rm -rf "$1"
"#;

pub struct Reaper {
    stdin: Option<ChildStdin>,
    child: Child,
}

/// Starts `script` as a reaper named `name` with `args`: a shell in its
/// own process group (a Ctrl-C aimed at the test run must not kill it
/// before it has cleaned up) that reads its stdin until the test process
/// closes it or dies.
pub(crate) fn spawn_reaper(
    script: &str,
    name: &str,
    args: &[&std::ffi::OsStr],
) -> std::io::Result<(Child, Option<ChildStdin>)> {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(name)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()?;
    let stdin = child.stdin.take();
    Ok((child, stdin))
}

impl Reaper {
    /// Starts a reaper that removes `dir` (and kills every watched PID)
    /// when this process exits.
    pub fn start(dir: &Path) -> std::io::Result<Self> {
        let (child, stdin) = spawn_reaper(REAPER, "argocd-pull-reaper", &[dir.as_os_str()])?;
        Ok(Self { stdin, child })
    }

    fn tell(&mut self, line: &str) {
        if let Some(stdin) = self.stdin.as_mut() {
            // The reaper only goes away when we close its stdin; a failed
            // write means it was killed, and then there is nothing to tell.
            let _ = writeln!(stdin, "{line}");
            let _ = stdin.flush();
        }
    }

    /// Stops the reaper once everything it watches is already gone, leaving
    /// `dir` in place when `keep` is set.
    fn finish(&mut self, keep: bool) {
        if keep {
            // Killing the reaper before it reads EOF keeps the folder.
            let _ = self.child.kill();
        } else {
            self.tell("-");
            self.stdin.take();
        }
        let _ = self.child.wait();
    }
}

/// A long-running child process with its output in a log file.
pub struct Proc {
    pub name: &'static str,
    pub log: PathBuf,
    child: Child,
}

impl Proc {
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn stop(&mut self) {
        // SIGKILL: these are throw-away test servers whose data goes too.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The last lines the process logged, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        // Start-up flag dumps say nothing about why a process stopped.
        let all: Vec<&str> = text.lines().filter(|l| !l.contains("] FLAG: ")).collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

/// The processes of one cluster and its data folder, all removed on drop or,
/// failing that, by the reaper when the test process exits.
pub struct Group {
    dir: PathBuf,
    keep: bool,
    reaper: Reaper,
    procs: Vec<Proc>,
}

impl Group {
    pub fn new(dir: PathBuf, keep: bool) -> std::io::Result<Self> {
        let reaper = Reaper::start(if keep { Path::new("") } else { &dir })?;
        Ok(Self {
            dir,
            keep,
            reaper,
            procs: Vec::new(),
        })
    }

    /// Starts `cmd` with stdout and stderr going to `<dir>/<name>.log`.
    pub fn spawn(&mut self, name: &'static str, mut cmd: Command) -> std::io::Result<&mut Proc> {
        let log = self.dir.join(format!("{name}.log"));
        let out = File::create(&log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(0)
            .spawn()?;
        self.reaper.tell(&child.id().to_string());
        self.procs.push(Proc { name, log, child });
        Ok(self.procs.last_mut().expect("just pushed"))
    }

    /// Why the process `name` (or, with `None`, any process of the group)
    /// is no longer running, if it is not: a port clash (to retry on
    /// another port) or an exit with the end of its log.
    pub fn exited(&mut self, name: Option<&str>) -> Option<crate::Error> {
        let proc = self
            .procs
            .iter_mut()
            .filter(|p| name.is_none_or(|n| p.name == n))
            .find_map(|p| (!p.is_running()).then_some(p))?;
        let tail = proc.log_tail(30);
        let lower = tail.to_lowercase();
        // Go, Redis and git daemon each say it their way.
        let clash = lower.contains("address already in use")
            || lower.contains("unable to allocate any listen sockets");
        Some(if clash {
            crate::Error::PortClash(proc.name)
        } else {
            crate::Error::Exited {
                name: proc.name,
                log: tail,
            }
        })
    }

    /// The last lines the process `name` logged.
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        self.procs
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.log_tail(lines))
            .unwrap_or_default()
    }

    /// Has the reaper kill `pid` too, a process this group did not start
    /// (a benchmark's controller, say), should this process die without
    /// stopping it. Stopping it normally is still the caller's job.
    pub fn adopt(&mut self, pid: u32) {
        self.reaper.tell(&pid.to_string());
    }

    /// The process id of the running process `name`, if any.
    pub fn pid(&mut self, name: &str) -> Option<u32> {
        self.procs
            .iter_mut()
            .find(|p| p.name == name)
            .and_then(|p| p.is_running().then(|| p.child.id()))
    }

    /// Kills and forgets the processes named `name` (to restart them).
    pub fn stop(&mut self, name: &str) {
        for p in self.procs.iter_mut().filter(|p| p.name == name) {
            p.stop();
        }
        self.procs.retain(|p| p.name != name);
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // Stop in reverse order of start: the controller-manager before the
        // API server, the API server before etcd.
        for p in self.procs.iter_mut().rev() {
            p.stop();
        }
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        self.reaper.finish(self.keep);
    }
}

/// Waits up to `timeout` until process `name` accepts connections on
/// `addr`. An error if it exits first (`exited` says whether it has: a
/// port clash among the reasons) or does not listen in time (with the end
/// of its log from `log_tail`).
pub(crate) async fn wait_listening(
    name: &'static str,
    addr: std::net::SocketAddr,
    timeout: std::time::Duration,
    exited: impl Fn() -> Option<crate::Error>,
    log_tail: impl Fn() -> String,
) -> crate::Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(e) = exited() {
            return Err(e);
        }
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(crate::Error::Exited {
                name,
                log: format!(
                    "still not listening on {addr} after {timeout:?}:\n{}",
                    log_tail()
                ),
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
