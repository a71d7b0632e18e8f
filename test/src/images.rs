//! argocd-pull's container images as a user gets them: OCI archives built
//! by `deploy/images/build.sh` (what `make images` runs), opened, unpacked
//! and run by runc, the OCI runtime under every kubelet here. Nothing
//! about an image is taken on trust: digests are checked, and a container
//! runs with the image's own user, entrypoint and environment, a read-only
//! root and no capabilities, as the Deployments ask.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::{Error, Result, paths};

/// The images `deploy/` names, by the binary each carries.
pub const NAMES: [&str; 2] = ["hub-controller", "spoke-agent"];

/// One image archive, opened and checked.
#[derive(Clone, Debug)]
pub struct Image {
    /// `argocd-pull-hub-controller`
    pub repository: String,
    pub archive: PathBuf,
    /// Every `repository:tag` the archive names (version, version-commit).
    pub references: Vec<String>,
    /// The image configuration (`config.User`, `config.Entrypoint`, ...).
    pub config: Value,
    /// The layer blobs, bottom first, as files inside `dir`.
    pub layers: Vec<PathBuf>,
    /// Where the archive was unpacked.
    pub dir: PathBuf,
}

/// Builds both images from the binaries in `bin_dir` (a Cargo profile's
/// folder) into `out`, and opens them. `release` names binaries of another
/// commit of this repository (version and commit); `None`: this workspace.
pub fn build(
    bin_dir: &Path,
    profile: &str,
    out: &Path,
    release: Option<(&str, &str)>,
) -> Result<Vec<Image>> {
    let script = paths::workspace_dir().join("deploy/images/build.sh");
    let mut command = Command::new("bash");
    command
        .arg(&script)
        .args(["--profile", profile, "--bin-dir"])
        .arg(bin_dir)
        .arg("--out")
        .arg(out);
    if let Some((version, commit)) = release {
        command.args(["--version", version, "--commit", commit]);
    }
    let output = command
        .env("ARGOCD_PULL_CACHE", paths::cache_dir())
        // Debug binaries are large; the fastest gzip keeps the build short.
        .env(
            "ARGOCD_PULL_IMAGE_GZIP",
            if profile == "release" { "9" } else { "1" },
        )
        .stdin(Stdio::null())
        .output()?;
    if !output.status.success() {
        return Err(command_error("deploy/images/build.sh", &output));
    }
    NAMES
        .iter()
        .map(|n| open(&out.join(format!("argocd-pull-{n}.oci.tar"))))
        .collect()
}

/// Builds one image (`hub-controller`, `spoke-agent`, or the harness's
/// `pause`) from the binary of that name in `bin_dir`, and opens it.
pub fn build_one(bin_dir: &Path, name: &str, out: &Path) -> Result<Image> {
    let script = paths::workspace_dir().join("deploy/images/build.sh");
    let output = Command::new("bash")
        .arg(&script)
        .args(["--profile", "debug", "--bin-dir"])
        .arg(bin_dir)
        .arg("--out")
        .arg(out)
        .arg(name)
        .env("ARGOCD_PULL_CACHE", paths::cache_dir())
        .env("ARGOCD_PULL_IMAGE_GZIP", "1")
        .stdin(Stdio::null())
        .output()?;
    if !output.status.success() {
        return Err(command_error("deploy/images/build.sh", &output));
    }
    open(&out.join(format!("argocd-pull-{name}.oci.tar")))
}

/// The images of this test binary's own debug build, built once into
/// `target/test-images/p<pid>/` (the binaries Cargo built for the tests).
pub async fn shared() -> Result<&'static [Image]> {
    static IMAGES: tokio::sync::OnceCell<Vec<Image>> = tokio::sync::OnceCell::const_new();
    IMAGES
        .get_or_try_init(|| async {
            let bin = paths::own_binary("hub-controller")?;
            paths::own_binary("spoke-agent")?;
            build_debug(&bin, test_images()?, None).await
        })
        .await
        .map(Vec::as_slice)
}

/// The previous release's images (`PREVIOUS_RELEASE` in
/// `test/tools/versions.env`, tagged with its version and commit), built
/// once into `target/test-images/p<pid>/previous/` from the binaries
/// `test/tools/build.sh` builds from this repository's history.
pub async fn previous() -> Result<&'static [Image]> {
    static IMAGES: tokio::sync::OnceCell<Vec<Image>> = tokio::sync::OnceCell::const_new();
    IMAGES
        .get_or_try_init(|| async {
            let bin = paths::previous_binary("hub-controller")?;
            paths::previous_binary("spoke-agent")?;
            let release = (paths::previous_release(), paths::previous_release_commit());
            build_debug(&bin, test_images()?.join("previous"), Some(release)).await
        })
        .await
        .map(Vec::as_slice)
}

