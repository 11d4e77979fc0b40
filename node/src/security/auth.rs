//! Authentication and tenant binding on the client port.
//!
//! - The tokens file (`--tokens-file`): `[[token]]` entries holding the SHA-256 of a bearer
//!   token (never the token) and either the tenant it acts for or `admin = true`. Loaded at
//!   start (a bad file refuses the start, naming the line) and re-read on SIGHUP (a bad file
//!   keeps the previous set and logs why).
//! - [`AuthLayer`]: a tower layer in front of every client-port service. It reads
//!   `authorization: Bearer <token>`, finds the token's entry, applies the per-service rule
//!   (see [`needs`]) and hands the handlers a [`Caller`] in the request's extensions. It sees
//!   the request path, so a new Admin RPC is admin-only without anyone remembering to say so.
//! - [`bind`]: puts the caller's tenant into the request's tenant fields before the handler
//!   builds a record key, so the tenant of every record comes from the credential. A request
//!   naming another tenant is refused; an empty field means "my tenant".
//!
//! Forwarded calls are not seen here: a follower forwards the record key it already resolved,
//! over the peer port (mutual TLS when configured).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};

use idemraft_proto::v1 as pb;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tonic::body::Body;
use tonic::{Request as GrpcRequest, Status};

/// One token's entry, as loaded.
#[derive(Clone)]
struct Entry {
    hash: [u8; 32],
    /// What logs call it: the entry's `name`, else its line.
    label: String,
    tenant: Option<String>,
    admin: bool,
}

/// The tokens of one tokens file.
#[derive(Clone, Default)]
pub struct TokenSet {
    entries: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDoc {
    #[serde(default)]
    token: Vec<toml::Spanned<FileEntry>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileEntry {
    name: Option<String>,
    tenant: Option<toml::Spanned<String>>,
    #[serde(default)]
    admin: bool,
    sha256: toml::Spanned<String>,
}

fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset).map_or(0, |t| t.matches('\n').count()) + 1
}

fn parse_hex32(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// SHA-256 of a token as sent (surrounding whitespace dropped), as the tokens file holds it.
pub fn hash_token(token: &str) -> [u8; 32] {
    Sha256::digest(token.trim().as_bytes()).into()
}

/// Equality that takes the same time wherever the first difference is.
fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl TokenSet {
    /// Parses a tokens file's text; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<TokenSet, String> {
        let doc: FileDoc = toml::from_str(text).map_err(|e| {
            let at = e.span().map(|s| format!(" line {}", line_of(text, s.start))).unwrap_or_default();
            format!("{file}{at}: {}", e.message().trim())
        })?;
        let mut entries: Vec<Entry> = Vec::new();
        for spanned in doc.token {
            let line = line_of(text, spanned.span().start);
            let e = spanned.into_inner();
            let at = format!("{file} line {line}");
            let at_field = |f: std::ops::Range<usize>| format!("{file} line {}", line_of(text, f.start));
            let hash = parse_hex32(e.sha256.get_ref()).ok_or_else(|| {
                format!(
                    "{}: sha256 must be 64 hex digits, the SHA-256 of the token (idemctl token hash)",
                    at_field(e.sha256.span())
                )
            })?;
            let tenant = match e.tenant {
                Some(t) => {
                    let span = t.span();
                    let t = t.into_inner();
                    idemraft_store::validate::tenant(&t)
                        .map_err(|err| format!("{}: tenant '{t}': {err}", at_field(span)))?;
                    Some(t)
                }
                None => None,
            };
            if tenant.is_none() && !e.admin {
                return Err(format!("{at}: the entry has neither a tenant nor admin = true"));
            }
            if let Some(other) = entries.iter().find(|x| x.hash == hash) {
                return Err(format!("{at}: the same token hash is already listed ({})", other.label));
            }
            let label = e.name.unwrap_or_else(|| format!("line {line}"));
            entries.push(Entry { hash, label, tenant, admin: e.admin });
        }
        if entries.is_empty() {
            return Err(format!(
                "{file} holds no [[token]] entries: nobody could call the node; add one, or leave --tokens-file out"
            ));
        }
        Ok(TokenSet { entries })
    }

    /// Reads and parses a tokens file.
    pub fn load(path: &Path) -> Result<TokenSet, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        TokenSet::parse(&path.display().to_string(), &text)
    }

    /// How many tokens the set holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the set is empty (never, for a loaded file).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The caller a token stands for. Compares against every entry, in constant time each,
    /// so the time taken says nothing about which entry (if any) is close.
    fn lookup(&self, token: &str) -> Option<Caller> {
        let hash = hash_token(token);
        let mut found = None;
        for e in &self.entries {
            if ct_eq(&e.hash, &hash) && found.is_none() {
                found = Some(Caller::Token { label: e.label.clone(), tenant: e.tenant.clone(), admin: e.admin });
            }
        }
        found
    }
}

