//! Property tests of the parsers that read what clients and operators send: the classify request
//! (every door's constructor) and policy directories. Path normalisation and JSON pointer
//! sources have theirs next to their code (`proxy/normalize.rs`, `proxy/screen.rs`), where the
//! private parts are reachable.

use http::{HeaderMap, HeaderValue};
use proptest::prelude::*;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use tiergate::error::ApiError;
use tiergate::policy::Policy;
use tiergate::request::{ClassifyRequest, MAX_TENANT_BYTES};
use tiergate::web::{headers, ServerConfig};

fn small_limits() -> ServerConfig {
    ServerConfig { max_text_bytes: 24, max_features: 3, max_deadline_ms: 1000, ..ServerConfig::default() }
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        "\\PC{0,30}".prop_map(Value::from),
        " {0,3}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{0,3}", inner, 0..5).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Bodies near the shape `/v1/classify` expects: the three fields (sometimes of the wrong type,
/// sometimes over a limit) and now and then an unknown one.
fn classify_body() -> impl Strategy<Value = Value> {
    let field = |name: &'static str, good: BoxedStrategy<Value>| {
        prop::option::of(prop_oneof![3 => good, 1 => json_value()]).prop_map(move |v| v.map(|v| (name, v)))
    };
    let text = prop_oneof![".{0,40}", "\\PC{0,40}", " {0,3}"].prop_map(Value::from).boxed();
    let features = prop::collection::btree_map("[a-z]{1,3}", json_value(), 0..6)
        .prop_map(|m| Value::Object(m.into_iter().collect()))
        .boxed();
    let tenant = "[a-z0-9-]{0,140}".prop_map(Value::from).boxed();
    let extra = prop::option::of(("[a-z]{1,6}", json_value()));
    (field("text", text), field("features", features), field("tenant", tenant), extra).prop_map(|(t, f, n, extra)| {
        let mut obj: Map<String, Value> = [t, f, n].into_iter().flatten().map(|(k, v)| (k.to_string(), v)).collect();
        if let Some((k, v)) = extra {
            obj.insert(k, v);
        }
        Value::Object(obj)
    })
}

fn request_headers() -> impl Strategy<Value = HeaderMap> {
    (prop::option::of("[ -~]{0,140}"), prop::option::of("[0-9 +-]{0,6}|[ -~]{0,6}")).prop_map(|(tenant, deadline)| {
        let mut h = HeaderMap::new();
        if let Some(v) = tenant.and_then(|t| HeaderValue::from_str(&t).ok()) {
            h.insert(headers::TENANT, v);
        }
        if let Some(v) = deadline.and_then(|d| HeaderValue::from_str(&d).ok()) {
            h.insert(headers::DEADLINE, v);
        }
        h
    })
}

/// What every answer of the one constructor promises: an accepted request within the limits, an
/// error that is the client's (4xx) and, for a field error, names a field the body or headers had.
fn check_answer(
    answer: Result<ClassifyRequest, ApiError>,
    body: Option<&Value>,
    server: &ServerConfig,
) -> Result<(), TestCaseError> {
    match answer {
        Ok(r) => {
            prop_assert!(!r.text.trim().is_empty() && r.text.len() <= server.max_text_bytes, "text {:?}", r.text);
            prop_assert!(r.features.len() <= server.max_features, "{} features", r.features.len());
            prop_assert!(!r.tenant.as_ref().is_some_and(|t| t.len() > MAX_TENANT_BYTES), "tenant {:?}", r.tenant);
            let ms = r.deadline.as_millis() as u64;
            prop_assert!((1..=server.max_deadline_ms).contains(&ms) || ms == server.default_deadline_ms, "{ms} ms");
        }
        Err(e) => {
            prop_assert!(e.status().is_client_error(), "{e:?} is {}", e.status());
            if let ApiError::InvalidField { field, message } = &e {
                let known = ["text", "features", "tenant", "body", headers::DEADLINE].contains(&field.as_str());
                let in_body = body.and_then(Value::as_object).is_some_and(|o| o.contains_key(field));
                prop_assert!(known || in_body, "field {field:?}: {message}");
                prop_assert!(!message.is_empty() && (field == "body" || message.contains(field.as_str())), "{e:?}");
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_bytes_give_a_request_within_limits_or_a_client_error(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let server = ServerConfig::default();
        let body = serde_json::from_slice::<Value>(&bytes).ok();
        check_answer(ClassifyRequest::from_json(&HeaderMap::new(), &bytes, &server), body.as_ref(), &server)?;
    }

    #[test]
    fn any_json_value_gives_a_request_within_limits_or_a_named_field(body in json_value(), h in request_headers()) {
        let server = small_limits();
        let bytes = serde_json::to_vec(&body).unwrap();
        check_answer(ClassifyRequest::from_json(&h, &bytes, &server), Some(&body), &server)?;
    }

    #[test]
    fn classify_shaped_bodies_give_a_request_within_limits_or_a_named_field(
        body in classify_body(),
        h in request_headers(),
    ) {
        let server = small_limits();
        let bytes = serde_json::to_vec(&body).unwrap();
        check_answer(ClassifyRequest::from_json(&h, &bytes, &server), Some(&body), &server)?;
    }
}

const BUNDLED: [&str; 3] = ["guards.toml", "routing.toml", "rules.toml"];

fn bundled() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    BUNDLED.iter().map(|n| (n.to_string(), std::fs::read_to_string(dir.join(n)).unwrap())).collect()
}

/// One edit of a policy file, by line: what a hurried operator (or a bad merge) does.
#[derive(Debug, Clone)]
enum Edit {
    Delete(usize),
    Duplicate(usize),
    Replace(usize, String),
    Insert(usize, String),
    /// Cut the file at a byte offset (on a char boundary at or before it).
    Truncate(usize),
}

fn toml_line() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z_]{1,14} = (\"[^\"\\\\\n]{0,12}\"|-?[0-9]{1,3}(\\.[0-9]{1,3})?(e[0-9]{1,3})?|true|nan|inf|-inf|\\[\\]|\\{\\})",
        "\\[\\[?[a-z_.]{1,14}\\]\\]?",
        "(when|patterns|action|score|name) = \"[a-z0-9_.<>=!&|()\\[\\]' +*/-]{0,30}\"",
        "patterns = \\['[a-z\\\\()\\[\\]+*?{},.|^$0-9]{0,16}'\\]",
        "\\PC{0,30}",
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        any::<usize>().prop_map(Edit::Delete),
        any::<usize>().prop_map(Edit::Duplicate),
        (any::<usize>(), toml_line()).prop_map(|(i, l)| Edit::Replace(i, l)),
        (any::<usize>(), toml_line()).prop_map(|(i, l)| Edit::Insert(i, l)),
        any::<usize>().prop_map(Edit::Truncate),
    ]
}

