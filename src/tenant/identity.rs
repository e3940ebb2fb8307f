//! Who a request is for: [`Tenants::resolve`] reads the configured identity sources in order of
//! trust and gives an [`Identity`] — a known tenant with its class, or the unknown tenant of the
//! default class, which every unknown or unauthenticated request shares.
//!
//! Order: an API key that matches a configured hash; the trusted front proxy's header (only when
//! `[tenants] trusted_header` names one); the proxy route's `tenant_name`; the request's own
//! claim (body `tenant`, `x-tiergate-tenant`, a route's `screen.tenant` source) only under
//! `accept_claimed = true`; else unknown.

use super::config::{valid_name, ClassConfig, TenantsConfig, API_KEY_HEADER, CLAIM_HEADER, OTHER};
use super::quota::Quota;
use super::share::GpuSlots;
use crate::error::ApiError;
use http::{header, HeaderMap, HeaderName};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A tenant class, compiled: its name and limits.
#[derive(Debug, Clone, PartialEq)]
pub struct Class {
    pub name: String,
    /// GCRA quota per tenant; `None`: no rate limit.
    pub rate: Option<Quota>,
    /// Share of the gpu tier's concurrency per tenant, (0, 1]; `None`: no share limit.
    pub gpu_share: Option<f64>,
    /// gpu-tier calls per tenant per UTC day; `None`: no budget.
    pub gpu_daily_budget: Option<u32>,
}

/// What one limit key owns: a known tenant, or all unknown tenants together.
#[derive(Debug)]
pub struct TenantState {
    /// The quota store's key: `tenant:NAME`, or `class:DEFAULT` for every unknown tenant.
    pub key: String,
    /// The metrics label: the known tenant's name, or [`OTHER`].
    pub label: String,
    pub class: Arc<Class>,
    /// Requests of this key on the gpu tier now (this replica).
    pub gpu: Arc<GpuSlots>,
    /// Until when (unix seconds) the daily gpu budget is known to be spent; 0: not known.
    budget_spent_until: AtomicU64,
}

impl TenantState {
    fn new(key: String, label: String, class: Arc<Class>) -> Arc<TenantState> {
        Arc::new(TenantState { key, label, class, gpu: Arc::default(), budget_spent_until: AtomicU64::new(0) })
    }

    /// Whether the daily gpu budget was found spent and has not renewed by `now_unix_s`.
    pub fn budget_spent(&self, now_unix_s: u64) -> bool {
        self.budget_spent_until.load(Ordering::Relaxed) > now_unix_s
    }

    /// Remembers that the store refused the budget until `until_unix_s`, so routing skips the
    /// gpu tier for this key without asking the store again.
    pub fn mark_budget_spent(&self, until_unix_s: u64) {
        self.budget_spent_until.store(until_unix_s, Ordering::Relaxed);
    }
}

/// How a request's tenant was established.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    ApiKey,
    TrustedHeader,
    Route,
    /// The request named itself and the config accepts claims.
    Claimed,
    /// Nothing identified it.
    None,
}

/// Who a request is for.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The tenant's name as rules and the audit see it: a known tenant, a trusted header's or an
    /// accepted claim's name (known or not); `None` when nothing identified it.
    pub name: Option<String>,
    pub source: Source,
    /// The limit key it counts against (shared by every unknown tenant).
    pub state: Arc<TenantState>,
}

impl Identity {
    /// The tenant's name when a configured source vouches for it (an API key, the trusted front
    /// proxy's header, a proxy route's tenant); `None` for the request's own claim (accepted or
    /// not) and for an unidentified request. For choices a client must not make by naming
    /// itself, such as its A/B arm.
    pub fn authenticated(&self) -> Option<&str> {
        match self.source {
            Source::ApiKey | Source::TrustedHeader | Source::Route => self.name.as_deref(),
            Source::Claimed | Source::None => None,
        }
    }
}

/// The compiled `[tenants]` section: resolves identities.
#[derive(Debug)]
pub struct Tenants {
    known: HashMap<String, Arc<TenantState>>,
    api_keys: HashMap<[u8; 32], String>,
    trusted_header: Option<HeaderName>,
    accept_claimed: bool,
    unknown: Arc<TenantState>,
}

