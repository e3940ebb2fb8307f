//! The shape docs/ARCHITECTURE.md promises, checked on the source: no import cycles between
//! the top-level modules of `src/`, no file over 600 lines and no function over 80 lines (in
//! `src/`, `tests/`, `benches/` and `examples/`) except
//! declarative tables (metric registration).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 600;
const MAX_FN_LINES: usize = 80;
/// Functions that are declarative tables, allowed to be long (metric registration, a table of
/// hostile requests).
const TABLES: [&str; 2] = ["src/metrics.rs::new", "tests/proxy_hostile.rs::hostile_table"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Each source file of `src/` with its top-level module and its path relative to the repo.
fn sources() -> Vec<(String, String, String)> {
    files_under(&["src"])
}

/// Every Rust file the size discipline covers: the crate, its tests and its benches.
fn all_sources() -> Vec<(String, String, String)> {
    files_under(&["src", "tests", "benches", "examples"])
}

/// The Rust files under `dirs` (relative to the repo): (top-level module, path, text).
fn files_under(dirs: &[&str]) -> Vec<(String, String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in dirs {
        rust_files(&root.join(dir), &mut files);
    }
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
            let module = rel.trim_start_matches("src/").split('/').next().unwrap().trim_end_matches(".rs").to_string();
            (module, rel, std::fs::read_to_string(&p).unwrap())
        })
        .collect()
}

/// `crate::NAME` references outside test code.
fn references(text: &str) -> BTreeSet<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                out.insert(item.trim().split("::").next().unwrap_or_default().to_string());
            }
        } else {
            out.insert(rest.split(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap_or_default().to_string());
        }
    }
    out
}

#[test]
fn no_import_cycles_between_modules() {
    let files = sources();
    let modules: BTreeSet<String> =
        files.iter().map(|(m, _, _)| m.clone()).filter(|m| m != "lib" && m != "main").collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, rel, text) in &files {
        if !modules.contains(module) || rel.ends_with("tests.rs") {
            continue;
        }
        let targets = references(text).into_iter().filter(|t| t != module && modules.contains(t));
        edges.entry(module.clone()).or_default().extend(targets);
    }
    // A module that reaches itself through its imports is in a cycle.
    for start in &modules {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<(String, Vec<String>)> = vec![(start.clone(), vec![start.clone()])];
        while let Some((at, path)) = stack.pop() {
            for next in edges.get(&at).into_iter().flatten() {
                assert!(next != start, "import cycle: {} -> {start}", path.join(" -> "));
                if seen.insert(next.clone()) {
                    stack.push((next.clone(), [path.clone(), vec![next.clone()]].concat()));
                }
            }
        }
    }
}

#[test]
fn files_stay_small() {
    let long: Vec<String> = all_sources()
        .into_iter()
        .map(|(_, rel, text)| (rel, text.lines().count()))
        .filter(|&(_, lines)| lines > MAX_FILE_LINES)
        .map(|(rel, lines)| format!("{rel} has {lines} lines"))
        .collect();
    assert!(long.is_empty(), "at most {MAX_FILE_LINES} lines a file; split by concern:\n{}", long.join("\n"));
}

#[test]
fn functions_stay_short() {
    let mut long = Vec::new();
    for (_, rel, text) in all_sources() {
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(name) = fn_name(line) else { continue };
            let length = body_length(&lines[i..]);
            if length > MAX_FN_LINES && !TABLES.contains(&format!("{rel}::{name}").as_str()) {
                long.push(format!("{rel}:{} fn {name} has {length} lines", i + 1));
            }
        }
    }
    assert!(long.is_empty(), "at most {MAX_FN_LINES} lines a function:\n{}", long.join("\n"));
}

