//! The configuration file: the session's budget and defaults, the durable ledger, the owner's log, and for each
//! private table where its data is and its policy ([`crate::policy`]). Loaded from TOML and validated, every
//! mistake reported with what to change.

use crate::accounting::Rho;
use crate::accounting::calibrate::{Accounting, MechanismChoice};
use crate::error::{DpError, Result};
use crate::policy::{ColumnPolicy, ColumnType, DomainValue, TablePolicy};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The whole configuration file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Session-wide budget and defaults.
    pub session: SessionSettings,
    /// The private tables, by name.
    #[serde(default)]
    pub tables: BTreeMap<String, TableConfig>,
    /// The durable budget ledger; without it the budget lives in memory only.
    pub ledger: Option<LedgerConfig>,
    /// `dpfusion serve`: where and how analysts connect.
    pub server: Option<ServerConfig>,
    /// Where private plans run: here, or on a Ballista cluster.
    pub engine: Option<EngineConfig>,
}

/// `[engine]`: where private plans run.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    /// A Ballista scheduler, `df://host:port`: private plans run on its cluster (`docs/cluster.md`).
    pub scheduler: Option<String>,
    /// Partitions of every private plan on the cluster (about the executors' cores in all; 16 by default).
    pub cluster_partitions: Option<usize>,
    /// The cluster key shared with the executors (`dpfusion cluster-key FILE` writes one).
    pub cluster_key_file: Option<String>,
    /// The cluster's certificate authority (PEM): only processes holding a certificate it signed are members
    /// (`dpfusion cluster-certs DIR` makes one, and a certificate for each process).
    pub cluster_ca: Option<String>,
    /// This process's certificate (PEM), signed by `cluster_ca`.
    pub cluster_cert: Option<String>,
    /// The private key of `cluster_cert` (PEM).
    pub cluster_cert_key: Option<String>,
    /// Talk to the cluster without TLS: anyone who can reach its ports can join it and read what it computes.
    /// Refused unless the scheduler is on a loopback address (a test, or one machine).
    #[serde(default)]
    pub insecure_plaintext: bool,
    /// Seconds a scan's capability lets the executors read it, for sessions without a server (the CLI, the REPL,
    /// the library); [`DEFAULT_CAPABILITY_LIFETIME_SECS`] unless set. With a `[server]` section the server's
    /// `statement_timeout_secs` is the lifetime, and setting this too is refused.
    pub capability_lifetime_secs: Option<u64>,
}

/// How the processes of a cluster talk to each other (`docs/cluster.md`, "Membership").
#[derive(Clone, Debug, PartialEq)]
pub enum ClusterTransport {
    /// Mutual TLS: every connection shows a certificate signed by the cluster's authority, and checks the other's.
    Tls {
        /// The cluster's certificate authority (PEM).
        ca: PathBuf,
        /// This process's certificate (PEM).
        cert: PathBuf,
        /// Its private key (PEM).
        key: PathBuf,
    },
    /// No TLS (`insecure_plaintext = true`), only where every address is a loopback one.
    InsecurePlaintext,
}

impl ClusterTransport {
    /// The transport of a process given the three TLS files or insecure plaintext (exactly one of the two),
    /// whose peers are at `hosts` (plaintext only if every one of them is a loopback address). `names` says how
    /// the settings are spelt where they were given: the three files' names, then the plaintext one's.
    pub fn choose(
        files: [Option<PathBuf>; 3],
        insecure_plaintext: bool,
        hosts: &[&str],
        names: [&str; 4],
    ) -> Result<ClusterTransport> {
        let [ca_name, cert_name, key_name, plaintext] = names;
        let tls = format!("{ca_name}, {cert_name} and {key_name}");
        let fail = |m: String| Err(DpError::Config(m));
        match (files, insecure_plaintext) {
            ([Some(ca), Some(cert), Some(key)], false) => Ok(ClusterTransport::Tls { ca, cert, key }),
            ([None, None, None], true) => match hosts.iter().find(|h| !is_loopback_host(h)) {
                None => Ok(ClusterTransport::InsecurePlaintext),
                Some(host) => fail(format!(
                    "{plaintext} is allowed only when every address is a loopback one, and {host} is not: anyone \
                     who can reach the cluster's ports could join it and read exact aggregates. Give {tls} \
                     instead (`dpfusion cluster-certs DIR` makes them)"
                )),
            },
            ([None, None, None], false) => fail(format!(
                "a cluster's processes talk over mutual TLS: give {tls} (`dpfusion cluster-certs DIR` makes a \
                 certificate authority and a certificate for each process), or, with every process on this \
                 machine only, {plaintext}"
            )),
            (_, true) => fail(format!("give either {tls}, or {plaintext}, not both")),
            (_, false) => fail(format!("give all three of {tls}")),
        }
    }
}

/// Whether `host` (a name or an address, IPv6 in brackets or not) is a loopback address.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|a| a.to_canonical().is_loopback())
}

/// The validated `[engine] scheduler` and what goes with it.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterSettings {
    /// The scheduler, `df://host:port`.
    pub scheduler: String,
    /// Partitions of every private plan (the parallelism of each stage across the executors).
    pub partitions: usize,
    /// The file holding the cluster key.
    pub key_file: PathBuf,
    /// How this process reaches the scheduler and the executors.
    pub transport: ClusterTransport,
    /// How long after its debit a query's scans may be read by the executors: the statement timeout
    /// (`[server] statement_timeout_secs`), or `[engine] capability_lifetime_secs` without a server.
    pub capability_lifetime: std::time::Duration,
}

/// Partitions of a private plan on a cluster unless `[engine] cluster_partitions` says otherwise.
pub const DEFAULT_CLUSTER_PARTITIONS: usize = 16;

