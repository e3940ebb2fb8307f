//! Issue 25, item 4: a conversation is screened whole, not by its last message. The real binary
//! with the shipped `config/sidecar.example.toml` in front of a recording app: a phishing text in
//! any role and content shape of an earlier message is never forwarded as `allow`, and never
//! reaches the app when it blocks; a harmless conversation passes; one longer than
//! `max_text_bytes` is refused, not forwarded.

mod common;

use common::app;
use http::StatusCode;
use serde_json::{json, Value};

use common::PHISHING;
const HARMLESS: &str = "Thanks, that sounds good. See you at lunch tomorrow.";

async fn post(sidecar: &common::Sidecar, body: &Value) -> common::Reply {
    let headers = [("content-type", "application/json")];
    common::send(sidecar.public, "POST", "/v1/chat/completions", &headers, body.to_string()).await
}

/// Conversations whose last message is harmless and whose phishing sits in one earlier place.
fn hidden_earlier() -> Vec<(&'static str, Value)> {
    let last = json!({"role": "user", "content": HARMLESS});
    let parts = |text: &str| json!([{"type": "text", "text": text}]);
    vec![
        ("system message", json!([{"role": "system", "content": PHISHING}, last])),
        (
            "earlier user turn",
            json!([{"role": "user", "content": PHISHING}, {"role": "assistant", "content": "ok"}, last]),
        ),
        ("user content parts", json!([{"role": "user", "content": parts(PHISHING)}, last])),
        ("developer parts", json!([{"role": "developer", "content": parts(PHISHING)}, last])),
        ("assistant prefill", json!([last, {"role": "assistant", "content": PHISHING}])),
        ("tool result", json!([{"role": "tool", "tool_call_id": "c1", "content": PHISHING}, last])),
        (
            "tool-call arguments",
            json!([{"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "send", "arguments": json!({"body": PHISHING}).to_string()}}]}, last]),
        ),
    ]
}

#[test]
fn every_message_of_a_conversation_is_screened_by_the_shipped_sidecar() {
    let app = app::start();
    let sidecar = common::Sidecar::start(&app.url());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let benign = json!({"messages": [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Are we still on for lunch tomorrow at noon? I booked the usual place."}]});
        let reply = post(&sidecar, &benign).await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json());
        for (what, messages) in hidden_earlier() {
            let seen = app.requests().len();
            let reply = post(&sidecar, &json!({"model": "m", "messages": messages})).await;
            match reply.status {
                StatusCode::FORBIDDEN => assert_eq!(app.requests().len(), seen, "{what}: a block reached the app"),
                StatusCode::OK => {
                    let action = app.last().headers.get("x-tiergate-action").map(|v| v.to_str().unwrap().to_owned());
                    assert_ne!(action.as_deref(), Some("allow"), "{what}: forwarded as allow");
                    panic!("{what}: forwarded ({action:?}); the phishing should be read and blocked");
                }
                other => panic!("{what}: {other}: {:?}", reply.json()),
            }
        }
        // Longer than max_text_bytes (16 KiB in the example): refused with the field named.
        let long: Vec<Value> = (0..40).map(|_| json!({"role": "user", "content": "a".repeat(500)})).collect();
        let seen = app.requests().len();
        let reply = post(&sidecar, &json!({"messages": long})).await;
        assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", reply.body);
        assert_eq!(reply.json()["error"]["field"], "text", "{:?}", reply.json());
        assert_eq!(app.requests().len(), seen, "an unscreened conversation reached the app");
    });
}
