//! The single integration-test binary (every extra test binary would link DataFusion again).

mod accounting;
mod cli;
mod common;
mod config;
mod differential;
mod guarantee;
mod ledger;
mod marginals;
mod noise_dist;
mod privacy_audit;
mod sql_accept;
mod sql_refuse;
mod vectors;
