//! zCDP accounting: the budget type, calibration of each measurement to its cost, the session filter that debits
//! charges, the durable ledger, and conversions to (ε, δ).
//!
//! Nothing here imports DataFusion or Arrow; [`ledger`] stores charges in SQLite. Depends on [`crate::noise`] for
//! the mechanisms' parameters, never the other way round.

pub mod admin;
pub mod calibrate;
pub mod convert;
pub mod filter;
pub mod gdp;
pub mod ledger;
pub mod pld;
pub mod rho;

pub use convert::{EpsilonBound, epsilon_for_charges};
pub use filter::{Charge, Debit, ZcdpFilter};
pub use ledger::{Ledger, LedgerDb, MemoryLedger, SqliteLedger};
pub use rho::Rho;
