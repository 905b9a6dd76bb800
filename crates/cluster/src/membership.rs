//! Who is a member of a dpfusion cluster, and what a member's servers accept: the certificates
//! (`dpfusion cluster-certs`), the scheduler's gRPC server and the executors' Flight servers behind mutual TLS
//! ([`dpfusion::cluster::Transport`] holds the claim and what it rests on), and job ids nobody can guess.
//!
//! Ballista's own servers have no TLS or authentication hook, so the scheduler's gRPC service and the executors'
//! Flight service are served here, by tonic, with the same services inside. Executors poll the scheduler for
//! tasks (Ballista's pull scheduling), so no executor runs a gRPC server of its own that would need one.

use crate::ClusterError;
use ballista_core::error::BallistaError;
use ballista_core::serde::protobuf::scheduler_grpc_server::SchedulerGrpcServer;
use ballista_executor::flight_service::BallistaFlightService;
use ballista_executor::shutdown::Shutdown;
use ballista_scheduler::scheduler_server::{JobIdGenerator, SchedulerServer};
use datafusion_proto::protobuf::{LogicalPlanNode, PhysicalPlanNode};
use dpfusion::cluster::{SERVER_NAME, Transport};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

/// Job ids of 128 random bits (Ballista's own are a millisecond clock and a counter): an id is what a job's
/// status and its partitions are asked for by, so nobody may guess another's.
pub(crate) struct RandomJobIds;

#[async_trait::async_trait]
impl JobIdGenerator for RandomJobIds {
    async fn next_id(&self) -> String {
        format!("{:032x}", rand::random::<u128>())
    }
}

/// Axum's `ConnectInfo` from tonic's own connection info: Ballista's scheduler reads the peer's address there (for
/// an executor that registers without a host name), as its own axum server would set it.
fn with_peer_address<B>(mut request: http::Request<B>) -> http::Request<B> {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    let extensions = request.extensions();
    let peer = extensions
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|i| i.get_ref().remote_addr())
        .or_else(|| extensions.get::<TcpConnectInfo>().and_then(|i| i.remote_addr()));
    if let Some(peer) = peer {
        request.extensions_mut().insert(axum::extract::ConnectInfo::<SocketAddr>(peer));
    }
    request
}

/// Serves `scheduler` on `listener` until the process ends, over mutual TLS unless `transport` is plaintext.
pub(crate) async fn serve_scheduler(
    listener: tokio::net::TcpListener,
    scheduler: SchedulerServer<LogicalPlanNode, PhysicalPlanNode>,
    transport: &Transport,
) -> Result<(), ClusterError> {
    let config = Arc::clone(&scheduler.state.config);
    let service = SchedulerGrpcServer::new(scheduler)
        .max_decoding_message_size(config.grpc_server_max_decoding_message_size as usize)
        .max_encoding_message_size(config.grpc_server_max_encoding_message_size as usize);
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = transport.server_tls() {
        server = server.tls_config(tls).map_err(BallistaError::TonicError)?;
    }
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    server
        .layer(tower::util::MapRequestLayer::new(with_peer_address))
        .add_service(service)
        .serve_with_incoming(incoming)
        .await
        .map_err(BallistaError::TonicError)?;
    Ok(())
}

/// An executor's Flight server (shuffle data, and results for the dpfusion process), as Ballista's executor starts
/// it through its hook, but over mutual TLS unless `transport` is plaintext.
pub(crate) fn flight_server(transport: Transport) -> Arc<ballista_executor::ArrowFlightServerProvider> {
    Arc::new(move |work_dir: String, address: SocketAddr, mut shutdown: Shutdown, _| {
        let transport = transport.clone();
        tokio::spawn(async move {
            use arrow_flight::flight_service_server::FlightServiceServer;
            let mut server = tonic::transport::Server::builder();
            if let Some(tls) = transport.server_tls() {
                server = server.tls_config(tls).map_err(BallistaError::TonicError)?;
            }
            let service = FlightServiceServer::new(BallistaFlightService::new(work_dir))
                .max_decoding_message_size(16 << 20)
                .max_encoding_message_size(16 << 20);
            server
                .add_service(service)
                .serve_with_shutdown(address, shutdown.recv())
                .await
                .map_err(BallistaError::TonicError)
        })
    })
}

/// The processes `dpfusion cluster-certs` makes certificates for unless told otherwise.
pub const DEFAULT_MEMBERS: [&str; 3] = ["scheduler", "executor", "dpfusion"];

/// Writes a new cluster into `dir` (created, and refused if it holds a cluster already): `ca.pem` (the authority's
/// certificate, which every process is given), `ca.key` (its key: it signs certificates and no process needs it;
/// keep it offline), and for each of `members` `<name>.pem` and `<name>.key`, a certificate signed by the
/// authority for [`SERVER_NAME`] valid for `days` days. Keys are written readable by their owner only.
pub fn write_certificates(dir: &Path, members: &[String], days: u32) -> Result<(), ClusterError> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
    let fail = |what: &str, e: &dyn std::fmt::Display| ClusterError::Config(format!("{what}: {e}"));
    if members.is_empty() || days == 0 {
        return Err(ClusterError::Config("give at least one member and a validity of at least one day".into()));
    }
    if let Some(bad) = members
        .iter()
        .find(|m| m.is_empty() || *m == "ca" || !m.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
    {
        return Err(ClusterError::Config(format!("member name `{bad}`: use letters, digits, - and _ (and not `ca`)")));
    }
    std::fs::create_dir_all(dir).map_err(|e| fail(&dir.display().to_string(), &e))?;
    let validity = |params: &mut CertificateParams| {
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(i64::from(days));
    };
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(|e| fail("the authority", &e))?;
    ca.distinguished_name.push(DnType::CommonName, "dpfusion cluster authority");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    validity(&mut ca);
    let ca_key = KeyPair::generate().map_err(|e| fail("the authority's key", &e))?;
    let ca_cert = ca.self_signed(&ca_key).map_err(|e| fail("the authority", &e))?;
    write_new(&dir.join("ca.key"), &ca_key.serialize_pem(), true)?;
    write_new(&dir.join("ca.pem"), &ca_cert.pem(), false)?;
    let issuer = Issuer::new(ca, ca_key);
    for name in members {
        let mut params = CertificateParams::new(vec![SERVER_NAME.to_string()]).map_err(|e| fail(name, &e))?;
        params.distinguished_name.push(DnType::CommonName, format!("dpfusion cluster member {name}"));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        validity(&mut params);
        let key = KeyPair::generate().map_err(|e| fail(name, &e))?;
        let cert = params.signed_by(&key, &issuer).map_err(|e| fail(name, &e))?;
        write_new(&dir.join(format!("{name}.key")), &key.serialize_pem(), true)?;
        write_new(&dir.join(format!("{name}.pem")), &cert.pem(), false)?;
    }
    Ok(())
}

/// Writes `text` to `path`, which must not exist; mode 600 if `private`.
fn write_new(path: &Path, text: &str, private: bool) -> Result<(), ClusterError> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, if private { 0o600 } else { 0o644 });
    let fail = |e: std::io::Error| ClusterError::Config(format!("{}: {e}", path.display()));
    let mut file = options.open(path).map_err(fail)?;
    file.write_all(text.as_bytes()).map_err(fail)?;
    file.sync_all().map_err(fail)
}