/// Seconds a scan's capability lives, without a server, unless `[engine] capability_lifetime_secs` says
/// otherwise: the server's default statement timeout, so that a query runs on a cluster as long as a server would
/// let it.
pub const DEFAULT_CAPABILITY_LIFETIME_SECS: u64 = DEFAULT_STATEMENT_TIMEOUT_SECS;

/// The longest `[engine] capability_lifetime_secs` (a day).
pub const MAX_CAPABILITY_LIFETIME_SECS: u64 = 24 * 3600;

/// The capability lifetime: `[engine] capability_lifetime_secs` (`configured`), or the server's statement timeout
/// when the configuration has `[server]`.
fn capability_lifetime(configured: Option<u64>, statement_timeout_secs: Option<u64>) -> Result<std::time::Duration> {
    let most = MAX_CAPABILITY_LIFETIME_SECS;
    let secs = match (configured, statement_timeout_secs) {
        (Some(_), Some(timeout)) => {
            return Err(DpError::Config(format!(
                "[engine] capability_lifetime_secs is for sessions without a server: with [server], a query's scans \
                 may be read for its statement_timeout_secs ({timeout}). Remove capability_lifetime_secs, or change \
                 statement_timeout_secs"
            )));
        }
        (None, Some(timeout)) if timeout > most => {
            return Err(DpError::Config(format!(
                "[server] statement_timeout_secs = {timeout}: on a cluster ([engine] scheduler) the executors may read \
                 a query's tables for its statement timeout after the debit; give at most {most} (a day)"
            )));
        }
        (None, Some(timeout)) => timeout,
        (Some(secs), None) if !(1..=most).contains(&secs) => {
            return Err(DpError::Config(format!(
                "[engine] capability_lifetime_secs = {secs}: give a whole number of seconds from 1 to {most} (a \
                 day), at least as long as the longest query should run on the cluster"
            )));
        }
        (Some(secs), None) => secs,
        (None, None) => DEFAULT_CAPABILITY_LIFETIME_SECS,
    };
    Ok(std::time::Duration::from_secs(secs))
}

fn cluster_settings(
    e: EngineConfig,
    tables: &BTreeMap<String, TableSource>,
    base_dir: &Path,
    statement_timeout_secs: Option<u64>,
) -> Result<Option<ClusterSettings>> {
    let Some(scheduler) = e.scheduler else {
        let tls = [&e.cluster_ca, &e.cluster_cert, &e.cluster_cert_key].iter().any(|f| f.is_some());
        let lifetime = e.capability_lifetime_secs.is_some();
        if e.cluster_partitions.is_some() || e.cluster_key_file.is_some() || tls || e.insecure_plaintext || lifetime {
            return Err(DpError::Config(
                "[engine] cluster_partitions, cluster_key_file, cluster_ca, cluster_cert, cluster_cert_key, \
                 insecure_plaintext and capability_lifetime_secs apply to a cluster: add scheduler = \
                 \"df://host:50050\""
                    .into(),
            ));
        }
        return Ok(None);
    };
    let key_file = e.cluster_key_file.ok_or_else(|| {
        DpError::Config(
            "[engine] scheduler needs cluster_key_file, the key shared with the executors (write one with \
             `dpfusion cluster-key FILE`)"
                .into(),
        )
    })?;
    let capability_lifetime = capability_lifetime(e.capability_lifetime_secs, statement_timeout_secs)?;
    let partitions = e.cluster_partitions.unwrap_or(DEFAULT_CLUSTER_PARTITIONS);
    if !(1..=4096).contains(&partitions) {
        return Err(DpError::Config(format!("[engine] cluster_partitions = {partitions} must be in 1..=4096")));
    }
    if let Some((name, _)) = tables.iter().find(|(_, t)| t.in_memory && t.public.is_none()) {
        return Err(DpError::Config(format!(
            "[tables.{name}] in_memory = true cannot run on a cluster ([engine] scheduler): its rows would travel \
             inside every plan. Remove in_memory, or the scheduler"
        )));
    }
    let files = [e.cluster_ca, e.cluster_cert, e.cluster_cert_key].map(|f| f.map(|f| resolve(base_dir, &f)));
    let host = scheduler_host(&scheduler);
    let names = ["[engine] cluster_ca", "cluster_cert", "cluster_cert_key", "[engine] insecure_plaintext = true"];
    let transport = ClusterTransport::choose(files, e.insecure_plaintext, &[host], names)?;
    let key_file = resolve(base_dir, &key_file);
    Ok(Some(ClusterSettings { scheduler, partitions, key_file, transport, capability_lifetime }))
}

/// The host of a scheduler address (`df://host:port`, `host:port`, `[::1]:port`).
fn scheduler_host(scheduler: &str) -> &str {
    let rest = scheduler.split_once("://").map_or(scheduler, |(_, r)| r).trim_end_matches('/');
    match rest.rsplit_once(':') {
        Some((host, port)) if port.parse::<u16>().is_ok() => host,
        _ => rest,
    }
}