impl Tenants {
    /// Compiles a checked config ([`TenantsConfig::check`]); `admission` is `[admission]`'s rate,
    /// which the default class takes when it has none of its own.
    pub fn new(config: &TenantsConfig, admission: Option<Quota>) -> Tenants {
        let class = |name: &str| {
            let c = config.classes.get(name).cloned().unwrap_or_default();
            let ClassConfig { rate, gpu_share, gpu_daily_budget } = c;
            let rate = rate.map(Quota::from).or(if name == config.default_class { admission } else { None });
            Arc::new(Class { name: name.to_string(), rate, gpu_share, gpu_daily_budget })
        };
        let classes: HashMap<&str, Arc<Class>> = config
            .classes
            .keys()
            .map(String::as_str)
            .chain([config.default_class.as_str()])
            .map(|n| (n, class(n)))
            .collect();
        let default = Arc::clone(&classes[config.default_class.as_str()]);
        // A class `check` would refuse falls back to the default class rather than panicking.
        let class_of = |c: &str| Arc::clone(classes.get(c).unwrap_or(&default));
        let known = config
            .known
            .iter()
            .map(|(t, c)| (t.clone(), TenantState::new(format!("tenant:{t}"), t.clone(), class_of(c))))
            .collect();
        let api_keys =
            config.api_keys.iter().filter_map(|(hex, tenant)| Some((decode_hex(hex)?, tenant.clone()))).collect();
        Tenants {
            known,
            api_keys,
            trusted_header: config.trusted_header.as_deref().and_then(|h| HeaderName::from_bytes(h.as_bytes()).ok()),
            accept_claimed: config.accept_claimed,
            unknown: TenantState::new(format!("class:{}", config.default_class), OTHER.into(), default),
        }
    }

    /// Whether the request's own claim counts (`[tenants] accept_claimed`).
    pub fn accepts_claims(&self) -> bool {
        self.accept_claimed
    }

    /// The class of `tenant` as a recorded decision names it: a known tenant's class, else the
    /// default class (unknown and unidentified tenants).
    pub fn class_of(&self, tenant: Option<&str>) -> &str {
        let state = tenant.and_then(|t| self.known.get(t)).unwrap_or(&self.unknown);
        &state.class.name
    }

    /// The identity of a request nothing identified.
    pub fn unknown(&self) -> Identity {
        Identity { name: None, source: Source::None, state: Arc::clone(&self.unknown) }
    }

    /// The known tenants' and the unknown key's states (for metrics and tests).
    pub fn states(&self) -> impl Iterator<Item = &Arc<TenantState>> {
        self.known.values().chain([&self.unknown])
    }

    /// Resolves a request's tenant from `headers`, the proxy route's `route` tenant and the
    /// request's own `claimed` name (see the module doc for the order).
    ///
    /// Errors: `RepeatedHeader` (400) naming an identity header tiergate reads that came more
    /// than once ([`Tenants::identity_headers`]); `InvalidField` (422) naming the trusted
    /// header, or `tenant` for an accepted claim, when its value is not a valid name
    /// ([`valid_name`]). An API key that matches no hash is
    /// not an error (on a proxy route it may be the app's own credential): the request is unknown.
    pub fn resolve(
        &self,
        headers: &HeaderMap,
        route: Option<&str>,
        claimed: Option<&str>,
    ) -> Result<Identity, ApiError> {
        self.refuse_repeated(headers)?;
        if let Some(tenant) = self.api_key_tenant(headers) {
            return Ok(self.named(tenant.to_string(), Source::ApiKey));
        }
        if let Some(h) = &self.trusted_header {
            if let Some(value) = headers.get(h) {
                let name = value.to_str().map_err(|_| ApiError::invalid(h.as_str(), "must be ASCII"))?;
                valid_name(name).map_err(|e| ApiError::invalid(h.as_str(), format!("`{h}` {e}")))?;
                return Ok(self.named(name.to_string(), Source::TrustedHeader));
            }
        }
        if let Some(name) = route {
            return Ok(self.named(name.to_string(), Source::Route));
        }
        match claimed {
            Some(name) if self.accept_claimed => {
                valid_name(name).map_err(|e| ApiError::invalid("tenant", format!("`tenant` {e}")))?;
                Ok(self.named(name.to_string(), Source::Claimed))
            }
            _ => Ok(self.unknown()),
        }
    }

