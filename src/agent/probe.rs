//! The preflight probe: ask the real container runtime (podman or docker) whether it can run a
//! container, and which image the runner would run, without ever pulling.
//!
//! Why a probe at all: a runtime binary on `PATH` says nothing about a missing OCI runtime, an
//! unwritable run root or a broken storage driver. `<runtime> info` initialises the runtime and
//! catches those cheaply; `create` and `run` go further for those who want it. A failure is
//! reported in the runtime's own words (the stderr line that says why, unframed by
//! `runtime_message`), because that is what an operator can act on, and every command is
//! bounded by a timeout because a hung runtime must not hang the runner's start-up.

use super::disk::{self, DiskFigures, Role, Thresholds};
use super::runner_images::WantedImage;
pub use super::runtime_message::last_error_line;
use crate::domain::digest::ImageDigest;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;
use tokio::process::Command;

/// How far the probe goes. Each depth includes the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum Depth {
    /// `<runtime> info`: the runtime initialises (OCI runtime, run root, storage driver).
    #[default]
    Info,
    /// Also create and remove a container from the image (`create --pull=never`, `rm`).
    Create,
    /// Also start one (`run --rm --pull=never <image> true`): catches runtimes that can create
    /// a container but not start it. The image must contain `true`.
    Run,
}

/// Which command-line dialect the runtime speaks; they differ only in `info`'s template.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    Podman,
    Docker,
}

/// A container runtime to probe: a name looked up on `PATH`, or a path to an executable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Runtime {
    program: PathBuf,
    /// What messages and the attestation call it: the program's file name.
    name: String,
    flavour: Flavour,
}

impl Runtime {
    /// `podman`, `docker`, or a path such as `/usr/local/bin/podman-wrapper`. A file name
    /// containing `docker` speaks docker's dialect; anything else podman's.
    pub fn new(spec: &str) -> Self {
        let program = PathBuf::from(spec);
        let name = program
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| spec.to_string());
        let flavour = if name.contains("docker") {
            Flavour::Docker
        } else {
            Flavour::Podman
        };
        Runtime {
            program,
            name,
            flavour,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Given as a path rather than a name to look up on `PATH`.
    fn is_path(&self) -> bool {
        self.program.components().count() > 1
    }

    /// `info`'s template: the version, a tab, and where the runtime keeps its images and
    /// containers (the directory whose disk fills up). A tab, because a path may hold spaces
    /// and a version does not.
    fn info_template(&self) -> &'static str {
        match self.flavour {
            Flavour::Podman => "{{.Version.Version}}\t{{.Store.GraphRoot}}",
            Flavour::Docker => "{{.ServerVersion}}\t{{.DockerRootDir}}",
        }
    }
}

impl std::str::FromStr for Runtime {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim().is_empty() {
            return Err("the runtime must not be empty".into());
        }
        Ok(Runtime::new(s))
    }
}

/// What to probe and how.
#[derive(Clone, Debug)]
pub struct ProbeSpec {
    pub runtime: Runtime,
    /// The image reference the runner is configured with; `None` probes the runtime only.
    pub image: Option<String>,
    /// Every image the runner may run (the first `--image`, the others, and those its forge
    /// runner's configuration names), each attested in `images`; an absent one is attested
    /// absent, not a failure.
    pub images: Vec<WantedImage>,
    pub depth: Depth,
    /// The bound on each runtime command.
    pub timeout: Duration,
    /// The runner's work directory, whose disk is measured beside the runtime's storage.
    pub work_dir: Option<PathBuf>,
    /// Below these the probe fails.
    pub disk: Thresholds,
}

/// Why the runtime cannot run a container, in words fit for `cannot run a container with
/// <runtime>: <message>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeFailure {
    pub message: String,
    /// The failing command's exit status, when it exited.
    pub exit_code: Option<i32>,
}

/// The image the runner would run, as the runtime resolved it locally.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageFacts {
    pub reference: String,
    /// The local image ID (podman: the config digest), as a full digest.
    pub id: Option<String>,
    /// The repo (manifest) digest, when the runtime knows one.
    pub digest: Option<String>,
}