fn apply(text: &str, edit: &Edit) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let n = lines.len().max(1);
    match edit {
        Edit::Delete(i) if !lines.is_empty() => drop(lines.remove(i % n)),
        Edit::Duplicate(i) if !lines.is_empty() => {
            let line = lines[i % n].clone();
            lines.insert(i % n, line);
        }
        Edit::Replace(i, l) if !lines.is_empty() => lines[i % n] = l.clone(),
        Edit::Insert(i, l) => lines.insert(i % (lines.len() + 1), l.clone()),
        Edit::Truncate(at) => {
            let at = at % (text.len() + 1);
            let at = (0..=at).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
            return text[..at].to_string();
        }
        _ => {}
    }
    lines.join("\n")
}

/// Every problem names a file the policy was read from (or, for a section no file defines, the
/// directory), and says so first when printed.
fn check_policy(dir: &Path, files: &[(PathBuf, String)]) -> Result<(), TestCaseError> {
    let Err(e) = Policy::from_sources(dir, files) else { return Ok(()) };
    prop_assert!(!e.0.is_empty(), "an error with no problem");
    for p in &e.0 {
        let named = files.iter().any(|(f, _)| *f == p.file) || p.file == dir;
        prop_assert!(named, "{} names neither a file nor the directory", p);
        prop_assert!(p.to_string().starts_with(&p.file.display().to_string()), "{}", p);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn a_mutated_bundled_policy_loads_or_names_the_file(
        edits in prop::collection::vec((0..BUNDLED.len(), edit()), 1..6),
    ) {
        let dir = Path::new("/policy-under-test");
        let mut files: Vec<(PathBuf, String)> = bundled().into_iter().map(|(n, t)| (dir.join(n), t)).collect();
        for (file, edit) in &edits {
            files[*file].1 = apply(&files[*file].1, edit);
        }
        check_policy(dir, &files)?;
    }

    #[test]
    fn arbitrary_policy_files_load_or_name_the_file(
        texts in prop::collection::vec(prop_oneof![
            prop::collection::vec(toml_line(), 0..12).prop_map(|l| l.join("\n")),
            any::<String>(),
        ], 1..4),
    ) {
        let dir = Path::new("/policy-under-test");
        let files: Vec<(PathBuf, String)> =
            texts.into_iter().enumerate().map(|(i, t)| (dir.join(format!("{i}.toml")), t)).collect();
        check_policy(dir, &files)?;
    }
}

/// The same through the filesystem: `load_dir` of a directory holding a mutated bundled policy.
#[test]
fn loading_a_mutated_policy_directory_names_the_file() {
    let dir = std::env::temp_dir().join(format!("tiergate-prop-policy-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (name, text) in bundled() {
        let text = if name == "rules.toml" { apply(&text, &Edit::Insert(3, "score = [".into())) } else { text };
        std::fs::write(dir.join(name), text).unwrap();
    }
    let e = Policy::load_dir(&dir).unwrap_err();
    let names: Vec<PathBuf> = BUNDLED.iter().map(|n| dir.join(n)).collect();
    assert!(e.0.iter().all(|p| names.contains(&p.file)), "{e}");
    // The broken file is named with TOML's message (a rule naming a signal it defined is named
    // in its own file, as an unknown signal).
    assert!(e.0.iter().any(|p| p.file == dir.join("rules.toml") && p.line.is_none()), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
