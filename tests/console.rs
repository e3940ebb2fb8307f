//! The review console in a real browser: headless Chromium driven over WebDriver.

mod common;

use common::browser::Browser;
use fantoccini::Locator;

/// The harness on its own: the fetched browser reads a page tiergate serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fetched_browser_reads_a_page_tiergate_serves() {
    let addr = common::default_server();
    let browser = Browser::start();
    let client = browser.session().await;
    client.goto(&format!("http://{addr}/healthz")).await.unwrap();
    let body = client.find(Locator::Css("body")).await.unwrap().text().await.unwrap();
    assert_eq!(body, r#"{"status":"ok"}"#);
    client.close().await.unwrap();
}
