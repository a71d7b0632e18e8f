//! [`Reaper`]: what removes everything of a node once the node is dropped,
//! or once the test process dies however it dies.

use std::path::Path;
use std::process::{Child, ChildStdin};

use crate::Result;
use crate::process::spawn_reaper;

const REAPER: &str = r#"
while read -r line; do :; done
dir=$1 netns=$2
# Processes of this node only: their command lines name its folder, or
# something in it (not a folder whose name starts with this one's, such as
# node 10's when this is node 1).
for p in /proc/[0-9]*; do
  [ "${p#/proc/}" = "$$" ] && continue
  if tr '\0' ' ' < "$p/cmdline" 2>/dev/null | grep -qF -e "$dir/" -e "$dir "; then kill -KILL "${p#/proc/}" 2>/dev/null; fi
done
sleep 0.2
grep -F -e " $dir/" -e " $dir " /proc/mounts | cut -d' ' -f2 | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
ip netns delete "$netns" 2>/dev/null
# Containers' processes (pause, the pods') name no folder: they are found
# by the node's cgroups, killed, and the cgroups removed once empty.
if [ -f "$dir/cgroup-root" ]; then
  root=$(cat "$dir/cgroup-root")
  for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
    left=""
    for h in /sys/fs/cgroup/*/"$root"; do
      [ -d "$h" ] || continue
      left=1
      find "$h" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u | xargs -r kill -KILL 2>/dev/null
      find "$h" -depth -type d -exec rmdir {} \; 2>/dev/null
    done
    [ -z "$left" ] && break
    sleep 0.25
  done
fi
rm -rf "$dir"
"#;

/// A shell in its own process group, reading a pipe from the test process:
/// when the pipe closes (the reaper is dropped, or the test process dies)
/// it kills every process whose command line names the node's folder,
/// unmounts what is left under it, deletes the network namespace, empties
/// the node's cgroups and removes the folder.
pub(super) struct Reaper {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Reaper {
    /// Starts the reaper of the node in folder `dir` and namespace `netns`
    /// (which need not exist yet).
    pub(super) fn start(dir: &Path, netns: &str) -> Result<Self> {
        let args = [dir.as_os_str(), netns.as_ref()];
        let (child, stdin) = spawn_reaper(REAPER, "argocd-pull-node-reaper", &args)?;
        Ok(Self { child, stdin })
    }
}

impl Drop for Reaper {
    /// Closes the pipe and waits until the reaper is done.
    fn drop(&mut self) {
        self.stdin.take();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::Reaper;
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Child, Command, Stdio};

    /// A process that waits (on its stdin) with `arg` on its command line.
    fn sleeper(arg: &std::path::Path) -> Child {
        Command::new("cat")
            .arg("-")
            .arg(arg)
            .stdin(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// Node 1's reaper kills what names node 1's folder and leaves node 10's
    /// alone, though the one folder's name starts with the other's.
    #[test]
    fn a_reaper_kills_its_nodes_processes_and_not_those_of_a_folder_named_alike() {
        let dirs = tempfile::tempdir().unwrap();
        let mine = dirs.path().join("apn-reapertest-1-1");
        let alike = dirs.path().join("apn-reapertest-1-10");
        std::fs::create_dir_all(&mine).unwrap();
        std::fs::create_dir_all(&alike).unwrap();
        let mut in_mine = sleeper(&mine.join("containerd.sock"));
        let mut named_mine = sleeper(&mine);
        let mut in_alike = sleeper(&alike.join("containerd.sock"));
        // The netns does not exist: deleting it fails quietly.
        drop(Reaper::start(&mine, "argocd-pull-reapertest-none").unwrap());
        // The reaper has finished (drop waits for it): its kills are done.
        let alike_alive = matches!(in_alike.try_wait(), Ok(None));
        let _ = in_alike.kill();
        let _ = in_alike.wait();
        let mine_status = in_mine.wait().unwrap();
        let named_status = named_mine.wait().unwrap();
        assert!(alike_alive, "node 10's process is left alone");
        // Killed, not ended by the EOF `wait` gives them.
        let killed = |s: std::process::ExitStatus| s.signal() == Some(9);
        assert!(
            killed(mine_status) && killed(named_status),
            "node 1's processes are killed"
        );
        assert!(
            !mine.exists() && alike.exists(),
            "only node 1's folder is removed"
        );
    }
}
