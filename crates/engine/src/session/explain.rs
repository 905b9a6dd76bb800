//! `EXPLAIN DP`: what a query would do and cost (private plan, sensitivities, mechanisms, accuracy of every output
//! column), from the same preparation and the same [`Quote`] as the query itself. Nothing is read or spent.

use crate::accounting::EpsilonBound;
use crate::accounting::calibrate::Calibration;
use crate::error::Result;
use crate::format::fmt_num;
use crate::noise::NoiseParams;
use crate::session::DpSession;
use crate::session::{accuracy, post, prepare};
use datafusion::common::ScalarValue;

/// One measurement as EXPLAIN DP shows it.
#[derive(Clone, Debug)]
pub struct ExplainedMeasure {
    /// e.g. `SUM(income)`.
    pub label: String,
    /// L1 sensitivity (grid units); NaN where only the L2 one is used (a workload's residual).
    pub l1: f64,
    /// L2 sensitivity (grid units).
    pub l2: f64,
    /// Where the sensitivity comes from.
    pub derivation: String,
    /// The calibrated mechanism and cost.
    pub calibration: Calibration,
    /// Noise standard deviation in the column's units (NaN for a quantile: no noise is added to a value).
    pub std: f64,
    /// CI half-width in the column's units; for a quantile, the rank half-width in values
    /// ([`crate::release::Accuracy::Rank`]).
    pub ci_half_width: f64,
    /// Grid unit (2^-s) of the measurement: 1 for counts and integer sums.
    pub unit: f64,
}

/// How the keys of a GROUP BY without a public domain are selected (EXPLAIN DP, before anything is spent).
#[derive(Clone, Debug)]
pub struct ExplainedSelection {
    /// The measurement whose noisy value selects (a COUNT(*), shown or hidden).
    pub measure: String,
    /// A key is released iff its noisy count is at least this.
    pub threshold: i64,
    /// The selection's δ (charged against the δ budget).
    pub delta: f64,
    /// The probability that a key held by 1, 10, 100 and 1 000 units (one row each) is released.
    pub release: Vec<(u64, f64)>,
}

/// The output of `EXPLAIN DP`: what the query would do and cost, computed without touching data.
#[derive(Clone, Debug)]
pub struct Explanation {
    /// The query.
    pub sql: String,
    /// The private plan (bounded aggregate), indented.
    pub private_plan: String,
    /// The canonical fingerprints of the private plans the query would run ([`crate::plan::fingerprint`]): what
    /// its charge names, and the only plans its debit would open the tables for.
    pub plans: Vec<crate::plan::fingerprint::Fingerprint>,
    /// Number of GROUP BY cells released; `None` for keys without a domain, where it is noisy ([`Self::selection`]).
    pub cells: Option<u64>,
    /// For keys without a domain: how their values are selected.
    pub selection: Option<ExplainedSelection>,
    /// How a join of private tables on their unit is bounded, if the query has one.
    pub join: Option<String>,
    /// How a question about each person is bounded, if the query is one.
    pub per_person: Option<String>,
    /// Each computed value or key ([`crate::plan::computed`]) and where its bounds or domain come from.
    pub computed: Vec<(String, String)>,
    /// Each measurement.
    pub measures: Vec<ExplainedMeasure>,
    /// Total ρ the query would cost.
    pub rho: f64,
    /// (ε, δ) of this query alone.
    pub epsilon: EpsilonBound,
    /// Confidence level of the intervals.
    pub confidence: f64,
    /// Each output column and how far off its values will be (or why no interval can be given).
    pub outputs: Vec<(String, String)>,
    /// With `SET dp.target`: how ρ was solved for it, and whether the budget left covers it.
    pub target: Option<String>,
    /// When the same measurements were charged before under this budget (`SET dp.reuse = 'exact'`): which charge
    /// the query would be answered from, at no cost; else, when sums of a stored release's cells can answer it
    /// (`SET dp.reuse = 'derive'`), that answer's accuracy beside the fresh one's.
    pub reuse: Option<String>,
    /// Whether a variance or standard deviation shares ρ 1 : 2 : 1 between its three measurements (the others
    /// share it equally).
    pub spread: bool,
    /// Whether a pair statistic (CORR, COVAR_*, REGR_*) shares ρ `1 : 2 : 1 : 2 : 1 : 4` between its COUNT and its
    /// sums of x, x², y, y² and x·y (centred), scaled to six equal shares ([`crate::session::Explanation`]'s
    /// measurements show each one's ρ).
    pub pair: bool,
    /// For a GROUPING SETS / CUBE / ROLLUP statement (a workload release): each marginal's accuracy and the total
    /// variance against the optimum and against answering the marginals one by one.
    pub workload: Option<String>,
    /// The output schema, and for each of its columns whether it is public (a GROUP BY key or a constant: exact,
    /// from the declared domain) rather than noisy.
    pub schema: datafusion::arrow::datatypes::SchemaRef,
    /// See [`Explanation::schema`].
    pub public: Vec<bool>,
}

