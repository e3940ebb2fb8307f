//! `tiergate audit`: reads the audit store (`[audit] dir`) with filters and prints the records as
//! JSON lines, oldest first, or their count. Needs no running tiergate.

use anyhow::Context as _;
use std::io::Write as _;
use std::path::PathBuf;
use tiergate::audit::query::{self, Filter};
use tiergate::audit::store::Store;

/// Query the audit trail: one record per line (JSON), oldest first, or `--count`.
///
/// Times are RFC 3339 (`2026-12-01T10:00:00Z`, `2026-12-01T11:00:00+01:00`) or a duration back
/// from now (`90s`, `15m`, `1h`, `2d`, `1h 30m`).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The audit data directory (`[audit] dir`), holding audit.db.
    #[arg(long, env = "TIERGATE_AUDIT_DIR")]
    pub dir: PathBuf,
    /// Only the records of this request id.
    #[arg(long)]
    pub request_id: Option<String>,
    /// Only records at or after this time (RFC 3339, or a duration ago such as 1h).
    #[arg(long)]
    pub since: Option<String>,
    /// Only records before this time (RFC 3339, or a duration ago).
    #[arg(long)]
    pub until: Option<String>,
    #[arg(long)]
    pub tenant: Option<String>,
    /// Proxy route (or layer) name.
    #[arg(long)]
    pub route: Option<String>,
    /// allow, review, block or unscreened.
    #[arg(long)]
    pub action: Option<String>,
    /// The deciding tier: cpu, gpu, rules, guard or unscreened.
    #[arg(long)]
    pub tier: Option<String>,
    /// Only records in which this rule (or guard) matched.
    #[arg(long)]
    pub rule: Option<String>,
    /// classify, screen, stream_cut or shadow.
    #[arg(long, value_parser = ["classify", "screen", "stream_cut", "shadow"])]
    pub kind: Option<String>,
    /// At most this many records (the oldest that match).
    #[arg(long)]
    pub limit: Option<u64>,
    /// Print the number of matching records instead of the records.
    #[arg(long)]
    pub count: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let now = std::time::SystemTime::now();
    let filter = Filter {
        request_id: args.request_id,
        since_ms: args.since.as_deref().map(|t| parse_time("--since", t, now)).transpose()?,
        until_ms: args.until.as_deref().map(|t| parse_time("--until", t, now)).transpose()?,
        tenant: args.tenant,
        route: args.route,
        action: args.action,
        tier: args.tier,
        kind: args.kind,
        rule: args.rule,
        limit: args.limit,
    };
    let conn = Store::open_read_only(&args.dir)?;
    if args.count {
        println!("{}", query::count(&conn, &filter)?);
        return Ok(());
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    query::for_each(&conn, &filter, |json| Ok(writeln!(out, "{json}")?))?;
    out.flush().context("writing to stdout")?;
    Ok(())
}

/// An RFC 3339 time, or a duration back from `now`, as ms since the Unix epoch.
fn parse_time(flag: &str, value: &str, now: std::time::SystemTime) -> anyhow::Result<u64> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(value.trim()) {
        return u64::try_from(t.timestamp_millis()).map_err(|_| anyhow::anyhow!("{flag}: `{value}` is before 1970"));
    }
    match humantime::parse_duration(value.trim()) {
        Ok(ago) => {
            let at = now.checked_sub(ago).unwrap_or(std::time::UNIX_EPOCH);
            Ok(at.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64))
        }
        Err(_) => anyhow::bail!(
            "{flag}: `{value}` is neither an RFC 3339 time (2026-12-01T10:00:00Z) nor a duration ago (90s, 15m, 1h, 2d)"
        ),
    }
}
