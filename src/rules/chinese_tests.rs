//! The bundled policy's Chinese signals and guard: both scripts, Chinese digits, padding.

use super::tests::{policy, RULES};
use super::*;
use crate::policy::Policy;
use std::path::Path;

#[test]
fn chinese_signals_match_both_scripts_and_chinese_digits() {
    let p = Policy::load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap();
    let n = |text: &str, signal: &str| p.rules.count_signals(text)[signal];
    // Simplified pattern, Traditional text; and a pattern written in Traditional, Simplified text.
    assert_eq!(n("您的驗證碼已過期，請立即點擊連結解凍帳戶", "scam_words_intl"), 2, "驗證碼 + 解凍");
    assert_eq!(n("您的驗證碼已過期，請立即點擊連結解凍帳戶", "urgency_intl"), 1);
    assert_eq!(n("驗證碼 123456，請勿向任何人透露。", "do_not_share"), 1);
    let traditional = policy(&RULES.replace("'https?://\\S+'", "'匯款'")).unwrap();
    assert_eq!(traditional.rules.count_signals("请马上汇款")["link"], 1);
    // A code in Chinese digits reads as digits; a single numeral in a word does not.
    let code = policy(&RULES.replace("'https?://\\S+'", "'\\d{6}'")).unwrap();
    assert_eq!(code.rules.count_signals("验证码：五八三二一〇")["link"], 1);
    assert_eq!(code.rules.count_signals("我们一起去吃饭，一下就到")["link"], 0);
    // Ordinary Chinese without the words.
    assert!(p.rules.count_signals("周末一起去爬山吧，天气不错").values().all(|&v| v == 0));
    // Padded apart around a scam word: the guard raises to review; the same words unpadded do not trip it.
    let guard = |text: &str| {
        let c = crate::text::canonicalize(text);
        let signals = p.rules.count_signals(&c.text);
        let features = serde_json::Map::new();
        let input = RulesInput {
            text: &c.text,
            lang: "cmn",
            obfuscation: &c.obfuscation,
            signals: &signals,
            features: &features,
            tenant: None,
            model: None,
            features_model: None,
            campaign: None,
        };
        p.rules.guard(&input).matched.map(|(name, action, _)| (name, action))
    };
    assert_eq!(
        guard("兼职日结，出 租 银 行 卡，加 微 信 了解"),
        Some(("padded_chinese_request".to_string(), Action::Review))
    );
    assert_eq!(guard("兼职日结，出租银行卡，加微信了解"), None);
}