/// The probe's result: what the attestation's `probe` and `image` claims are made of.
#[derive(Clone, Debug)]
pub struct ProbeReport {
    pub runtime: String,
    pub runtime_version: Option<String>,
    /// When the probe began, in milliseconds since the epoch. The start, not the end, because
    /// the runtime's state was observed somewhere in between and the earlier bound is the one
    /// that cannot overstate freshness.
    pub checked_at_ms: i64,
    pub outcome: Result<(), ProbeFailure>,
    pub image: Option<ImageFacts>,
    pub depth: Depth,
    /// The runtime's storage and the work directory, as measured (the attestation's
    /// `probe.disk`); empty when neither was.
    pub disk: Vec<DiskFigures>,
    /// Each of `ProbeSpec::images`, as found locally (the attestation's `images`).
    pub images: Vec<LocalImage>,
}

/// One of the runner's several images, as the runtime has it locally (or not).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalImage {
    pub wanted: WantedImage,
    /// `None` when the image is not present locally (it is attested absent).
    pub facts: Option<ImageFacts>,
}

impl ProbeReport {
    pub fn ok(&self) -> bool {
        self.outcome.is_ok()
    }

    /// The one line an operator reads: `podman 4.3.1 ok; image sha256:…` or
    /// `cannot run a container with podman: <the runtime's words>`.
    pub fn summary(&self) -> String {
        match &self.outcome {
            Ok(()) => {
                let mut line = self.runtime.clone();
                if let Some(v) = &self.runtime_version {
                    line.push(' ');
                    line.push_str(v);
                }
                line.push_str(" ok");
                match self.depth {
                    Depth::Info => {}
                    Depth::Create => line.push_str(" (created and removed a container)"),
                    Depth::Run => line.push_str(" (ran a container)"),
                }
                if let Some(id) = self.image.as_ref().and_then(|i| i.id.as_deref()) {
                    line.push_str("; image ");
                    line.push_str(id);
                }
                for d in &self.disk {
                    line.push_str(&format!(
                        "; {} free on {}",
                        disk::human_bytes(d.free_bytes),
                        d.path
                    ));
                }
                line
            }
            Err(f) => failure_line(&self.runtime, &f.message),
        }
    }
}

/// `cannot run a container with <runtime>: <message>`, the same sentence the service puts in a
/// `probe_failed` refusal, so that the journal and the service say the same thing.
pub fn failure_line(runtime: &str, message: &str) -> String {
    format!("cannot run a container with {runtime}: {message}")
}

/// Probes the runtime. Never pulls an image.
pub async fn run(spec: &ProbeSpec) -> ProbeReport {
    let checked_at_ms = now_ms();
    let mut report = ProbeReport {
        runtime: spec.runtime.name.clone(),
        runtime_version: None,
        checked_at_ms,
        outcome: Ok(()),
        image: spec.image.as_ref().map(|r| ImageFacts {
            reference: r.clone(),
            id: None,
            digest: None,
        }),
        depth: spec.depth,
        disk: Vec::new(),
        images: Vec::new(),
    };
    report.outcome = probe_steps(spec, &mut report).await;
    report
}

async fn probe_steps(spec: &ProbeSpec, report: &mut ProbeReport) -> Result<(), ProbeFailure> {
    let rt = &spec.runtime;
    let out = invoke(spec, "info", &["info", "--format", rt.info_template()]).await?;
    let (version, storage) = parse_info(&out.stdout);
    report.runtime_version = version;
    report.disk = measure_disks(storage.as_deref(), spec.work_dir.as_deref())?;
    if let Some(message) = report.disk.iter().find_map(|d| spec.disk.shortfall(d)) {
        return Err(ProbeFailure {
            message,
            exit_code: None,
        });
    }

    let primary = match spec.image.as_deref() {
        None => None,
        Some(image_ref) => match inspect(spec, image_ref).await? {
            Some(facts) => Some(facts),
            None => {
                return Err(ProbeFailure {
                    message: format!(
                        "image {image_ref} is not present locally (preflight never pulls)"
                    ),
                    exit_code: None,
                });
            }
        },
    };
    report.image = primary.clone();
    for wanted in &spec.images {
        let facts = match &primary {
            Some(p) if p.reference == wanted.reference => Some(p.clone()),
            _ => inspect(spec, &wanted.reference).await?,
        };
        report.images.push(LocalImage {
            wanted: wanted.clone(),
            facts,
        });
    }
    let Some(image_ref) = spec.image.as_deref() else {
        return Ok(());
    };

    // A label, so that an operator can find a container a killed probe left behind.
    let label = "io.leasegate.preflight=true";
    match spec.depth {
        Depth::Info => {}
        Depth::Create => {
            let created = invoke(
                spec,
                "create",
                &[
                    "create",
                    "--pull=never",
                    "--label",
                    label,
                    image_ref,
                    "true",
                ],
            )
            .await?;
            let id = first_line(&created.stdout).unwrap_or_default().to_string();
            if id.is_empty() {
                return Err(ProbeFailure {
                    message: format!("{} create printed no container ID", rt.name),
                    exit_code: created.status.code(),
                });
            }
            invoke(spec, "rm", &["rm", &id]).await?;
        }
        Depth::Run => {
            invoke(
                spec,
                "run",
                &[
                    "run",
                    "--rm",
                    "--pull=never",
                    "--label",
                    label,
                    image_ref,
                    "true",
                ],
            )
            .await?;
        }
    }
    Ok(())
}

