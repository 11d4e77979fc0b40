//! The configuration's rules, one test per rule family.

use super::*;

fn opts(id: u64) -> Options {
    Options { id: Some(id), ..Options::default() }
}

#[test]
fn defaults_follow_the_id() {
    let c = opts(2).resolve().map_err(|e| e.to_string()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.client_addr.to_string(), "127.0.0.1:7102");
    assert_eq!(c.peer_addr.to_string(), "127.0.0.1:7202");
    assert_eq!(c.http_addr.to_string(), "127.0.0.1:7302");
    assert_eq!(c.data_dir, PathBuf::from("data/node-2"));
    assert_eq!(c.db_cache_bytes, 4 << 20);
}

/// Whatever sizes are configured, the largest admitted command fits one entry, one entry
/// fits one AppendEntries, and an AppendEntries cut at its budget plus one oversize entry
/// stays under the peer port's message bound.
#[test]
fn no_accepted_size_configuration_lets_a_message_pass_the_peer_bound() {
    let sizes = [None, Some(300 * 1024), Some(1 << 20), Some(4 << 20), Some(16 << 20), Some(64 << 20)];
    let mut accepted = 0;
    for response in [None, Some(1024), Some(256 * 1024), Some(4 << 20)] {
        for entry in sizes {
            for replication in sizes {
                let o = Options {
                    max_response_bytes: response,
                    entry_max_bytes: entry,
                    replication_max_bytes: replication,
                    ..opts(1)
                };
                let Ok(c) = o.resolve() else { continue };
                accepted += 1;
                assert!(c.limits.max_command_bytes() <= c.entry_max_bytes, "{o:?}");
                assert!(c.entry_max_bytes <= c.replication_max_bytes, "{o:?}");
                assert!(c.replication_max_bytes + c.entry_max_bytes < crate::wire::MAX_PEER_MESSAGE, "{o:?}");
            }
        }
    }
    assert!(accepted > 20, "only {accepted} configurations were accepted");
    let c = opts(1).resolve().map_err(|e| e.to_string()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((c.entry_max_bytes, c.replication_max_bytes), (1 << 20, 4 << 20));
}

#[test]
fn bad_values_name_their_option() {
    let cases: Vec<(Options, &str)> = vec![
        (Options::default(), "--id"),
        (Options { initial_cluster: Some("1=127.0.0.1".into()), ..opts(1) }, "--initial-cluster"),
        (Options { initial_cluster: Some("2=127.0.0.1:7202".into()), ..opts(1) }, "--initial-cluster"),
        (Options { initial_cluster: Some("1=a:1,1=b:2".into()), ..opts(1) }, "--initial-cluster"),
        (Options { heartbeat: Some("100".into()), ..opts(1) }, "--heartbeat"),
        (Options { election_timeout_min: Some("150ms".into()), ..opts(1) }, "--election-timeout-min"),
        (Options { election_timeout_max: Some("300ms".into()), ..opts(1) }, "--election-timeout-max"),
        (Options { batch_max: Some(0), ..opts(1) }, "--batch-max"),
        (Options { batch_max: Some(idemraft_store::Token::MAX_BATCH), ..opts(1) }, "--batch-max"),
        (Options { entry_max_bytes: Some(64 * 1024), ..opts(1) }, "--entry-max-bytes"),
        (Options { snapshot_log_bytes: Some(1 << 20), ..opts(1) }, "--snapshot-log-bytes"),
        (Options { snapshot_rate: Some(4096), ..opts(1) }, "--snapshot-rate"),
        (Options { db_cache_bytes: Some(4096), ..opts(1) }, "--db-cache-bytes"),
        (
            Options { snapshot_log_bytes: Some(16 << 20), entry_max_bytes: Some(8 << 20), ..opts(1) },
            "--snapshot-log-bytes",
        ),
        (Options { max_response_bytes: Some(4 << 20), entry_max_bytes: Some(2 << 20), ..opts(1) }, "--entry-max-bytes"),
        (Options { replication_max_bytes: Some(512 * 1024), ..opts(1) }, "--replication-max-bytes"),
        (Options { replication_max_bytes: Some(1 << 30), ..opts(1) }, "--replication-max-bytes"),
        (Options { max_response_bytes: Some(1 << 30), ..opts(1) }, "--max-response-bytes"),
        (Options { min_ttl: Some("500ms".into()), ..opts(1) }, "--min-ttl"),
        (Options { min_ttl: Some("31d".into()), ..opts(1) }, "--min-ttl"),
        (Options { default_lease: Some("1h".into()), ..opts(1) }, "--default-lease"),
        (Options { scope_retention: Some("bad scope!=1d".into()), ..opts(1) }, "--scope-retention"),
        (Options { sweep_interval: Some("5s".into()), ..opts(1) }, "--sweep-interval"),
        (Options { log_format: Some("xml".into()), ..opts(1) }, "--log-format"),
        (Options { http_addr: "127.0.0.1:7101".parse().ok(), ..opts(1) }, "--client-addr/--peer-addr/--http-addr"),
        (Options { peer_route: Some("2=nowhere".into()), ..opts(1) }, "--peer-route"),
        (Options { unsafe_planted_bugs: Some("ignore-leases,typo".into()), ..opts(1) }, "--unsafe-planted-bugs"),
        (Options { max_pending_writes: Some(0), ..opts(1) }, "--max-pending-writes"),
        (Options { max_streams_per_connection: Some(4096), ..opts(1) }, "--max-streams-per-connection"),
    ];
    for (o, option) in cases {
        match o.resolve() {
            Ok(_) => panic!("{o:?} was accepted"),
            Err(e) => assert_eq!(e.option, option, "{e}"),
        }
    }
}

#[test]
fn flags_win_over_the_file() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("node.toml");
    std::fs::write(&path, "id = 3\nbatch-max = 64\ndefault-lease = \"10s\"\ndb-cache-bytes = 67108864\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let o = Options { config: Some(path.clone()), batch_max: Some(8), ..Options::default() };
    let c = o.with_file().and_then(|o| o.resolve()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.id, 3);
    assert_eq!(c.batch_max, 8);
    assert_eq!(c.default_lease, Duration::from_secs(10));
    assert_eq!(c.db_cache_bytes, 64 << 20);

    std::fs::write(&path, "id = 3\nbatch_maximum = 64\n").unwrap_or_else(|e| panic!("{e}"));
    let err = Options { config: Some(path), ..Options::default() }.with_file().err();
    let err = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("batch_maximum"), "{err}");
}