/// Who is calling, as the handlers see it (a request extension set by [`AuthLayer`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// Authentication is off (no `--tokens-file`): the tenant comes from the request.
    Anyone,
    /// A caller with a token from the tokens file.
    Token {
        /// The entry's name (or line), for logs.
        label: String,
        /// The tenant the token acts for; `None` for an admin-only token.
        tenant: Option<String>,
        /// Whether the token may call Admin RPCs.
        admin: bool,
    },
}

/// The node's tokens and where they come from; shared by the layer and the SIGHUP task.
pub struct Auth {
    path: PathBuf,
    set: RwLock<Arc<TokenSet>>,
}

impl Auth {
    /// Loads the tokens file at `path`.
    pub fn load(path: &Path) -> Result<Arc<Auth>, String> {
        let set = TokenSet::load(path)?;
        Ok(Arc::new(Auth { path: path.to_path_buf(), set: RwLock::new(Arc::new(set)) }))
    }

    /// Re-reads the file; on any problem the current set stays in force.
    pub fn reload(&self) -> Result<usize, String> {
        let set = TokenSet::load(&self.path)?;
        let n = set.len();
        let mut slot = self.set.write().map_err(|_| "the token set's lock is poisoned".to_string())?;
        *slot = Arc::new(set);
        Ok(n)
    }

    fn current(&self) -> Option<Arc<TokenSet>> {
        self.set.read().ok().map(|s| Arc::clone(&s))
    }

    /// Resolves the `authorization` header into a caller.
    pub fn authenticate(&self, header: Option<&http::HeaderValue>) -> Result<Caller, Status> {
        let Some(value) = header else {
            return Err(Status::unauthenticated(
                "this node requires a bearer token: send the metadata `authorization: Bearer <token>` \
                 (idemctl --token or IDEMCTL_TOKEN; ClientConfig::bearer_token in the SDK)",
            ));
        };
        let text = value.to_str().unwrap_or("");
        let token = match text.split_once(' ') {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") && !rest.trim().is_empty() => rest.trim(),
            _ => {
                return Err(Status::unauthenticated(
                    "the authorization metadata is not `Bearer <token>`: send the token with the Bearer scheme",
                ))
            }
        };
        let set = self.current().ok_or_else(|| Status::internal("the token set is unavailable"))?;
        set.lookup(token).ok_or_else(|| {
            Status::unauthenticated(
                "the bearer token is not in this node's tokens file (mistyped, revoked, or meant for another cluster)",
            )
        })
    }
}

/// What a client-port path requires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// The standard gRPC health service: open, like the HTTP health port.
    Nothing,
    /// `Idempotency`: a token with a tenant.
    Tenant,
    /// Everything else (`Admin`, and any service added later): an admin token.
    Admin,
}

/// The rule for a gRPC path (`/package.Service/Method`).
pub fn needs(path: &str) -> Need {
    if path.starts_with("/idemraft.v1.Idempotency/") {
        Need::Tenant
    } else if path.starts_with("/grpc.health.v1.Health/") {
        Need::Nothing
    } else {
        Need::Admin
    }
}

