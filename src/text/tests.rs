use super::canonical::nfkc_by_pieces_for_test;
use super::lang::MIN_CONFIDENCE;
use super::*;
use proptest::prelude::*;
use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};

fn canon(s: &str) -> Canonical {
    canonicalize(s)
}

/// Canonicalizing the canonical text again changes nothing.
fn assert_idempotent(s: &str) {
    let once = canon(s).text;
    let twice = canon(&once);
    assert_eq!(twice.text, once, "not idempotent for {s:?}");
    assert!(!twice.obfuscation.changed, "second pass still changed {s:?}: {:?}", twice.obfuscation);
}

// ---------------------------------------------------------------------------------------------
// Fast path

#[test]
fn plain_ascii_takes_the_fast_path_unchanged() {
    let sms = "Your parcel is waiting. Pay the 1.99 fee at https://example.com/track today (ref 123).";
    let c = canon(sms);
    assert_eq!(c.text, sms);
    assert_eq!(c.obfuscation, Obfuscation::default());
    assert_eq!(c.skeleton, skeleton(sms));
    assert!(!c.obfuscation.changed);
}

#[test]
fn ascii_skeleton_table_matches_the_crate() {
    // The table path must give exactly what the UTS #39 implementation gives.
    let printable: Vec<char> = (0u8..128).map(char::from).collect();
    for &a in &printable {
        for &b in &printable {
            let s: String = [a, b].iter().collect();
            let expected: String = unicode_security::skeleton(&s).flat_map(char::to_lowercase).collect();
            assert_eq!(skeleton(&s), expected, "{s:?}");
        }
    }
}

#[test]
fn ascii_prototypes_start_and_end_with_starters() {
    // What lets `skeleton` cut the text between ASCII and non-ASCII runs.
    use unicode_normalization::char::canonical_combining_class;
    for b in 0u8..128 {
        let prototype: Vec<char> = unicode_security::skeleton(&char::from(b).to_string()).collect();
        let (first, last) = (prototype.first().copied(), prototype.last().copied());
        assert_eq!(first.map(canonical_combining_class), Some(0), "{b}");
        assert_eq!(last.map(canonical_combining_class), Some(0), "{b}");
    }
}

#[test]
fn skeleton_catches_digit_and_case_lookalikes() {
    assert_eq!(skeleton("PAYPAL"), skeleton("paypal"));
    assert_eq!(skeleton("PayPaI"), skeleton("paypal")); // capital I for l
    assert_eq!(skeleton("g00gle"), skeleton("google"));
    assert_eq!(skeleton("rnicrosoft"), skeleton("microsoft"));
    assert!(canon("Log in to PayPaI now").skeleton.contains(&skeleton("paypal")));
}

// ---------------------------------------------------------------------------------------------
// Confusables, one kind each

#[test]
fn cyrillic_letters_in_a_latin_word_fold_to_latin() {
    // "pаypal" and "pаsswоrd" with Cyrillic а (U+0430) and о (U+043E).
    let c = canon("Confirm your p\u{430}ypal p\u{430}ssw\u{43E}rd");
    assert_eq!(c.text, "Confirm your paypal password");
    assert_eq!(c.obfuscation.mixed_script_words, 2);
    assert_eq!(c.obfuscation.confusable_chars, 3);
    assert!(c.obfuscation.changed);
    assert!(c.skeleton.contains(&skeleton("password")));
}

#[test]
fn mostly_cyrillic_word_that_looks_latin_folds_too() {
    // "раураl": Cyrillic р а у а р + Latin l.
    let c = canon("\u{440}\u{430}\u{443}\u{440}\u{430}l");
    assert_eq!(c.text, "paypal");
    assert_eq!(c.obfuscation.mixed_script_words, 1);
    assert_eq!(c.obfuscation.confusable_chars, 5);
}

#[test]
fn uppercase_cyrillic_folds_to_uppercase_latin() {
    // "РayPal" with Cyrillic Р (U+0420).
    assert_eq!(canon("\u{420}ayPal").text, "PayPal");
}

