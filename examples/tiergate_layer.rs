//! tiergate in-process, as a tower layer in a plain hyper app: each request is screened before
//! the app's handler runs. A request the policy blocks gets 403 with the decision and never
//! reaches the handler; the handler gets every other request with the `Decision` in its
//! extensions and the `x-tiergate-*` decision headers set (any a client sent are removed).
//!
//!   cargo run --release --example tiergate_layer -- --listen 127.0.0.1:3001
//!   curl -s localhost:3001/ -H 'content-type: application/json' -d '{"message": "See you at noon?"}'
//!
//! The screened text is the body's `message` field. The model and policies come from
//! `config/tiergate.toml` when run from the repository root, else from `models/` and `policies/`.
//! Listen address: `--listen ADDR`, else the `LISTEN` environment variable, else 127.0.0.1:3001;
//! "listening on ADDR" is printed once requests are accepted (port 0 picks a free port).

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tiergate::decision::Decision;
use tiergate::gateway::Sources;
use tiergate::proxy::config::ScreenConfig;
use tiergate::proxy::layer::TierGateLayer;
use tiergate::web::BoxBody;
use tiergate::{Config, Gateway};
use tower::ServiceBuilder;

/// The screening rule, as a proxied route's `[routes.screen]` section would give it.
const SCREEN: &str = r#"
text = ["/message"]            # JSON pointer into the request body
features = { user = "/user" }  # optional; missing sources are left out
on_error = "closed"            # unreadable / non-JSON / text-less bodies are refused, not passed
on_review = "forward"          # the handler sees review decisions and may act on them
on_block = "block"
"#;

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let listen = listen_addr()?;
    let config = load_config()?;
    let screen: ScreenConfig = toml::from_str(SCREEN)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(serve(config, screen, listen))
}

/// `--listen ADDR`, else `LISTEN`, else 127.0.0.1:3001.
fn listen_addr() -> anyhow::Result<SocketAddr> {
    let mut args = std::env::args().skip(1);
    let mut listen = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => listen = Some(args.next().ok_or_else(|| anyhow::anyhow!("--listen needs an address"))?),
            other => match other.strip_prefix("--listen=") {
                Some(addr) => listen = Some(addr.to_string()),
                None => anyhow::bail!("unknown argument `{other}` (usage: tiergate_layer [--listen ADDR])"),
            },
        }
    }
    let listen = listen.or_else(|| std::env::var("LISTEN").ok()).unwrap_or_else(|| "127.0.0.1:3001".into());
    listen.parse().map_err(|e| anyhow::anyhow!("listen address `{listen}`: {e}"))
}

/// The bundled config when run from the repository root, else the defaults with `models/` and
/// `policies/` in the current directory.
fn load_config() -> anyhow::Result<Config> {
    let bundled = Path::new("config/tiergate.toml");
    if bundled.is_file() {
        return Config::load(bundled).map_err(anyhow::Error::msg);
    }
    let mut config = Config::default();
    config.model.dir = PathBuf::from("models");
    config.policies.dir = PathBuf::from("policies");
    Ok(config)
}

async fn serve(config: Config, screen: ScreenConfig, listen: SocketAddr) -> anyhow::Result<()> {
    let gateway = Gateway::start(&config.gateway(), Sources::default())?;
    let layer = TierGateLayer::new(Arc::clone(&gateway), config.server.clone(), "example", &screen)
        .map_err(anyhow::Error::msg)?;
    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!("listening on {}", listener.local_addr()?);
    let builder = auto::Builder::new(TokioExecutor::new());
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => accepted?,
            _ = tokio::signal::ctrl_c() => return Ok(()),
        };
        // The layer screens, then calls the app's own handler with the request it passed.
        let service = ServiceBuilder::new().layer(layer.clone()).service(tower::service_fn(handler));
        let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service)).into_owned();
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
}

/// The app: answers what it was told about the request, to show what a handler can rely on.
async fn handler(req: Request<BoxBody>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let decision = parts.extensions.get::<Decision>();
    // Every x-tiergate-* header the handler received, with all its values: only the layer's.
    let mut tiergate_headers = Map::new();
    for name in parts.headers.keys().filter(|k| k.as_str().starts_with("x-tiergate-")) {
        let values: Vec<Value> =
            parts.headers.get_all(name).iter().map(|v| String::from_utf8_lossy(v.as_bytes()).into()).collect();
        tiergate_headers.insert(name.to_string(), values.into());
    }
    // The body arrives intact after screening read it.
    let body_bytes = body.collect().await.map(|b| b.to_bytes().len()).ok();
    let answer = json!({
        "ok": true,
        "action": decision.map(|d| d.action.as_str()),
        "risk_score": decision.map(|d| d.risk_score),
        "tier": decision.map(|d| d.tier.as_str()),
        "x-tiergate-action header": parts.headers.get("x-tiergate-action").and_then(|v| v.to_str().ok()),
        "tiergate_headers": tiergate_headers,
        "body_bytes": body_bytes,
    });
    let mut response = Response::new(Full::new(Bytes::from(answer.to_string())));
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    Ok(response)
}
