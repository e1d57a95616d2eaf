//! Buildkite agents under the gate, by pausing.
//!
//! Buildkite's agents take their jobs from Buildkite's own servers, where no gate can stand.
//! What a third party can do is pause an agent through Buildkite's REST API ("preventing
//! dispatch of new jobs but allowing any existing job to finish"), with a note and a timeout
//! after which Buildkite lifts the pause by itself. A leasegate runner bound to Buildkite agents
//! by name (`{"kind": "buildkite", "agent_name": …}`) has them paused while the lease's rules
//! refuse it and resumed when they admit it again; pauses that lapse while the refusal lasts
//! are made again. Only pauses leasegate made, remembered in the store, are ever resumed. A
//! stopped leasegate fails open: nothing renews its pauses, and each lapses after its timeout.
//!
//! - `settings`: `LEASEGATE_BUILDKITE_*`, read and checked at start;
//! - `api`: the agents API's list, pause and resume calls;
//! - `context`: what of the running service Buildkite's side touches, handed over by it;
//! - `watcher`: the background task that follows the verdicts and pauses and resumes.
//!
//! The rules of what to do when are `domain::buildkite`'s.

pub mod api;
pub mod context;
pub mod settings;
pub mod watcher;

use api::AgentsApi;
use settings::BuildkiteSettings;

/// The Buildkite side of a running service.
pub struct Buildkite {
    settings: BuildkiteSettings,
    api: AgentsApi,
}

impl Buildkite {
    pub fn new(settings: BuildkiteSettings) -> anyhow::Result<Self> {
        let api = AgentsApi::new(&settings)?;
        Ok(Buildkite { settings, api })
    }

    pub fn settings(&self) -> &BuildkiteSettings {
        &self.settings
    }

    pub fn api(&self) -> &AgentsApi {
        &self.api
    }
}
