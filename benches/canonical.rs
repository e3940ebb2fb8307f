//! Cost of preparing the text: [`canonicalize`] (entities, invisible characters, NFKC,
//! mixed-script folding, defanged links, skeleton) and language detection, on a short ASCII SMS
//! (fast path), a 1 KB mail with accents and an entity (full path, nothing to fold) and a text
//! full of look-alikes, zero-width characters and a defanged link.
//!
//! Run: `cargo bench --bench canonical`

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::time::Duration;
use tiergate::text::{canonicalize, detect};

const SMS: &str = "Your parcel is on hold. Pay the 1.99 GBP fee at https://royalmail-track.example.top/pay today.";

const MAIL_PARAGRAPH: &str = "Dear customer, we noticed an unusual sign-in to your account from a new device. \
For your security we have temporarily limited some features. To restore full access, please confirm \
your identity within 24 hours &ndash; otherwise the account will be closed. Thank you, the Security Team. ";

/// "Confirm your pаypal pаsswоrd" with Cyrillic letters, zero-width spaces, a soft hyphen,
/// fullwidth and mathematical letters and a defanged link.
fn confusable_text() -> String {
    "Confirm your p\u{430}yp\u{430}l p\u{430}ss\u{200B}w\u{43E}rd at hxxps://p\u{430}ypal-secure[.]top/log\u{AD}in \
     or call \u{FF10}\u{FF18}\u{FF10}\u{FF10}. \u{1D41A}\u{1D41C}\u{1D41C}\u{1D428}\u{1D42E}\u{1D427}\u{1D42D} \
     l\u{43E}cked: v\u{435}rify n\u{43E}w &#112;lease."
        .to_string()
}

fn mail_1k() -> String {
    let mut mail = String::from("Chère cliente, cher client,\n\n");
    while mail.len() < 1024 {
        mail.push_str(MAIL_PARAGRAPH);
    }
    mail.truncate(mail.char_indices().map(|(i, _)| i).take_while(|&i| i <= 1024).last().unwrap_or(0));
    mail
}

fn bench(c: &mut Criterion) {
    let mail = mail_1k();
    let confusable = confusable_text();
    let cases = [("sms_ascii", SMS), ("mail_1k", mail.as_str()), ("confusable", confusable.as_str())];
    for (name, text) in cases {
        c.bench_function(&format!("canonicalize/{name}"), |b| b.iter(|| canonicalize(black_box(text))));
    }
    for (name, text) in cases {
        let canonical = canonicalize(text).text;
        c.bench_function(&format!("detect/{name}"), |b| b.iter(|| detect(black_box(&canonical))));
    }
    for (name, text) in cases {
        c.bench_function(&format!("canonicalize+detect/{name}"), |b| {
            b.iter(|| {
                let canonical = canonicalize(black_box(text));
                detect(&canonical.text)
            })
        });
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