/// `[server]`: the PostgreSQL-wire server (`dpfusion serve`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address and port to listen on.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// PEM certificate chain for TLS (with `tls_key`).
    pub tls_cert: Option<String>,
    /// PEM private key for TLS.
    pub tls_key: Option<String>,
    /// Listen on a non-loopback address without TLS, or, with TLS configured, also accept clients that do not use
    /// it (passwords are still never sent in clear, but queries and answers are). Off: with TLS configured, a
    /// connection that did not start TLS is refused at startup.
    #[serde(default)]
    pub allow_plaintext: bool,
    /// Most logged-in connections at once; a login beyond them is refused with SQLSTATE 53300. A slot is taken
    /// only once the password checked out.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Most connections of one analyst at once (within `max_connections`); more are refused with 53300.
    #[serde(default = "default_max_connections_per_analyst")]
    pub max_connections_per_analyst: usize,
    /// Places for connections still logging in (TCP accepted, not yet authenticated). Separate from
    /// `max_connections`, so clients that never log in cannot take their slots. When every place is taken, a new
    /// connection takes the place of the one that has shown the least (closed with 53300): a silent one (no byte
    /// received) before one whose login is under way, one of the address holding the most places (never one of an
    /// address holding no more than the newcomer's own), the oldest first; so silent sockets, from any number of
    /// addresses, cannot keep a real login out. A logged-in connection holds no place.
    #[serde(default = "default_max_pending_logins")]
    pub max_pending_logins: usize,
    /// Most of those places held by connections from one client address (an IPv6 client counts by its /64
    /// prefix, which one host usually holds whole); a further connection from it takes the place of one of that
    /// address's own, chosen as above. Default: a quarter of `max_pending_logins` for every address but a loopback
    /// one (a local proxy or tunnel brings every client from it); when set, for all.
    pub max_pending_logins_per_address: Option<usize>,
    /// Seconds a connection has to complete its login (TLS, startup, SCRAM) before it is closed.
    #[serde(default = "default_login_timeout")]
    pub login_timeout_secs: u64,
    /// Seconds a connection has, from its TCP accept, to send its startup message (TLS first, if it uses it)
    /// before it is closed; the rest of the login stays within `login_timeout_secs`. Default: 2, or
    /// `login_timeout_secs` if that is less; at most `login_timeout_secs`.
    pub startup_timeout_secs: Option<u64>,
    /// Seconds a logged-in connection may stay without sending anything before it is closed (SQLSTATE 57P05); a
    /// client that reads nothing of what the server or the web console writes to it for as long is cut off too.
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout_secs: u64,
    /// Longest a statement may run, in seconds (a query stopped after its debit stays charged).
    #[serde(default = "default_statement_timeout")]
    pub statement_timeout_secs: u64,
    /// Memory each connection's queries may use, in MiB (DataFusion's memory pool).
    #[serde(default = "default_memory_mb")]
    pub memory_limit_mb: usize,
    /// Longest accepted SQL text, in bytes.
    #[serde(default = "default_max_query_bytes")]
    pub max_query_bytes: usize,
    /// Answer an analyst's statement from the noisy measurements another analyst's charge paid for, when they are
    /// the same measurements (`SET dp.reuse = 'exact'`): free for the second analyst, and nothing more is
    /// released about the data. Off by default: each analyst's budget pays for what they see.
    #[serde(default)]
    pub share_releases: bool,
    /// Address and port of the web console (`dpfusion-console`: HTTPS with the same TLS settings, analysts and
    /// passwords); none unless set.
    pub http: Option<String>,
    /// Analysts who may also use the web console's Owner page (analysts, budgets, caps, grants).
    #[serde(default)]
    pub admins: Vec<String>,
}

fn default_listen() -> String {
    "127.0.0.1:5433".into()
}
fn default_max_connections() -> usize {
    64
}
fn default_max_connections_per_analyst() -> usize {
    8
}
fn default_max_pending_logins() -> usize {
    32
}
fn default_login_timeout() -> u64 {
    10
}
/// `startup_timeout_secs` unless set (or `login_timeout_secs` is less): a client sends its startup message right
/// after connecting (after TLS's round trips, if it uses it), so two seconds leave room for a slow network.
const DEFAULT_STARTUP_TIMEOUT_SECS: u64 = 2;
fn default_idle_timeout() -> u64 {
    3600
}
/// `[server] statement_timeout_secs` unless set.
pub const DEFAULT_STATEMENT_TIMEOUT_SECS: u64 = 300;
fn default_statement_timeout() -> u64 {
    DEFAULT_STATEMENT_TIMEOUT_SECS
}
fn default_memory_mb() -> usize {
    1024
}
fn default_max_query_bytes() -> usize {
    1 << 20
}

/// A validated `[server]` section.
#[derive(Clone, Debug)]
pub struct ServerSettings {
    /// Address to listen on.
    pub listen: std::net::SocketAddr,
    /// TLS certificate and key files, resolved.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Plaintext allowed: on a non-loopback address, and next to TLS.
    pub allow_plaintext: bool,
    /// Most logged-in connections at once.
    pub max_connections: usize,
    /// Most logged-in connections of one analyst at once.
    pub max_connections_per_analyst: usize,
    /// Most connections logging in at once.
    pub max_pending_logins: usize,
    /// Most connections logging in at once from one client address, if set (see
    /// [`ServerSettings::pending_logins_per_address`]).
    pub max_pending_logins_per_address: Option<usize>,
    /// Time to complete a login.
    pub login_timeout: std::time::Duration,
    /// Time to send the startup message (within `login_timeout`).
    pub startup_timeout: std::time::Duration,
    /// Time a logged-in connection may stay silent.
    pub idle_timeout: std::time::Duration,
    /// Statement timeout.
    pub statement_timeout: std::time::Duration,
    /// Memory per connection, in bytes.
    pub memory_limit: usize,
    /// Longest SQL text, in bytes.
    pub max_query_bytes: usize,
    /// Analysts' statements may be answered from other analysts' charges (`share_releases`).
    pub share_releases: bool,
    /// The web console's address (`http`), if it is served.
    pub http: Option<std::net::SocketAddr>,
    /// Analysts with the console's admin role (`admins`).
    pub admins: Vec<String>,
}

impl ServerSettings {
    /// The most connections from `address` that may be logging in at once: `max_pending_logins_per_address` if
    /// set; else a quarter of `max_pending_logins` (at least 1), and no limit of its own for a loopback address
    /// (an IPv4-mapped IPv6 one included: what a dual-stack listener sees).
    pub fn pending_logins_per_address(&self, address: std::net::IpAddr) -> usize {
        match self.max_pending_logins_per_address {
            Some(most) => most,
            None if address.to_canonical().is_loopback() => self.max_pending_logins,
            None => (self.max_pending_logins / 4).max(1),
        }
    }
}

