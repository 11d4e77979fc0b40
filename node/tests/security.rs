//! Security on real processes: TLS on the client port, mutual TLS between peers, bearer
//! tokens and tenant isolation. Certificates are made at test time (`idemctl::certs`,
//! the code behind `idemctl dev-certs`) for the cluster's own loopback IP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Access, Cluster, SERIAL};
use idemctl::certs;
use idemraft_client::proto::raft_client::RaftClient;
use idemraft_client::proto::{ListRequest, RaftMessage};
use idemraft_client::{BearerToken, ClaimOptions, Client, ClientConfig, Error, Outcome, StoredResponse, TlsIdentity};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use tonic::Code;

/// The `idemctl` binary next to `idemraft` (built by `cargo test --workspace`).
fn idemctl(args: &[&str], env: &[(&str, &str)], stdin: Option<&str>) -> (i32, String, String) {
    use std::io::Write;
    let node = std::path::PathBuf::from(env!("CARGO_BIN_EXE_idemraft"));
    let ctl = node.with_file_name(format!("idemctl{}", std::env::consts::EXE_SUFFIX));
    assert!(ctl.exists(), "{} is missing: run the suite with scripts/test.sh", ctl.display());
    let mut cmd = std::process::Command::new(ctl);
    cmd.args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()
}

fn identity(pair: &(std::path::PathBuf, std::path::PathBuf)) -> TlsIdentity {
    TlsIdentity { cert_pem: read(&pair.0), key_pem: read(&pair.1) }
}

/// A client with a short deadline, so refusals come back quickly.
fn quick(endpoints: Vec<String>, access: &Access) -> Client {
    let mut config = access.apply(ClientConfig::new(endpoints));
    config.deadline = Duration::from_millis(1500);
    config.attempt_timeout = Duration::from_millis(700);
    Client::new(config).unwrap()
}

/// A raw Raft-service client to a peer port, with the given TLS (None: plaintext).
async fn raw_peer(addr: &str, tls: Option<ClientTlsConfig>) -> Result<tonic::Status, String> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut ep = Endpoint::from_shared(format!("{scheme}://{addr}")).unwrap().connect_timeout(Duration::from_secs(2));
    if let Some(t) = tls {
        ep = ep.tls_config(t).unwrap();
    }
    let channel = match ep.connect().await {
        Ok(c) => c,
        Err(e) => return Err(format!("connect refused: {e}")),
    };
    let mut raft = RaftClient::new(channel);
    let mut req = tonic::Request::new(RaftMessage { target: 99, payload: vec![1, 2, 3] });
    req.set_timeout(Duration::from_secs(2));
    match raft.vote(req).await {
        Ok(_) => Ok(tonic::Status::ok("answered")),
        Err(s) => Ok(s),
    }
}

