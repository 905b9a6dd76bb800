//! zCDP accounting: the budget type, the session filter that debits charges, and conversions to (ε, δ).
//!
//! Pure arithmetic: nothing here imports DataFusion or Arrow.

pub mod convert;
pub mod filter;
pub mod ledger;
pub mod rho;

pub use convert::{EpsilonBound, epsilon_for_charges};
pub use filter::{Charge, ZcdpFilter};
pub use ledger::{Ledger, MemoryLedger, SqliteLedger};
pub use rho::Rho;
