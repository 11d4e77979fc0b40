//! Data-directory identity on real processes: a node refuses (exit code 2, naming the owner
//! and the fix) another node's directory and another cluster's directory; a joiner records
//! the cluster id of the leader that added it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{key, Cluster, SERIAL};
use idemraft_client::{ClaimOptions, Outcome, StoredResponse};

/// The node's IDENTITY file, empty while it does not exist yet (a node just spawned).
fn identity_of(cluster: &Cluster, id: u64) -> String {
    std::fs::read_to_string(cluster.data_dir(id).join("IDENTITY")).unwrap_or_default()
}

fn cluster_id_in(identity: &str) -> String {
    identity
        .lines()
        .find_map(|l| l.strip_prefix("cluster-id = "))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_default()
}

async fn complete_one(cluster: &Cluster, k: &str) -> u64 {
    let client = cluster.client();
    let g = match client.claim("id.test", k, "owner-1", &ClaimOptions::default()).await.unwrap() {
        Outcome::Acquired(g) => g,
        other => panic!("{other:?}"),
    };
    client.complete("id.test", k, g.token, &StoredResponse::new(200, "done")).await.unwrap();
    g.token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn swapped_data_dirs_are_refused_and_work_once_put_back() {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::start(3, &[]).await;
    let token = complete_one(&cluster, &key("swap", 1)).await;
    let founders = cluster.identity_flags();

    let id1 = identity_of(&cluster, 1);
    assert!(id1.contains("node-id = 1"), "{id1}");
    let cid = cluster_id_in(&id1);
    assert_eq!(cid.len(), 32, "{id1}");
    assert_eq!(cluster_id_in(&identity_of(&cluster, 2)), cid, "founders derive the same cluster id");

    assert!(cluster.terminate(1, Duration::from_secs(15)).is_some());
    assert!(cluster.terminate(2, Duration::from_secs(15)).is_some());
    let (d1, d2, tmp) = (cluster.data_dir(1), cluster.data_dir(2), cluster.dir.path().join("swap"));
    std::fs::rename(&d1, &tmp).unwrap();
    std::fs::rename(&d2, &d1).unwrap();
    std::fs::rename(&tmp, &d2).unwrap();

    // Node 1 on node 2's directory, and node 2 on node 1's.
    for (id, owner) in [(1u64, 2u64), (2, 1)] {
        let (code, err) = cluster.run_expecting_refusal(id, &cluster.data_dir(id), &founders, Duration::from_secs(20));
        assert_eq!(code, 2, "node {id} on node {owner}'s directory: {err}");
        assert!(err.contains(&format!("belongs to node {owner} of cluster {}", &cid[..12])), "{err}");
        assert!(err.contains(&format!("started as node {id}")), "{err}");
        assert!(
            err.contains("point --data-dir at") && err.contains("wipe it to rejoin as a new node with a new id"),
            "{err}"
        );
    }

    // Put back, everything works and nothing was lost.
    std::fs::rename(&d1, &tmp).unwrap();
    std::fs::rename(&d2, &d1).unwrap();
    std::fs::rename(&tmp, &d2).unwrap();
    cluster.restart(1);
    cluster.restart(2);
    cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(30)).await;
    match cluster.client().claim("id.test", &key("swap", 1), "auditor", &ClaimOptions::default()).await.unwrap() {
        Outcome::Replay { token: t, .. } => assert_eq!(t, token),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_clusters_data_dir_is_refused_and_a_joiner_adopts_its_clusters_id() {
    let _serial = SERIAL.lock().await;
    let mut a = Cluster::start(3, &[]).await;
    complete_one(&a, &key("foreign", 1)).await;
    let cid_a = cluster_id_in(&identity_of(&a, 1));

    // A second cluster, on addresses of its own: its node 1 pointed at A's node 1 directory.
    let b = Cluster::start(3, &[]).await;
    let cid_b = cluster_id_in(&identity_of(&b, 1));
    assert_ne!(cid_a, cid_b);
    assert!(a.terminate(1, Duration::from_secs(15)).is_some());
    let flags_b = b.identity_flags();
    let (code, err) = b.run_expecting_refusal(1, &a.data_dir(1), &flags_b, Duration::from_secs(20));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&format!("belongs to node 1 of cluster {}", &cid_a[..12])), "{err}");
    assert!(err.contains(&format!("describe cluster {}", &cid_b[..12])), "{err}");
    assert!(err.contains("wipe it to rejoin as a new node with a new id"), "{err}");

    // The same with another token: a rebuilt cluster on the same addresses is another cluster.
    let mut flags_a = a.identity_flags();
    flags_a.extend(["--initial-cluster-token".to_string(), "rebuild-2".to_string()]);
    let (code, err) = a.run_expecting_refusal(1, &a.data_dir(1), &flags_a, Duration::from_secs(20));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("describe cluster"), "{err}");
    drop(b);
    a.restart(1);
    a.wait_for_leader(&[1, 2, 3], Duration::from_secs(30)).await;

    // A joiner has no cluster id until its leader's first message, then keeps it for good.
    a.spawn(4, false);
    let client = a.client_for(&[1, 2, 3]);
    client.add_learner(4, &a.peer_addr(4), true).await.unwrap();
    let end = tokio::time::Instant::now() + Duration::from_secs(20);
    while cluster_id_in(&identity_of(&a, 4)) != cid_a {
        assert!(tokio::time::Instant::now() < end, "node 4 never recorded the cluster id: {}", identity_of(&a, 4));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    a.kill(4);
    // Restarted as a founder of some other cluster, it refuses.
    let mut other = a.identity_flags();
    other[1] = format!("{},4={}", other[1], a.peer_addr(4));
    let (code, err) = a.run_expecting_refusal(4, &a.data_dir(4), &other, Duration::from_secs(20));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&format!("belongs to node 4 of cluster {}", &cid_a[..12])), "{err}");
}