/// The name of the function a line declares, if it does.
fn fn_name(line: &str) -> Option<&str> {
    let t = line.trim_start();
    let t = t
        .strip_prefix("pub(crate) ")
        .or_else(|| t.strip_prefix("pub(super) "))
        .or_else(|| t.strip_prefix("pub "))
        .unwrap_or(t);
    let t = t.strip_prefix("async ").unwrap_or(t);
    let t = t.strip_prefix("const ").unwrap_or(t);
    let rest = t.strip_prefix("fn ")?;
    Some(rest.split(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap_or_default())
}

/// Lines from a `fn` line to the line closing its body (1 for a declaration without a body).
fn body_length(lines: &[&str]) -> usize {
    let mut depth = 0i64;
    let mut opened = false;
    for (n, line) in lines.iter().enumerate() {
        let code = strip_literals(line);
        depth += code.matches('{').count() as i64 - code.matches('}').count() as i64;
        opened |= code.contains('{');
        if (opened && depth <= 0) || (!opened && code.trim_end().ends_with(';')) {
            return n + 1;
        }
    }
    lines.len()
}

/// The line without string and char literals and `//` comments (their braces are not code).
fn strip_literals(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                while let Some(d) = chars.next() {
                    match d {
                        '\\' => drop(chars.next()),
                        '"' => break,
                        _ => {}
                    }
                }
            }
            '\'' if chars.clone().nth(1) == Some('\'') || chars.peek() == Some(&'\\') => {
                for d in chars.by_ref() {
                    if d == '\'' {
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'/') => break,
            _ => out.push(c),
        }
    }
    out
}

/// The module path of a file under `src/` ("src/audit/kafka/shipper.rs" -> audit, kafka, shipper;
/// "src/audit/mod.rs" -> audit).
fn module_path(rel: &str) -> Vec<String> {
    let inner = rel.trim_start_matches("src/").trim_end_matches(".rs");
    let mut path: Vec<String> = inner.split('/').map(String::from).collect();
    if path.last().is_some_and(|l| l == "mod" || l == "lib" || l == "main") {
        path.pop();
    }
    path
}

/// The paths a use-tree starting at `s` names ("a::b::{c, d::e}" -> a::b::c, a::b::d::e), each
/// cut at its first item that is not a plain identifier.
fn use_paths(s: &str) -> Vec<Vec<String>> {
    let ident_end = |s: &str| s.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(s.len());
    let mut head = Vec::new();
    let mut rest = s;
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            // Split the group at its top-level commas.
            let (mut depth, mut start, mut out) = (0, 0, Vec::new());
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        out.push(&group[start..i]);
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(&group[start..i]);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            return out.iter().flat_map(|item| use_paths(item.trim())).map(|p| [head.clone(), p].concat()).collect();
        }
        let end = ident_end(rest);
        if end == 0 {
            return vec![head];
        }
        head.push(rest[..end].to_string());
        match rest[end..].strip_prefix("::") {
            Some(more) => rest = more.trim_start(),
            None => return vec![head],
        }
    }
}

/// Files of `src/` that `text` (the file at module path `at`) names through `crate::` or
/// `super::`, outside test code, as module paths of existing files.
fn file_references(text: &str, at: &[String], files: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    let mut out = BTreeSet::new();
    for (prefix, base) in [("crate::", Vec::new()), ("super::", at[..at.len().saturating_sub(1)].to_vec())] {
        let mut rest = code;
        while let Some(i) = rest.find(prefix) {
            let preceded = rest[..i].chars().last().is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
            rest = &rest[i + prefix.len()..];
            if preceded {
                continue;
            }
            for path in use_paths(rest) {
                let full = [base.clone(), path].concat();
                // The longest prefix of the path that is a file.
                if let Some(n) = (1..=full.len()).rev().find(|&n| files.contains(&full[..n])) {
                    out.insert(full[..n].to_vec());
                }
            }
        }
    }
    out
}

#[test]
fn no_import_cycles_between_files() {
    let sources: Vec<(Vec<String>, String)> = sources()
        .into_iter()
        .filter(|(_, rel, _)| !rel.ends_with("tests.rs") && rel != "src/main.rs")
        .map(|(_, rel, text)| (module_path(&rel), text))
        .collect();
    let files: BTreeSet<Vec<String>> = sources.iter().map(|(p, _)| p.clone()).collect();
    // A file and its ancestors' files (a module file declaring and re-exporting its children, a
    // child naming its parent's items) are one unit here; circles between siblings are what count.
    let related = |a: &[String], b: &[String]| a.starts_with(b) || b.starts_with(a);
    let edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = sources
        .iter()
        .map(|(at, text)| {
            let targets = file_references(text, at, &files).into_iter().filter(|t| !related(at, t)).collect();
            (at.clone(), targets)
        })
        .collect();
    let mut circles = BTreeSet::new();
    for start in &files {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<(Vec<String>, Vec<String>)> = vec![(start.clone(), vec![start.join("::")])];
        while let Some((at, path)) = stack.pop() {
            for next in edges.get(&at).into_iter().flatten() {
                if next == start {
                    let mut circle = path.clone();
                    let min = circle.iter().enumerate().min_by_key(|(_, p)| *p).map_or(0, |(i, _)| i);
                    circle.rotate_left(min);
                    circles.insert(circle.join(" -> "));
                } else if seen.insert(next.clone()) {
                    stack.push((next.clone(), [path.clone(), vec![next.join("::")]].concat()));
                }
            }
        }
    }
    assert!(circles.is_empty(), "file-level import circles:\n{}", circles.into_iter().collect::<Vec<_>>().join("\n"));
}

