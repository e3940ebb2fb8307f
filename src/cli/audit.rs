//! `tiergate audit`: reads the audit store (`[audit] dir`) with filters and prints the records as
//! JSON lines, oldest first, or their count; `tiergate audit backup` copies the live store. Needs
//! no running tiergate, and holds no write lock on a running one's store.

use super::time;
use anyhow::Context as _;
use std::io::Write as _;
use std::path::PathBuf;
use tiergate::audit::query::{self, Filter};
use tiergate::audit::store::Store;

/// Query the audit trail: one record per line (JSON), oldest first, or `--count`.
///
/// Times are RFC 3339 (`2026-12-01T10:00:00Z`, `2026-12-01T11:00:00+01:00`), unix ms, or a
/// duration back from now (`90s`, `15m`, `1.5h`, `2d`, `1h 30m`).
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<AuditCommand>,
    /// The audit data directory (`[audit] dir`), holding audit.db.
    #[arg(long, visible_alias = "audit-dir", env = "TIERGATE_AUDIT_DIR", required = true)]
    pub dir: Option<PathBuf>,
    /// Only the records of this request id.
    #[arg(long)]
    pub request_id: Option<String>,
    /// Only records at or after this time (RFC 3339, unix ms, or a duration ago such as 1h).
    #[arg(long)]
    pub since: Option<String>,
    /// Only records before this time (RFC 3339, unix ms, or a duration ago).
    #[arg(long)]
    pub until: Option<String>,
    #[arg(long)]
    pub tenant: Option<String>,
    /// Proxy route (or layer) name.
    #[arg(long)]
    pub route: Option<String>,
    #[arg(long, value_parser = ["allow", "review", "block", "unscreened"])]
    pub action: Option<String>,
    /// The deciding tier.
    #[arg(long, value_parser = ["cpu", "gpu", "rules", "guard", "unscreened"])]
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

#[derive(Debug, clap::Subcommand)]
pub enum AuditCommand {
    /// Copy the store, while tiergate runs, into one consistent snapshot file (SQLite's
    /// `VACUUM INTO` through a read-only connection: the writer is never locked out). The copy
    /// is an audit store of its own: `tiergate audit --dir` reads a directory holding it as
    /// audit.db.
    Backup {
        /// The audit data directory (`[audit] dir`), holding audit.db.
        #[arg(long, env = "TIERGATE_AUDIT_DIR")]
        dir: PathBuf,
        /// The file to write; it must not exist yet.
        #[arg(long)]
        out: PathBuf,
    },
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(AuditCommand::Backup { dir, out }) = args.command {
        let records = Store::backup(&dir, &out)?;
        println!("wrote {} ({records} records)", out.display());
        return Ok(());
    }
    let dir = args.dir.context("--dir (the `[audit] dir`) is required")?;
    let now = std::time::SystemTime::now();
    let since_ms = args.since.as_deref().map(|t| time::parse("--since", t, now)).transpose()?;
    let until_ms = args.until.as_deref().map(|t| time::parse("--until", t, now)).transpose()?;
    if let (Some(since), Some(until)) = (since_ms, until_ms) {
        time::ensure_ordered(since, until)?;
    }
    let filter = Filter {
        request_id: args.request_id,
        since_ms,
        until_ms,
        tenant: args.tenant,
        route: args.route,
        action: args.action,
        tier: args.tier,
        kind: args.kind,
        rule: args.rule,
        limit: args.limit,
    };
    let conn = Store::open_read_only(&dir)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let printed = if args.count {
        let n = query::count(&conn, &filter)?;
        writeln!(out, "{n}").context("writing to stdout")
    } else {
        query::for_each(&conn, &filter, |json| writeln!(out, "{json}").context("writing to stdout")).map(drop)
    };
    match printed.and_then(|()| out.flush().context("writing to stdout")) {
        // A reader that has seen enough (`| head`) is not an error.
        Err(e)
            if e.root_cause()
                .downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            Ok(())
        }
        other => other,
    }
}
