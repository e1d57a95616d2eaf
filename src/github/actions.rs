//! The three calls of GitHub Actions' self-hosted runner API that leasegate makes, for any
//! scope (`orgs/ORG`, `repos/OWNER/REPO`, `enterprises/ENT`):
//!
//! - `POST /{scope}/actions/runners/generate-jitconfig` `{name, runner_group_id, labels,
//!   work_folder}` → `201 {runner: {id, name, …}, encoded_jit_config}`; `409` when the name
//!   is taken;
//! - `GET /{scope}/actions/runners?per_page=100`, paged by `Link` → `{total_count, runners:
//!   [{id, name, status: online|offline, busy, …}]}`;
//! - `DELETE /{scope}/actions/runners/{id}` → `204`; `422` when the runner has just taken a
//!   job; `404` when it is gone.

use super::Github;
use super::error::{GithubError, classify};
use super::settings::Secret;
use crate::domain::github::{GithubPool, GithubScope};
use crate::domain::time::Millis;
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::json;

/// The most pages of a list followed (10,000 runners).
const MAX_PAGES: usize = 100;

/// What `generate-jitconfig` minted.
#[derive(Debug)]
pub struct JitConfig {
    pub runner_id: i64,
    pub name: String,
    /// What the runner runs with: `run.sh --jitconfig <it>`. Never logged or stored.
    pub encoded: Secret,
}

/// A runner as GitHub's list shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedRunner {
    pub id: i64,
    pub name: String,
    pub online: bool,
    pub busy: bool,
}

/// What became of a `DELETE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deleted {
    Deleted,
    /// 404: it was gone already.
    Gone,
    /// 422: it has just taken a job, and stays.
    Busy,
}

#[derive(Deserialize)]
struct RunnerJson {
    id: i64,
    name: String,
    status: String,
    busy: bool,
}

#[derive(Deserialize)]
struct JitJson {
    runner: RunnerJson,
    encoded_jit_config: String,
}

#[derive(Deserialize)]
struct RunnersPage {
    runners: Vec<RunnerJson>,
}

fn unexpected(what: &str, e: serde_json::Error) -> GithubError {
    GithubError::Unexpected(format!("{what}: {e}"))
}

impl Github {
    /// Mints a JIT configuration named `name` in `pool`'s scope, group and labels. A taken
    /// name is `Refused { status: 409 }`.
    pub async fn generate_jitconfig(
        &self,
        pool: &GithubPool,
        name: &str,
    ) -> Result<JitConfig, GithubError> {
        let url = self.rest.url(&format!(
            "/{}/actions/runners/generate-jitconfig",
            pool.scope.as_str()
        ));
        let body = json!({
            "name": name,
            "runner_group_id": pool.runner_group_id,
            "labels": pool.labels,
            "work_folder": pool.work_folder,
        });
        let answer = self.authorized(Method::POST, &url, Some(&body)).await?;
        if answer.status != StatusCode::CREATED {
            return Err(classify(
                answer.status,
                &answer.headers,
                &answer.body,
                Millis::now().0 / 1000,
            ));
        }
        let jit: JitJson = serde_json::from_slice(&answer.body)
            .map_err(|e| unexpected("generate-jitconfig's answer", e))?;
        Ok(JitConfig {
            runner_id: jit.runner.id,
            name: jit.runner.name,
            encoded: Secret::new(jit.encoded_jit_config),
        })
    }

    /// Every self-hosted runner of `scope`, a page of 100 at a time.
    pub async fn list_runners(
        &self,
        scope: &GithubScope,
    ) -> Result<Vec<ListedRunner>, GithubError> {
        let mut url = self
            .rest
            .url(&format!("/{}/actions/runners?per_page=100", scope.as_str()));
        let mut runners = Vec::new();
        for _ in 0..MAX_PAGES {
            let answer = self.authorized(Method::GET, &url, None).await?;
            if answer.status != StatusCode::OK {
                return Err(classify(
                    answer.status,
                    &answer.headers,
                    &answer.body,
                    Millis::now().0 / 1000,
                ));
            }
            let page: RunnersPage = serde_json::from_slice(&answer.body)
                .map_err(|e| unexpected("the runner list", e))?;
            runners.extend(page.runners.into_iter().map(|r| ListedRunner {
                id: r.id,
                name: r.name,
                online: r.status == "online",
                busy: r.busy,
            }));
            match answer.next_page(self.rest.api()) {
                Some(next) => url = next,
                None => return Ok(runners),
            }
        }
        Err(GithubError::Unexpected(format!(
            "the runner list of {scope} runs past {MAX_PAGES} pages"
        )))
    }

    /// Removes runner `id` of `scope`.
    pub async fn delete_runner(
        &self,
        scope: &GithubScope,
        id: i64,
    ) -> Result<Deleted, GithubError> {
        let url = self
            .rest
            .url(&format!("/{}/actions/runners/{id}", scope.as_str()));
        let answer = self.authorized(Method::DELETE, &url, None).await?;
        match answer.status {
            StatusCode::NO_CONTENT => Ok(Deleted::Deleted),
            StatusCode::NOT_FOUND => Ok(Deleted::Gone),
            StatusCode::UNPROCESSABLE_ENTITY => Ok(Deleted::Busy),
            status => Err(classify(
                status,
                &answer.headers,
                &answer.body,
                Millis::now().0 / 1000,
            )),
        }
    }
}
