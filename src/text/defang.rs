//! Step 5 of canonicalisation: defanged links restored (`hxxps://evil[.]top` is
//! `https://evil.top`), only where the marker sits in a URL, domain or address, never in prose.

/// A bracketed defanging marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Marker {
    Dot,
    Colon,
    SchemeSeparator,
    At,
}

impl Marker {
    fn restored(self) -> &'static str {
        match self {
            Marker::Dot => ".",
            Marker::Colon => ":",
            Marker::SchemeSeparator => "://",
            Marker::At => "@",
        }
    }
}

/// The bracketed marker at the start of `b` (`[.]`, `(dot)`, `[:]`, `[at]`, ...; any case) and its
/// length in bytes.
pub(super) fn bracket_marker(b: &[u8]) -> Option<(Marker, usize)> {
    const INNER: [(&[u8], Marker); 6] = [
        (b".", Marker::Dot),
        (b"dot", Marker::Dot),
        (b":", Marker::Colon),
        (b"://", Marker::SchemeSeparator),
        (b"@", Marker::At),
        (b"at", Marker::At),
    ];
    let close = match b.first()? {
        b'[' => b']',
        b'(' => b')',
        b'{' => b'}',
        _ => return None,
    };
    INNER.iter().find_map(|&(inner, marker)| {
        let end = 1 + inner.len();
        (b.len() > end && b[1..end].eq_ignore_ascii_case(inner) && b[end] == close).then_some((marker, end + 1))
    })
}

/// The defanged scheme at the start of `b` (`hxxps`, `hxxp`, `fxps`, `fxp`; any case): the real
/// scheme and the length in bytes.
pub(super) fn defanged_scheme(b: &[u8]) -> Option<(&'static str, usize)> {
    const SCHEMES: [(&[u8], &str); 4] = [(b"hxxps", "https"), (b"hxxp", "http"), (b"fxps", "ftps"), (b"fxp", "ftp")];
    SCHEMES
        .iter()
        .find(|(fanged, _)| b.len() >= fanged.len() && b[..fanged.len()].eq_ignore_ascii_case(fanged))
        .map(|&(fanged, scheme)| (scheme, fanged.len()))
}

/// Restores defanged schemes and bracketed markers where they sit in a link, domain or address;
/// adds the number of whitespace-separated tokens it touched to `links`.
pub(super) fn restore_defanged(s: &str, links: &mut usize) -> Option<String> {
    let b = s.as_bytes();
    if !b.iter().any(|c| matches!(c, b'[' | b'(' | b'{' | b'x' | b'X')) {
        return None;
    }
    let mut out = String::new();
    let mut copied = 0;
    let mut token = 0usize;
    let mut counted_token = None;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            token += 1;
        }
        // Every byte looked at below is ASCII, hence a char boundary.
        let prev = || if copied < i { s[..i].chars().next_back() } else { out.chars().next_back() };
        let replacement = match c {
            b'h' | b'H' | b'f' | b'F' => defanged_scheme(&b[i..]).filter(|&(_, len)| {
                let rest = &b[i + len..];
                !prev().is_some_and(char::is_alphanumeric)
                    && (rest.first() == Some(&b':')
                        || matches!(bracket_marker(rest), Some((Marker::Colon | Marker::SchemeSeparator, _))))
            }),
            b'[' | b'(' | b'{' => bracket_marker(&b[i..]).and_then(|(marker, len)| {
                let (prev, next) = (prev(), s[i + len..].chars().next());
                let alnum = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
                let fits = match marker {
                    Marker::Dot | Marker::SchemeSeparator => alnum(prev) && alnum(next),
                    Marker::Colon => alnum(prev) && next.is_some_and(|n| n == '/' || n.is_ascii_digit()),
                    Marker::At => {
                        (alnum(prev) || prev.is_some_and(|p| matches!(p, '.' | '_' | '%' | '+' | '-'))) && alnum(next)
                    }
                };
                fits.then_some((marker.restored(), len))
            }),
            _ => None,
        };
        match replacement {
            Some((restored, len)) => {
                out.push_str(&s[copied..i]);
                out.push_str(restored);
                i += len;
                copied = i;
                if counted_token != Some(token) {
                    *links += 1;
                    counted_token = Some(token);
                }
            }
            None => i += 1,
        }
    }
    if copied == 0 {
        return None;
    }
    out.push_str(&s[copied..]);
    Some(out)
}