/// Decides one call: the caller to hand the handler, or the refusal. An open path (health)
/// gets no caller while tokens are on, so if it ever reached a tenant-bound handler, [`bind`]
/// would refuse it rather than take the request's tenant.
pub fn admit(auth: Option<&Auth>, path: &str, header: Option<&http::HeaderValue>) -> Result<Option<Caller>, Status> {
    let Some(auth) = auth else { return Ok(Some(Caller::Anyone)) };
    let need = needs(path);
    if need == Need::Nothing {
        return Ok(None);
    }
    let caller = auth.authenticate(header)?;
    let Caller::Token { label, tenant, admin } = &caller else { return Ok(Some(caller)) };
    match need {
        Need::Admin if !admin => Err(Status::permission_denied(format!(
            "{path} needs an admin token; this token ({label}) is for tenant '{}' only",
            tenant.as_deref().unwrap_or("")
        ))),
        Need::Tenant if tenant.is_none() => Err(Status::permission_denied(format!(
            "{path} needs a token with a tenant; this admin token ({label}) has none: \
             give it `tenant = ...` in the tokens file, or use the tenant's own token"
        ))),
        _ => Ok(Some(caller)),
    }
}

/// The tower layer that runs [`admit`] in front of the client-port services.
#[derive(Clone)]
pub struct AuthLayer {
    auth: Option<Arc<Auth>>,
}

impl AuthLayer {
    /// A layer checking tokens against `auth`; `None` lets every call through as [`Caller::Anyone`].
    pub fn new(auth: Option<Arc<Auth>>) -> AuthLayer {
        AuthLayer { auth }
    }
}

impl<S> tower_layer::Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> AuthService<S> {
        AuthService { inner, auth: self.auth.clone() }
    }
}

/// The service [`AuthLayer`] wraps around the client-port routes.
#[derive(Clone)]
pub struct AuthService<S> {
    inner: S,
    auth: Option<Arc<Auth>>,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S> tower_service::Service<http::Request<Body>> for AuthService<S>
where
    S: tower_service::Service<http::Request<Body>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        let path = req.uri().path().to_string();
        match admit(self.auth.as_deref(), &path, req.headers().get(http::header::AUTHORIZATION)) {
            Ok(caller) => {
                // The token has done its job; nothing after this point needs to see it.
                req.headers_mut().remove(http::header::AUTHORIZATION);
                if let Some(caller) = caller {
                    req.extensions_mut().insert(caller);
                }
                Box::pin(self.inner.call(req))
            }
            Err(status) => {
                tracing::info!(path = %path, code = ?status.code(), reason = status.message(), "call refused by auth");
                Box::pin(std::future::ready(Ok(status.into_http())))
            }
        }
    }
}

/// Re-reads the tokens file on every SIGHUP, for the life of the process.
#[cfg(unix)]
pub async fn reload_on_sighup(auth: Arc<Auth>) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGHUP: the tokens file will not be reloaded");
            return;
        }
    };
    while hup.recv().await.is_some() {
        match auth.reload() {
            Ok(n) => tracing::info!(tokens = n, file = %auth.path.display(), "tokens file reloaded"),
            Err(e) => tracing::error!(error = %e, "tokens file NOT reloaded; the previous tokens stay in force"),
        }
    }
}

/// Requests whose tenant fields [`bind`] fills from the credential.
pub trait Tenanted {
    /// Every tenant field of the message (none for an Admin request).
    fn tenants(&mut self) -> Vec<&mut String>;
}

macro_rules! by_id {
    ($($t:ty),*) => {$(
        impl Tenanted for $t {
            fn tenants(&mut self) -> Vec<&mut String> {
                self.id.as_mut().map(|i| &mut i.tenant).into_iter().collect()
            }
        }
    )*};
}

by_id!(
    pb::ClaimRequest,
    pb::CompleteRequest,
    pb::FailRequest,
    pb::ExtendLeaseRequest,
    pb::CheckpointRequest,
    pb::TakeoverRequest,
    pb::GetRequest,
    pb::WaitRequest
);

