//! # dpfusion
//!
//! A differentially private SQL engine on Apache DataFusion. Analysts write ordinary SQL; every released number
//! carries exact discrete noise calibrated to its sensitivity, says how far off it may be, and every query is
//! charged to a zero-concentrated DP (zCDP) budget before any result leaves the engine.
//!
//! **Neighbouring relation.** Two datasets are neighbours when one is obtained from the other by adding or removing
//! all rows of one privacy unit (a person, a household, ... as the policy declares). Every sensitivity and every
//! privacy claim in this crate is stated under that relation.
//!
//! ## The path of one query
//!
//! ```text
//! SQL ─session::prepare─▶ parsed, typed, every constant evaluated, ─plan::compile─▶ validated against the
//!       (nothing read,    policy, bounded (clamp, ≤ k rows and ≤ g groups per unit), sensitivities;
//!        nothing spent)   optimized plan checked total; post-processing bounded and tried
//!     ─accounting─▶ priced (Quote), then debited durably: the Debit (request id claimed with it)
//!     ─session::execute─▶ the Debit opens the private tables; the private plan runs once; exact discrete
//!       noise per cell (noise); stored with the id
//!     ─session::post─▶ the analyst's HAVING / ORDER BY / arithmetic over the noisy table (free)
//!     ─▶ Release { result, an interval (or a reason) per column, the charge, (ε, δ) }
//! ```
//!
//! Only the accountant ([`accounting`]) mints a [`accounting::Debit`], and only a `Debit` opens the private tables
//! ([`session::PrivateTables`]): a private row is never read before its debit, and the compiler holds that rule.
//! A refusal ([`Refusal`]) spends nothing and never depends on the data.
//!
//! ## Example
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> dpfusion::Result<()> {
//! use datafusion::arrow::array::{Int64Array, RecordBatch};
//! use dpfusion::accounting::Rho;
//! use dpfusion::noise::Mechanism;
//! use dpfusion::{ColumnPolicy, DpSession, Response, TablePolicy};
//! use std::sync::Arc;
//!
//! // The data owner's table and policy: one row per person, ages clamped to [0, 100].
//! let people = RecordBatch::try_from_iter([
//!     ("person", Arc::new(Int64Array::from(vec![1, 2, 3, 4])) as _),
//!     ("age", Arc::new(Int64Array::from(vec![34, 51, 27, 63])) as _),
//! ])
//! .expect("a batch");
//! let columns = [("age".to_string(), ColumnPolicy::Bounds { lo: 0.0, hi: 100.0 })].into();
//! let policy = TablePolicy::with_unit("person", 1, 1, columns)?;
//! let mut session = DpSession::empty(Rho::new(1.0)?, Rho::new(0.1)?, Mechanism::Gaussian, 1e-6, 0.95)?;
//! session.register_batches("people", vec![people], policy)?;
//!
//! // The analyst's query: answered with noise, an interval per column, and its cost.
//! let Response::Release(r) = session.sql("SELECT COUNT(*) AS n, AVG(age) AS mean_age FROM people").await? else {
//!     unreachable!("a query answers with a release");
//! };
//! assert_eq!(r.num_rows(), 1);
//! assert!(r.charge().rho().get() <= 0.1);
//! println!("{}", r.to_pretty_string());
//! # Ok(())
//! # }
//! ```

pub mod accounting;
pub mod config;
pub mod error;
pub mod format;
pub mod marginals;
pub mod noise;
pub mod owner_log;
pub mod plan;
pub mod policy;
pub mod refusal;
pub mod release;
pub mod session;
pub mod source;
pub mod workload;

/// Running private plans on a Ballista cluster (a part of the private tables' door: [`session::PrivateTables`]).
#[cfg(feature = "cluster")]
pub use session::private::cluster;
/// How far a running private plan has read its table.
pub use session::progress;

pub use config::SessionConfig;
pub use error::{DpError, Result};
pub use policy::{ColumnPolicy, DomainValue, TablePolicy};
pub use refusal::Refusal;
pub use release::{Accuracy, Release};
pub use session::{DpSession, Response, split_statements};