impl std::fmt::Display for Explanation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "EXPLAIN DP {}", self.sql)?;
        writeln!(f, "Private plan (bounded, exact aggregates; never released without noise):")?;
        for line in self.private_plan.lines() {
            writeln!(f, "  {line}")?;
        }
        if let Some(join) = &self.join {
            writeln!(f, "Join: {join}")?;
        }
        if let Some(p) = &self.per_person {
            writeln!(f, "Per person: {p}")?;
        }
        if !self.computed.is_empty() {
            writeln!(f, "Computed (every column they read clamped to its bounds first):")?;
            for (expr, origin) in &self.computed {
                writeln!(f, "  {expr}: {origin}")?;
            }
        }
        match (self.cells, &self.selection) {
            (Some(cells), _) => writeln!(f, "Cells released: {cells}")?,
            (None, Some(s)) => {
                writeln!(
                    f,
                    "Keys released: those whose noisy {} is at least {} (Gaussian thresholding, δ = {:.4e}; only keys \
                     present in the data are candidates, and how many pass is itself noisy)",
                    s.measure, s.threshold, s.delta
                )?;
                let chances: Vec<String> =
                    s.release.iter().map(|(n, p)| format!("{n} → {}", crate::format::fmt_probability(*p))).collect();
                writeln!(
                    f,
                    "  chance a key is released, by how many units hold it (one row each): {}",
                    chances.join(", ")
                )?;
            }
            (None, None) => writeln!(f, "Cells released: the keys selected from the data")?,
        }
        // (Each measurement's ρ is its cost, at most its share: σ is rounded up onto a grid.)
        let split = if self.workload.is_some() {
            "ρ allocated over the residuals for the least sum of the cells' variances (ResidualPlanner)"
        } else if self.target.is_some() {
            "ρ per measurement, the least that meets dp.target"
        } else if self.spread && self.pair {
            "ρ split equally but for a variance's COUNT : SUM : SUM of squares, 1 : 2 : 1, and a pair's COUNT : Σx : \
             Σx² : Σy : Σy² : Σxy, 1 : 2 : 1 : 2 : 1 : 4 (six shares in all)"
        } else if self.spread {
            "ρ split equally but for a variance's COUNT : SUM : SUM of squares, 1 : 2 : 1"
        } else if self.pair {
            "ρ split equally but for a pair's COUNT : Σx : Σx² : Σy : Σy² : Σxy (centred), 1 : 2 : 1 : 2 : 1 : 4 (six \
             shares in all)"
        } else {
            "ρ split equally"
        };
        writeln!(f, "Measurements ({split}; neighbours differ by one privacy unit):")?;
        for m in &self.measures {
            let c = &m.calibration;
            let (what, param) = match c.params() {
                NoiseParams::Gaussian { sigma_sq } => ("σ", sigma_sq.to_f64().sqrt() * m.unit),
                NoiseParams::Laplace { scale } => ("scale", scale.to_f64() * m.unit),
                NoiseParams::Exponential { eta } => ("η", eta.to_f64()),
            };
            writeln!(f, "  {}", m.label)?;
            if m.l1.is_nan() {
                writeln!(f, "    sensitivity: L2 = {} ({})", fmt_num(m.l2 * m.unit), m.derivation)?;
            } else {
                writeln!(
                    f,
                    "    sensitivity: L1 = {}, L2 = {} ({})",
                    fmt_num(m.l1 * m.unit),
                    fmt_num(m.l2 * m.unit),
                    m.derivation
                )?;
            }
            writeln!(
                f,
                "    mechanism: {} with {what} = {}, ρ = {}",
                c.mechanism().report_name(),
                fmt_num(param),
                fmt_num(c.rho().get())
            )?;
            if c.mechanism() == crate::noise::Mechanism::Exponential {
                writeln!(
                    f,
                    "    accuracy: rank within ± {} values of the best candidate's at {}% confidence (per cell)",
                    fmt_num(m.ci_half_width),
                    self.confidence * 100.0
                )?;
            } else {
                writeln!(
                    f,
                    "    accuracy: std {}, ± {} at {}% confidence",
                    fmt_num(m.std),
                    fmt_num(m.ci_half_width),
                    self.confidence * 100.0
                )?;
            }
        }
        writeln!(f, "Output columns:")?;
        for (column, accuracy) in &self.outputs {
            writeln!(f, "  {column}: {accuracy}")?;
        }
        if let Some(workload) = &self.workload {
            writeln!(f, "{workload}")?;
        }
        if let Some(target) = &self.target {
            writeln!(f, "{target}")?;
        }
        if let Some(reuse) = &self.reuse {
            writeln!(f, "{reuse}")?;
        }
        write!(
            f,
            "Cost: ρ = {} (ε = {:.4} at δ = {}, {}); nothing was spent by EXPLAIN DP",
            fmt_num(self.rho),
            self.epsilon.epsilon,
            self.epsilon.delta_text(),
            self.epsilon.kind.describe()
        )
    }
}