/// `target/test-images/p<pid>/`, beside the tests' own binaries: this
/// process's own, because test binaries run side by side and [`open`]
/// unpacks beside each archive. What processes that have ended left there
/// is removed first.
fn test_images() -> Result<PathBuf> {
    let root = paths::own_binary("hub-controller")?
        .parent()
        .and_then(Path::parent)
        .expect("target/debug sits in target/")
        .join("test-images");
    remove_ended(&root);
    Ok(root.join(format!("p{}", std::process::id())))
}

/// Removes what `root` holds but the folders of live processes (`p<pid>`).
fn remove_ended(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let live = name
            .strip_prefix('p')
            .and_then(|p| p.parse::<u32>().ok())
            .is_some_and(|pid| {
                pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists()
            });
        if !live {
            let path = e.path();
            let _ = match path.is_dir() {
                true => std::fs::remove_dir_all(&path),
                false => std::fs::remove_file(&path),
            };
        }
    }
}

/// [`build`] of the debug binaries in the folder of `bin` into `out`, off
/// the async runtime.
async fn build_debug(
    bin: &Path,
    out: PathBuf,
    release: Option<(String, String)>,
) -> Result<Vec<Image>> {
    let bin_dir = bin
        .parent()
        .expect("a binary sits in a folder")
        .to_path_buf();
    tokio::task::spawn_blocking(move || {
        let release = release.as_ref().map(|(v, c)| (v.as_str(), c.as_str()));
        build(&bin_dir, "debug", &out, release)
    })
    .await
    .expect("the image build does not panic")
}

/// Unpacks and checks an OCI archive: the index, every blob's digest and
/// size, one manifest for all its tags.
pub fn open(archive: &Path) -> Result<Image> {
    let dir = archive.with_extension("d");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    run_ok(
        Command::new("tar")
            .arg("-xf")
            .arg(archive)
            .arg("-C")
            .arg(&dir),
    )?;
    let invalid = |why: String| Error::Command {
        command: format!("open {}", archive.display()),
        output: why,
    };
    let layout = read_json(&dir.join("oci-layout"))?;
    if layout["imageLayoutVersion"] != "1.0.0" {
        return Err(invalid(format!("oci-layout is {layout}")));
    }
    let index = read_json(&dir.join("index.json"))?;
    let entries = index["manifests"].as_array().cloned().unwrap_or_default();
    let mut references = Vec::new();
    let mut manifest_digest = None;
    for e in &entries {
        let digest = e["digest"].as_str().unwrap_or_default().to_string();
        if *manifest_digest.get_or_insert(digest.clone()) != digest {
            return Err(invalid("the tags name different manifests".into()));
        }
        references.push(
            e["annotations"]["org.opencontainers.image.ref.name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
    }
    let manifest_desc = entries
        .first()
        .ok_or_else(|| invalid("index.json names no manifest".into()))?;
    let manifest = serde_json::from_slice::<Value>(&checked_blob(&dir, manifest_desc)?)
        .map_err(|e| invalid(e.to_string()))?;
    let config = serde_json::from_slice::<Value>(&checked_blob(&dir, &manifest["config"])?)
        .map_err(|e| invalid(e.to_string()))?;
    let mut layers = Vec::new();
    for l in manifest["layers"].as_array().cloned().unwrap_or_default() {
        checked_blob(&dir, &l)?;
        layers.push(blob_path(&dir, &l));
    }
    let repository = references
        .first()
        .and_then(|r| r.split(':').next())
        .unwrap_or_default()
        .to_string();
    Ok(Image {
        repository,
        archive: archive.to_path_buf(),
        references,
        config,
        layers,
        dir,
    })
}

impl Image {
    /// The tag `deploy/` names: the workspace version.
    pub fn version_reference(&self) -> String {
        format!("{}:{}", self.repository, env!("CARGO_PKG_VERSION"))
    }

    /// The layers applied in order into `rootfs`.
    pub fn unpack(&self, rootfs: &Path) -> Result<()> {
        std::fs::create_dir_all(rootfs)?;
        for layer in &self.layers {
            run_ok(
                Command::new("tar")
                    .arg("-xzf")
                    .arg(layer)
                    .arg("-C")
                    .arg(rootfs)
                    .arg("--numeric-owner"),
            )?;
        }
        Ok(())
    }

    /// Runs the image's entrypoint with `args` in a runc container, the way
    /// the Deployments ask for it (read-only root, no capabilities, no new
    /// privileges, the image's user), with no network but loopback, and
    /// rlimits at the ones this process has (runc cannot raise them here).
    /// Waits for it to exit.
    pub fn run(&self, args: &[&str]) -> Result<Output> {
        let runc = paths::bin_dir().join("runc");
        if !runc.exists() {
            return Err(Error::MissingTool(runc));
        }
        let bundle = tempfile::Builder::new()
            .prefix("argocd-pull-runc-")
            .tempdir()?;
        let rootfs = bundle.path().join("rootfs");
        self.unpack(&rootfs)?;
        std::fs::write(
            bundle.path().join("config.json"),
            serde_json::to_vec_pretty(&self.runtime_spec(args)).expect("JSON values serialise"),
        )?;
        static N: AtomicUsize = AtomicUsize::new(0);
        let id = format!(
            "argocd-pull-{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            self.repository
        );
        let state = bundle.path().join("state");
        let output = Command::new(&runc)
            .arg("--root")
            .arg(&state)
            .args(["run", "--bundle"])
            .arg(bundle.path())
            .arg(&id)
            .stdin(Stdio::null())
            .output();
        // A container left behind (the test process killed mid-run) is
        // removed with its bundle: `runc run` waits for it, so only a kill
        // of this process can leave one, and its state is in the bundle.
        let _ = Command::new(&runc)
            .arg("--root")
            .arg(&state)
            .args(["delete", "--force", &id])
            .output();
        Ok(output?)
    }

    /// An OCI runtime spec from the image's configuration, locked down like
    /// the Deployments' security contexts.
    pub fn runtime_spec(&self, args: &[&str]) -> Value {
        let c = &self.config["config"];
        let (uid, gid) = c["User"]
            .as_str()
            .and_then(|u| u.split_once(':'))
            .map(|(u, g)| (u.parse::<u32>().unwrap_or(0), g.parse::<u32>().unwrap_or(0)))
            .unwrap_or((0, 0));
        let mut process_args: Vec<Value> = c["Entrypoint"].as_array().cloned().unwrap_or_default();
        process_args.extend(args.iter().map(|a| json!(a)));
        let (nofile, nproc) = (rlimit("Max open files"), rlimit("Max processes"));
        json!({
            "ociVersion": "1.0.2",
            "process": {
                "terminal": false,
                "user": { "uid": uid, "gid": gid },
                "args": process_args,
                "env": c["Env"],
                "cwd": c["WorkingDir"].as_str().filter(|w| !w.is_empty()).unwrap_or("/"),
                "capabilities": { "bounding": [], "effective": [], "permitted": [], "ambient": [] },
                "rlimits": [
                    { "type": "RLIMIT_NOFILE", "hard": nofile, "soft": nofile },
                    { "type": "RLIMIT_NPROC", "hard": nproc, "soft": nproc },
                ],
                "noNewPrivileges": true,
            },
            "root": { "path": "rootfs", "readonly": true },
            "hostname": "argocd-pull",
            "mounts": [
                { "destination": "/proc", "type": "proc", "source": "proc" },
                { "destination": "/dev", "type": "tmpfs", "source": "tmpfs",
                  "options": ["nosuid", "strictatime", "mode=755", "size=65536k"] },
                { "destination": "/dev/pts", "type": "devpts", "source": "devpts",
                  "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"] },
                { "destination": "/dev/shm", "type": "tmpfs", "source": "shm",
                  "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"] },
                { "destination": "/sys", "type": "sysfs", "source": "sysfs",
                  "options": ["nosuid", "noexec", "nodev", "ro"] },
            ],
            "linux": {
                "namespaces": [
                    { "type": "pid" }, { "type": "network" }, { "type": "ipc" },
                    { "type": "uts" }, { "type": "mount" },
                ],
                "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
                "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
            },
        })
    }
}

