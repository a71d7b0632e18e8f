//! [`Reaper`]: what removes everything of a node once the node is dropped,
//! or once the test process dies however it dies.

use std::path::Path;
use std::process::{Child, ChildStdin};

use crate::Result;
use crate::process::spawn_reaper;

const REAPER: &str = r#"
while read -r line; do :; done
dir=$1 netns=$2
# Processes of this node only: their command lines name its folder.
for p in /proc/[0-9]*; do
  [ "${p#/proc/}" = "$$" ] && continue
  if tr '\0' ' ' < "$p/cmdline" 2>/dev/null | grep -qF -- "$dir"; then kill -KILL "${p#/proc/}" 2>/dev/null; fi
done
sleep 0.2
grep -F " $dir" /proc/mounts | cut -d' ' -f2 | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
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