impl DpSession {
    /// `EXPLAIN DP <query>`: the private plan that would run, sensitivities, mechanism, cost and accuracy. Every
    /// check a query goes through before its debit runs here too, so EXPLAIN DP refuses exactly what the query
    /// would refuse. Spends nothing, reads no data.
    pub async fn explain(&self, sql: &str) -> Result<Explanation> {
        self.explain_with_params(sql, &[]).await
    }

    /// [`DpSession::explain`] of a query whose `$n` placeholders are bound to `params[n-1]` (as values, see
    /// [`DpSession::sql_with_params`]).
    pub async fn explain_with_params(&self, sql: &str, params: &[ScalarValue]) -> Result<Explanation> {
        let label = super::execute::labelled(sql, params);
        if let Some((g, p)) = self.prepare_grouping(sql, params).await? {
            self.ledger.check_access(&[g.table.table().to_string()])?;
            return self.explain_grouping(&label, &g, &p);
        }
        prepare::grow_stack(async {
            let prepared = self.prepare(sql, params).await?;
            let dp = &prepared.dp;
            // What it would cost and whether it would be reused are answers too: only for tables still granted.
            let tables: Vec<String> = dp.tables.iter().map(|t| t.table().to_string()).collect();
            self.ledger.check_access(&tables)?;
            let quote = self.quote(dp)?;
            let mut measures = Vec::new();
            for (i, (m, c)) in dp.measures.iter().zip(&quote.measurements).enumerate() {
                let unit = post::unit_of(&m.kind);
                let (std, ci) = match accuracy::rank_accuracy(dp, &quote.measurements, i, quote.confidence)? {
                    Some(crate::release::Accuracy::Rank { rank_half_width, .. }) => (f64::NAN, rank_half_width),
                    _ => accuracy::noise_accuracy(c, quote.confidence)?,
                };
                measures.push(ExplainedMeasure {
                    label: m.label(),
                    l1: m.sensitivity.l1,
                    l2: m.sensitivity.l2,
                    derivation: m.sensitivity.derivation.clone(),
                    calibration: c.clone(),
                    std: std * unit,
                    ci_half_width: ci * unit,
                    unit,
                });
            }
            let outputs = dp
                .original
                .schema()
                .fields()
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    let text = accuracy::explain_output(dp, &quote.measurements, i, quote.confidence)?;
                    Ok((f.name().clone(), text))
                })
                .collect::<Result<Vec<_>>>()?;
            let public = (0..outputs.len())
                .map(|i| {
                    let a = accuracy::plan_accuracy(dp, &quote.measurements, i, quote.confidence)?;
                    Ok(matches!(a, accuracy::Planned::Ready(crate::release::Accuracy::Public)))
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Explanation {
                sql: label,
                private_plan: prepared.private.display_indent().to_string(),
                plans: vec![*prepared.physical.fingerprint()],
                cells: dp.cells(),
                selection: explained_selection(dp, &quote),
                join: dp.join.clone(),
                per_person: dp.per_person.clone(),
                computed: dp.computed.clone(),
                measures,
                rho: quote.rho.get(),
                epsilon: quote.epsilon,
                confidence: quote.confidence,
                outputs,
                target: self.explained_target(&quote)?,
                reuse: self.explained_reuse(&prepared, &quote)?,
                spread: dp.outputs.iter().any(|o| matches!(o, crate::plan::OutputKind::Spread { .. })),
                pair: dp.outputs.iter().any(|o| matches!(o, crate::plan::OutputKind::Pair { .. })),
                workload: None,
                schema: std::sync::Arc::new(dp.original.schema().as_arrow().clone()),
                public,
            })
        })
        .await
    }
}

