//! `idemctl` owns the operator side of Idemraft outside the server: the `idemctl` CLI
//! (`src/main.rs`: claims and the other calls, status, membership, quotas, backups) and
//! [`certs`], the throwaway CA and node certificates of `idemctl dev-certs`, which tests and
//! `scripts/cluster.sh up --tls` use too. It is a crate of its own so that a service linking
//! `idemraft-client` builds neither clap nor rcgen.

pub mod certs;
