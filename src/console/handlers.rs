//! The console's handlers: the page and its login, the JSON it reads, and labels.

use super::queue::{self, Filter, MAX_FILTER};
use super::session::{self, Keys, Session};
use super::{page, Context};
use crate::audit::record::now_ms;
use crate::audit::review_text;
use crate::audit::store::Store;
use crate::error::{json_response, ApiError};
use crate::feedback::{parse_labels, Outcome};
use crate::web;
use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

/// How long the cpu tier may take over an item's word attributions.
const ATTRIBUTION_BUDGET: Duration = Duration::from_secs(3);

fn signed_in(cx: &Context<'_>, headers: &HeaderMap) -> Option<Session> {
    Session::from_headers(&Keys::new(cx.token), headers, now_ms())
}

/// `GET /admin/console`: the console with a session, else the login form.
pub(super) fn page(cx: &Context<'_>, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let Some(s) = signed_in(cx, req.headers()) else {
        return page::login(StatusCode::OK, None, "", cx.token.is_some());
    };
    // The page shows what the filters hold; the queue's own reading of them checks them.
    let filters: Vec<(&str, String)> = form_urlencoded::parse(req.uri().query().unwrap_or_default().as_bytes())
        .filter_map(|(k, v)| page::FILTERS.iter().find(|(name, _)| *name == k).map(|(name, _)| (*name, v.into_owned())))
        .collect();
    page::console(&s.reviewer, &s.csrf(&Keys::new(cx.token)), &filters)
}

/// `POST /admin/console/login` (`application/x-www-form-urlencoded`: `reviewer`, `token`):
/// 303 to the console with the session cookie, or the form again saying what was wrong (403
/// from another origin, 422 a bad reviewer name, 401 a wrong token).
pub(super) async fn login(cx: &Context<'_>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, ApiError> {
    let (parts, body) = req.into_parts();
    let token_set = cx.token.is_some();
    if let Err(e) = session::same_origin(&parts.headers, &parts.uri) {
        return Ok(page::login(StatusCode::FORBIDDEN, Some(&e.to_string()), "", token_set));
    }
    let bytes = web::read_body(&parts.headers, body, cx.max_body_bytes).await?;
    let field = |name: &str| {
        form_urlencoded::parse(&bytes).find(|(k, _)| k == name).map(|(_, v)| v.into_owned()).unwrap_or_default()
    };
    let (reviewer, token) = (field("reviewer").trim().to_string(), field("token"));
    if let Err(e) = session::check_reviewer(&reviewer) {
        let shown: String = reviewer.chars().take(session::MAX_REVIEWER).collect();
        return Ok(page::login(StatusCode::UNPROCESSABLE_ENTITY, Some(&e.to_string()), &shown, token_set));
    }
    if !session::token_matches(&token, cx.token) {
        tracing::warn!(reviewer = %reviewer, "review console: sign-in with a wrong admin token");
        return Ok(page::login(StatusCode::UNAUTHORIZED, Some("That is not the admin token."), &reviewer, token_set));
    }
    let s = Session::issue(&Keys::new(cx.token), &reviewer, now_ms());
    tracing::info!(reviewer = %reviewer, "review console: signed in");
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::SEE_OTHER;
    response.headers_mut().insert(header::LOCATION, HeaderValue::from_static("/admin/console"));
    response.headers_mut().insert(header::SET_COOKIE, cookie(&s.set_cookie())?);
    Ok(response)
}

fn cookie(value: &str) -> Result<HeaderValue, ApiError> {
    HeaderValue::from_str(value).map_err(|e| ApiError::Internal(format!("session cookie: {e}")))
}

/// `POST /admin/console/logout`: 204, the cookie cleared (with a session, only with its CSRF
/// token: another site cannot sign the analyst out).
pub(super) fn logout(cx: &Context<'_>, req: &Request<Incoming>) -> Result<Response<Full<Bytes>>, ApiError> {
    if let Some(s) = signed_in(cx, req.headers()) {
        s.check_csrf(&Keys::new(cx.token), req.headers(), req.uri())?;
    }
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::NO_CONTENT;
    response.headers_mut().insert(header::SET_COOKIE, cookie(&session::clear_cookie())?);
    Ok(response)
}