/// `image inspect` of `image_ref`: its facts, or `None` when it is not present locally.
async fn inspect(spec: &ProbeSpec, image_ref: &str) -> Result<Option<ImageFacts>, ProbeFailure> {
    let template = "{{.Id}}{{range .RepoDigests}} {{.}}{{end}}";
    let out = invoke_raw(
        spec,
        "image inspect",
        &["image", "inspect", "--format", template, image_ref],
    )
    .await?;
    if !out.status.success() {
        if is_image_missing(&out.stderr) {
            return Ok(None);
        }
        return Err(runtime_failure(&spec.runtime, "image inspect", &out));
    }
    parse_inspect(image_ref, &out.stdout)
        .map(Some)
        .map_err(|message| ProbeFailure {
            message,
            exit_code: None,
        })
}

/// What a runtime command printed and how it ended.
struct Output {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs one runtime command and fails on a non-zero exit.
async fn invoke(spec: &ProbeSpec, step: &str, args: &[&str]) -> Result<Output, ProbeFailure> {
    let out = invoke_raw(spec, step, args).await?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(runtime_failure(&spec.runtime, step, &out))
    }
}

/// Runs one runtime command, bounded by the timeout. A command that cannot be started or does
/// not answer is a failure; its exit status is the caller's to judge.
async fn invoke_raw(spec: &ProbeSpec, step: &str, args: &[&str]) -> Result<Output, ProbeFailure> {
    let rt = &spec.runtime;
    let mut cmd = Command::new(&rt.program);
    cmd.args(args.iter().map(OsString::from))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Dropping the future on timeout kills the runtime instead of leaving it behind.
        .kill_on_drop(true);
    let child = cmd.spawn().map_err(|e| spawn_failure(rt, &e))?;
    match tokio::time::timeout(spec.timeout, child.wait_with_output()).await {
        Err(_) => Err(ProbeFailure {
            message: format!(
                "{} {step} did not answer within {} s",
                rt.name,
                spec.timeout.as_secs_f64()
            ),
            exit_code: None,
        }),
        Ok(Err(e)) => Err(ProbeFailure {
            message: format!("{} {step} could not be read: {e}", rt.name),
            exit_code: None,
        }),
        Ok(Ok(out)) => Ok(Output {
            status: out.status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }),
    }
}

fn spawn_failure(rt: &Runtime, e: &std::io::Error) -> ProbeFailure {
    let message = match e.kind() {
        std::io::ErrorKind::NotFound if rt.is_path() => {
            format!("{} is not installed (no such file)", rt.program.display())
        }
        std::io::ErrorKind::NotFound => {
            format!("{} is not installed (not found on PATH)", rt.name)
        }
        std::io::ErrorKind::PermissionDenied => {
            format!(
                "{} is not executable (permission denied)",
                rt.program.display()
            )
        }
        _ => format!("{} could not be started: {e}", rt.program.display()),
    };
    ProbeFailure {
        message,
        exit_code: None,
    }
}