/// The layer of each module in docs/ARCHITECTURE.md's "Modules, lowest first" table (the row it
/// is named in, from 0).
fn declared_layers() -> BTreeMap<String, usize> {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/ARCHITECTURE.md")).unwrap();
    let table = doc.split("## Modules, lowest first").nth(1).expect("the modules table").split("\n## ").next().unwrap();
    let rows = table.lines().filter(|l| l.starts_with("| `"));
    let mut layers = BTreeMap::new();
    for (layer, row) in rows.enumerate() {
        let names = row.split('|').nth(1).unwrap_or_default();
        for name in names.split(',').map(|n| n.trim().trim_matches('`')) {
            layers.insert(name.to_string(), layer);
        }
    }
    layers
}

#[test]
fn modules_use_only_modules_declared_below_them() {
    let layers = declared_layers();
    let mut against = BTreeSet::new();
    for (module, rel, text) in sources() {
        if module == "lib" || module == "main" || rel.ends_with("tests.rs") {
            continue;
        }
        let Some(&at) = layers.get(&module) else {
            against.insert(format!("{module} is not in docs/ARCHITECTURE.md's modules table"));
            continue;
        };
        for target in references(&text) {
            if let Some(&to) = layers.get(&target) {
                if target != module && to >= at {
                    against.insert(format!("{rel} uses crate::{target}, declared at or above it"));
                }
            }
        }
    }
    assert!(
        against.is_empty(),
        "arrows against the declared order:\n{}",
        against.into_iter().collect::<Vec<_>>().join("\n")
    );
}

/// `text` up to its unit-test module (`#[cfg(test)]` then `mod`), without comment lines.
fn non_test_lines(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let end = (0..lines.len())
        .find(|&i| lines[i].trim() == "#[cfg(test)]" && lines.get(i + 1).is_some_and(|l| l.contains("mod ")))
        .unwrap_or(lines.len());
    lines[..end].iter().map(|l| l.trim()).filter(|l| !l.starts_with("//")).collect()
}

/// One record builder and one record site per front door: an audit `Draft` is only built in
/// `audit/record.rs` (`Draft::new`, from an `Event`); the classify endpoint and the proxy's
/// pipeline (routes and `TierGateLayer` alike) each record once through `Gateway::record`; a
/// shadow disagreement through `Gateway::record_detached`; a stream cut (a later event of a
/// proxied response, after the gateway has answered) through `Draft::new` in the stream guard.
#[test]
fn one_record_builder_and_one_record_site_per_front_door() {
    let mut found: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (_, rel, text) in sources() {
        for line in non_test_lines(&text) {
            let kinds = [
                (
                    "Draft literal",
                    line.contains("Draft {")
                        && !["struct Draft", "impl Draft", "-> Draft"].iter().any(|d| line.contains(d)),
                ),
                ("Draft::new", line.contains("Draft::new(")),
                ("record", line.contains(".record(Event::") || line.contains(".record(event")),
                ("record_detached", line.contains("record_detached(Event::")),
            ];
            for (kind, hit) in kinds {
                if hit {
                    found.entry(kind).or_default().push(rel.clone());
                }
            }
        }
    }
    let literals: BTreeSet<&String> = found.get("Draft literal").into_iter().flatten().collect();
    assert_eq!(literals.into_iter().collect::<Vec<_>>(), ["src/audit/record.rs"], "drafts built outside Draft::new");
    let expect = |kind: &str, files: &[&str]| {
        assert_eq!(found.get(kind).cloned().unwrap_or_default(), files, "{kind} call sites");
    };
    expect("Draft::new", &["src/gateway/audit.rs", "src/proxy/stream_guard/mod.rs"]);
    // The proxy's pipeline records through its port, which passes the call to the gateway.
    expect("record", &["src/ingress/endpoints.rs", "src/proxy/pipeline.rs", "src/proxy/port.rs"]);
    expect("record_detached", &["src/gateway/shadow.rs"]);
}