#[test]
fn greek_letters_in_a_latin_word_fold_to_latin() {
    // Greek ο (U+03BF) and α (U+03B1).
    let c = canon("Verify your Amaz\u{3BF}n acc\u{3BF}unt: p\u{3B1}ssword expired");
    assert_eq!(c.text, "Verify your Amazon account: password expired");
    assert_eq!(c.obfuscation.mixed_script_words, 3);
    assert_eq!(c.obfuscation.confusable_chars, 3);
}

#[test]
fn zero_width_characters_inside_a_word_are_removed_and_counted() {
    let c = canon("pass\u{200B}word and pay\u{200D}pal and log\u{200C}in and ac\u{2060}count\u{FEFF}");
    assert_eq!(c.text, "password and paypal and login and account");
    assert_eq!(c.obfuscation.invisible_chars, 5);
    assert_eq!(c.obfuscation.mixed_script_words, 0);
}

#[test]
fn soft_hyphen_is_removed() {
    let c = canon("pass\u{AD}word");
    assert_eq!(c.text, "password");
    assert_eq!(c.obfuscation.invisible_chars, 1);
    // Also when it comes as an entity.
    let c = canon("pass&shy;word");
    assert_eq!(c.text, "password");
    assert_eq!((c.obfuscation.html_entities, c.obfuscation.invisible_chars), (1, 1));
}

#[test]
fn bidi_controls_and_other_format_characters_are_removed() {
    // Right-to-left override used to disguise a file name, a left-to-right isolate, a tag char.
    // A tag character shadows an ASCII one: it is read as that character (ASCII smuggling).
    let c = canon("invoice\u{202E}fdp.exe \u{2066}x\u{2069} a\u{E0041}b");
    assert_eq!(c.text, "invoicefdp.exe x aAb");
    assert_eq!((c.obfuscation.invisible_chars, c.obfuscation.smuggled_chars), (4, 1));
}

#[test]
fn control_characters_are_removed_but_line_breaks_kept() {
    let c = canon("pay\u{0}pal\u{1B}\tnow\r\nok\u{7F}\u{85}");
    assert_eq!(c.text, "paypal\tnow\r\nok\u{85}");
    assert_eq!(c.obfuscation.invisible_chars, 3);
}

#[test]
fn variation_selectors_and_hangul_fillers_are_removed() {
    let c = canon("pass\u{FE0F}word\u{3164}x\u{FFA0}y");
    assert_eq!(c.text, "passwordxy");
    assert_eq!(c.obfuscation.invisible_chars, 3);
}

#[test]
fn joiners_in_emoji_and_non_latin_scripts_are_removed_without_counting() {
    // Family emoji (ZWJ sequence), red heart with VS16, Persian word with a ZWNJ.
    let c = canon("\u{1F468}\u{200D}\u{1F469}\u{200D}\u{1F467} \u{2764}\u{FE0F} \u{645}\u{6CC}\u{200C}\u{62E}\u{648}\u{627}\u{647}\u{645}");
    assert_eq!(c.text, "\u{1F468}\u{1F469}\u{1F467} \u{2764} \u{645}\u{6CC}\u{62E}\u{648}\u{627}\u{647}\u{645}");
    assert_eq!(c.obfuscation.invisible_chars, 0);
    assert!(c.obfuscation.changed);
}

/// `text` written in Unicode Tag characters (U+E0000 + each ASCII code).
fn tags(text: &str) -> String {
    text.chars().map(|c| char::from_u32(0xE0000 + c as u32).unwrap()).collect()
}

/// `text`'s UTF-8 bytes as variation selectors (0-15 -> U+FE00.., 16-255 -> U+E0100..).
fn selectors(text: &str) -> String {
    let vs = |b: u8| char::from_u32(if b < 16 { 0xFE00 + b as u32 } else { 0xE0100 + b as u32 - 16 }).unwrap();
    text.bytes().map(vs).collect()
}