fn server_settings(c: ServerConfig, base_dir: &Path) -> Result<ServerSettings> {
    let listen = server_address("listen", &c.listen, "127.0.0.1:5433")?;
    let http = c.http.as_deref().map(|h| server_address("http", h, "127.0.0.1:8443")).transpose()?;
    let tls = match (c.tls_cert, c.tls_key) {
        (Some(cert), Some(key)) => Some((resolve(base_dir, &cert), resolve(base_dir, &key))),
        (None, None) => None,
        _ => return Err(DpError::Config("[server] needs both tls_cert and tls_key, or neither".into())),
    };
    for (name, address) in std::iter::once(("listen", listen)).chain(http.map(|h| ("http", h))) {
        if tls.is_none() && !address.ip().is_loopback() && !c.allow_plaintext {
            return Err(DpError::Config(format!(
                "[server] {name} = \"{address}\" is reachable from other machines, but no TLS is configured: \
                 analysts' queries and answers would cross the network in clear. Set tls_cert and tls_key, listen on \
                 127.0.0.1, or say allow_plaintext = true"
            )));
        }
    }
    if c.max_connections == 0 || c.statement_timeout_secs == 0 || c.memory_limit_mb == 0 || c.max_query_bytes == 0 {
        return Err(DpError::Config(
            "[server] max_connections, statement_timeout_secs, memory_limit_mb and max_query_bytes must be positive"
                .into(),
        ));
    }
    let per_address = c.max_pending_logins_per_address.unwrap_or(1);
    let bounded = [
        ("max_connections_per_analyst", c.max_connections_per_analyst as u64, 100_000),
        ("max_pending_logins", c.max_pending_logins as u64, 100_000),
        ("max_pending_logins_per_address", per_address as u64, 100_000),
        ("login_timeout_secs", c.login_timeout_secs, 3600),
        ("idle_timeout_secs", c.idle_timeout_secs, 30 * 24 * 3600),
    ];
    for (name, value, most) in bounded {
        if value == 0 || value > most {
            return Err(DpError::Config(format!("[server] {name} = {value}: give a whole number from 1 to {most}")));
        }
    }
    let login = c.login_timeout_secs;
    let startup = c.startup_timeout_secs.unwrap_or(DEFAULT_STARTUP_TIMEOUT_SECS.min(login));
    if startup == 0 || startup > login {
        return Err(DpError::Config(format!(
            "[server] startup_timeout_secs = {startup}: give a whole number from 1 to login_timeout_secs ({login})"
        )));
    }
    Ok(ServerSettings {
        listen,
        tls,
        allow_plaintext: c.allow_plaintext,
        max_connections: c.max_connections,
        max_connections_per_analyst: c.max_connections_per_analyst,
        max_pending_logins: c.max_pending_logins,
        max_pending_logins_per_address: c.max_pending_logins_per_address,
        login_timeout: std::time::Duration::from_secs(login),
        startup_timeout: std::time::Duration::from_secs(startup),
        idle_timeout: std::time::Duration::from_secs(c.idle_timeout_secs),
        statement_timeout: std::time::Duration::from_secs(c.statement_timeout_secs),
        memory_limit: c.memory_limit_mb.saturating_mul(1 << 20),
        max_query_bytes: c.max_query_bytes,
        share_releases: c.share_releases,
        http,
        admins: c.admins,
    })
}

/// `[server] name = "text"` as an address and port (`example` shows one).
fn server_address(name: &str, text: &str, example: &str) -> Result<std::net::SocketAddr> {
    text.parse().map_err(|_| {
        DpError::Config(format!("[server] {name} = \"{text}\" is not an address and port, e.g. \"{example}\""))
    })
}

/// `[ledger]`: where the durable budget ledger is.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LedgerConfig {
    /// SQLite file (created if missing; relative paths resolve against the configuration file's directory).
    pub path: String,
    /// Name of the budget inside the ledger (one per dataset and analyst is the expected use).
    #[serde(default = "default_budget")]
    pub budget: String,
    /// How long to wait for another process holding the ledger's lock before reporting an error.
    #[serde(default = "default_busy")]
    pub busy_timeout_ms: u64,
}

fn default_budget() -> String {
    "default".into()
}
fn default_busy() -> u64 {
    5000
}

/// A validated ledger location.
#[derive(Clone, Debug)]
pub struct LedgerSettings {
    /// Resolved file path.
    pub path: PathBuf,
    /// Budget name.
    pub budget: String,
    /// Lock wait.
    pub busy_timeout: std::time::Duration,
}

