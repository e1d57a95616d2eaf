//! Recycling a runner once per expected image set, not once a minute.
//!
//! The heartbeat exits 3 when the service answers `"action": "recycle"` (the runner is not on
//! its pool's current image), and the shipped units restart the runner's unit on that status,
//! then the heartbeat after `RestartSec`. When the restart does not bring the new image (nothing
//! pulled it, the registry was down), the next heartbeat hears "recycle" again: without a
//! memory, the runner's unit would be restarted every minute, ending whatever job it ran, for
//! as long as the image stays missing.
//!
//! So the heartbeat remembers, in a file beside the runner's state file
//! (`runner.json` → `runner.recycled.json`), the expected set it last asked to recycle for,
//! and for a runner of several images the current set of each image it was to pull
//! (`expected_images`): a pool that describes only `images` has no set of its own, and one
//! of its entries rolling on (by its operator, or its registry) is a new set all the same.
//! Asked to recycle for that same set again, it stays up and says at WARN what it is waiting
//! for (the runner to come onto that image: pull it, restart the runner). A set it has not
//! recycled for yet (the pool rolled on) is recycled for once more. The memory is forgotten
//! when the service says the runner is on its pool's current image, so a pool that later rolls
//! back to an image recycled for before is recycled for again.

use super::client::{Action, ExpectedImage, HeartbeatAnswer};
use super::exit::Exit;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often the heartbeat repeats, at WARN, what it waits for.
const WAITING_WARN_EVERY: Duration = Duration::from_secs(600);

/// What the memory file holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recycled {
    /// The pool's expected set the runner was recycled for, sorted.
    pub expected_image_ids: Vec<String>,
    /// When (RFC 3339), for the operator reading the file.
    pub recycled_at: String,
    /// The image the runner ran then.
    #[serde(default)]
    pub running: Option<String>,
    /// The current set of each of its several images it was to pull, by ref, each sorted
    /// (none in a memory written before several images).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expected_images: Vec<ExpectedImage>,
}

/// The heartbeat's memory of its last recycle, and its decisions.
pub struct Recycler {
    path: PathBuf,
    /// When the heartbeat last said at WARN what it waits for.
    warned_waiting: Option<Instant>,
}

/// `ids` as a set: sorted, without repeats.
fn as_set(ids: &[String]) -> Vec<String> {
    let mut set = ids.to_vec();
    set.sort();
    set.dedup();
    set
}

/// Images' sets, each as a set, by ref: comparable whatever order the service sent them in.
fn as_sets(images: &[ExpectedImage]) -> Vec<ExpectedImage> {
    let mut sets: Vec<ExpectedImage> = images
        .iter()
        .map(|i| ExpectedImage {
            image_ref: i.image_ref.clone(),
            expected_image_ids: as_set(&i.expected_image_ids),
        })
        .collect();
    sets.sort_by(|a, b| a.image_ref.cmp(&b.image_ref));
    sets.dedup();
    sets
}