#[test]
fn a_message_written_only_in_tag_characters_or_selectors_is_not_blank() {
    assert!(!crate::text::is_blank(&tags("send the code")), "decoded and judged, not refused as empty");
    assert!(!crate::text::is_blank(&selectors("send the code")));
    // Tags that shadow nothing printable (language tag, cancel tag, a shadowed space) are blank.
    assert!(crate::text::is_blank(&format!("\u{200B} \u{E0001}{}\u{E007F}", tags(" "))));
}

#[test]
fn text_hidden_in_tag_characters_is_read_and_counted_wherever_it_stands() {
    let hidden = "verify your password at http://x.top";
    for before in ["Hi! ", "Hi \u{1F44B} ", "\u{4F60}\u{597D} ", "\u{645}\u{631}\u{62D}\u{628}\u{627} ", ""] {
        let c = canon(&format!("{before}{}", tags(hidden)));
        assert!(c.text.ends_with(hidden), "{before:?}: {:?}", c.text);
        assert_eq!(
            (c.obfuscation.invisible_chars, c.obfuscation.smuggled_chars),
            (hidden.len(), hidden.len()),
            "{before:?}"
        );
    }
    // Language and cancel tags around it shadow nothing printable, but are counted.
    let c = canon(&format!("ok\u{E0001}{}\u{E007F}", tags("pay")));
    assert_eq!((c.text.as_str(), c.obfuscation.invisible_chars, c.obfuscation.smuggled_chars), ("okpay", 5, 3));
}

#[test]
fn emoji_flag_tag_sequences_stay_ordinary() {
    // The flags of England and Scotland (UTS #51 tag sequences) are not hidden text.
    let c = canon(&format!("Go \u{1F3F4}{}\u{E007F} and \u{1F3F4}{}\u{E007F}!", tags("gbeng"), tags("gbsct")));
    assert_eq!(c.text, "Go \u{1F3F4} and \u{1F3F4}!");
    assert_eq!((c.obfuscation.invisible_chars, c.obfuscation.smuggled_chars), (0, 0));
    // The same tags after anything but the black flag, or spelling more than a region, are hidden text.
    let c = canon(&format!("Go \u{1F600}{}\u{E007F}", tags("gbeng")));
    assert_eq!((c.obfuscation.invisible_chars, c.obfuscation.smuggled_chars), (6, 5));
    let c = canon(&format!("\u{1F3F4}{}\u{E007F}", tags("send the code")));
    assert_eq!(c.obfuscation.smuggled_chars, 13);
}

#[test]
fn text_hidden_in_variation_selectors_is_read_and_counted() {
    let hidden = "send your OTP to +1 555 0100";
    let c = canon(&format!("Lunch? \u{1F354}{}", selectors(hidden)));
    assert!(c.text.contains(hidden), "{:?}", c.text);
    let n = hidden.len();
    assert_eq!((c.obfuscation.invisible_chars, c.obfuscation.smuggled_chars), (n, n));
    // Bytes that are not UTF-8 are dropped, and still counted.
    let c = canon("x \u{1F354}\u{E01EF}\u{E01EF}");
    assert_eq!((c.text.as_str(), c.obfuscation.invisible_chars, c.obfuscation.smuggled_chars), ("x \u{1F354}", 2, 2));
    // One selector after an emoji, a keycap base or an ideograph is ordinary; after a Latin letter
    // it is counted (hidden, not smuggled).
    let c = canon("\u{2764}\u{FE0F} 1\u{FE0F}\u{20E3} \u{845B}\u{E0100}");
    assert_eq!((c.obfuscation.invisible_chars, c.obfuscation.smuggled_chars), (0, 0), "{:?}", c.text);
    let c = canon("pay\u{FE0F}pal");
    assert_eq!((c.text.as_str(), c.obfuscation.invisible_chars, c.obfuscation.smuggled_chars), ("paypal", 1, 0));
}

#[test]
fn a_joiner_after_an_emoji_joins_only_what_follows_it() {
    // A ZWJ between two emoji is a ZWJ sequence; before a space or a Latin letter it joins nothing.
    let c = canon("\u{1F600}\u{200D} pass\u{200B}word \u{1F600}\u{200D}x");
    assert_eq!(c.text, "\u{1F600} password \u{1F600}x");
    assert_eq!(c.obfuscation.invisible_chars, 3);
}