/// `[session]`: the budget and the defaults of each query.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSettings {
    /// Total zCDP budget ρ of the session (give this, or `epsilon` with `delta`).
    pub rho: Option<f64>,
    /// Total budget as (ε, δ)-DP, with `delta`: enforced as μ-GDP (see [`crate::accounting::gdp`]).
    pub epsilon: Option<f64>,
    /// ρ charged per query unless `SET dp.rho` says otherwise (or give `default_query_fraction`).
    pub default_query_rho: Option<f64>,
    /// The share of the total each query costs by default, in (0, 1] (e.g. 0.01 for 100 equal queries).
    pub default_query_fraction: Option<f64>,
    /// Default mechanism: `"gaussian"`, `"laplace"` or `"auto"` (per measurement, the smaller noise at its price).
    #[serde(default = "default_mechanism")]
    pub mechanism: String,
    /// δ at which (ε, δ) is reported, and the δ of an (ε, δ) budget.
    #[serde(default = "default_delta")]
    pub delta: f64,
    /// The total δ that key selections (GROUP BY keys without a public domain) may spend, beside `rho`: each is
    /// δ-approximately ρ-zCDP. Absent: what the ledger says (0, no key selection, for a new budget).
    pub delta_budget: Option<f64>,
    /// Confidence level of reported intervals, in (0, 1).
    #[serde(default = "default_confidence")]
    pub confidence: f64,
    /// A file only the data owner reads: how many values of each column did not parse (read as NULL), and the
    /// details of errors whose text is withheld from analysts. Relative to the configuration file.
    pub owner_log: Option<String>,
    /// The quantile MIN answers (MAX answers one minus it) in every table that does not set its own; 0.01 when
    /// absent.
    pub min_max_quantile: Option<f64>,
    /// `"exact"` (the default): a query whose measurements were charged before is answered from them, free;
    /// `"derive"`: also sub-totals and totals of a stored GROUP BY, summed from its cells, free; `"off"`: every
    /// query is charged (`SET dp.reuse` changes it per session).
    pub reuse: Option<String>,
    /// The most memory one workload release may hold, in MiB (its cells and residuals, known before any read;
    /// a larger workload is refused, free). 4096 when absent.
    pub workload_memory_mb: Option<u64>,
}

fn default_mechanism() -> String {
    "gaussian".into()
}
fn default_delta() -> f64 {
    1e-6
}
fn default_confidence() -> f64 {
    0.95
}

/// `[tables.NAME]`: where a private table is and how it is protected.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableConfig {
    /// File path or glob (relative paths are resolved against the configuration file's directory).
    pub path: String,
    /// `csv`, `parquet` or `json` (newline-delimited JSON).
    pub format: String,
    /// For CSV: whether the first line is a header (default true).
    #[serde(default = "default_true")]
    pub has_header: bool,
    /// For CSV: the field delimiter (default `,`).
    #[serde(default = "default_delimiter")]
    pub delimiter: char,
    /// For CSV: quoted fields may hold line breaks (default false: every line is read alone, so a malformed
    /// record never affects another line; with true, the data owner answers for the file's quoting).
    #[serde(default)]
    pub multiline_fields: bool,
    /// Read the table's files once, when the session (or server) starts, and answer every query from memory
    /// (default false: every query reads the files). Changes to the files are seen after a restart.
    #[serde(default)]
    pub in_memory: bool,
    /// A public table (default false): no privacy unit, no noise, read as it is, queried directly for free and
    /// joined with private tables ([`crate::plan::lookup`]). Only `type` may be given for its columns.
    #[serde(default)]
    pub public: bool,
    /// The privacy-unit column; absent means every row is its own unit.
    pub privacy_unit: Option<String>,
    /// Most rows one unit may contribute (per group in a GROUP BY).
    pub max_rows_per_unit: Option<u64>,
    /// Most groups one unit may contribute to in a GROUP BY.
    pub max_groups_per_unit: Option<u64>,
    /// Per-column policy: `bounds` or `domain`.
    #[serde(default)]
    pub columns: BTreeMap<String, ColumnConfig>,
    /// The quantile MIN answers (MAX answers one minus it), in (0, 0.5); 0.01 when absent.
    pub min_max_quantile: Option<f64>,
}

fn default_true() -> bool {
    true
}
fn default_delimiter() -> char {
    ','
}

/// A column's declared policy in the file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnConfig {
    /// The column's type (`int64`, `float64`, `string`, ...; see [`ColumnType`]). Required: the schema the
    /// analyst sees must never be inferred from the data.
    #[serde(rename = "type")]
    pub data_type: Option<String>,
    /// `[lo, hi]`: values are clamped to this range before SUM/AVG; for a `date` or `timestamp` column, the first
    /// and last instants as text (`["2019-01-01", "2023-12-31"]`).
    pub bounds: Option<Vec<BoundConfig>>,
    /// The public set of values a GROUP BY key can take.
    pub domain: Option<Vec<DomainValue>>,
    /// With `bounds`: the number of candidates of a quantile's grid over them (1000 when absent).
    pub grid: Option<usize>,
}

/// One end of a column's `bounds`: a number, or a date or timestamp as text.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum BoundConfig {
    /// A number (a numeric column's bound).
    Number(f64),
    /// A date (`2024-01-31`) or a timestamp (`2024-01-31T08:30:00`): a temporal column's bound.
    Text(String),
}

/// A column's `bounds` as its policy: numbers for a numeric column, instants for a date or timestamp column.
fn column_bounds(table: &str, col: &str, ty: &ColumnType, bounds: &[BoundConfig]) -> Result<ColumnPolicy> {
    use datafusion::arrow::datatypes::{DataType, TimeUnit};
    let fail = |what: String| DpError::Config(format!("[tables.{table}.columns] {col}: bounds: {what}"));
    let temporal = matches!(ty.data_type(), DataType::Date32 | DataType::Timestamp(..));
    match (bounds, temporal) {
        ([BoundConfig::Number(lo), BoundConfig::Number(hi)], false) => Ok(ColumnPolicy::Bounds { lo: *lo, hi: *hi }),
        ([BoundConfig::Text(lo), BoundConfig::Text(hi)], true) => {
            let instant = |text: &str| -> Result<i64> {
                let v = datafusion::common::ScalarValue::Utf8(Some(text.trim().to_string()))
                    .cast_to(&DataType::Timestamp(TimeUnit::Microsecond, None));
                match v {
                    Ok(datafusion::common::ScalarValue::TimestampMicrosecond(Some(us), _)) => Ok(us),
                    _ => Err(fail(format!("`{text}` is not a date (2024-01-31) or a timestamp (2024-01-31T08:30:00)"))),
                }
            };
            let (lo, hi) = (instant(lo)?, instant(hi)?);
            if *ty.data_type() == DataType::Date32
                && let Some(t) = [lo, hi].into_iter().find(|us| us.rem_euclid(crate::policy::MICROS_PER_DAY) != 0)
            {
                return Err(fail(format!(
                    "`{}` has a time of day, but {col} is a date; write the date alone",
                    crate::policy::show_instant(t)
                )));
            }
            Ok(ColumnPolicy::Period { lo, hi })
        }
        ([_, _], true) => Err(fail(format!(
            "{col} is a {ty} column, so its bounds are its first and last {ty}s as text, e.g. \
             bounds = [\"2019-01-01\", \"2023-12-31\"]"
        ))),
        ([_, _], false) => Err(fail(format!("{col} is a {ty} column, so its bounds are two numbers [lo, hi]"))),
        (other, _) => Err(fail(format!(
            "{} values, but they must be two numbers [lo, hi] (or a date's or timestamp's first and last as text)",
            other.len()
        ))),
    }
}