impl DpSession {
    /// Whether the query would be answered from an earlier charge of the same measurements ([`super::reuse`]);
    /// else, whether sums of a stored release's cells can answer it ([`super::derive`]): offered both ways, with the
    /// derived accuracy of each noisy column, and which one `SET dp.reuse` picks.
    fn explained_reuse(&self, prepared: &prepare::Prepared, quote: &super::quote::Quote) -> Result<Option<String>> {
        use crate::config::Reuse;
        let measured = super::reuse::measured(prepared, &quote.measurements)?;
        let key = self.reuse_key(&measured, &prepared.dp.tables)?;
        let exact = self.explained_reuse_of(&key, "measurements")?;
        if exact.is_some() || !self.reuse().exact() {
            return Ok(exact);
        }
        let dp = &prepared.dp;
        let Some(derived) = self.derivation(dp, quote.confidence, &measured)? else { return Ok(None) };
        let mut columns = Vec::new();
        for (i, f) in dp.original.schema().fields().iter().enumerate() {
            let planned = accuracy::plan_accuracy(dp, &derived.cals, i, quote.confidence)?;
            if !matches!(planned, accuracy::Planned::Ready(crate::release::Accuracy::Public)) {
                let text = accuracy::explain_output(dp, &derived.cals, i, quote.confidence)?;
                columns.push(format!("\n  {}: {text}", f.name()));
            }
        }
        let columns = columns.concat();
        let rho = fmt_num(quote.rho.get());
        Ok(Some(match self.reuse() {
            Reuse::Derive => format!(
                "Derived (SET dp.reuse = 'derive'): {}, with:{columns}\nOr fresh (SET dp.reuse = 'exact'): ρ = {rho}, \
                 with the output columns' accuracy above",
                derived.source()
            ),
            _ => format!(
                "Derivable: {}; with SET dp.reuse = 'derive' it would have:{columns}\nAs set (dp.reuse = '{}'), it is \
                 charged ρ = {rho} for fresh measurements, with the output columns' accuracy above",
                derived.source(),
                self.reuse_setting()
            ),
        }))
    }

    /// EXPLAIN DP's line when the `what` stored under reuse key `key` would answer the statement (this budget's
    /// charge, or with `[server] share_releases` another budget's); None when it would be charged.
    pub(crate) fn explained_reuse_of(
        &self,
        key: &crate::plan::fingerprint::Fingerprint,
        what: &str,
    ) -> Result<Option<String>> {
        use crate::accounting::ledger::{LedgerKey, Prior};
        if !self.reuse().exact() {
            return Ok(None);
        }
        let (prior, whose) = match self.ledger.prior(&LedgerKey::Reuse(*key))? {
            Prior::None => (self.shared_prior(key)?, " of another analyst's budget"),
            own => (Some(own), ""),
        };
        Ok(match prior {
            None | Some(Prior::None) => None,
            Some(Prior::Charged(c) | Prior::Drawn(c, _) | Prior::Released(c, _)) => Some(format!(
                "Reused: charge #{}{whose} paid for these {what}; the query would be answered from them, spending \
                 nothing (SET dp.reuse = 'off' to pay for new ones)",
                c.id()
            )),
        })
    }

    /// How `quote`'s ρ was solved for the session's target, and whether what remains of the budget covers it.
    fn explained_target(&self, quote: &super::quote::Quote) -> Result<Option<String>> {
        let Some(solved) = &quote.target else { return Ok(None) };
        let remaining = self.status()?.rho_remaining;
        let mut text = solved.describe(quote.confidence);
        if quote.rho.get() > remaining {
            text.push_str(&format!(
                "\nThe budget left (ρ = {}) does not cover it: the query would be refused, spending nothing",
                fmt_num(remaining)
            ));
        }
        Ok(Some(text))
    }
}

/// The selection of `dp`'s keys as `quote` priced it, for EXPLAIN DP.
fn explained_selection(dp: &crate::plan::DpPlan, quote: &super::quote::Quote) -> Option<ExplainedSelection> {
    let (i, sel) = (dp.selection?, quote.selection.as_ref()?);
    Some(ExplainedSelection {
        measure: dp.measures.get(i).map(|m| m.label()).unwrap_or_default(),
        threshold: sel.threshold(),
        delta: sel.delta(),
        release: sel.release_chances(),
    })
}