/// This process's hard limit `name` from /proc/self/limits (runc may only
/// keep or lower it), at most 1024.
fn rlimit(name: &str) -> u64 {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            l.lines().find(|x| x.starts_with(name)).and_then(|x| {
                x[name.len()..]
                    .split_whitespace()
                    .nth(1)
                    .and_then(|h| h.parse().ok())
            })
        })
        .unwrap_or(1024u64)
        .min(1024)
}

fn blob_path(dir: &Path, desc: &Value) -> PathBuf {
    let digest = desc["digest"].as_str().unwrap_or_default();
    dir.join("blobs")
        .join(digest.replacen(':', "/", 1).replace("..", ""))
}

fn checked_blob(dir: &Path, desc: &Value) -> Result<Vec<u8>> {
    let path = blob_path(dir, desc);
    let bytes = std::fs::read(&path)?;
    let digest = format!("sha256:{:x}", Sha256::digest(&bytes));
    let size = desc["size"].as_u64();
    if desc["digest"] != digest.as_str() || size != Some(bytes.len() as u64) {
        return Err(Error::Command {
            command: format!("check {}", path.display()),
            output: format!(
                "descriptor {desc} does not match the blob ({digest}, {} bytes)",
                bytes.len()
            ),
        });
    }
    Ok(bytes)
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read(path)?;
    serde_json::from_slice(&text).map_err(|e| Error::Command {
        command: format!("read {}", path.display()),
        output: e.to_string(),
    })
}

fn run_ok(cmd: &mut Command) -> Result<Output> {
    let output = cmd.stdin(Stdio::null()).output()?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(command_error(&format!("{cmd:?}"), &output))
    }
}

fn command_error(command: &str, output: &Output) -> Error {
    Error::Command {
        command: command.to_string(),
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    }
}
