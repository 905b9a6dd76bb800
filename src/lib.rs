//! # dpfusion
//!
//! A differentially private SQL engine on Apache DataFusion. Analysts write ordinary SQL; every released number
//! carries exact discrete noise calibrated to its sensitivity, and every query is charged to a zero-concentrated
//! DP (zCDP) budget before any result leaves the engine.
//!
//! **Neighbouring relation.** Two datasets are neighbours when one is obtained from the other by adding or removing
//! all rows of one privacy unit (a person, a household, ... as the policy declares). Every sensitivity and every
//! privacy claim in this crate is stated under that relation.
//!
//! Modules follow the flow of data: policy → plan → accounting (debit) → execution → noise → release.
//! The foundation is in place: [`noise`] (exact samplers, calibration, accuracy) and [`accounting`] (ρ budget,
//! session filter, (ε, δ) conversions).

pub mod accounting;
pub mod config;
pub mod error;
pub mod marginals;
pub mod noise;
pub mod owner_log;
pub mod plan;
pub mod policy;
pub mod refusal;
pub mod release;
pub mod session;
pub mod source;

pub use config::SessionConfig;
pub use error::{DpError, Result};
pub use policy::{ColumnPolicy, DomainValue, TablePolicy};
pub use refusal::Refusal;
pub use release::{Accuracy, Release};
pub use session::{DpSession, Response, split_statements};
