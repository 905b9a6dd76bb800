//! zCDP accounting: the budget type, calibration of each measurement to its cost, the session filter that debits
//! charges, the durable ledger, and conversions to (ε, δ).
//!
//! Nothing here imports DataFusion or Arrow; [`ledger`] stores charges in SQLite. Depends on [`crate::noise`] for
//! the mechanisms' parameters, never the other way round.
//!
//! # References
//! The doc comments of this crate cite the papers by these keys (the full list, with the other papers cited, is in
//! `docs/accounting.md`):
//! * **BS16**: Mark Bun and Thomas Steinke, "Concentrated Differential Privacy: Simplifications, Extensions, and
//!   Lower Bounds", Theory of Cryptography Conference (TCC), 2016.
//! * **CKS20**: Clément L. Canonne, Gautam Kamath and Thomas Steinke, "The Discrete Gaussian for Differential
//!   Privacy", Advances in Neural Information Processing Systems (NeurIPS), 2020.
//! * **DRS19**: Jinshuo Dong, Aaron Roth and Weijie J. Su, "Gaussian Differential Privacy", Journal of the Royal
//!   Statistical Society Series B, 2022 (arXiv 1905.02383, 2019).

pub mod admin;
pub mod calibrate;
pub mod convert;
pub mod filter;
pub mod gdp;
pub mod ledger;
pub mod pld;
pub mod rho;

pub use convert::{EpsilonBound, epsilon_for_charges};
pub use filter::{Charge, Debit, DeltaBudget, ZcdpFilter};
pub use ledger::{Ledger, LedgerDb, MemoryLedger, SqliteLedger};
pub use rho::Rho;
