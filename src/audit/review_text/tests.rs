//! The review-text store against real SQLite files: what is kept, for how long, and that turning
//! it off forgets it.

use super::*;
use crate::audit::store::tests::record;

fn fresh(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tiergate-review-text-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const ON: ReviewTextConfig = ReviewTextConfig { enabled: true, retention_hours: 72 };

#[test]
fn only_review_decisions_are_wanted_and_never_a_shadow_candidates() {
    assert!(ReviewTexts::wanted(Kind::Classify, RecordedAction::Review));
    assert!(ReviewTexts::wanted(Kind::Screen, RecordedAction::Review));
    for action in [RecordedAction::Allow, RecordedAction::Block, RecordedAction::Unscreened] {
        assert!(!ReviewTexts::wanted(Kind::Classify, action), "{action:?}");
    }
    assert!(!ReviewTexts::wanted(Kind::Shadow, RecordedAction::Review));
}

#[test]
fn kept_texts_are_read_back_by_record_id_until_their_retention_deletes_them() {
    let dir = fresh("retention");
    let mut store = ReviewTexts::open(&dir, &ON).unwrap().expect("enabled");
    let hour = 3_600_000;
    let (old, new) = (record("old", 10 * hour), record("new", 80 * hour));
    let kept = store.keep(
        &[old.clone(), new.clone(), record("none", 80 * hour)],
        &[Some(Arc::from("the old text")), Some(Arc::from("the new text")), None],
    );
    assert_eq!(kept.unwrap(), 2);
    assert_eq!(read(&dir, &old.record_id).unwrap().as_deref(), Some("the old text"));
    assert_eq!(read(&dir, "rec-none").unwrap(), None);
    // 72 h after the old one and one ms: it goes, the new one stays.
    assert_eq!(store.retain(82 * hour + 1).unwrap(), 1);
    assert_eq!(read(&dir, &old.record_id).unwrap(), None);
    assert_eq!(read(&dir, &new.record_id).unwrap().as_deref(), Some("the new text"));
    assert_eq!(store.retain(82 * hour + 1).unwrap(), 0);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.join(DB_FILE)).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "only tiergate's user reads the texts");
}

#[test]
fn turning_the_store_off_deletes_what_it_kept() {
    let dir = fresh("off");
    let mut store = ReviewTexts::open(&dir, &ON).unwrap().unwrap();
    let r = record("a", 5);
    store.keep(std::slice::from_ref(&r), &[Some(Arc::from("text"))]).unwrap();
    drop(store);
    assert!(ReviewTexts::open(&dir, &ReviewTextConfig::default()).unwrap().is_none());
    assert!(!dir.join(DB_FILE).exists());
    assert_eq!(read(&dir, &r.record_id).unwrap(), None, "no file reads as nothing kept");
}

#[test]
fn retention_outside_one_hour_to_a_month_is_refused_naming_the_key() {
    let at = |retention_hours| ReviewTextConfig { enabled: true, retention_hours }.validate();
    assert_eq!(at(0).unwrap_err(), "`audit.review_text.retention_hours` must be between 1 and 720, got 0");
    assert!(at(721).unwrap_err().contains("got 721"));
    assert_eq!(at(1), Ok(()));
    assert_eq!(at(720), Ok(()));
}

#[test]
fn the_bundled_configs_commented_section_is_valid_and_turns_the_store_on() {
    let bundled = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/tiergate.toml")).unwrap();
    let at = bundled.find("# [audit.review_text]").expect("config/tiergate.toml documents [audit.review_text]");
    let section: String = bundled[at..]
        .lines()
        .take_while(|l| l.starts_with('#'))
        .map(|l| l.trim_start_matches('#').trim_start())
        .collect::<Vec<_>>()
        .join("\n");
    let text = format!("[audit]\ndir = \"audit\"\n{section}");
    let config = crate::config::Config::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let audit = config.audit.expect("[audit] is on");
    assert_eq!(audit.review_text, ReviewTextConfig { enabled: true, retention_hours: 72 });
    audit.review_text.validate().unwrap();
}