    /// The headers tiergate reads a tenant from under this config: `x-api-key` and
    /// `authorization` when API keys are configured, the trusted header when one is, the claim
    /// header when claims count.
    fn identity_headers(&self) -> impl Iterator<Item = HeaderName> + '_ {
        let keys =
            (!self.api_keys.is_empty()).then_some([HeaderName::from_static(API_KEY_HEADER), header::AUTHORIZATION]);
        let claim = self.accept_claimed.then_some(HeaderName::from_static(CLAIM_HEADER));
        keys.into_iter().flatten().chain(self.trusted_header.clone()).chain(claim)
    }

    /// Refuses a request that sends an identity header more than once: tiergate would resolve
    /// the tenant by one line while the app may read another (many read the last).
    fn refuse_repeated(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        for name in self.identity_headers() {
            let count = headers.get_all(&name).iter().count();
            if count > 1 {
                return Err(ApiError::RepeatedHeader { header: name.to_string(), count });
            }
        }
        Ok(())
    }

    /// Removes tiergate's own credentials before a request reaches an app: the trusted tenant
    /// header (it is addressed to tiergate by the front proxy), and each `x-api-key` or
    /// `authorization` line whose key is one of `[tenants.api_keys]`. A key that matches none is
    /// left alone: on a proxy route it is the app's own credential (an LLM server's API key).
    pub fn strip_credentials(&self, headers: &mut HeaderMap) {
        if let Some(trusted) = &self.trusted_header {
            headers.remove(trusted);
        }
        if self.api_keys.is_empty() {
            return;
        }
        for name in [HeaderName::from_static(API_KEY_HEADER), header::AUTHORIZATION] {
            let lines: Vec<_> = headers.get_all(&name).iter().cloned().collect();
            if !lines.iter().any(|v| self.is_own_key(&name, v)) {
                continue;
            }
            headers.remove(&name);
            for v in lines.into_iter().filter(|v| !self.is_own_key(&name, v)) {
                headers.append(&name, v);
            }
        }
    }

    /// Whether one `x-api-key` / `authorization` line carries a key of `[tenants.api_keys]`.
    fn is_own_key(&self, name: &HeaderName, value: &http::HeaderValue) -> bool {
        let Ok(value) = value.to_str() else { return false };
        let key = if name == header::AUTHORIZATION { bearer(value) } else { Some(value.trim()) };
        key.is_some_and(|key| self.api_keys.contains_key(&<[u8; 32]>::from(Sha256::digest(key.as_bytes()))))
    }

    /// A named tenant: its own key when known, else the unknown tenants' shared key.
    fn named(&self, name: String, source: Source) -> Identity {
        let state = Arc::clone(self.known.get(&name).unwrap_or(&self.unknown));
        Identity { name: Some(name), source, state }
    }

    /// The tenant of the API key in `x-api-key` or `authorization: Bearer`, if it matches a
    /// configured hash. Lookup is by the key's SHA-256, so a timing difference could only tell
    /// about a digest, never about the key.
    fn api_key_tenant(&self, headers: &HeaderMap) -> Option<&str> {
        if self.api_keys.is_empty() {
            return None;
        }
        let bearer = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(bearer);
        let api_key = headers.get(API_KEY_HEADER).and_then(|v| v.to_str().ok()).map(str::trim);
        [api_key, bearer].into_iter().flatten().find_map(|key| {
            let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
            self.api_keys.get(&digest).map(String::as_str)
        })
    }
}

/// The token of `Bearer TOKEN` (the scheme in any case).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, rest) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
}

fn decode_hex(hex: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    if hex.len() != 64 {
        return None;
    }
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests;
