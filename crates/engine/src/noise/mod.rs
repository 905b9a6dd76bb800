//! Exact noise on the integers: discrete Gaussian and discrete Laplace (Canonne, Kamath & Steinke 2020, "CKS20").
//!
//! Nothing in this module imports DataFusion or Arrow: it is pure, privacy-critical arithmetic, reviewed and
//! tested in isolation.
//!
//! * [`rng`]: the only randomness source, a ChaCha20 CSPRNG seeded by the operating system.
//! * [`ratio`]: exact rational parameters (σ², scale), so no floating-point number is on the sampling path.
//! * [`bernoulli`], [`laplace`], [`gaussian`]: the CKS20 samplers.
//! * [`exponential`]: the exponential mechanism over public candidates, sampled exactly by rejection with CKS20's
//!   Bernoulli(e^{−γ}); the quantile score over a public grid.
//! * [`mechanism`]: the two mechanisms and their exact parameters (how they are calibrated to a sensitivity and a
//!   budget is [`crate::accounting::calibrate`], which depends on this module; nothing here depends on it).
//! * [`accuracy`]: standard deviation and confidence-interval half-width of the exact discrete distributions.
//! * [`selection`]: the Gaussian thresholding mechanism that releases keys nobody published: its threshold, its δ
//!   (approximate zCDP) and the chance a key is released.
//!
//! Neighbouring relation throughout dpfusion: two datasets are neighbours when one is obtained from the other by
//! adding or removing **all rows of one privacy unit**.

pub mod accuracy;
pub mod bernoulli;
pub mod exponential;
pub mod gaussian;
pub mod laplace;
pub mod mechanism;
pub mod ratio;
pub mod rng;
pub mod selection;

pub use mechanism::{Mechanism, NoiseParams};
pub use ratio::Ratio;
pub use rng::NoiseRng;
pub use selection::Selection;
