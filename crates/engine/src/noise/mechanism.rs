//! The two noise mechanisms and their exact parameters.
//!
//! A [`NoiseParams`] is what a sampler needs (σ² or the Laplace scale, as exact rationals); how it is chosen for a
//! sensitivity and a budget is [`crate::accounting::calibrate`].

use crate::error::{DpError, Result};
use crate::noise::Ratio;
use serde::{Deserialize, Serialize};

/// The noise mechanism of a measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mechanism {
    /// Discrete Gaussian (CKS20 Alg. 3), calibrated to the L2 sensitivity.
    Gaussian,
    /// Discrete Laplace (CKS20 Alg. 2), calibrated to the L1 sensitivity.
    Laplace,
    /// The exponential mechanism over a public grid of candidates (quantiles: [`crate::noise::exponential`]),
    /// calibrated to the sensitivity of its integer scores. Never chosen by `SET dp.mechanism`: a quantile uses it,
    /// a count or a sum never does.
    Exponential,
}

impl Mechanism {
    /// The name used in reports: `discrete_gaussian` or `discrete_laplace`.
    pub fn report_name(self) -> &'static str {
        match self {
            Mechanism::Gaussian => "discrete_gaussian",
            Mechanism::Laplace => "discrete_laplace",
            Mechanism::Exponential => "exponential",
        }
    }
}

impl std::str::FromStr for Mechanism {
    type Err = DpError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "gaussian" | "discrete_gaussian" => Ok(Mechanism::Gaussian),
            "laplace" | "discrete_laplace" => Ok(Mechanism::Laplace),
            other => Err(DpError::invalid("mechanism", format!("`{other}` is not known; use 'gaussian' or 'laplace'"))),
        }
    }
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mechanism::Gaussian => "gaussian",
            Mechanism::Laplace => "laplace",
            Mechanism::Exponential => "exponential",
        })
    }
}

/// The exact parameter of a calibrated sampler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mechanism", rename_all = "snake_case")]
pub enum NoiseParams {
    /// Discrete Gaussian with variance parameter σ² (exact rational).
    Gaussian {
        /// σ², the variance parameter of N_Z(0, σ²).
        sigma_sq: Ratio,
    },
    /// Discrete Laplace with scale b: P(z) ∝ exp(−|z|/b).
    Laplace {
        /// The scale b.
        scale: Ratio,
    },
    /// The exponential mechanism with weights exp(η·score) over a public grid of candidates.
    Exponential {
        /// η, the weight per unit of score.
        eta: Ratio,
    },
}

impl NoiseParams {
    /// Which mechanism these parameters belong to.
    pub fn mechanism(&self) -> Mechanism {
        match self {
            NoiseParams::Gaussian { .. } => Mechanism::Gaussian,
            NoiseParams::Laplace { .. } => Mechanism::Laplace,
            NoiseParams::Exponential { .. } => Mechanism::Exponential,
        }
    }

    /// The exact standard deviation of the discrete noise ([`crate::noise::accuracy`]).
    pub fn std(&self) -> f64 {
        match *self {
            NoiseParams::Gaussian { sigma_sq } => crate::noise::accuracy::discrete_gaussian_std(sigma_sq),
            NoiseParams::Laplace { scale } => crate::noise::accuracy::discrete_laplace_std(scale),
            // A draw among candidates has no additive noise: its accuracy is a rank interval (release::Accuracy::Rank).
            NoiseParams::Exponential { .. } => f64::NAN,
        }
    }

    /// σ for the Gaussian, the scale b for the Laplace, η for the exponential mechanism (for display).
    pub fn sigma_or_scale(&self) -> f64 {
        match self {
            NoiseParams::Gaussian { sigma_sq } => sigma_sq.to_f64().sqrt(),
            NoiseParams::Laplace { scale } => scale.to_f64(),
            NoiseParams::Exponential { eta } => eta.to_f64(),
        }
    }
}