/// A failed command in the runtime's own words: the line of its stderr that says why, without
/// podman's framing (`runtime_message`).
fn runtime_failure(rt: &Runtime, step: &str, out: &Output) -> ProbeFailure {
    let message = match last_error_line(&out.stderr) {
        Some(line) => line,
        None => match out.status.code() {
            Some(code) => format!("{} {step} failed with exit status {code}", rt.name),
            None => format!("{} {step} was killed by a signal", rt.name),
        },
    };
    ProbeFailure {
        message,
        exit_code: out.status.code(),
    }
}

/// `info`'s `<version>\t<storage>` line. An older runtime, or a wrapper, may print the
/// version alone: the storage is then unknown and not measured.
fn parse_info(stdout: &str) -> (Option<String>, Option<PathBuf>) {
    let Some(line) = first_line(stdout) else {
        return (None, None);
    };
    let (version, storage) = match line.split_once('\t') {
        Some((v, s)) => (v.trim(), Some(s.trim())),
        None => (line, None),
    };
    let storage = storage.filter(|s| s.starts_with('/')).map(PathBuf::from);
    let version = (!version.is_empty()).then(|| version.to_string());
    (version, storage)
}

/// The runtime's storage and the work directory, measured. Storage that is not on this
/// machine (a docker daemon reached over `DOCKER_HOST`) is left out; a work directory the
/// operator named must be measurable.
fn measure_disks(
    storage: Option<&Path>,
    work_dir: Option<&Path>,
) -> Result<Vec<DiskFigures>, ProbeFailure> {
    let fail = |message| ProbeFailure {
        message,
        exit_code: None,
    };
    let mut figures = Vec::new();
    if let Some(path) = storage.filter(|p| p.exists()) {
        figures.push(disk::measure(path, Role::Storage).map_err(fail)?);
    }
    if let Some(path) = work_dir {
        figures.push(disk::measure(path, Role::WorkDir).map_err(fail)?);
    }
    Ok(figures)
}

fn is_image_missing(stderr: &str) -> bool {
    let s = stderr.to_ascii_lowercase();
    s.contains("image not known") || s.contains("no such image")
}

fn first_line(s: &str) -> Option<&str> {
    s.lines().map(str::trim).find(|l| !l.is_empty())
}

/// Reads `image inspect`'s `<id> <repo>@<digest> …` line. podman prints a bare 64-hex ID,
/// docker `sha256:<hex>`; both become `sha256:<hex>`. Of the repo digests, the one whose
/// repository is the configured reference's is preferred, then the first.
pub fn parse_inspect(reference: &str, stdout: &str) -> Result<ImageFacts, String> {
    let line = first_line(stdout).ok_or("image inspect printed nothing")?;
    let mut fields = line.split_whitespace();
    let raw_id = fields.next().unwrap_or_default();
    let id = normalise_image_id(raw_id)
        .ok_or_else(|| format!("image inspect gave an ID that is not a full digest: {raw_id}"))?;
    let repo_digests: Vec<(&str, &str)> = fields.filter_map(|f| f.split_once('@')).collect();
    let wanted = repository_of(reference);
    let digest = repo_digests
        .iter()
        .find(|(repo, _)| repo_matches(repo, wanted))
        .or_else(|| repo_digests.first())
        .and_then(|(_, d)| ImageDigest::parse(d).ok())
        .map(|d| d.as_str().to_string());
    Ok(ImageFacts {
        reference: reference.to_string(),
        id: Some(id),
        digest,
    })
}

/// `sha256:<64 hex>` from either spelling of an image ID, or `None`.
pub fn normalise_image_id(raw: &str) -> Option<String> {
    let candidate = if raw.len() == 64 && !raw.contains(':') {
        format!("sha256:{raw}")
    } else {
        raw.to_string()
    };
    ImageDigest::parse(&candidate)
        .ok()
        .map(|d| d.as_str().to_string())
}

/// The repository part of a reference: without `@digest`, and without a `:tag` after the last
/// `/` (a `:` before it is a registry port).
fn repository_of(reference: &str) -> &str {
    let without_digest = reference.split('@').next().unwrap_or(reference);
    let last_slash = without_digest.rfind('/').map_or(0, |i| i + 1);
    match without_digest[last_slash..].find(':') {
        Some(colon) => &without_digest[..last_slash + colon],
        None => without_digest,
    }
}

