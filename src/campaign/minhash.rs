//! Near-duplicate detection: a MinHash signature of a text's character shingles, cut into LSH
//! bands, so that one template with changed names, amounts and links lands in the same bands.
//!
//! Method: Broder, "On the resemblance and containment of documents" (1997) for MinHash — the
//! probability that two sets share a slot's minimum equals their Jaccard similarity — and the
//! banding technique of Leskovec, Rajaraman & Ullman, *Mining of Massive Datasets*, ch. 3.4:
//! with `b` bands of `r` rows, two texts of similarity `s` share at least one band with
//! probability `1 - (1 - s^r)^b`, an S-curve whose threshold is near `(1/b)^(1/r)` (0.5 for the
//! 16 × 4 used here: similarity 0.8 shares a band with probability 0.9987, 0.3 with 0.12).
//!
//! Every hash is a fixed function written here (FNV-1a over the shingle's bytes, then the
//! SplitMix64 finaliser of Steele, Lea & Flood, "Fast splittable pseudorandom number
//! generators", OOPSLA 2014, with a per-slot seed), not `std`'s unspecified hasher: two
//! replicas, and two releases of tiergate, compute the same bands for the same text without
//! talking. A small own implementation rather than a crate (`gaoya`, `probminhash`) for that
//! reason: the band hashes are stored in Redis and must not change with a dependency's version.

/// Characters per shingle. Five characters carry a word's stem in alphabetic scripts and a
/// phrase in Chinese; shorter ones make unrelated texts look alike.
pub const SHINGLE_CHARS: usize = 5;
/// LSH bands per signature.
pub const BANDS: usize = 16;
/// MinHash slots per band.
pub const ROWS: usize = 4;
/// MinHash slots in a signature (`BANDS × ROWS`).
pub const SLOTS: usize = BANDS * ROWS;
/// Characters of the normalised text that are shingled: a template is recognised by its start,
/// and the cost of a lookup stays bounded whatever the request's length.
pub const MAX_CHARS: usize = 2_000;

/// The bands of one text: `BANDS` 64-bit band hashes, in band order (band `i`'s hash mixes its
/// index, so equal rows in different bands do not collide).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bands(pub [u64; BANDS]);

/// The text as templates vary it least: lowercase, every URL as `⟨u⟩`, every digit run as `0`,
/// whitespace runs as one space. Names still differ; shingles absorb that.
pub fn normalise(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(MAX_CHARS * 4));
    let mut chars = 0;
    for word in text.split_whitespace() {
        if chars >= MAX_CHARS {
            break;
        }
        if !out.is_empty() {
            out.push(' ');
        }
        if is_link(word) {
            out.push('⟨');
            out.push('u');
            out.push('⟩');
            chars += 4;
            continue;
        }
        let mut in_digits = false;
        for c in word.chars().flat_map(char::to_lowercase) {
            let digit = c.is_ascii_digit();
            if !(digit && in_digits) {
                out.push(if digit { '0' } else { c });
                chars += 1;
            }
            in_digits = digit;
        }
        chars += 1;
    }
    out
}

/// Whether a whitespace-separated word is a link (a scheme or a `www.` start).
fn is_link(word: &str) -> bool {
    let w = word.trim_start_matches(|c: char| !c.is_alphanumeric());
    let lower = |p: &str| w.len() >= p.len() && w.is_char_boundary(p.len()) && w[..p.len()].eq_ignore_ascii_case(p);
    lower("http://") || lower("https://") || lower("www.")
}

/// FNV-1a, 64 bits (Fowler, Noll & Vo; the IETF draft-eastlake-fnv constants).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The SplitMix64 finaliser: a bijection on `u64` whose output bits each depend on every input bit.
pub const fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Each slot's `(a, b)`: its hash of a (mixed) shingle hash `x` is `a·x + b mod 2^64`, `a` odd —
/// the multiply-add family MinHash implementations use for their permutations (Carter & Wegman
/// 1979; MMDS 3.3.5), one multiply per slot instead of a full mix: the lookup's largest cost.
const SLOT_SEEDS: [(u64, u64); SLOTS] = {
    let mut seeds = [(0u64, 0u64); SLOTS];
    let mut i = 0;
    while i < SLOTS {
        seeds[i] = (mix(i as u64 + 1) | 1, mix(i as u64 + 0x1000));
        i += 1;
    }
    seeds
};

