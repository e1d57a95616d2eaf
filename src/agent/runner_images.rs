//! The images a docker-executor runner on this machine will run, read from its own
//! configuration: forgejo-runner's (and act_runner's) `config.yml`, whose `runner.labels`
//! entries map a label to an image (`ubuntu-latest:docker://node:20-bookworm`), and
//! gitlab-runner's `config.toml`, whose `[runners.docker]` names an `image` and `services`.
//!
//! Why read them rather than ask for a list: the forge never learns a label's image (a runner
//! declares label names only), and a list kept beside the runner's configuration drifts from
//! it. What the runner will run is what its configuration says.

use std::path::Path;

/// An image the runner will run, with the labels that pick it (none for GitLab's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WantedImage {
    pub reference: String,
    pub labels: Vec<String>,
}

/// Adds `reference` (with `label`) to `wanted`, once per reference, labels in order.
pub fn add(wanted: &mut Vec<WantedImage>, reference: &str, label: Option<&str>) {
    let entry = match wanted.iter_mut().position(|w| w.reference == reference) {
        Some(i) => &mut wanted[i],
        None => {
            wanted.push(WantedImage {
                reference: reference.to_string(),
                labels: Vec::new(),
            });
            wanted.last_mut().expect("just pushed")
        }
    };
    if let Some(l) = label
        && !entry.labels.iter().any(|x| x == l)
    {
        entry.labels.push(l.to_string());
    }
}

/// The docker images of a forgejo-runner / act_runner `config.yml`: each `runner.labels`
/// entry `name:docker://ref`. Labels of other schemes (`host`, `lxc`) run no image.
pub fn from_forgejo_runner_config(path: &Path) -> Result<Vec<WantedImage>, String> {
    let what = |m: String| format!("--forgejo-runner-config {}: {m}", path.display());
    let text = std::fs::read_to_string(path).map_err(|e| what(e.to_string()))?;
    let config: serde_norway::Value =
        serde_norway::from_str(&text).map_err(|e| what(format!("not YAML ({e})")))?;
    let labels = config
        .get("runner")
        .and_then(|r| r.get("labels"))
        .and_then(|l| l.as_sequence())
        .ok_or_else(|| what("no runner.labels".into()))?;
    let mut wanted = Vec::new();
    for label in labels {
        let Some(label) = label.as_str() else {
            return Err(what(format!("runner.labels holds {label:?}, not a string")));
        };
        let Some((name, scheme)) = label.split_once(':') else {
            continue;
        };
        if let Some(reference) = scheme.strip_prefix("docker://")
            && !reference.is_empty()
        {
            add(&mut wanted, reference, Some(name));
        }
    }
    if wanted.is_empty() {
        return Err(what(
            "no runner.labels entry names a docker image (name:docker://ref)".into(),
        ));
    }
    Ok(wanted)
}

/// The images of a gitlab-runner `config.toml`: each `[[runners]]`'s `[runners.docker]`
/// `image`, and its `services` (names, or tables with a `name`).
pub fn from_gitlab_config(path: &Path) -> Result<Vec<WantedImage>, String> {
    let what = |m: String| format!("--gitlab-config {}: {m}", path.display());
    let text = std::fs::read_to_string(path).map_err(|e| what(e.to_string()))?;
    let config: toml::Table = text.parse().map_err(|e| what(format!("not TOML ({e})")))?;
    let runners = config
        .get("runners")
        .and_then(|r| r.as_array())
        .ok_or_else(|| what("no [[runners]]".into()))?;
    let mut wanted = Vec::new();
    for docker in runners.iter().filter_map(|r| r.get("docker")) {
        if let Some(image) = docker.get("image").and_then(|i| i.as_str())
            && !image.is_empty()
        {
            add(&mut wanted, image, None);
        }
        let services = docker.get("services").and_then(|s| s.as_array());
        for service in services.into_iter().flatten() {
            let name = service
                .as_str()
                .or_else(|| service.get("name").and_then(|n| n.as_str()));
            if let Some(name) = name.filter(|n| !n.is_empty()) {
                add(&mut wanted, name, None);
            }
        }
    }
    if wanted.is_empty() {
        return Err(what(
            "no [runners.docker] names an image (is it a docker executor?)".into(),
        ));
    }
    Ok(wanted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_that_share_an_image_are_one_image_with_both_labels() {
        let mut w = Vec::new();
        add(&mut w, "node:20", Some("ubuntu-latest"));
        add(&mut w, "alpine:3", None);
        add(&mut w, "node:20", Some("ubuntu-24.04"));
        add(&mut w, "node:20", Some("ubuntu-latest"));
        assert_eq!(
            w,
            [
                WantedImage {
                    reference: "node:20".into(),
                    labels: vec!["ubuntu-latest".into(), "ubuntu-24.04".into()]
                },
                WantedImage {
                    reference: "alpine:3".into(),
                    labels: vec![]
                },
            ]
        );
    }
}