/// The audit trail's directory, or 404 without the trail.
fn audit_dir(cx: &Context<'_>, path: &str) -> Result<PathBuf, ApiError> {
    match &cx.gateway.audit {
        Some(audit) => Ok(audit.dir().to_path_buf()),
        None => Err(ApiError::NotFound { path: format!("{path} (the audit trail is off: the queue is its records)") }),
    }
}

/// Runs `read` on the blocking pool over a read-only connection to the audit store.
async fn with_store<T: Send + 'static>(
    dir: PathBuf,
    read: impl FnOnce(&rusqlite::Connection, &std::path::Path) -> anyhow::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    let done = tokio::task::spawn_blocking(move || read(&Store::open_read_only(&dir)?, &dir)).await;
    done.map_err(|e| ApiError::Internal(format!("audit store read: {e}")))?
        .map_err(|e| ApiError::Internal(format!("reading the audit store: {e:#}")))
}

/// The three reads, with the session or the bearer token (or no token set); 401 otherwise:
/// the queue ([`queue::Queue`]), an item ([`item`]), and the panel — `{"live": the Feedback
/// service's last [`crate::feedback::live::Snapshot`] or `null` before its first refresh,
/// "today": [`queue::Today`], "queue": {"waiting"}}`.
pub(super) async fn read(cx: &Context<'_>, req: &Request<Incoming>) -> Result<Response<Full<Bytes>>, ApiError> {
    let session = signed_in(cx, req.headers());
    if session.is_none() && cx.token.is_some() && !session::bearer_matches(req.headers(), cx.token) {
        return Err(ApiError::Unauthorized);
    }
    let path = req.uri().path();
    let dir = audit_dir(cx, path)?;
    let query: Vec<(String, String)> =
        form_urlencoded::parse(req.uri().query().unwrap_or_default().as_bytes()).into_owned().collect();
    match path {
        "/admin/review/queue" => {
            let filter = filter(&query)?;
            let queue = with_store(dir, move |conn, _| queue::queue(conn, &filter)).await?;
            Ok(json_response(StatusCode::OK, &queue))
        }
        "/admin/review/item" => item(cx, dir, &query, crate::request::explain_flag(req.uri().query())?).await,
        _ => {
            let reviewer = session.map(|s| s.reviewer);
            let (today, waiting) = with_store(dir, move |conn, _| {
                Ok((
                    queue::today(conn, now_ms(), reviewer.as_deref())?,
                    queue::queue(conn, &Filter::default())?.waiting,
                ))
            })
            .await?;
            // The Feedback service's numbers as its last refresh left them (what the
            // `tiergate_quality_*` gauges say), not recomputed here.
            let live = cx.gateway.feedback.as_ref().and_then(|f| f.live());
            Ok(json_response(StatusCode::OK, &json!({ "live": live, "today": today, "queue": { "waiting": waiting } })))
        }
    }
}

/// The queue's filters from the query; 422 naming an unknown parameter or an over-long value.
fn filter(query: &[(String, String)]) -> Result<Filter, ApiError> {
    let mut filter = Filter::default();
    for (name, value) in query {
        let slot = match name.as_str() {
            "tenant" => &mut filter.tenant,
            "scenario" => &mut filter.scenario,
            "rule" => &mut filter.rule,
            "lang" => &mut filter.lang,
            _ => return Err(ApiError::invalid(name, "the queue is filtered by tenant, scenario, rule and lang only")),
        };
        if value.len() > MAX_FILTER {
            return Err(ApiError::invalid(name, format!("at most {MAX_FILTER} bytes")));
        }
        *slot = (!value.trim().is_empty()).then(|| value.trim().to_string());
    }
    Ok(filter)
}

