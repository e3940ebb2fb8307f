//! Text preparation shared by the model and the rules.
//!
//! - [`canonical`]: [`canonicalize`] turns the text a client sent into the canonical text that the
//!   model and the rules read (HTML entities decoded, invisible and format characters removed,
//!   Unicode NFKC per UAX #15, look-alike letters inside mixed-script words folded to Latin,
//!   defanged links restored, padded Chinese characters and split letters joined), a lower-cased
//!   UTS #39 skeleton for look-alike-proof matching, and [`Obfuscation`] that count what was
//!   hidden. The original text stays what the audit and the
//!   app see; nothing here changes it.
//! - [`han`]: Chinese evasions: padded characters joined (a canonical step), and [`han::fold`]
//!   (Traditional to Simplified, Chinese digit runs to ASCII) for the policy's signals.
//! - [`lang`]: [`detect`] names the language (ISO 639-3) and script (ISO 15924) of a text with the
//!   `whatlang` crate, and says "und" when the text is too short or the guess is unreliable.
//!
//! Everything is pure, allocation-light and free of I/O; the Unicode data comes from the
//! `unicode-normalization`, `unicode-security`, `unicode-properties`, `unicode-script` and
//! `unicode-segmentation` crates and the entity table from `html-escape`, not from tables kept
//! here.

pub mod canonical;
mod defang;
pub mod han;
mod invisible;
pub mod lang;
mod split;

pub use canonical::{canonicalize, skeleton, Canonical, Obfuscation};
pub use invisible::is_blank;
pub use lang::{detect, Elsewhere, Language, LanguageCell};

#[cfg(test)]
mod tests;
