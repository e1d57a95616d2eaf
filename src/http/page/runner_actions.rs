//! The runner page's forms: cordon, uncordon, reinstate and revoke, for an operator or an
//! admin with the session's CSRF token; each is audited as the API's own would be.

use super::session;
use super::{CsrfForm, PageViewer, see_other};
use crate::app::AppState;
use crate::client::Client;
use crate::domain::audit::Action;
use crate::domain::ids::RunnerId;
use crate::domain::operator::Role;
use crate::domain::time::Millis;
use crate::http::auth::Caller;
use crate::http::problem::Problem;
use crate::problem::ApiError;
use axum::extract::{Form, Path, State};
use axum::http::HeaderMap;
use axum::response::Response;

#[utoipa::path(post, path = "/admin/runners/{id}/{action}", tag = "page",
    request_body(content = CsrfForm, content_type = "application/x-www-form-urlencoded", description = "Without a session the answer is the redirect, whatever the body."),
    security((), ("admin_token" = [])),
    params(("id" = String, Path, description = "The runner id: no control characters.", pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$"), ("action" = String, Path, description = "`cordon`, `uncordon`, `reinstate` or `revoke`.")),
    responses(
        (status = 303, description = "Done: back to the form's `back` (default `/admin`), or no session: to `/admin/login`."),
        (status = 403, description = "`forbidden`: a missing or wrong CSRF token, another site's `Origin`, or a viewer.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`not_found`: no such runner or action.", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn runner_action(
    State(state): State<AppState>,
    PageViewer(viewer): PageViewer,
    client: Client,
    headers: HeaderMap,
    Path((id, action)): Path<(String, String)>,
    Form(form): Form<CsrfForm>,
) -> Result<Response, ApiError> {
    if !session::post_allowed(&viewer, &headers, form.csrf.as_deref()) {
        return Err(ApiError::forbidden(
            "cross-site request refused: reload the page and try again",
        ));
    }
    let operator = viewer.operator();
    if !operator.may(Role::Operator) {
        return Err(ApiError::forbidden(format!(
            "{} is a {}: changing runners needs the operator role",
            operator.name, operator.role
        )));
    }
    let caller = Caller {
        operator: operator.clone(),
        client,
    };
    let id = RunnerId::parse("id", &id)?;
    let now = Millis::now();
    let store = state.store();
    let audit = |action| caller.audit(action, id.as_str(), now);
    let done = match action.as_str() {
        "cordon" => {
            store
                .set_cordoned(&id, true, &audit(Action::RunnerCordon))
                .await?
        }
        "uncordon" => {
            store
                .set_cordoned(&id, false, &audit(Action::RunnerUncordon))
                .await?
        }
        "reinstate" => {
            store
                .reinstate_runner(&id, &audit(Action::RunnerReinstate))
                .await?
        }
        "revoke" => {
            state
                .revoke_runner(&id, now, &audit(Action::RunnerRevoke))
                .await?
        }
        _ => return Err(ApiError::not_found("action")),
    };
    done.ok_or_else(|| ApiError::not_found("runner"))?;
    tracing::info!(runner_id = %id, action = %action, "runner changed from the page");
    // Only paths on this page are followed back to.
    let back = form
        .back
        .filter(|b| b.starts_with("/admin") && !b.starts_with("//"))
        .unwrap_or_else(|| "/admin".into());
    Ok(see_other(&back))
}