/// `GET /admin/review/item?record_id=[&explain=true]`: the record, its `text` as the console
/// shows it, `explainable` (the text is there and the cpu tier scored it) and, with `explain`,
/// the word attributions (`[]` when not explainable). Attributions cost the cpu tier a model run
/// per word: the page asks for them after showing the item.
async fn item(
    cx: &Context<'_>,
    dir: PathBuf,
    query: &[(String, String)],
    explain: bool,
) -> Result<Response<Full<Bytes>>, ApiError> {
    let id = query.iter().find(|(k, _)| k == "record_id").map(|(_, v)| v.clone()).unwrap_or_default();
    if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::invalid("record_id", "give the record's id: 1 to 64 visible ASCII characters"));
    }
    let lookup = id.clone();
    let (record, kept) = with_store(dir, move |conn, dir| {
        let record = queue::record(conn, &lookup)?;
        let kept = match &record {
            Some(_) => review_text::read(dir, &lookup)?,
            None => None,
        };
        Ok((record, kept))
    })
    .await?;
    let Some(mut record) = record else {
        return Err(ApiError::UnknownRecord { field: "record_id", id });
    };
    let (text, words) = shown_text(&record, kept);
    record["text"] = text;
    let cpu_scored =
        record["path"].as_array().is_some_and(|p| p.iter().any(|s| s["tier"] == "cpu" && s["risk_score"].is_number()));
    record["explainable"] = json!(cpu_scored && words.is_some());
    if explain {
        let attributions = match words {
            Some(words) if cpu_scored => cx.gateway.word_attributions(&words, ATTRIBUTION_BUDGET).await,
            _ => Vec::new(),
        };
        record["attributions"] = json!(attributions);
    }
    Ok(json_response(StatusCode::OK, &record))
}

/// The record's `text` as the console shows it, and the words to attribute (the text as sent,
/// when the console has it).
fn shown_text(record: &Value, kept: Option<String>) -> (Value, Option<String>) {
    let mode = record["text"]["mode"].as_str().unwrap_or("hash").to_string();
    let value = record["text"]["value"].as_str().unwrap_or_default().to_string();
    match (kept, mode.as_str()) {
        (Some(text), _) => (json!({"kept": true, "mode": "review_text", "value": text}), Some(text)),
        (None, "full") => (json!({"kept": true, "mode": "full", "value": value}), Some(value)),
        (None, "redacted") => (
            json!({"kept": true, "mode": "redacted", "value": value,
                   "why": "the audit trail keeps this text redacted ([audit] text = \"redacted\")"}),
            None,
        ),
        (None, _) => (
            json!({"kept": false, "mode": mode, "value": value,
                   "why": "the text is not kept: [audit.review_text] is off, or past its retention; the trail keeps its keyed hash"}),
            None,
        ),
    }
}

/// `POST /admin/review/label` (`{"record_id", "label", "note"?}`): the label, as source
/// `analyst` with the session's reviewer, through the audit writer as `POST /v1/feedback`
/// writes it. Needs the session (401), its CSRF token and the same origin (403); 404 naming an
/// unknown record; 422 naming a bad field.
pub(super) async fn label(cx: &Context<'_>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, ApiError> {
    let (parts, body) = req.into_parts();
    let Some(s) = signed_in(cx, &parts.headers) else { return Err(ApiError::Unauthorized) };
    s.check_csrf(&Keys::new(cx.token), &parts.headers, &parts.uri)?;
    let g = cx.gateway;
    let Some(audit) = &g.audit else { return Err(ApiError::NotFound { path: "/admin/review/label".into() }) };
    web::require_json(&parts.headers)?;
    let bytes = web::read_body(&parts.headers, body, cx.max_body_bytes).await?;
    let mut given = match web::json::parse(&bytes)? {
        Value::Object(fields) => fields,
        _ => return Err(ApiError::invalid("body", "a JSON object: {\"record_id\", \"label\", \"note\"?}")),
    };
    if let Some(extra) = given.keys().find(|k| !["record_id", "label", "note"].contains(&k.as_str())) {
        return Err(ApiError::invalid(extra.clone(), "the console sends record_id, label and note only"));
    }
    given.insert("source".into(), json!("analyst"));
    given.insert("reviewer".into(), json!(s.reviewer));
    let labels = parse_labels(Value::Object(given))?;
    let applied = audit.feedback(labels.clone()).await?;
    if let Some(feedback) = &g.feedback {
        feedback.counted(&labels, &applied, false);
    }
    if applied.first().is_some_and(|a| a.outcome == Outcome::Unknown) {
        return Err(ApiError::UnknownRecord { field: "record_id", id: labels[0].target.id().to_string() });
    }
    tracing::info!(reviewer = %s.reviewer, record_id = ?applied[0].record_id, label = labels[0].truth.as_str(), "review console: labelled");
    Ok(json_response(StatusCode::OK, &json!({ "results": applied })))
}