/// The MinHash signature of `text`'s [`normalise`]d form: for every slot, the least slot hash
/// over all its shingles of [`SHINGLE_CHARS`] characters (a text shorter than one shingle is one
/// shingle). Same text, same signature, on every machine.
pub fn signature(text: &str) -> [u64; SLOTS] {
    let normal = normalise(text);
    let starts: Vec<usize> = normal.char_indices().map(|(i, _)| i).chain([normal.len()]).collect();
    let shingles = starts.len().saturating_sub(SHINGLE_CHARS).max(1);
    let mut sig = [u64::MAX; SLOTS];
    for s in 0..shingles {
        let end = starts[(s + SHINGLE_CHARS).min(starts.len() - 1)];
        let x = mix(fnv1a(&normal.as_bytes()[starts[s]..end]));
        for (slot, (a, b)) in sig.iter_mut().zip(&SLOT_SEEDS) {
            *slot = (*slot).min(a.wrapping_mul(x).wrapping_add(*b));
        }
    }
    sig
}

/// The LSH bands of `text`: each band's [`ROWS`] slots hashed together with the band's index.
pub fn bands(text: &str) -> Bands {
    let sig = signature(text);
    let mut out = [0u64; BANDS];
    for (b, band) in out.iter_mut().enumerate() {
        let mut h = mix(b as u64 + 1);
        for row in &sig[b * ROWS..(b + 1) * ROWS] {
            h = mix(h ^ *row);
        }
        *band = h;
    }
    Bands(out)
}

/// The fraction of equal slots of two signatures: an unbiased estimate of the Jaccard
/// similarity of their shingle sets (Broder 1997).
pub fn similarity(a: &[u64; SLOTS], b: &[u64; SLOTS]) -> f64 {
    a.iter().zip(b).filter(|(x, y)| x == y).count() as f64 / SLOTS as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEMPLATE: [&str; 3] = [
        "Dear Anna Schmidt, your parcel 48213 is held at customs. Pay the 2.99 EUR fee within 24 hours at https://dhl-parcel.example/p/8812 or it is returned.",
        "Dear Li Wei, your parcel 99120 is held at customs. Pay the 3.49 EUR fee within 12 hours at http://parcel-dhl.example/track?id=1 or it is returned.",
        "Dear Mohammed Al-Farsi, your parcel 1002 is held at customs. Pay the 1.99 EUR fee within 48 hours at https://bit.example/x or it is returned.",
    ];

    fn shared_bands(a: &str, b: &str) -> usize {
        let (a, b) = (bands(a), bands(b));
        a.0.iter().zip(&b.0).filter(|(x, y)| x == y).count()
    }

    #[test]
    fn one_template_with_changed_names_amounts_and_links_shares_bands() {
        for other in &TEMPLATE[1..] {
            let s = similarity(&signature(TEMPLATE[0]), &signature(other));
            assert!(s > 0.6, "similarity {s} of {other:?}");
            assert!(shared_bands(TEMPLATE[0], other) >= 2, "{other:?}");
        }
    }

    #[test]
    fn chinese_template_variants_share_bands_and_differ_from_other_chinese_text() {
        let a = "【顺丰】尊敬的王先生，您的包裹1234因地址不详被退回，请在24小时内点击 https://sf-ex.example/a 更新地址并支付3元手续费。";
        let b = "【顺丰】尊敬的李女士，您的包裹98765因地址不详被退回，请在12小时内点击 http://sf.example/zz 更新地址并支付5元手续费。";
        let c = "今晚公司年会六点开始，请大家准时到三楼会议室，带上工牌，谢谢配合。";
        assert!(shared_bands(a, b) >= 2);
        assert_eq!(shared_bands(a, c), 0);
    }

    #[test]
    fn unrelated_texts_share_no_band() {
        let other = "The quarterly board meeting moves to Thursday at 10am; agenda attached, coffee provided.";
        for t in TEMPLATE {
            assert_eq!(shared_bands(t, other), 0, "{t:?}");
        }
    }

    #[test]
    fn bands_are_stable_values_not_a_platform_hasher() {
        // Pinned: a change here changes every band key stored in Redis (a fleet mid-upgrade would
        // split every campaign in two). Change it only with a new key prefix.
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(mix(0), 0);
        assert_eq!(bands("hello world").0[0], bands("HELLO   world").0[0]);
        assert_eq!(normalise("Pay 1,234.50 at https://x.example/a NOW"), "pay 0,0.0 at ⟨u⟩ now");
    }

    #[test]
    fn empty_and_short_texts_have_a_signature() {
        assert_eq!(bands(""), bands(" "));
        assert_ne!(bands("hi"), bands("yo"));
    }
}