/// Where a table's data lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataFormat {
    /// CSV with a header line (or not) and a delimiter.
    Csv {
        /// First line is a header.
        has_header: bool,
        /// Field delimiter.
        delimiter: u8,
        /// Quoted fields may hold line breaks (records are read across lines).
        multiline_fields: bool,
    },
    /// Apache Parquet.
    Parquet,
    /// Newline-delimited JSON.
    Json,
}

/// A table as the configuration declares it: where the data is, its columns and their types, and its policy (or,
/// for a public table, its [`PublicSource`]).
#[derive(Clone, Debug)]
pub struct TableSource {
    /// Resolved path, directory or glob.
    pub path: PathBuf,
    /// File format.
    pub format: DataFormat,
    /// Every column the analyst can use, with its declared type (columns of the file not listed are not read).
    pub columns: BTreeMap<String, ColumnType>,
    /// Privacy policy.
    pub policy: TablePolicy,
    /// Read once into memory at start ([`TableConfig::in_memory`]).
    pub in_memory: bool,
    /// Set for a table declared public ([`TableConfig::public`]), whose `policy` is unused: what reads its rows.
    pub public: Option<PublicSource>,
}

/// A table the configuration declares public (`public = true`), ready to be read: the only source dpfusion reads
/// without a debit ([`crate::session::read_public_table`]). Only the configuration makes one, for a table declared
/// public, from that table's own declaration, which it keeps in a private field: a private table's [`TableSource`]
/// cannot become one, and nothing a caller changes in its copy of the configuration (a path, a `public` set by
/// hand) reaches the files a public source reads.
#[derive(Clone, Debug)]
pub struct PublicSource {
    name: String,
    declared: Box<TableSource>,
}

impl PublicSource {
    /// The table's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its files, format and columns, as the configuration declared them.
    pub(crate) fn declared(&self) -> &TableSource {
        &self.declared
    }
}

/// The largest `[session] workload_memory_mb` (1 TiB).
const MAX_WORKLOAD_MEMORY_MB: u64 = 1 << 20;

/// The validated session configuration.
#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// How the budget is enforced: zCDP (`rho`) or GDP (`epsilon`, `delta`).
    pub accounting: Accounting,
    /// Total budget, in the ledger's units: ρ, or μ²/2 for an (ε, δ) budget.
    pub total_rho: Rho,
    /// Default ρ per query.
    pub default_query_rho: Rho,
    /// Default mechanism (or `auto`: the smaller noise per measurement).
    pub mechanism: MechanismChoice,
    /// δ for (ε, δ) reports.
    pub delta: f64,
    /// `[session] delta_budget`: the total δ of key selections, if configured.
    pub delta_budget: Option<f64>,
    /// Confidence level of reported intervals.
    pub confidence: f64,
    /// Whether a query whose measurements were charged before is answered from them (`[session] reuse`).
    pub reuse: Reuse,
    /// `[session] workload_memory_mb`, in bytes.
    pub workload_memory: u64,
    /// The private tables.
    pub tables: BTreeMap<String, TableSource>,
    /// The durable ledger, if configured.
    pub ledger: Option<LedgerSettings>,
    /// The data owner's log (values that did not parse, details of failed reads), if configured.
    pub owner_log: Option<PathBuf>,
    /// `[server]`, if configured.
    pub server: Option<ServerSettings>,
    /// `[engine] scheduler`, if configured: private plans run on that cluster.
    pub cluster: Option<ClusterSettings>,
}

fn cfg_err(e: DpError, key: &str) -> DpError {
    match e {
        DpError::InvalidParameter { reason, .. } => DpError::Config(format!("[session] {key}: {reason}")),
        other => other,
    }
}