/// Whether a peer-port call was refused before the Raft service saw it: a connection
/// failure, or a transport-level status rather than the service's own answer to a message
/// addressed to the wrong node (FAILED_PRECONDITION).
fn refused_before_the_service(r: &Result<tonic::Status, String>) -> bool {
    match r {
        Err(_) => true,
        Ok(s) => matches!(s.code(), Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_client_port_and_mutual_tls_between_peers() {
    let _serial = SERIAL.lock().await;
    let mut made = None;
    let cluster = Cluster::start_with(3, |ip, dir| {
        let good = certs::generate(&dir.join("certs"), 1, &[ip.to_string()]).unwrap();
        let other = certs::generate(&dir.join("other"), 1, &[ip.to_string()]).unwrap();
        let (cert, key) = good.nodes[0].clone();
        let p = |x: &Path| x.display().to_string();
        let flags = vec![
            "--tls-cert".into(),
            p(&cert),
            "--tls-key".into(),
            p(&key),
            "--tls-client-ca".into(),
            p(&good.ca),
            "--peer-tls-cert".into(),
            p(&cert),
            "--peer-tls-key".into(),
            p(&key),
            "--peer-tls-ca".into(),
            p(&good.ca),
        ];
        let access = Access { tls_ca: Some(read(&good.ca)), tls_identity: Some(identity(&good.client)), token: None };
        made = Some((good, other));
        (flags, access)
    })
    .await;
    let (good, other) = made.unwrap();
    // A leader was elected and is known everywhere: votes and heartbeats crossed mutual TLS.
    let leader = cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(20)).await;
    let follower = (1..=3).find(|i| *i != leader).unwrap();
    let via_follower = || quick(vec![cluster.client_addr(follower)], &cluster.access);

    // Claim and complete through a follower: each fresh client's first call is forwarded to
    // the leader over the peer port.
    let key = common::key("tls", 1);
    let owner = "tls-owner";
    let o = via_follower().claim("tls.test", &key, owner, &ClaimOptions::default()).await.unwrap();
    let Outcome::Acquired(g) = o else { panic!("{o:?}") };
    let done = via_follower().complete("tls.test", &key, g.token, &StoredResponse::new(201, "ok")).await.unwrap();
    assert!(matches!(done, Outcome::Completed { .. }), "{done:?}");
    let replay = via_follower().claim("tls.test", &key, "someone-else", &ClaimOptions::default()).await.unwrap();
    assert!(matches!(replay, Outcome::Replay { .. }), "{replay:?}");

    let eps = vec![cluster.client_addr(leader)];
    let claim = |c: Client| async move {
        c.claim("tls.test", &common::key("tls", 2), "o", &ClaimOptions::default()).await.map(|o| o.name())
    };
    // A plaintext client is refused (the port speaks TLS only).
    let plain = claim(quick(eps.clone(), &Access::default())).await;
    assert!(plain.is_err(), "a plaintext client got {plain:?}");
    // A TLS client without a client certificate is refused (--tls-client-ca).
    let no_cert = Access { tls_identity: None, ..cluster.access.clone() };
    let r = claim(quick(eps.clone(), &no_cert)).await;
    assert!(r.is_err(), "a client without a certificate got {r:?}");
    // A client certificate from another CA is refused.
    let foreign = Access { tls_identity: Some(identity(&other.client)), ..cluster.access.clone() };
    let r = claim(quick(eps.clone(), &foreign)).await;
    assert!(r.is_err(), "a client with a foreign certificate got {r:?}");
    // A client that trusts another CA does not accept the node's certificate.
    let wrong_ca = Access { tls_ca: Some(read(&other.ca)), ..cluster.access.clone() };
    let r = claim(quick(eps.clone(), &wrong_ca)).await;
    assert!(r.is_err(), "a client trusting another CA got {r:?}");
    // And the right client still works.
    assert_eq!(claim(quick(eps, &cluster.access)).await.unwrap(), "ACQUIRED");
    // So does idemctl with --ca, --cert and --key (a follower's address; no scheme needed).
    let p = |x: &Path| x.display().to_string();
    let (ca, cc, ck) = (p(&good.ca), p(&good.client.0), p(&good.client.1));
    let follower_ep = cluster.client_addr(follower);
    let (code, out, err) = idemctl(
        &["--endpoints", &follower_ep, "--ca", &ca, "--cert", &cc, "--key", &ck, "get", "tls.test", &key],
        &[],
        None,
    );
    assert_eq!(code, 0, "{out} {err}");
    assert!(out.contains("COMPLETED"), "{out}");
    let (code, _, _) = idemctl(&["--endpoints", &follower_ep, "--timeout", "1s", "get", "tls.test", &key], &[], None);
    assert_ne!(code, 0, "idemctl without TLS must not get an answer");

    // The peer port: only certificates of the cluster's CA get to the Raft service.
    let peer = cluster.peer_addr(leader);
    let ca = Certificate::from_pem(read(&good.ca));
    let tls = |id: Option<&(std::path::PathBuf, std::path::PathBuf)>| {
        let mut t = ClientTlsConfig::new().ca_certificate(ca.clone()).domain_name(cluster.ip.clone());
        if let Some((c, k)) = id {
            t = t.identity(Identity::from_pem(read(c), read(k)));
        }
        Some(t)
    };
    let genuine = raw_peer(&peer, tls(Some(&good.nodes[0]))).await;
    assert!(
        matches!(&genuine, Ok(s) if s.code() == Code::FailedPrecondition),
        "a genuine peer should reach the service (and be told the message is for another node): {genuine:?}"
    );
    let wrong_cert = raw_peer(&peer, tls(Some(&other.nodes[0]))).await;
    assert!(refused_before_the_service(&wrong_cert), "a peer with another CA's certificate got {wrong_cert:?}");
    let no_cert = raw_peer(&peer, tls(None)).await;
    assert!(refused_before_the_service(&no_cert), "a peer without a certificate got {no_cert:?}");
    let plaintext = raw_peer(&peer, None).await;
    assert!(refused_before_the_service(&plaintext), "a plaintext peer got {plaintext:?}");
    // Nor does the peer link's plaintext preface: a port with peer TLS serves no link.
    let mut link = tokio::net::TcpStream::connect(&peer).await.unwrap();
    link.write_all(idemraft_node::cluster::link::PREFACE).await.unwrap();
    let mut echo = [0u8; 16];
    let answered = tokio::time::timeout(Duration::from_secs(5), link.read_exact(&mut echo)).await;
    assert!(
        !matches!(answered, Ok(Ok(_)) if &echo == idemraft_node::cluster::link::PREFACE),
        "a port with peer TLS accepted a plaintext peer link"
    );

    // A node whose certificate comes from another CA cannot join: it is added as a learner
    // (an operator mistake), but the leader cannot replicate to it.
    let mut cluster = cluster;
    let (cert, key) = other.nodes[0].clone();
    cluster.extra_flags = vec![
        "--tls-cert".into(),
        p(&cert),
        "--tls-key".into(),
        p(&key),
        "--peer-tls-cert".into(),
        p(&cert),
        "--peer-tls-key".into(),
        p(&key),
        "--peer-tls-ca".into(),
        p(&other.ca),
    ];
    cluster.spawn(4, false);
    let admin = cluster.client_for(&[leader]);
    let added = admin.add_learner(4, &cluster.peer_addr(4), false).await;
    assert!(added.is_ok(), "{added:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = std::fs::read_to_string(cluster.log_path(4)).unwrap_or_default();
    assert!(!log.contains("panicked"), "{log}");
    let mut joined = Access { tls_ca: Some(read(&other.ca)), ..Access::default() };
    joined.tls_identity = None;
    let status = quick(vec![cluster.client_addr(4)], &joined).node_status(0).await.unwrap();
    assert_eq!(status.applied_index, 0, "a node outside the CA must receive no log: {status:?}");
    assert_eq!(status.leader_id, 0, "and must not hear from the leader: {status:?}");
}

fn hash(token: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

fn tokens_file(entries: &[(&str, &str)]) -> String {
    let mut out = String::from("# tenant tokens, hashed\n");
    for (who, token) in entries {
        out.push_str("\n[[token]]\n");
        if *who == "admin" {
            out.push_str("name = \"operator\"\nadmin = true\n");
        } else {
            out.push_str(&format!("name = \"{who}-app\"\ntenant = \"{who}\"\n"));
        }
        out.push_str(&format!("sha256 = \"{}\"\n", hash(token)));
    }
    out
}

fn code_of(e: &Error) -> Option<Code> {
    match e {
        Error::Rpc { code, .. } => Some(*code),
        _ => None,
    }
}

const TOKEN_A: &str = "token-of-tenant-a-0123456789abcdef";
const TOKEN_B: &str = "token-of-tenant-b-0123456789abcdef";
const TOKEN_C: &str = "token-of-tenant-c-0123456789abcdef";
const TOKEN_ADMIN: &str = "token-of-the-operator-0123456789ab";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_tokens_bind_the_tenant_and_gate_admin() {
    let _serial = SERIAL.lock().await;
    let mut file = None;
    let mut cluster = Cluster::start_with(3, |_, dir| {
        let path = dir.join("tokens.toml");
        std::fs::write(&path, tokens_file(&[("a", TOKEN_A), ("b", TOKEN_B), ("admin", TOKEN_ADMIN)])).unwrap();
        file = Some(path.clone());
        let access = Access { token: Some(TOKEN_ADMIN.into()), ..Access::default() };
        (vec!["--tokens-file".into(), path.display().to_string()], access)
    })
    .await;
    let file = file.unwrap();
    let eps: Vec<String> = (1..=3).map(|i| cluster.client_addr(i)).collect();
    let as_token = |token: Option<&str>| {
        let mut c = ClientConfig::new(eps.clone());
        c.bearer_token = token.map(BearerToken::new);
        c.deadline = Duration::from_secs(10);
        Client::new(c).unwrap()
    };
    let (a, b, admin) = (as_token(Some(TOKEN_A)), as_token(Some(TOKEN_B)), as_token(Some(TOKEN_ADMIN)));
    let opts = ClaimOptions::default();
    let key = common::key("shared", 1);

    // No token, a wrong token, a malformed header: UNAUTHENTICATED, with a message that says so.
    let e = as_token(None).claim("pay", &key, "x", &opts).await.unwrap_err();
    assert_eq!(code_of(&e), Some(Code::Unauthenticated), "{e}");
    assert!(e.to_string().contains("bearer token"), "{e}");
    let e = as_token(Some("not-a-token")).claim("pay", &key, "x", &opts).await.unwrap_err();
    assert_eq!(code_of(&e), Some(Code::Unauthenticated), "{e}");
    let e = as_token(None).node_status(0).await.unwrap_err();
    assert_eq!(code_of(&e), Some(Code::Unauthenticated), "{e}");

    // Tenant A holds the key.
    let Outcome::Acquired(ga) = a.claim("pay", &key, "owner-a", &opts).await.unwrap() else { panic!() };

    // Tenant B learns nothing of it and cannot touch it.
    assert!(b.get("pay", &key).await.unwrap().is_none(), "B must not see A's record");
    let w = b.wait("pay", &key, Duration::from_millis(200)).await.unwrap();
    assert!(w.record.is_none() && !w.timed_out, "B's wait must find nothing: {w:?}");
    let stolen = b.complete("pay", &key, ga.token, &StoredResponse::new(200, "stolen")).await.unwrap();
    assert_eq!(stolen, Outcome::NotFound, "B completing A's key with A's token must not reach A's record");
    let r = b.fail("pay", &key, ga.token, false, Some(&StoredResponse::new(500, "x"))).await.unwrap();
    assert_eq!(r, Outcome::NotFound);
    let r = b.takeover("pay", &key, "owner-b", true, None).await.unwrap();
    assert_eq!(r, Outcome::NotFound, "B cannot take over A's key");
    let listed = b.list(ListRequest::default()).await.unwrap();
    assert!(listed.records.is_empty(), "B's list must be empty: {:?}", listed.records);

    // B claiming the same key gets a record of its own: ACQUIRED, not IN_PROGRESS or REPLAY.
    let Outcome::Acquired(gb) = b.claim("pay", &key, "owner-b", &opts).await.unwrap() else { panic!() };
    assert_ne!(gb.token, ga.token);
    assert_eq!(gb.attempt, 1, "B's record is fresh");

    // A completes; B's record is untouched, and each replays only its own.
    let r = a.complete("pay", &key, ga.token, &StoredResponse::new(201, "a's answer")).await.unwrap();
    assert!(matches!(r, Outcome::Completed { .. }), "{r:?}");
    let rec_b = b.get("pay", &key).await.unwrap().unwrap();
    assert_eq!(rec_b.id.as_ref().map(|i| i.tenant.as_str()), Some("b"));
    assert_eq!(rec_b.token, gb.token);
    assert!(rec_b.response.is_none(), "A's response must not appear in B's record");
    let Outcome::Replay { response, .. } = a.claim("pay", &key, "owner-a2", &opts).await.unwrap() else { panic!() };
    assert_eq!(response.body, b"a's answer");
    let wa = a.wait("pay", &key, Duration::from_millis(200)).await.unwrap();
    assert_eq!(wa.record.map(|r| r.response.map(|x| x.body)), Some(Some(b"a's answer".to_vec())));
    let la = a.list(ListRequest::default()).await.unwrap();
    assert_eq!(la.records.len(), 1);
    assert_eq!(la.records[0].id.as_ref().map(|i| i.tenant.as_str()), Some("a"));
    let lb = b.list(ListRequest::default()).await.unwrap();
    assert_eq!(lb.records.len(), 1);
    assert_eq!(lb.records[0].id.as_ref().map(|i| i.tenant.as_str()), Some("b"));

    // Naming another tenant in the request is refused, not honoured.
    let e = b.list(ListRequest { tenant: "a".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(code_of(&e), Some(Code::PermissionDenied), "{e}");
    assert!(e.to_string().contains("tenant 'a'"), "{e}");
    let mut cfg = ClientConfig::new(eps.clone());
    cfg.bearer_token = Some(BearerToken::new(TOKEN_B));
    cfg.tenant = "a".into();
    let b_as_a = Client::new(cfg).unwrap();
    let e = b_as_a.get("pay", &key).await.unwrap_err();
    assert_eq!(code_of(&e), Some(Code::PermissionDenied), "{e}");
    let e = b_as_a.claim("pay", &key, "owner-b", &opts).await.unwrap_err();
    assert_eq!(code_of(&e), Some(Code::PermissionDenied), "{e}");

    // Admin calls: refused with a tenant token, allowed with the admin token; the admin token
    // itself carries no tenant, so it cannot read records.
    let e = a.members().await.unwrap_err();
    assert_eq!(code_of(&e), Some(Code::PermissionDenied), "{e}");
    assert!(e.to_string().contains("admin token"), "{e}");
    let e = a.node_status(0).await.unwrap_err();
    assert_eq!(code_of(&e), Some(Code::PermissionDenied), "{e}");
    let e = a.remove(&[3]).await.unwrap_err();
    assert_eq!(code_of(&e), Some(Code::PermissionDenied), "{e}");
    assert_eq!(admin.members().await.unwrap().members.len(), 3);
    assert!(admin.node_status(0).await.is_ok());
    let e = admin.get("pay", &key).await.unwrap_err();
    assert_eq!(code_of(&e), Some(Code::PermissionDenied), "{e}");

    // idemctl: --token and IDEMCTL_TOKEN, and `token hash` for filling the file.
    let ep = eps.join(",");
    let (code, out, err) =
        idemctl(&["--endpoints", &ep, "--token", TOKEN_B, "-w", "json", "get", "pay", &key], &[], None);
    assert_eq!(code, 0, "{out} {err}");
    assert!(out.contains("\"tenant\":\"b\""), "{out}");
    let (code, out, err) = idemctl(&["--endpoints", &ep, "member", "list"], &[("IDEMCTL_TOKEN", TOKEN_ADMIN)], None);
    assert_eq!(code, 0, "{out} {err}");
    assert_eq!(out.matches("voter").count(), 3, "{out}");
    let (code, _, err) = idemctl(&["--endpoints", &ep, "get", "pay", &key], &[], None);
    assert_ne!(code, 0);
    assert!(err.contains("bearer token"), "{err}");
    let (code, out, _) = idemctl(&["token", "hash"], &[], Some(&format!("{TOKEN_C}\n")));
    assert_eq!(code, 0);
    assert_eq!(out.trim(), hash(TOKEN_C));

    // SIGHUP: tenant C is added, tenant A's token revoked.
    std::fs::write(&file, tokens_file(&[("b", TOKEN_B), ("c", TOKEN_C), ("admin", TOKEN_ADMIN)])).unwrap();
    let hup = |cluster: &Cluster| {
        for child in cluster.children.values() {
            let ok = std::process::Command::new("kill").arg("-HUP").arg(child.id().to_string()).status().unwrap();
            assert!(ok.success());
        }
    };
    hup(&cluster);
    let c = as_token(Some(TOKEN_C));
    let end = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let c_ok = c.get("pay", &key).await.is_ok();
        let a_out = matches!(a.get("pay", &key).await, Err(ref e) if code_of(e) == Some(Code::Unauthenticated));
        if c_ok && a_out {
            break;
        }
        assert!(std::time::Instant::now() < end, "the reload did not take effect within 10 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(c.get("pay", &key).await.unwrap().is_none(), "tenant C starts with nothing");
    // Every node reloaded, not just the one that answered.
    for id in 1..=3 {
        let one = quick(vec![cluster.client_addr(id)], &Access { token: Some(TOKEN_C.into()), ..Access::default() });
        assert!(one.list(ListRequest::default()).await.is_ok(), "node {id} did not take tenant C");
    }

    // A broken file on reload keeps the tokens in force and the nodes up.
    std::fs::write(&file, "[[token]]\ntenant = \"c\"\nsha256 = \"not hex\"\n").unwrap();
    hup(&cluster);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(c.list(ListRequest::default()).await.is_ok(), "a bad reload must keep the previous tokens");
    for id in 1..=3 {
        assert!(cluster.children.get_mut(&id).unwrap().try_wait().unwrap().is_none(), "node {id} exited");
    }
    let log = std::fs::read_to_string(cluster.log_path(1)).unwrap();
    assert!(log.contains("tokens file NOT reloaded") && log.contains("line 3"), "{log}");
}
