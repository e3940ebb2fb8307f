//! Times on the command line (`tiergate audit --since/--until`, `tiergate drift --since`): one
//! reading for every command, so that the same value selects the same records everywhere.

use std::time::{SystemTime, UNIX_EPOCH};

/// The forms a time may take, for help texts and errors.
pub const FORMS: &str =
    "an RFC 3339 time (2026-12-01T10:00:00Z), unix ms (1796193247904), or a duration ago (90s, 15m, 1.5h, 2d, 1h 30m)";

/// `value` as ms since the Unix epoch: an RFC 3339 time; a bare integer, which is unix ms; or a
/// duration back from `now` with units (humantime's syntax; `1.5h` is read as 90 minutes).
/// Errors name `flag` and the accepted forms; times before 1970 are refused.
pub fn parse(flag: &str, value: &str, now: SystemTime) -> anyhow::Result<u64> {
    let value = value.trim();
    if let Ok(ms) = value.parse::<u64>() {
        return Ok(ms);
    }
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(value) {
        return u64::try_from(t.timestamp_millis()).map_err(|_| anyhow::anyhow!("{flag}: `{value}` is before 1970"));
    }
    let ago = match humantime::parse_duration(value) {
        Ok(ago) => ago,
        Err(_) => match decimal_duration(value) {
            Some(ago) => ago,
            None => anyhow::bail!("{flag}: `{value}` is not {FORMS}"),
        },
    };
    let at = now.checked_sub(ago).unwrap_or(UNIX_EPOCH);
    Ok(at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64))
}

/// Checks that `since_ms` is before `until_ms`; the error gives both as RFC 3339 times (UTC).
pub fn ensure_ordered(since_ms: u64, until_ms: u64) -> anyhow::Result<()> {
    let at = |ms: u64| {
        chrono::DateTime::from_timestamp_millis(ms as i64)
            .map_or_else(|| format!("{ms} unix ms"), |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
    };
    anyhow::ensure!(since_ms < until_ms, "--since ({}) must be before --until ({})", at(since_ms), at(until_ms));
    Ok(())
}

/// `1.5h`, `0.5d`, `2.5m`: a decimal number of one unit, which humantime does not take.
fn decimal_duration(value: &str) -> Option<std::time::Duration> {
    let split = value.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (n, unit) = value.split_at(split);
    let n: f64 = n.parse().ok().filter(|n: &f64| n.is_finite() && *n >= 0.0)?;
    let unit_s = match unit {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        _ => return None,
    };
    std::time::Duration::try_from_secs_f64(n * unit_s).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_order_error_gives_rfc3339_times() {
        let e = ensure_ordered(1_796_585_687_159, 1_796_000_000_000).unwrap_err().to_string();
        assert!(e.contains("2026-12-") && e.contains("Z)") && !e.contains("unix ms"), "{e}");
        assert!(ensure_ordered(1, 2).is_ok());
    }

    #[test]
    fn every_form_reads_the_same_way() {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let now_ms = 1_800_000_000_000;
        assert_eq!(parse("--since", "0", now).unwrap(), 0, "a bare integer is unix ms");
        assert_eq!(parse("--since", "1796193247904", now).unwrap(), 1_796_193_247_904);
        assert_eq!(parse("--since", "2026-12-01T10:00:00Z", now).unwrap(), 1_796_119_200_000);
        assert_eq!(parse("--since", "2026-12-01T11:00:00+01:00", now).unwrap(), 1_796_119_200_000);
        assert_eq!(parse("--since", "90s", now).unwrap(), now_ms - 90_000);
        assert_eq!(parse("--since", "1h 30m", now).unwrap(), now_ms - 5_400_000);
        assert_eq!(parse("--since", "1.5h", now).unwrap(), now_ms - 5_400_000);
        assert_eq!(parse("--since", "100000d", now).unwrap(), 0, "before the epoch: the epoch");
        let err = parse("--until", "yesterday", now).unwrap_err().to_string();
        assert!(err.starts_with("--until: `yesterday` is not an RFC 3339 time"), "{err}");
        assert!(parse("--since", "1969-12-31T23:59:59Z", now).unwrap_err().to_string().contains("before 1970"));
    }
}
