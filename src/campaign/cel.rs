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

/// The variables when campaigns are off: built once (every rule context of every request gets
/// them; the maps are shared, not copied).
static OFF: std::sync::LazyLock<(Value, Value)> = std::sync::LazyLock::new(|| build(None));

/// `(campaign, entity)`, the two variables' values for `velocity` (`None`: campaigns off).
pub fn variables(velocity: Option<&Velocity>) -> (Value, Value) {
    match velocity {
        None => OFF.clone(),
        some => build(some),
    }
}

fn build(velocity: Option<&Velocity>) -> (Value, Value) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::campaign::EntityVelocity;
    use cel::{Context, Program};

    fn eval(when: &str, velocity: Option<&Velocity>) -> Value {
        let (campaign, entity) = variables(velocity);
        let mut ctx = Context::default();
        ctx.add_variable_from_value("campaign", campaign);
        ctx.add_variable_from_value("entity", entity);
        Program::compile(when).unwrap().execute(&ctx).unwrap()
    }

    const GUARD: &str = "campaign.sources_1h > 50 && entity.link_domain.sources_1h > 0 \
        && entity.link_domain.sources_1h * 2 < campaign.sources_1h";

    #[test]
    fn the_bundled_guard_reads_a_velocity_and_reads_zeros_when_campaigns_are_off() {
        let domain = Counts { sources_1h: 1, ..Counts::default() };
        let iban = Counts { sources_1h: 30, sources_24h: 31, ..Counts::default() };
        let velocity = Velocity {
            id: "00ff".into(),
            shared: true,
            campaign: Counts { count_1h: 60, sources_1h: 51, ..Counts::default() },
            entities: vec![
                EntityVelocity { kind: EntityKind::LinkDomain, hash: "a".into(), counts: domain },
                EntityVelocity { kind: EntityKind::Iban, hash: "b".into(), counts: iban },
            ],
        };
        assert_eq!(eval(GUARD, Some(&velocity)), Value::Bool(true));
        assert_eq!(
            eval("entity.iban.sources_24h >= 30 && entity.max_sources_1h == 30", Some(&velocity)),
            Value::Bool(true)
        );
        assert_eq!(
            eval("campaign.shared && campaign.id == '00ff' && entity.found == 2", Some(&velocity)),
            Value::Bool(true)
        );
        assert_eq!(eval(GUARD, None), Value::Bool(false), "off: zeros, no error");
        assert_eq!(eval("campaign.available || entity.wallet.sources_1h > 0", None), Value::Bool(false));
    }
}