impl Recycler {
    /// The memory of the runner whose state file is `state`: a file beside it.
    pub fn beside(state: &Path) -> Self {
        let stem = state
            .file_stem()
            .map_or_else(|| "runner".into(), |s| s.to_string_lossy().into_owned());
        Recycler {
            path: state.with_file_name(format!("{stem}.recycled.json")),
            warned_waiting: None,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the file says, if it says anything readable (an unreadable file is said at WARN
    /// and taken as no memory: recycling once too often beats never).
    pub fn remembered(&self) -> Option<Recycled> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot read the memory of the last recycle");
                return None;
            }
        };
        match serde_json::from_str(&text) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "the memory of the last recycle does not parse; ignoring it");
                None
            }
        }
    }

    fn remember(&self, recycled: &Recycled) -> std::io::Result<()> {
        let tmp = self.path.with_extension("json.tmp");
        let mut text = serde_json::to_string_pretty(recycled).expect("serialises");
        text.push('\n');
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&tmp, &self.path)
    }

    fn forget(&self) {
        match std::fs::remove_file(&self.path) {
            Ok(()) => tracing::info!(
                path = %self.path.display(),
                "the runner is on its pool's current image; the next new image will be recycled for again"
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot remove the memory of the last recycle")
            }
        }
    }

    /// What the heartbeat does after `answer`, `running` being the image it reported: exit
    /// with `Exit::Recycle`, or carry on.
    pub fn after(&mut self, answer: &HeartbeatAnswer, running: Option<&str>) -> Option<Exit> {
        if answer.image_current == Some(true) {
            if self.path.exists() {
                self.forget();
            }
            self.warned_waiting = None;
            return None;
        }
        if answer.action != Action::Recycle {
            return None;
        }
        let expected = as_set(&answer.expected_image_ids);
        let images = as_sets(&answer.expected_images);
        let wanted = expected.join(" or ");
        let pull = answer.pull.join(", ");
        if let Some(before) = self.remembered().filter(|r| {
            as_set(&r.expected_image_ids) == expected && as_sets(&r.expected_images) == images
        }) {
            let due = self
                .warned_waiting
                .is_none_or(|at| at.elapsed() >= WAITING_WARN_EVERY);
            if due {
                self.warned_waiting = Some(Instant::now());
                tracing::warn!(
                    runner_id = %answer.runner_id,
                    running = running.unwrap_or("-"),
                    expected = %wanted,
                    pull = %pull,
                    recycled_at = %before.recycled_at,
                    memory = %self.path.display(),
                    "waiting for this runner to come onto its pool's current image: it was \
                     recycled for it already and still runs another; pull the image and restart \
                     the runner (it is not recycled again for the same image)"
                );
            }
            return None;
        }
        tracing::warn!(
            runner_id = %answer.runner_id,
            running = running.unwrap_or("-"),
            expected = %wanted,
            pull = %pull,
            "the service asks to recycle this runner onto its pool's current image; exiting with status {}",
            Exit::Recycle as u8
        );
        let recycled = Recycled {
            expected_image_ids: expected,
            recycled_at: crate::domain::time::Millis::now().rfc3339(),
            running: running.map(str::to_string),
            expected_images: images,
        };
        if let Err(e) = self.remember(&recycled) {
            tracing::warn!(
                path = %self.path.display(),
                error = %e,
                "cannot remember this recycle: the next start of the heartbeat asks to recycle again"
            );
        }
        Some(Exit::Recycle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn answer(action: Action, current: Option<bool>, expected: &[&str]) -> HeartbeatAnswer {
        HeartbeatAnswer {
            runner_id: "r-1".into(),
            status: "healthy".into(),
            code: None,
            detail: None,
            expected_image_ids: expected.iter().map(|s| s.to_string()).collect(),
            image_current: current,
            next_heartbeat_s: 15,
            action,
            pull: Vec::new(),
            expected_images: Vec::new(),
            raw: serde_json::Value::Null,
        }
    }

    /// A runner of several images off one of them: the pool has no set of its own.
    fn image_off(image_ref: &str, ids: &[&str]) -> HeartbeatAnswer {
        let mut a = answer(Action::Recycle, Some(false), &[]);
        a.pull = vec![image_ref.to_string()];
        a.expected_images = vec![ExpectedImage {
            image_ref: image_ref.into(),
            expected_image_ids: ids.iter().map(|s| s.to_string()).collect(),
        }];
        a
    }

    #[test]
    fn once_per_set_of_each_image_for_a_pool_of_images_only() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("runner.json");
        let mut r = Recycler::beside(&state);
        assert_eq!(
            r.after(&image_off("node:20", &["b", "a"]), None),
            Some(Exit::Recycle)
        );
        let memory = r.remembered().unwrap();
        assert_eq!(memory.expected_images[0].expected_image_ids, ["a", "b"]);
        // The same set again, in another order: waits.
        let mut r = Recycler::beside(&state);
        assert_eq!(r.after(&image_off("node:20", &["a", "b"]), None), None);
        // The entry rolled on (its operator, or its registry): recycled for once more.
        assert_eq!(
            r.after(&image_off("node:20", &["c"]), None),
            Some(Exit::Recycle)
        );
        assert_eq!(r.after(&image_off("node:20", &["c"]), None), None);
        // Another image off its set is another set too.
        assert_eq!(
            r.after(&image_off("postgres:16", &["c"]), None),
            Some(Exit::Recycle)
        );
        // A memory written before several images reads, and is a set with no images.
        std::fs::write(
            r.path(),
            r#"{"expected_image_ids":["a"],"recycled_at":"2026-12-01T00:00:00Z"}"#,
        )
        .unwrap();
        assert_eq!(
            r.after(&answer(Action::Recycle, Some(false), &["a"]), None),
            None
        );
    }

    #[test]
    fn the_memory_lives_beside_the_state_file() {
        let r = Recycler::beside(Path::new("/var/lib/leasegate/runner-build-01.json"));
        assert_eq!(
            r.path(),
            Path::new("/var/lib/leasegate/runner-build-01.recycled.json")
        );
        let r = Recycler::beside(Path::new("state"));
        assert_eq!(r.path(), Path::new("state.recycled.json"));
    }

    #[test]
    fn once_per_expected_set_until_the_runner_is_current() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("runner.json");
        let drifted = |set: &[&str]| answer(Action::Recycle, Some(false), set);

        // The first ask recycles, and is remembered (privately).
        let mut r = Recycler::beside(&state);
        assert_eq!(
            r.after(&drifted(&["b", "a"]), Some("old")),
            Some(Exit::Recycle)
        );
        let mode = std::fs::metadata(r.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(
            r.remembered().unwrap().expected_image_ids,
            ["a", "b"],
            "sorted"
        );

        // A new process (the unit's restart) asked again for the same set, in any order: waits.
        let mut r = Recycler::beside(&state);
        assert_eq!(r.after(&drifted(&["a", "b", "a"]), Some("old")), None);
        assert_eq!(r.after(&drifted(&["a", "b"]), Some("old")), None);
        // Neither a refusal without an action nor an unknown action recycles.
        assert_eq!(r.after(&answer(Action::None, None, &["c"]), None), None);
        assert_eq!(r.after(&answer(Action::Unknown, None, &["c"]), None), None);

        // The pool rolled on: recycled for once more.
        assert_eq!(r.after(&drifted(&["c"]), Some("old")), Some(Exit::Recycle));
        assert_eq!(r.after(&drifted(&["c"]), Some("old")), None);

        // On the image: forgotten, so a roll back to an image recycled for before recycles.
        assert_eq!(
            r.after(&answer(Action::None, Some(true), &["c"]), Some("c")),
            None
        );
        assert!(!r.path().exists());
        assert_eq!(
            r.after(&drifted(&["a", "b"]), Some("c")),
            Some(Exit::Recycle)
        );
    }

    #[test]
    fn a_memory_that_cannot_be_read_or_written_still_recycles() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("runner.json");
        let mut r = Recycler::beside(&state);
        std::fs::write(r.path(), "not json").unwrap();
        let drifted = answer(Action::Recycle, Some(false), &["a"]);
        assert_eq!(r.after(&drifted, None), Some(Exit::Recycle));
        // Written over with the set it recycled for.
        assert_eq!(r.remembered().unwrap().expected_image_ids, ["a"]);

        let mut nowhere = Recycler::beside(&dir.path().join("missing/runner.json"));
        assert_eq!(nowhere.after(&drifted, None), Some(Exit::Recycle));
        assert_eq!(nowhere.after(&drifted, None), Some(Exit::Recycle));
    }
}