#[test]
fn routes_and_planted_bugs_parse() {
    let o = Options {
        peer_route: Some("2=127.0.0.1:9002, 3=127.0.0.1:9003".into()),
        unsafe_planted_bugs: Some("ignore-leases,ignore-leases,stale-local-reads".into()),
        ..opts(1)
    };
    let c = o.resolve().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.peer_routes.get(&3).map(String::as_str), Some("127.0.0.1:9003"));
    assert_eq!(c.planted_bugs, vec![Bug::IgnoreLeases, Bug::StaleLocalReads]);
    assert!(opts(1).resolve().unwrap_or_else(|e| panic!("{e}")).planted_bugs.is_empty());
}

#[test]
fn plaintext_beyond_loopback_is_refused_unless_chosen() {
    let open: Option<SocketAddr> = "0.0.0.0:7101".parse().ok();
    let err = Options { client_addr: open, ..opts(1) }.resolve().err().unwrap_or_else(|| panic!("accepted"));
    assert_eq!(err.option, "--client-addr");
    assert!(err.fix.contains("--tls-cert") && err.fix.contains("--insecure-plaintext"), "{err}");
    let remote_peer = Options { initial_cluster: Some("1=127.0.0.1:7201,2=10.1.2.3:7202".into()), ..opts(1) };
    let err = remote_peer.clone().resolve().err().unwrap_or_else(|| panic!("accepted"));
    assert_eq!(err.option, "--peer-addr");
    assert!(err.problem.contains("10.1.2.3:7202"), "{err}");
    assert!(Options { client_addr: open, insecure_plaintext: true, ..opts(1) }.resolve().is_ok());
    assert!(Options { insecure_plaintext: true, ..remote_peer }.resolve().is_ok());
    // Loopback needs no choice: the quick start and the tests run as they always did.
    let local = Options { initial_cluster: Some("1=127.0.0.1:7201,2=localhost:7202,3=[::1]:7203".into()), ..opts(1) };
    assert!(local.resolve().is_ok());
}