/// Runtimes expand short names (`alpine` → `docker.io/library/alpine`), so a repo digest's
/// repository matches when it equals the wanted one or ends with `/<wanted>`.
fn repo_matches(repo: &str, wanted: &str) -> bool {
    repo == wanted
        || repo
            .strip_suffix(wanted)
            .is_some_and(|head| head.ends_with('/'))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "ab18ead3fcae10744bfa6eac32515d9181e11701a7e02ff04d0b0c0c448f27ab";
    const DIGEST: &str = "sha256:821b9a0e488f210219f31b6ab39f8ec77054be77882b67e3f9ceb9a53c9de985";

    #[test]
    fn image_ids_become_full_digests() {
        assert_eq!(normalise_image_id(HEX), Some(format!("sha256:{HEX}")));
        assert_eq!(
            normalise_image_id(&format!("sha256:{HEX}")),
            Some(format!("sha256:{HEX}"))
        );
        assert_eq!(normalise_image_id("ab18ead3fcae"), None);
        assert_eq!(normalise_image_id(&HEX.to_uppercase()), None);
    }

    #[test]
    fn inspect_output_gives_id_and_the_matching_repo_digest() {
        let other = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
        let out =
            format!("{HEX} mirror.example/ci/runner@{other} registry.example/ci/runner@{DIGEST}\n");
        let facts = parse_inspect("registry.example/ci/runner:stable", &out).unwrap();
        assert_eq!(facts.id, Some(format!("sha256:{HEX}")));
        assert_eq!(facts.digest.as_deref(), Some(DIGEST));

        let facts = parse_inspect("unrelated:1", &out).unwrap();
        assert_eq!(
            facts.digest.as_deref(),
            Some(other),
            "the first when none matches"
        );

        let facts = parse_inspect(
            "alpine",
            &format!("sha256:{HEX} docker.io/library/alpine@{DIGEST}"),
        )
        .unwrap();
        assert_eq!(facts.digest.as_deref(), Some(DIGEST));

        let facts = parse_inspect("local/x:1", &format!("{HEX}\n")).unwrap();
        assert_eq!(facts.digest, None);

        assert!(parse_inspect("x", "").is_err());
        assert!(parse_inspect("x", "deadbeef").is_err());
    }

    #[test]
    fn repositories_ignore_tags_digests_and_keep_ports() {
        assert_eq!(
            repository_of("registry:5000/ci/runner:stable"),
            "registry:5000/ci/runner"
        );
        assert_eq!(
            repository_of("registry:5000/ci/runner"),
            "registry:5000/ci/runner"
        );
        assert_eq!(repository_of(&format!("alpine@{DIGEST}")), "alpine");
        assert!(repo_matches("docker.io/library/alpine", "alpine"));
        assert!(!repo_matches("docker.io/library/xalpine", "alpine"));
    }

    #[test]
    fn info_gives_the_version_and_where_the_storage_is() {
        assert_eq!(
            parse_info("5.4.2\t/var/lib/containers/storage\n"),
            (
                Some("5.4.2".into()),
                Some(PathBuf::from("/var/lib/containers/storage"))
            )
        );
        assert_eq!(
            parse_info("27.3.1\t/srv/docker root\n"),
            (
                Some("27.3.1".into()),
                Some(PathBuf::from("/srv/docker root"))
            )
        );
        // A wrapper that prints the version alone, or a path that is not one.
        assert_eq!(
            parse_info("9.9.9-fake\n"),
            (Some("9.9.9-fake".into()), None)
        );
        assert_eq!(parse_info("1.0\t<no value>\n"), (Some("1.0".into()), None));
        assert_eq!(parse_info(""), (None, None));
    }

    #[test]
    fn runtimes_by_name_or_path() {
        let rt = Runtime::new("podman");
        assert_eq!(
            (rt.name(), rt.is_path(), rt.flavour),
            ("podman", false, Flavour::Podman)
        );
        let rt = Runtime::new("/opt/bin/docker-wrapper");
        assert_eq!(
            (rt.name(), rt.is_path(), rt.flavour),
            ("docker-wrapper", true, Flavour::Docker)
        );
    }
}
