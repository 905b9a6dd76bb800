//! Membership of a dpfusion cluster: mutual TLS on every connection between the dpfusion process, the scheduler
//! and the executors (gRPC to the scheduler, Arrow Flight between executors and back to dpfusion).
//!
//! **Claim.** A process joins the cluster, submits a job, polls for tasks or fetches a partition only if it shows
//! a certificate signed by the cluster's certificate authority and holds its private key; every process checks
//! the other side's certificate the same way. Someone who can reach the ports but holds no such certificate gets
//! nothing: the TLS handshake fails before any request is read, so they cannot register an executor (and receive
//! tasks and their exact pre-noise aggregates), fetch a partition, or submit a plan. The traffic itself is
//! encrypted, so the scan capabilities inside plans cannot be copied off the network.
//!
//! **What it rests on.** TLS 1.3/1.2 client authentication (RFC 8446 §4.4.2, rustls's `WebPkiClientVerifier`
//! through tonic) and the secrecy of the private keys: each process's key file, and the authority's key, which
//! signs certificates and is needed by no process (keep it offline). Every member is trusted alike: a certificate
//! names no role, so a member's key lets its holder act as any member. Names are not checked: every certificate
//! carries the one name [`SERVER_NAME`], since membership, not a host name, is what is verified.
//!
//! **Without it** (`insecure_plaintext`), accepted only where every address is a loopback one: anyone who can reach
//! the ports is a member.

use crate::config::ClusterTransport;
use crate::error::{DpError, Result};
use ballista_core::extension::{EndpointOverrideFn, SessionConfigExt};
use datafusion::prelude::SessionConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

/// The name every certificate of a cluster carries and every client expects (`dpfusion cluster-certs`).
pub const SERVER_NAME: &str = "dpfusion-cluster";

/// How long a TLS handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A process's loaded credentials: the cluster's authority and its own certificate and key (`None`: plaintext).
#[derive(Clone)]
pub struct Transport(Option<Arc<Credentials>>);

struct Credentials {
    ca: Certificate,
    identity: Identity,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Transport(mutual TLS)" } else { "Transport(insecure plaintext)" })
    }
}

/// Reads `path`, checking that it holds what `parse` finds in PEM (a clear error at start, not a failed handshake
/// later).
fn read_pem(path: &Path, what: &str, parse: fn(&[u8]) -> bool) -> Result<Vec<u8>> {
    let fail = |m: String| DpError::Config(format!("{what} {}: {m}", path.display()));
    let bytes = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
    if parse(&bytes) { Ok(bytes) } else { Err(fail(format!("no PEM-encoded {what} in it"))) }
}

fn has_certificate(pem: &[u8]) -> bool {
    CertificateDer::pem_slice_iter(pem).next().is_some_and(|c| c.is_ok())
}

fn has_private_key(pem: &[u8]) -> bool {
    PrivateKeyDer::from_pem_slice(pem).is_ok()
}

impl Transport {
    /// The credentials `settings` names, read and checked (a private key readable by others is refused).
    pub fn load(settings: &ClusterTransport) -> Result<Transport> {
        let ClusterTransport::Tls { ca, cert, key } = settings else { return Ok(Transport(None)) };
        #[cfg(unix)]
        if let Ok(meta) = std::fs::metadata(key)
            && std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o077 != 0
        {
            return Err(DpError::Config(format!(
                "private key {}: others may read it; make it private with `chmod 600`",
                key.display()
            )));
        }
        let ca = read_pem(ca, "certificate authority", has_certificate)?;
        let cert = read_pem(cert, "certificate", has_certificate)?;
        let key = read_pem(key, "private key", has_private_key)?;
        let credentials = Credentials { ca: Certificate::from_pem(ca), identity: Identity::from_pem(cert, key) };
        Ok(Transport(Some(Arc::new(credentials))))
    }

    /// Whether connections use mutual TLS.
    pub fn is_tls(&self) -> bool {
        self.0.is_some()
    }

    /// The TLS settings of a server of the cluster: its certificate, and a client certificate required and
    /// checked against the authority. `None` in plaintext.
    pub fn server_tls(&self) -> Option<ServerTlsConfig> {
        let c = self.0.as_ref()?;
        Some(
            ServerTlsConfig::new()
                .identity(c.identity.clone())
                .client_ca_root(c.ca.clone())
                .client_auth_optional(false)
                .timeout(HANDSHAKE_TIMEOUT),
        )
    }

    /// `endpoint` as a client of the cluster dials it: over TLS with this process's certificate, the server's
    /// checked against the authority (Ballista makes `http://` endpoints; tonic uses TLS only for `https://`, so
    /// the endpoint is made again for `https://` with Ballista's default timeouts). Unchanged in plaintext.
    pub fn client_endpoint(&self, endpoint: Endpoint) -> std::result::Result<Endpoint, tonic::transport::Error> {
        let Some(c) = &self.0 else { return Ok(endpoint) };
        let endpoint = match endpoint.uri().authority() {
            Some(authority) if endpoint.uri().scheme_str() != Some("https") => {
                let defaults = ballista_core::utils::GrpcClientConfig::default();
                ballista_core::utils::create_grpc_client_endpoint(format!("https://{authority}"), Some(&defaults))?
            }
            _ => endpoint,
        };
        let tls = ClientTlsConfig::new()
            .domain_name(SERVER_NAME)
            .ca_certificate(c.ca.clone())
            .identity(c.identity.clone())
            .timeout(HANDSHAKE_TIMEOUT);
        endpoint.tls_config(tls)
    }

    /// [`Transport::client_endpoint`] as Ballista's endpoint hook; `None` in plaintext.
    pub fn endpoint_override(&self) -> Option<EndpointOverrideFn> {
        self.0.as_ref()?;
        let this = self.clone();
        Some(Arc::new(move |endpoint| this.client_endpoint(endpoint).map_err(|e| Box::new(e) as _)))
    }

    /// `config` with this transport for every connection Ballista opens under it (Flight fetches included).
    pub fn session_config(&self, config: SessionConfig) -> SessionConfig {
        match self.endpoint_override() {
            Some(f) => config.with_ballista_use_tls(true).with_ballista_override_create_grpc_client_endpoint(f),
            None => config.with_ballista_use_tls(false),
        }
    }
}