#[test]
fn tls_files_are_read_and_checked_at_start() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let certs = idemctl::certs::generate(dir.path(), 1, &[]).unwrap_or_else(|e| panic!("{e}"));
    let (cert, key) = certs.nodes[0].clone();
    let missing = dir.path().join("missing.pem");
    let full = Options {
        tls_cert: Some(cert.clone()),
        tls_key: Some(key.clone()),
        tls_client_ca: Some(certs.ca.clone()),
        peer_tls_cert: Some(cert.clone()),
        peer_tls_key: Some(key.clone()),
        peer_tls_ca: Some(certs.ca.clone()),
        client_addr: "0.0.0.0:7101".parse().ok(),
        ..opts(1)
    };
    let c = full.clone().resolve().unwrap_or_else(|e| panic!("{e}"));
    assert!(c.client_tls.as_ref().is_some_and(|t| t.client_ca.is_some()) && c.peer_tls.is_some());
    assert!(!format!("{c:?}").contains("PRIVATE KEY"), "a logged config must not show keys");

    let cases: Vec<(Options, &str, String)> = vec![
        (Options { tls_cert: Some(missing.clone()), ..full.clone() }, "--tls-cert", missing.display().to_string()),
        (Options { tls_key: Some(cert.clone()), ..full.clone() }, "--tls-key", "no usable PEM private key".into()),
        (Options { tls_cert: Some(key.clone()), ..full.clone() }, "--tls-cert", "no PEM certificate".into()),
        (Options { tls_key: None, ..full.clone() }, "--tls-key", "is not set".into()),
        (Options { tls_cert: None, tls_key: None, ..full.clone() }, "--tls-client-ca", "no TLS".into()),
        (Options { peer_tls_ca: None, ..full.clone() }, "--peer-tls-ca", "all three".into()),
        (Options { peer_tls_ca: Some(missing.clone()), ..full.clone() }, "--peer-tls-ca", "cannot read".into()),
    ];
    for (o, option, says) in cases {
        match o.resolve() {
            Ok(_) => panic!("accepted, wanted an error on {option}"),
            Err(e) => {
                assert_eq!(e.option, option, "{e}");
                assert!(e.to_string().contains(&says), "wanted '{says}' in: {e}");
            }
        }
    }
}

#[test]
fn a_bad_tokens_file_is_named_with_its_line() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("tokens.toml");
    let hash = "ab".repeat(32);
    std::fs::write(
        &path,
        format!("[[token]]\ntenant = \"acme\"\nsha256 = \"{hash}\"\n\n[[token]]\nsha256 = \"zz\"\ntenant = \"b\"\n"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let err = Options { tokens_file: Some(path.clone()), ..opts(1) }.resolve().err();
    let err = err.unwrap_or_else(|| panic!("accepted"));
    assert_eq!(err.option, "--tokens-file");
    assert!(err.problem.contains("tokens.toml line 6") && err.problem.contains("64 hex digits"), "{err}");
    std::fs::write(&path, format!("[[token]]\ntenant = \"acme\"\nsha256 = \"{hash}\"\n"))
        .unwrap_or_else(|e| panic!("{e}"));
    let c = Options { tokens_file: Some(path.clone()), ..opts(1) }.resolve().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.tokens_file, Some(path));
}

#[test]
fn durations() {
    assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
    assert!(parse_duration("5").is_err());
    assert!(parse_duration("5y").is_err());
    assert!(parse_duration("s").is_err());
}

#[test]
fn min_ttl_lowers_the_edge_bound_only() {
    let c = opts(1).resolve().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.limits.ttl_min_ms, 60_000);
    let c = Options { min_ttl: Some("1s".into()), ..opts(1) }.resolve().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.limits.ttl_min_ms, 1_000);
    assert_eq!(c.limits.ttl_max_ms, Limits::DEFAULT.ttl_max_ms);
}