impl Tenanted for pb::ListRequest {
    fn tenants(&mut self) -> Vec<&mut String> {
        let mut out = vec![&mut self.tenant];
        if let Some(id) = self.start_after.as_mut() {
            out.push(&mut id.tenant);
        }
        out
    }
}

macro_rules! no_tenant {
    ($($t:ty),*) => {$(
        impl Tenanted for $t {
            fn tenants(&mut self) -> Vec<&mut String> {
                Vec::new()
            }
        }
    )*};
}

no_tenant!(
    pb::StatusRequest,
    pb::MembersRequest,
    pb::AddLearnerRequest,
    pb::PromoteRequest,
    pb::RemoveRequest,
    pb::SnapshotRequest,
    // An admin names any tenant here: quotas are set by the operator, not by the tenant.
    pb::SetQuotaRequest,
    pb::GetQuotaRequest
);

/// Fills the request's tenant fields from the caller's credential: an empty field becomes the
/// caller's tenant, the same tenant passes, another tenant is PERMISSION_DENIED. With
/// authentication off the request is left as it is. A request that did not pass
/// [`AuthLayer`] is refused: failing closed beats trusting a field.
pub fn bind<T: Tenanted>(mut req: GrpcRequest<T>) -> Result<GrpcRequest<T>, Status> {
    let caller = req.extensions().get::<Caller>().cloned();
    let tenant = match caller {
        Some(Caller::Anyone) => return Ok(req),
        Some(Caller::Token { tenant, .. }) => tenant,
        None => return Err(Status::internal("the call reached a handler without passing the auth layer")),
    };
    for field in req.get_mut().tenants() {
        match &tenant {
            Some(t) if field.is_empty() => t.clone_into(field),
            Some(t) if field == t => {}
            Some(t) => {
                return Err(Status::permission_denied(format!(
                    "the request names tenant '{field}' but the token is for tenant '{t}': \
                     leave the tenant empty (it defaults to the token's) or send '{t}'"
                )))
            }
            None => {
                return Err(Status::permission_denied(
                    "this admin token has no tenant: data calls need a tenant's token",
                ))
            }
        }
    }
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(token: &str) -> String {
        hash_token(token).iter().map(|b| format!("{b:02x}")).collect()
    }

    fn set() -> TokenSet {
        let text = format!(
            "[[token]]\nname = \"acme\"\ntenant = \"acme\"\nsha256 = \"{}\"\n\n[[token]]\nadmin = true\nsha256 = \"{}\"\n",
            hex("acme-secret"),
            hex("root-secret")
        );
        TokenSet::parse("tokens.toml", &text).unwrap_or_else(|e| panic!("{e}"))
    }

    fn header(v: &str) -> http::HeaderValue {
        http::HeaderValue::from_str(v).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn bad_files_name_the_line() {
        let good = hex("x");
        let cases = [
            ("[[token]]\ntenant = \"a\"\nsha256 = \"abc\"\n", "line 3", "64 hex digits"),
            (&*format!("[[token]]\nsha256 = \"{good}\"\n"), "line 1", "neither a tenant"),
            (&*format!("[[token]]\ntenant = \"a\"\nsha256 = \"{good}\"\n\n[[token]]\ntenant = \"b\"\nsha256 = \"{good}\"\n"), "line 5", "already listed"),
            (&*format!("[[token]]\ntenant = \"bad tenant!\"\nsha256 = \"{good}\"\n"), "line 2", "tenant 'bad tenant!'"),
            ("[[token]]\ntenant = \"a\"\nsha = 1\n", "line 3", "unknown field"),
            ("[[token]]\ntenant = \"a\"\nsha256 = \n", "line 3", ""),
            ("", "", "no [[token]] entries"),
        ];
        for (text, line, what) in cases {
            let err = TokenSet::parse("t.toml", text).err().unwrap_or_else(|| panic!("accepted: {text}"));
            assert!(err.starts_with("t.toml"), "{err}");
            assert!(err.contains(line), "wanted {line}: {err}");
            assert!(err.contains(what), "wanted {what}: {err}");
        }
    }

    #[test]
    fn tokens_resolve_to_their_tenant_and_role() {
        let auth = Auth { path: PathBuf::new(), set: RwLock::new(Arc::new(set())) };
        let acme = admit(Some(&auth), "/idemraft.v1.Idempotency/Claim", Some(&header("Bearer acme-secret")));
        assert_eq!(
            acme.ok().flatten(),
            Some(Caller::Token { label: "acme".into(), tenant: Some("acme".into()), admin: false })
        );
        let code = |path: &str, h: Option<&str>| {
            let h = h.map(header);
            admit(Some(&auth), path, h.as_ref()).err().map(|s| s.code())
        };
        use tonic::Code;
        assert_eq!(code("/idemraft.v1.Idempotency/Claim", None), Some(Code::Unauthenticated));
        assert_eq!(code("/idemraft.v1.Idempotency/Claim", Some("Bearer nope")), Some(Code::Unauthenticated));
        assert_eq!(code("/idemraft.v1.Idempotency/Claim", Some("Basic acme-secret")), Some(Code::Unauthenticated));
        assert_eq!(code("/idemraft.v1.Admin/Members", Some("Bearer acme-secret")), Some(Code::PermissionDenied));
        assert_eq!(code("/idemraft.v1.Admin/Snapshot", Some("Bearer acme-secret")), Some(Code::PermissionDenied));
        assert_eq!(code("/idemraft.v1.Admin/SetQuota", Some("Bearer acme-secret")), Some(Code::PermissionDenied));
        assert_eq!(code("/idemraft.v1.Admin/GetQuota", Some("Bearer acme-secret")), Some(Code::PermissionDenied));
        assert_eq!(code("/idemraft.v1.Admin/SetQuota", Some("Bearer root-secret")), None);
        assert_eq!(code("/idemraft.v1.Admin/Members", Some("bearer root-secret")), None);
        assert_eq!(code("/idemraft.v1.Idempotency/Get", Some("Bearer root-secret")), Some(Code::PermissionDenied));
        assert_eq!(code("/grpc.health.v1.Health/Check", None), None);
        assert_eq!(admit(Some(&auth), "/grpc.health.v1.Health/Check", None).ok(), Some(None));
        assert_eq!(admit(None, "/idemraft.v1.Admin/Members", None).ok(), Some(Some(Caller::Anyone)));
    }

    #[test]
    fn bind_fills_or_refuses_the_tenant() {
        let with = |caller: Caller, tenant: &str| {
            let mut r = GrpcRequest::new(pb::GetRequest {
                id: Some(pb::RecordId { tenant: tenant.into(), scope: "s".into(), key: "k".into() }),
            });
            r.extensions_mut().insert(caller);
            bind(r).map(|r| r.into_inner().id.map(|i| i.tenant).unwrap_or_default())
        };
        let acme = Caller::Token { label: "l".into(), tenant: Some("acme".into()), admin: false };
        assert_eq!(with(acme.clone(), "").ok().as_deref(), Some("acme"));
        assert_eq!(with(acme.clone(), "acme").ok().as_deref(), Some("acme"));
        assert_eq!(with(acme, "other").err().map(|s| s.code()), Some(tonic::Code::PermissionDenied));
        assert_eq!(with(Caller::Anyone, "other").ok().as_deref(), Some("other"));
        let bare = GrpcRequest::new(pb::GetRequest { id: None });
        assert_eq!(bind(bare).err().map(|s| s.code()), Some(tonic::Code::Internal));

        let mut list = GrpcRequest::new(pb::ListRequest {
            start_after: Some(pb::RecordId { tenant: "other".into(), ..Default::default() }),
            ..Default::default()
        });
        list.extensions_mut().insert(Caller::Token { label: "l".into(), tenant: Some("acme".into()), admin: false });
        assert_eq!(bind(list).err().map(|s| s.code()), Some(tonic::Code::PermissionDenied));
    }
}