/// The cascade asks routing once per stage: it reaches `select` only through a `Router`
/// (`Router::start`, then one question in `follow`, which every stage ends with), never through
/// `select`'s choice functions, and keeps no routing state of its own. `follow` asks once:
/// `after_verdict` or `after_failure`, by how the stage ended.
#[test]
fn the_cascade_asks_the_router_once_per_stage() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("src/gateway/cascade.rs")).unwrap();
    let lines = non_test_lines(&text);
    let count = |needle: &str| lines.iter().filter(|l| l.contains(needle)).count();
    let direct: Vec<&&str> = lines
        .iter()
        .filter(|l| {
            l.match_indices("select::").any(|(i, _)| {
                let rest = &l[i + "select::".len()..];
                let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                name.starts_with(|c: char| c.is_lowercase()) && rest[name.len()..].starts_with('(')
            })
        })
        .collect();
    assert!(direct.is_empty(), "select's functions called from the cascade: {direct:?}");
    assert_eq!(count("Router::start("), 1, "the router starts once");
    assert_eq!(count(".router.after_verdict("), 1, "one routing question after a verdict, in `follow`");
    assert_eq!(count(".router.after_failure("), 1, "one routing question after a failure, in `follow`");
    for stage in ["async fn cpu(&mut self", "async fn gpu(&mut self"] {
        let at = lines.iter().position(|l| l.contains(stage)).unwrap_or_else(|| panic!("{stage} in cascade.rs"));
        let body: Vec<&&str> =
            lines[at + 1..].iter().take_while(|l| !l.starts_with("fn ") && !l.starts_with("async fn ")).collect();
        let asks = body.iter().filter(|l| l.contains("self.follow(")).count();
        assert_eq!(asks, 1, "{stage} ends with one `follow`");
    }
    for state in ["tried:", "escalated:"] {
        assert_eq!(count(state), 0, "routing state `{state}` belongs to the router");
    }
}

/// The proxy reaches the gateway through one narrow interface, `proxy/port.rs` (`Port`): no
/// other file under `src/proxy` names `Gateway` or `crate::gateway`. And the phases of screening
/// are written once: reading, deciding and recording happen in `proxy/pipeline.rs`, which the
/// routes (`Proxy::handle`) and `TierGateLayer` both call.
#[test]
fn the_proxy_reaches_the_gateway_through_its_port_and_screens_in_one_pipeline() {
    let mut reaches = Vec::new();
    let mut calls: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (module, rel, text) in sources() {
        if module != "proxy" {
            continue;
        }
        for line in non_test_lines(&text) {
            let code = strip_literals(line);
            let names_gateway = code.contains("crate::gateway")
                || code.split(|c: char| !(c.is_alphanumeric() || c == '_')).any(|token| token == "Gateway");
            if names_gateway && rel != "src/proxy/port.rs" {
                reaches.push(format!("{rel}: {line}"));
            }
            for phase in ["screen::read(", "port.decide(", "port.record(", "pipeline::screen("] {
                if code.contains(phase) {
                    calls.entry(phase).or_default().push(rel.clone());
                }
            }
        }
    }
    assert!(reaches.is_empty(), "src/proxy reaches the gateway outside port.rs: {reaches:#?}");
    let expect = |phase: &str, files: &[&str]| {
        assert_eq!(calls.get(phase).cloned().unwrap_or_default(), files, "`{phase}` call sites under src/proxy");
    };
    expect("screen::read(", &["src/proxy/pipeline.rs"]);
    expect("port.decide(", &["src/proxy/pipeline.rs"]);
    expect("port.record(", &["src/proxy/pipeline.rs"]);
    expect("pipeline::screen(", &["src/proxy/layer.rs", "src/proxy/mod.rs"]);
}