#[test]
fn fullwidth_forms_become_ascii() {
    // "ｐａｙｐａｌ．ｃｏｍ" in fullwidth.
    let c = canon("\u{FF50}\u{FF41}\u{FF59}\u{FF50}\u{FF41}\u{FF4C}\u{FF0E}\u{FF43}\u{FF4F}\u{FF4D}");
    assert_eq!(c.text, "paypal.com");
    assert_eq!(c.obfuscation.confusable_chars, 9); // letters only, not the full stop
    assert_eq!(c.obfuscation.mixed_script_words, 0);
}

#[test]
fn mathematical_bold_letters_become_ascii() {
    // "𝐩𝐚𝐬𝐬𝐰𝐨𝐫𝐝" in MATHEMATICAL BOLD SMALL letters.
    let bold: String = "password".chars().map(|c| char::from_u32(0x1D41A + (c as u32 - 'a' as u32)).unwrap()).collect();
    let c = canon(&format!("Reset your {bold} now"));
    assert_eq!(c.text, "Reset your password now");
    assert_eq!(c.obfuscation.confusable_chars, 8);
}

#[test]
fn ligatures_and_circled_letters_become_ascii() {
    assert_eq!(canon("\u{FB01}nance \u{24B6}\u{24B7}").text, "finance AB");
}

#[test]
fn genuinely_russian_and_greek_text_is_left_alone() {
    for s in [
        "Привет! Ваш заказ готов, оплатите доставку по ссылке.",
        "Καλημέρα, ο λογαριασμός σας έχει κλειδωθεί.",
        "сор рос сера", // Russian words made only of Latin look-alike letters
    ] {
        let c = canon(s);
        assert_eq!(c.text, s);
        assert_eq!(c.obfuscation, Obfuscation::default(), "{s}");
    }
}

#[test]
fn whole_script_confusable_is_left_in_the_text_but_caught_by_the_skeleton() {
    // "аррӏе": every letter Cyrillic (а р р palochka е), so it is one script and stays as is,
    // but its skeleton is that of "apple".
    let s = "\u{430}\u{440}\u{440}\u{4CF}\u{435} id locked";
    let c = canon(s);
    assert_eq!(c.text, s);
    assert_eq!(c.obfuscation.mixed_script_words, 0);
    assert!(c.skeleton.contains(&skeleton("apple")), "{:?}", c.skeleton);
}

#[test]
fn mixed_script_word_without_a_latin_form_is_counted_but_kept() {
    // "Пpивет" with a Latin p (U+0070): П has no Latin look-alike, so the word stays.
    let s = "\u{41F}p\u{438}\u{432}\u{435}\u{442} мир";
    let c = canon(s);
    assert_eq!(c.text, s);
    assert_eq!(c.obfuscation.mixed_script_words, 1);
    assert_eq!(c.obfuscation.confusable_chars, 0);
    assert!(!c.obfuscation.changed);
}

#[test]
fn mixing_scripts_without_lookalikes_is_not_a_signal() {
    // Korean particles attach to Latin words; Chinese and Japanese mix scripts without spaces.
    for s in ["iPhone을 샀어요", "我用iPhone拍照", "東京タワーへ行きます"] {
        let c = canon(s);
        assert_eq!(c.text, s);
        assert_eq!(c.obfuscation.mixed_script_words, 0, "{s}");
    }
}

#[test]
fn mixed_script_words_are_counted_once_per_word() {
    let c = canon("p\u{430}yp\u{430}l s\u{435}cur\u{435} \u{43E}k fine");
    // "pаypаl" and "sеcurе" are mixed; "оk" is Cyrillic о + Latin k, mixed as well.
    assert_eq!(c.obfuscation.mixed_script_words, 3);
    assert_eq!(c.obfuscation.confusable_chars, 5);
    assert_eq!(c.text, "paypal secure ok fine");
}

// ---------------------------------------------------------------------------------------------
// Defanged links

#[test]
fn defanged_link_is_restored() {
    let c = canon("Log in at hxxps://evil[.]top/login now");
    assert_eq!(c.text, "Log in at https://evil.top/login now");
    assert_eq!(c.obfuscation.defanged_links, 1);
    assert!(c.obfuscation.changed);
}

