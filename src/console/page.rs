//! The console's HTML, rendered on the server: the login form and the console itself, each one
//! self-contained page (its style and script inline under a per-response CSP nonce, nothing
//! fetched from elsewhere: no build step, no CDN). What the page shows of decisions its script
//! fetches as JSON and writes as text; the few values rendered here (the reviewer, the filters,
//! the CSRF token, an error message) are HTML-escaped.

use bytes::Bytes;
use html_escape::{encode_double_quoted_attribute as attr, encode_text as text};
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;

const STYLE: &str = include_str!("console.css");
const SCRIPT: &str = include_str!("console.js");

/// The filters the queue can be narrowed by, as query parameters (`tenant`, `scenario`, `rule`,
/// `lang`), with their labels.
pub const FILTERS: [(&str, &str); 4] =
    [("tenant", "Tenant"), ("scenario", "Scenario"), ("rule", "Rule"), ("lang", "Language")];

/// A fresh nonce for one response's `Content-Security-Policy`.
fn nonce() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the OS random source works");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An HTML response with the console's security headers: a CSP that allows only this
/// response's inline style and script and requests to this origin, no framing, no referrer to
/// other sites, no caching, no MIME sniffing.
fn html(status: StatusCode, nonce: &str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let csp = format!(
        "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; connect-src 'self'; \
         img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    );
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_str(&csp).expect("hex nonce"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Not `no-referrer`: under it browsers send `Origin: null` with the page's own POSTs, which
    // the origin check must refuse. `same-origin` sends nothing to other sites.
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

fn head(nonce: &str, title: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{}</title><style nonce=\"{nonce}\">{STYLE}</style></head>",
        text(title)
    )
}

/// The login form (`status` 200, or 401/422/403 with `error` said above the form).
pub fn login(status: StatusCode, error: Option<&str>, reviewer: &str, token_set: bool) -> Response<Full<Bytes>> {
    let nonce = nonce();
    let error = error.map(|e| format!("<p class=\"error\" id=\"login-error\">{}</p>", text(e))).unwrap_or_default();
    let token = if token_set {
        "<label for=\"token\">Admin token</label>\
         <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"current-password\" required>"
    } else {
        "<p class=\"note\">No <code>[admin] token</code> is set: anyone who reaches this listener may sign in.</p>"
    };
    let body = format!(
        "{head}<body><form class=\"login\" method=\"post\" action=\"/admin/console/login\">\
         <h2>tiergate review console</h2>{error}\
         <label for=\"reviewer\">Your name (recorded with each label)</label>\
         <input id=\"reviewer\" name=\"reviewer\" value=\"{reviewer}\" maxlength=\"{max}\" autocomplete=\"username\" required>\
         {token}<button id=\"sign-in\" type=\"submit\">Sign in</button></form></body></html>",
        head = head(&nonce, "Sign in · tiergate review console"),
        reviewer = attr(reviewer),
        max = super::session::MAX_REVIEWER,
    );
    html(status, &nonce, body)
}

/// The console for `reviewer`, with the session's `csrf` token and the queue's filters as given
/// in the page's query (`filters`: name, value).
pub fn console(reviewer: &str, csrf: &str, filters: &[(&str, String)]) -> Response<Full<Bytes>> {
    let nonce = nonce();
    let inputs: String = FILTERS
        .iter()
        .map(|(name, label)| {
            let value = filters.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str()).unwrap_or_default();
            format!(
                "<label>{label}<input id=\"f-{name}\" name=\"{name}\" value=\"{value}\" maxlength=\"128\"></label>",
                value = attr(value)
            )
        })
        .collect();
    let body = format!(
        "{head}<body data-csrf=\"{csrf}\">\
         <header><h1>tiergate · review console</h1><span id=\"who\">signed in as <b>{reviewer}</b></span>\
         <button id=\"logout\" type=\"button\">Sign out</button></header>\
         <form id=\"filters\">{inputs}<button type=\"submit\">Filter</button></form>\
         <main><section id=\"queue-pane\"><h2>Review queue: <span id=\"queue-count\">-</span> waiting, oldest first</h2>\
         <ol id=\"queue\"></ol></section>\
         <section id=\"item-pane\"><div id=\"item\" data-record-id=\"\"><p class=\"empty\">Loading…</p></div>\
         <div id=\"actions\"><button id=\"btn-risk\" type=\"button\">Risk <kbd>r</kbd></button>\
         <button id=\"btn-ok\" type=\"button\">OK <kbd>o</kbd></button></div></section>\
         {quality}</main>\
         <footer><kbd>j</kbd> / <kbd>k</kbd> next / previous · <kbd>r</kbd> label risk · <kbd>o</kbd> label ok · \
         labels go to the audit trail as source <code>analyst</code></footer>\
         <p id=\"status\" role=\"status\"></p><script nonce=\"{nonce}\">{SCRIPT}</script></body></html>",
        head = head(&nonce, "tiergate review console"),
        csrf = attr(csrf),
        reviewer = text(reviewer),
        quality = QUALITY,
    );
    html(StatusCode::OK, &nonce, body)
}

/// The live quality panel; the script fills the numbers in: live quality per `[feedback]`
/// window as the Feedback service last computed it, the day's labels, the queue's length.
const QUALITY: &str = "<aside id=\"quality\"><h2>Live quality</h2>\
    <p class=\"note\" id=\"q-refreshed\">-</p>\
    <table id=\"q-live\"><thead><tr><th></th></tr></thead><tbody></tbody></table>\
    <h3>Labels today (UTC)</h3><dl>\
    <dt>all reviewers</dt><dd id=\"q-today\" class=\"big\">-</dd>\
    <dt>risk</dt><dd id=\"q-risk\">-</dd><dt>ok</dt><dd id=\"q-ok\">-</dd>\
    <dt>yours</dt><dd id=\"q-mine\">-</dd></dl>\
    <h3>Queue</h3><dl><dt>waiting</dt><dd id=\"q-waiting\">-</dd></dl></aside>";
