//! The rule variables of a request's [`Velocity`] (CEL maps; every key always present, zeros
//! when campaigns are off, so that a guard reading them never errors):
//!
//! - `campaign`: `available` (bool: campaigns are on), `shared` (bool: the fleet's counts, not
//!   this replica's alone), `id` (string), and ints `count_1m`, `count_1h`, `count_24h`,
//!   `sources_1m`, `sources_1h`, `sources_24h`, `first_seen_s` (the request itself counted);
//! - `entity`: ints `found` (entities in the request), `max_count_1h`, `max_sources_1h`,
//!   `max_sources_24h` (over all its entities), and per kind (`link_domain`, `phone`, `iban`,
//!   `wallet`, `device`) a map of `count_1h`, `sources_1h`, `sources_24h`, `count_24h`,
//!   `first_seen_s`: the largest over that kind's entities in the request (zeros when none).

use super::{Counts, EntityKind, Velocity};
use cel::objects::{Key, Map};
use cel::Value;
use std::collections::HashMap;
use std::sync::Arc;

fn int(v: u64) -> Value {
    Value::Int(i64::try_from(v).unwrap_or(i64::MAX))
}

fn map(entries: Vec<(&'static str, Value)>) -> Value {
    let map: HashMap<Key, Value> = entries.into_iter().map(|(k, v)| (Key::from(k), v)).collect();
    Value::Map(Map { map: Arc::new(map) })
}

/// `(campaign, entity)`, the two variables' values for `velocity` (`None`: campaigns off).
pub fn variables(velocity: Option<&Velocity>) -> (Value, Value) {
    let c = velocity.map(|v| v.campaign).unwrap_or_default();
    let campaign = map(vec![
        ("available", Value::Bool(velocity.is_some())),
        ("shared", Value::Bool(velocity.is_some_and(|v| v.shared))),
        ("id", Value::from(velocity.map_or("", |v| v.id.as_str()))),
        ("count_1m", int(c.count_1m)),
        ("count_1h", int(c.count_1h)),
        ("count_24h", int(c.count_24h)),
        ("sources_1m", int(c.sources_1m)),
        ("sources_1h", int(c.sources_1h)),
        ("sources_24h", int(c.sources_24h)),
        ("first_seen_s", int(c.first_seen_s)),
    ]);
    let entities = velocity.map_or(&[][..], |v| &v.entities[..]);
    let max_of = |kind: Option<EntityKind>| {
        let of_kind = entities.iter().filter(|e| kind.is_none_or(|k| e.kind == k)).map(|e| e.counts);
        of_kind.fold(Counts::default(), |m, c| Counts {
            count_1m: m.count_1m.max(c.count_1m),
            count_1h: m.count_1h.max(c.count_1h),
            count_24h: m.count_24h.max(c.count_24h),
            sources_1m: m.sources_1m.max(c.sources_1m),
            sources_1h: m.sources_1h.max(c.sources_1h),
            sources_24h: m.sources_24h.max(c.sources_24h),
            first_seen_s: m.first_seen_s.max(c.first_seen_s),
        })
    };
    let all = max_of(None);
    let mut entries = vec![
        ("found", int(entities.len() as u64)),
        ("max_count_1h", int(all.count_1h)),
        ("max_sources_1h", int(all.sources_1h)),
        ("max_sources_24h", int(all.sources_24h)),
    ];
    for kind in EntityKind::ALL {
        let m = max_of(Some(kind));
        entries.push((
            kind.as_str(),
            map(vec![
                ("count_1h", int(m.count_1h)),
                ("count_24h", int(m.count_24h)),
                ("sources_1h", int(m.sources_1h)),
                ("sources_24h", int(m.sources_24h)),
                ("first_seen_s", int(m.first_seen_s)),
            ]),
        ));
    }
    (campaign, map(entries))
}