#[test]
fn defanging_variants_are_restored() {
    let cases = [
        ("hXXp://bad(.)example{.}com", "http://bad.example.com"),
        ("HXXPS[:]//secure[dot]bank(dot)co[.]uk", "https://secure.bank.co.uk"),
        ("fxp://files[.]example[.]net", "ftp://files.example.net"),
        ("hxxp[://]evil[.]top", "http://evil.top"),
        ("mail john[at]evil[.]top or jane[@]evil(.)top", "mail john@evil.top or jane@evil.top"),
        ("10[.]0[.]0[.]1[:]8080", "10.0.0.1:8080"),
        ("j.doe[at]example[dot]com", "j.doe@example.com"),
    ];
    for (defanged, restored) in cases {
        assert_eq!(canon(defanged).text, restored, "{defanged}");
    }
    assert_eq!(canon("hxxps://a[.]b[.]c/x and evil[.]top").obfuscation.defanged_links, 2);
}

#[test]
fn brackets_in_prose_are_left_alone() {
    for s in [
        "see [1] (a) and b.",
        "The options are (a), (b) and [c]. Done (.) or not [ . ] and (at) noon [at] home.",
        "a list: [.] [:] [@] at the start",
        "hxxp alone, ahxxp://x, thxxps: and fxpress",
        "the (dot) matters {.}",
    ] {
        let c = canon(s);
        assert_eq!(c.text, s);
        assert_eq!(c.obfuscation.defanged_links, 0, "{s}");
    }
}

#[test]
fn nested_defanging_settles_in_later_rounds() {
    assert_idempotent("evil[[.].]top and hxxp[[:]]//x");
}

// ---------------------------------------------------------------------------------------------
// HTML entities

#[test]
fn html_entities_are_decoded() {
    let c = canon("Enter your &#112;assword &amp; PIN &lt;here&gt; &#x70;ay&eacute;");
    assert_eq!(c.text, "Enter your password & PIN <here> payé");
    assert_eq!(c.obfuscation.html_entities, 6);
}

#[test]
fn double_encoded_entities_decode_in_one_round() {
    let c = canon("&amp;#112;assword and &amp;amp; and &amp;lt;");
    assert_eq!(c.text, "password and & and <");
    assert_eq!(c.obfuscation.html_entities, 6);
}

#[test]
fn ampersands_in_prose_and_unknown_entities_stay() {
    for s in ["AT&T and R&D, Q&A", "&notanentity; &#;", "&amp without semicolon", "& ; &#xZZ;", "&#0;"] {
        let c = canon(s);
        assert_eq!(c.text, s);
        assert_eq!(c.obfuscation.html_entities, 0, "{s}");
    }
}

#[test]
fn entities_hiding_invisible_and_confusable_characters() {
    // A zero-width space and a Cyrillic а, both written as numeric references.
    let c = canon("pass&#8203;word p&#1072;ypal");
    assert_eq!(c.text, "password paypal");
    assert_eq!(c.obfuscation.html_entities, 2);
    assert_eq!(c.obfuscation.invisible_chars, 1);
    assert_eq!(c.obfuscation.mixed_script_words, 1);
}

#[test]
fn entity_built_by_nfkc_is_decoded_in_a_later_round() {
    // A fullwidth ampersand and semicolon around "amp" become "&amp;" only after NFKC.
    assert_eq!(canon("\u{FF06}amp\u{FF1B}lt\u{FF1B}").text, "<");
    assert_idempotent("\u{FF06}amp\u{FF1B}lt\u{FF1B}");
}

// ---------------------------------------------------------------------------------------------
// Idempotence and robustness

