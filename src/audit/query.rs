//! Reading the store back: records by request id, time range, tenant, route, action, tier,
//! kind and matched rule, oldest first (`tiergate audit`, and any tool that reads the trail).

use rusqlite::types::Value;
use rusqlite::Connection;

/// Which records to read; every set field must match.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub request_id: Option<String>,
    /// At or after, ms since the Unix epoch.
    pub since_ms: Option<u64>,
    /// Before, ms since the Unix epoch.
    pub until_ms: Option<u64>,
    pub tenant: Option<String>,
    pub route: Option<String>,
    pub action: Option<String>,
    pub tier: Option<String>,
    pub kind: Option<String>,
    /// A rule id among the record's `rules`.
    pub rule: Option<String>,
    pub limit: Option<u64>,
}

impl Filter {
    /// The `WHERE` clause and its parameters.
    fn clause(&self) -> (String, Vec<Value>) {
        let mut terms = Vec::new();
        let mut params = Vec::new();
        let columns = [
            ("request_id", &self.request_id),
            ("tenant", &self.tenant),
            ("route", &self.route),
            ("action", &self.action),
            ("tier", &self.tier),
            ("kind", &self.kind),
        ];
        for (column, value) in columns {
            if let Some(v) = value {
                params.push(Value::Text(v.clone()));
                terms.push(format!("{column} = ?{}", params.len()));
            }
        }
        if let Some(since) = self.since_ms {
            params.push(Value::Integer(since as i64));
            terms.push(format!("unix_ms >= ?{}", params.len()));
        }
        if let Some(until) = self.until_ms {
            params.push(Value::Integer(until as i64));
            terms.push(format!("unix_ms < ?{}", params.len()));
        }
        if let Some(rule) = &self.rule {
            params.push(Value::Text(rule.clone()));
            terms.push(format!("EXISTS (SELECT 1 FROM json_each(record, '$.rules') WHERE value = ?{})", params.len()));
        }
        let clause = if terms.is_empty() { String::new() } else { format!(" WHERE {}", terms.join(" AND ")) };
        (clause, params)
    }
}

/// Calls `each` with the JSON of every matching record, oldest first, up to `limit`.
pub fn for_each(
    conn: &Connection,
    filter: &Filter,
    mut each: impl FnMut(&str) -> anyhow::Result<()>,
) -> anyhow::Result<u64> {
    let (clause, mut params) = filter.clause();
    let mut sql = format!("SELECT record FROM records{clause} ORDER BY id");
    if let Some(limit) = filter.limit {
        params.push(Value::Integer(limit.min(i64::MAX as u64) as i64));
        sql.push_str(&format!(" LIMIT ?{}", params.len()));
    }
    let mut stmt = conn.prepare(&sql)?;
    let mut rows = stmt.query(rusqlite::params_from_iter(params))?;
    let mut n = 0;
    while let Some(row) = rows.next()? {
        each(row.get_ref(0)?.as_str()?)?;
        n += 1;
    }
    Ok(n)
}

/// How many records match (`limit` caps the count).
pub fn count(conn: &Connection, filter: &Filter) -> anyhow::Result<u64> {
    let (clause, params) = filter.clause();
    let n: i64 =
        conn.query_row(&format!("SELECT COUNT(*) FROM records{clause}"), rusqlite::params_from_iter(params), |r| {
            r.get(0)
        })?;
    Ok(filter.limit.map_or(n as u64, |l| l.min(n as u64)))
}