impl SessionConfig {
    /// Loads and validates a configuration file. Relative table paths resolve against the file's directory.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text =
            std::fs::read_to_string(path).map_err(|source| DpError::Io { path: path.display().to_string(), source })?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Self::from_toml_str(&text, &base).map_err(|e| match e {
            DpError::Config(m) => DpError::Config(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// Parses and validates configuration text; relative table paths resolve against `base_dir`.
    pub fn from_toml_str(text: &str, base_dir: &Path) -> Result<Self> {
        let raw: Config = toml::from_str(text).map_err(|e| DpError::Config(e.to_string()))?;
        let s = &raw.session;
        crate::accounting::convert::check_delta(s.delta).map_err(|e| cfg_err(e, "delta"))?;
        let (accounting, total_rho) = match (s.rho, s.epsilon) {
            (Some(r), None) => (Accounting::Zcdp, Rho::new(r).map_err(|e| cfg_err(e, "rho"))?),
            (None, Some(e)) => (
                Accounting::Gdp,
                crate::accounting::gdp::total_for_epsilon_delta(e, s.delta).map_err(|e| cfg_err(e, "epsilon"))?,
            ),
            (Some(_), Some(_)) => {
                return Err(DpError::Config(
                    "[session] gives both rho and epsilon; keep one: rho = 1.0 (a zCDP budget) or epsilon = 1.0 with \
                     delta = 1e-6 (an (epsilon, delta) budget)"
                        .into(),
                ));
            }
            (None, None) => {
                return Err(DpError::Config(
                    "[session] needs a total budget: rho = 1.0 (zCDP) or epsilon = 1.0 with delta = 1e-6".into(),
                ));
            }
        };
        let default_query_rho = match (s.default_query_rho, s.default_query_fraction) {
            (Some(q), None) => {
                let q = Rho::positive(q).map_err(|e| cfg_err(e, "default_query_rho"))?;
                if q.get() > total_rho.get() {
                    return Err(DpError::Config(format!(
                        "[session] default_query_rho = {} exceeds the total ({}); lower it",
                        q.get(),
                        total_rho.get()
                    )));
                }
                q
            }
            (None, Some(f)) if f > 0.0 && f <= 1.0 => {
                Rho::positive(total_rho.get() * f).map_err(|e| cfg_err(e, "default_query_fraction"))?
            }
            (None, Some(f)) => {
                return Err(DpError::Config(format!(
                    "[session] default_query_fraction = {f} must be in (0, 1]; 0.01 makes each query cost 1% of the total"
                )));
            }
            (Some(_), Some(_)) => {
                return Err(DpError::Config(
                    "[session] gives both default_query_rho and default_query_fraction; keep one".into(),
                ));
            }
            (None, None) => {
                return Err(DpError::Config(
                    "[session] needs a per-query cost: default_query_rho = 0.05, or default_query_fraction = 0.01 \
                     (each query costs 1% of the total)"
                        .into(),
                ));
            }
        };
        let mechanism: MechanismChoice = s.mechanism.parse().map_err(|e| cfg_err(e, "mechanism"))?;
        crate::noise::accuracy::check_confidence(s.confidence).map_err(|e| cfg_err(e, "confidence"))?;
        let confidence = s.confidence;
        let reuse = match s.reuse.as_deref().map(Reuse::parse) {
            None => Reuse::Exact,
            Some(r) => r.map_err(|e| DpError::Config(format!("[session] reuse: {e}")))?,
        };
        let workload_memory = match s.workload_memory_mb {
            None => crate::workload::DEFAULT_MEMORY_BYTES,
            Some(mb @ 1..=MAX_WORKLOAD_MEMORY_MB) => mb << 20,
            Some(mb) => {
                return Err(DpError::Config(format!(
                    "[session] workload_memory_mb = {mb}: give a number of MiB from 1 to {MAX_WORKLOAD_MEMORY_MB}"
                )));
            }
        };
        let mut tables = BTreeMap::new();
        for (name, mut t) in raw.tables {
            t.min_max_quantile = t.min_max_quantile.or(s.min_max_quantile);
            tables.insert(name.clone(), table_source(&name, t, base_dir)?);
        }
        let ledger = match raw.ledger {
            None => None,
            Some(l) => {
                if l.budget.trim().is_empty() {
                    return Err(DpError::Config("[ledger] budget must be a non-empty name".into()));
                }
                if l.busy_timeout_ms > MAX_BUSY_TIMEOUT_MS {
                    return Err(DpError::Config(format!(
                        "[ledger] busy_timeout_ms = {} is more than an hour ({MAX_BUSY_TIMEOUT_MS}); 5000 is usual",
                        l.busy_timeout_ms
                    )));
                }
                Some(LedgerSettings {
                    path: resolve(base_dir, &l.path),
                    budget: l.budget,
                    busy_timeout: std::time::Duration::from_millis(l.busy_timeout_ms),
                })
            }
        };
        if let Some(d) = s.delta_budget {
            crate::accounting::DeltaBudget::check_total(d).map_err(|e| cfg_err(e, "delta_budget"))?;
            if d > 0.0 && accounting == Accounting::Gdp {
                return Err(DpError::Config(
                    "[session] delta_budget needs a zCDP budget (rho = ...): key selection is accounted as approximate \
                     zCDP, which an (epsilon, delta) budget enforced as Gaussian DP cannot compose"
                        .into(),
                ));
            }
        }
        let owner_log = s.owner_log.as_deref().map(|p| resolve(base_dir, p));
        let statement_timeout_secs = raw.server.as_ref().map(|c| c.statement_timeout_secs);
        let server = raw.server.map(|c| server_settings(c, base_dir)).transpose()?;
        let cluster = match raw.engine {
            Some(e) => cluster_settings(e, &tables, base_dir, statement_timeout_secs)?,
            None => None,
        };
        Ok(SessionConfig {
            server,
            cluster,
            accounting,
            total_rho,
            default_query_rho,
            mechanism,
            delta: s.delta,
            delta_budget: s.delta_budget,
            confidence,
            reuse,
            workload_memory,
            tables,
            ledger,
            owner_log,
        })
    }
}

/// Longest accepted `[ledger] busy_timeout_ms` (one hour).
pub const MAX_BUSY_TIMEOUT_MS: u64 = 3_600_000;

/// `p` resolved against the configuration file's directory when relative.
pub fn resolve(base_dir: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() { p.to_path_buf() } else { base_dir.join(p) }
}

fn table_source(name: &str, t: TableConfig, base_dir: &Path) -> Result<TableSource> {
    let format = match t.format.to_ascii_lowercase().as_str() {
        "csv" => {
            if !t.delimiter.is_ascii() {
                return Err(DpError::Config(format!("[tables.{name}] delimiter must be one ASCII character")));
            }
            DataFormat::Csv {
                has_header: t.has_header,
                delimiter: t.delimiter as u8,
                multiline_fields: t.multiline_fields,
            }
        }
        _ if t.multiline_fields => {
            return Err(DpError::Config(format!(
                "[tables.{name}] multiline_fields applies to CSV files only; remove it"
            )));
        }
        "parquet" => DataFormat::Parquet,
        "json" | "ndjson" => DataFormat::Json,
        other => {
            return Err(DpError::Config(format!(
                "[tables.{name}] format = \"{other}\" is not supported; use \"csv\", \"parquet\" or \"json\""
            )));
        }
    };
    if t.public {
        check_public(name, &t)?;
    }
    let mut columns = BTreeMap::new();
    let mut types = BTreeMap::new();
    let mut grid = BTreeMap::new();
    for (col, c) in t.columns {
        if col.to_ascii_lowercase().starts_with(crate::policy::RESERVED_PREFIX) {
            return Err(DpError::Config(format!(
                "[tables.{name}.columns] {col}: names beginning with `{}` are reserved for dpfusion's own columns; \
                 rename the column in the file",
                crate::policy::RESERVED_PREFIX
            )));
        }
        let Some(ty) = &c.data_type else {
            return Err(DpError::Config(format!(
                "[tables.{name}.columns] {col}: no `type`. Column types come from the policy, never from the data \
                 (one unusual value would change them): run `dpfusion pin --config <this file>` once to write the \
                 types of the file into the policy, check them, or write e.g. `type = \"int64\"`"
            )));
        };
        let ty: ColumnType =
            ty.parse().map_err(|e| DpError::Config(format!("[tables.{name}.columns] {col}: type {e}")))?;
        let p = match (c.bounds, c.domain) {
            (Some(b), None) => Some(column_bounds(name, &col, &ty, &b)?),
            (None, Some(d)) => Some(ColumnPolicy::Domain(d)),
            (Some(_), Some(_)) => {
                return Err(DpError::Config(format!(
                    "[tables.{name}.columns] {col}: give either `bounds` or `domain`, not both"
                )));
            }
            (None, None) => None,
        };
        types.insert(col.clone(), ty);
        if let Some(n) = c.grid {
            grid.insert(col.clone(), n);
        }
        if let Some(p) = p {
            columns.insert(col, p);
        }
    }
    if let Some(pu) = &t.privacy_unit
        && !types.contains_key(pu)
    {
        return Err(DpError::Config(format!(
            "[tables.{name}.columns] the privacy unit `{pu}` must be declared with its type, e.g. `{pu} = {{ type = \"int64\" }}`"
        )));
    }
    let policy = TablePolicy {
        max_rows_per_unit: t.max_rows_per_unit.unwrap_or(1),
        max_groups_per_unit: t.max_groups_per_unit.unwrap_or(1),
        privacy_unit: t.privacy_unit,
        columns,
        quantiles: crate::policy::QuantilePolicy {
            grid,
            min_max_quantile: t.min_max_quantile.unwrap_or(crate::policy::QuantilePolicy::default().min_max_quantile),
        },
    };
    policy.validate(name)?;
    let mut source = TableSource {
        path: resolve(base_dir, &t.path),
        format,
        columns: types,
        policy,
        in_memory: t.in_memory,
        public: None,
    };
    if t.public {
        source.public = Some(PublicSource { name: name.to_string(), declared: Box::new(source.clone()) });
    }
    Ok(source)
}

/// A public table has no privacy policy: refuses the settings that only a private table takes.
fn check_public(name: &str, t: &TableConfig) -> Result<()> {
    let mut set: Vec<String> = [
        ("privacy_unit", t.privacy_unit.is_some()),
        ("max_rows_per_unit", t.max_rows_per_unit.is_some()),
        ("max_groups_per_unit", t.max_groups_per_unit.is_some()),
        ("min_max_quantile", t.min_max_quantile.is_some()),
    ]
    .into_iter()
    .filter(|(_, given)| *given)
    .map(|(key, _)| key.to_string())
    .collect();
    for (col, c) in &t.columns {
        for (key, given) in [("bounds", c.bounds.is_some()), ("domain", c.domain.is_some()), ("grid", c.grid.is_some())]
        {
            if given {
                set.push(format!("{col}.{key}"));
            }
        }
    }
    match set.as_slice() {
        [] => Ok(()),
        _ => Err(DpError::Config(format!(
            "[tables.{name}] a public table (public = true) is read as it is, without a privacy policy; remove {} \
             (or make the table private: remove `public = true`)",
            set.join(", ")
        ))),
    }
}

/// What `SET dp.reuse` and `[session] reuse` allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reuse {
    /// A statement with the measurements of an earlier release is answered from them (the default).
    Exact,
    /// As `Exact`, and a statement whose answer is a sum of cells of an earlier GROUP BY (a sub-total, a total)
    /// on the same rows is answered from those cells, at no cost (`session::derive`).
    Derive,
    /// Every statement is charged and drawn afresh.
    Off,
}

impl Reuse {
    /// Parses a `SET dp.reuse` or `[session] reuse` value.
    pub fn parse(text: &str) -> Result<Reuse, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "exact" | "on" => Ok(Reuse::Exact),
            "derive" => Ok(Reuse::Derive),
            "off" => Ok(Reuse::Off),
            _ => Err("must be 'exact' (the default), 'derive' or 'off'".into()),
        }
    }

    /// Whether the same measurements released before are answered from them (`exact` and `derive`).
    pub fn exact(self) -> bool {
        self != Reuse::Off
    }

    /// The value as `SET dp.reuse` stores it and `SHOW dp.reuse` gives it.
    pub fn name(self) -> &'static str {
        match self {
            Reuse::Exact => "exact",
            Reuse::Derive => "derive",
            Reuse::Off => "off",
        }
    }
}