#[test]
fn canonical_text_is_idempotent_on_the_examples() {
    for s in [
        "Confirm your p\u{430}ypal p\u{430}ssw\u{43E}rd",
        "hxxps://evil[.]top/login",
        "&amp;#112;assword",
        "pass\u{200B}word \u{FF50}\u{FF41}\u{FF59}",
        "e\u{200B}\u{301}", // a mark that NFKC can compose only once the zero-width space is gone
        "Пpивет мир",
        "Καλημέρα",
        "p&#1072;ypal[.]com",
        "\u{1F468}\u{200D}\u{1F469}",
        "&amp;amp;amp;amp;amp;amp;amp;",
    ] {
        assert_idempotent(s);
    }
}

fn is_forbidden_in_text(c: char) -> bool {
    matches!(c.general_category(), GeneralCategory::Format)
        || (c.is_control() && !c.is_whitespace())
        || matches!(c, '\u{200B}'..='\u{200F}' | '\u{2060}' | '\u{FEFF}' | '\u{AD}' | '\u{FE00}'..='\u{FE0F}' | '\u{3164}')
}

fn tricky_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("p".to_string()),
        Just("\u{430}".to_string()),
        Just("\u{3BF}".to_string()),
        Just("\u{200B}".to_string()),
        Just("\u{200D}".to_string()),
        Just("\u{AD}".to_string()),
        Just("\u{FF06}".to_string()),
        Just("&".to_string()),
        Just("amp;".to_string()),
        Just("#112;".to_string()),
        Just("[.]".to_string()),
        Just("[".to_string()),
        Just(".]".to_string()),
        Just("hxxp".to_string()),
        Just(":".to_string()),
        Just(" ".to_string()),
        Just("\u{301}".to_string()),
        Just("\u{316}".to_string()),
        Just("\u{34F}".to_string()),
        Just("e".to_string()),
        Just("\u{1100}".to_string()), // Hangul choseong kiyeok, composes with a following vowel
        Just("\u{1161}".to_string()),
        Just("\u{FB01}".to_string()),
        Just("\u{1D41A}".to_string()),
        Just("П".to_string()),
        "[a-z]{1,4}",
        any::<char>().prop_map(String::from),
    ];
    prop::collection::vec(piece, 0..24).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn canonicalize_never_panics_and_leaves_nothing_invisible(s in any::<String>()) {
        let c = canonicalize(&s);
        prop_assert!(!c.text.chars().any(is_forbidden_in_text), "{:?} -> {:?}", s, c.text);
        prop_assert_eq!(c.obfuscation.changed, c.text != s);
    }

    #[test]
    fn skeleton_matches_one_call_of_the_crate(s in tricky_text()) {
        let expected: String = unicode_security::skeleton(&s).flat_map(char::to_lowercase).collect();
        prop_assert_eq!(skeleton(&s), expected);
    }

    #[test]
    fn skeleton_matches_one_call_of_the_crate_on_any_text(s in any::<String>()) {
        let expected: String = unicode_security::skeleton(&s).flat_map(char::to_lowercase).collect();
        prop_assert_eq!(skeleton(&s), expected);
    }

    #[test]
    fn nfkc_by_pieces_matches_nfkc_of_the_whole(s in tricky_text()) {
        use unicode_normalization::UnicodeNormalization;
        prop_assert_eq!(nfkc_by_pieces_for_test(&s), s.nfkc().collect::<String>());
    }

    #[test]
    fn nfkc_by_pieces_matches_nfkc_of_the_whole_on_any_text(s in any::<String>()) {
        use unicode_normalization::UnicodeNormalization;
        prop_assert_eq!(nfkc_by_pieces_for_test(&s), s.nfkc().collect::<String>());
    }

    #[test]
    fn canonicalize_is_idempotent_on_tricky_text(s in tricky_text()) {
        let once = canonicalize(&s);
        prop_assert!(!once.text.chars().any(is_forbidden_in_text));
        let twice = canonicalize(&once.text);
        prop_assert_eq!(&twice.text, &once.text, "input {:?}", s);
    }
}

#[test]
fn canonical_serializes_with_its_field_names() {
    let json = serde_json::to_value(canon("p\u{430}ypal")).unwrap();
    assert_eq!(json["text"], "paypal");
    assert_eq!(json["obfuscation"]["mixed_script_words"], 1);
    assert_eq!(json["obfuscation"]["changed"], true);
    let json = serde_json::to_value(detect("")).unwrap();
    assert_eq!(json["code"], "und");
}

// ---------------------------------------------------------------------------------------------
// Language

#[test]
fn language_of_a_sentence() {
    let cases = [
        ("Your account has been suspended, please confirm your details to restore access.", "eng"),
        ("Votre colis est en attente de livraison, merci de payer les frais de douane aujourd'hui.", "fra"),
        ("Su cuenta ha sido bloqueada, por favor confirme sus datos para recuperar el acceso.", "spa"),
        ("Sehr geehrter Kunde, Ihr Paket wartet auf Zustellung. Bitte bezahlen Sie die Gebühr.", "deu"),
    ];
    for (text, code) in cases {
        let l = detect(text);
        assert_eq!(l.code, code, "{text}: {l:?}");
        assert_eq!(l.guess, code);
        assert_eq!(l.script, "Latn");
        assert!(l.reliable, "{text}: {l:?}");
        assert!((0.0..=1.0).contains(&l.confidence));
    }
    let l = detect("Уважаемый клиент, мы заметили подозрительную активность в вашем аккаунте. Пожалуйста, подтвердите свою личность.");
    assert_eq!((l.code, l.script, l.reliable), ("rus", "Cyrl", true));
}

#[test]
fn close_languages_are_confirmed_against_english() {
    // Portuguese next to Spanish, Dutch next to Afrikaans: whatlang's 70-way confidence is low,
    // but head to head with English the language is clear.
    for (text, code) in [
        ("Prezado cliente, sua fatura está disponível. Pague hoje para evitar juros.", "por"),
        ("Hoi allemaal, de vergadering van morgen is verplaatst naar tien uur in zaal drie.", "nld"),
    ] {
        let l = detect(text);
        assert!(l.confidence < MIN_CONFIDENCE, "the 70-way guess alone would not do: {text}: {l:?}");
        assert_eq!((l.code, l.reliable), (code, true), "{text}: {l:?}");
    }
}

#[test]
fn short_text_is_unreliable() {
    let l = detect("call me now");
    assert_eq!(l.code, "und");
    assert!(l.confidence < 1.0);
    assert!(!l.reliable);
    assert_eq!(l.script, "Latn");
    // One Greek word: whatlang is sure (one language per script), the length rule is not.
    let l = detect("Καλημέρα");
    assert_eq!((l.code, l.script, l.reliable), ("und", "Grek", false));
}

#[test]
fn low_confidence_sentence_keeps_its_guess_but_no_code() {
    // Long enough, but whatlang's margin over the runner-up is small on one short sentence.
    let l = detect("Dear customer, your account is locked.");
    assert_eq!((l.code, l.guess, l.reliable), ("und", "eng", false), "{l:?}");
    assert!(l.confidence < MIN_CONFIDENCE);
}

#[test]
fn text_without_letters_has_no_language() {
    for s in ["", "12345 !!! 678", "\u{1F600}\u{1F600}"] {
        let l = detect(s);
        assert_eq!((l.code, l.guess, l.script, l.reliable), ("und", "und", "Zzzz", false), "{s:?}");
        assert_eq!(l.confidence, 0.0);
    }
}

#[test]
fn long_text_is_sampled_at_a_char_boundary() {
    let long = "é".repeat(5000) + " Your account has been suspended, please confirm your details.";
    let l = detect(&long); // must not panic on the multi-byte cut
    assert_eq!(l.script, "Latn");
}

#[test]
fn letters_split_apart_are_joined_and_counted() {
    let c = canon("Your p|a|s|s|w|o|r|d expires: confirm it at http://example.top");
    assert_eq!(c.text, "Your password expires: confirm it at http://example.top");
    assert_eq!(c.obfuscation.split_chars, 8);
    assert!(c.obfuscation.changed);
    assert_idempotent("M|u|m| |I| |l|o|s|t| |m|y| |p|h|o|n|e");
    let plain = canon("Meeting on 2026-12-06 at 10:30, room B-2.");
    assert_eq!(plain.obfuscation.split_chars, 0);
    assert!(!plain.obfuscation.changed);
}
