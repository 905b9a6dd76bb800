//! Preparing a one-way marginal release (the mechanism and its privacy claim: [`crate::marginals`]): the
//! histograms, their price and the physical plans that will run, all settled before anything is spent. Answering
//! it (`execute.rs`) debits exactly this quote and runs exactly these plans, as for a SQL query.
//!
//! Neighbouring relation: add/remove all rows of one privacy unit.

use crate::error::{DpError, Result, engine};
use crate::marginals::{self, Histograms, MarginalLayout, MarginalPlan, MarginalRelease, MarginalSpec};
use crate::noise::accuracy;
use crate::plan::bound;
use crate::policy::DomainValue;
use crate::refusal::Refusal;
use crate::session::quote::Quote;
use crate::session::{DpSession, PrivatePlan};
use datafusion::common::Column;
use datafusion::logical_expr::{Expr, LogicalPlanBuilder, col, lit};

/// A marginal release planned and priced end to end; nothing has been spent or read.
pub(crate) struct PreparedMarginals {
    /// What is counted (public).
    pub(crate) histograms: Histograms,
    /// Its noise and accuracy.
    pub(crate) plan: MarginalPlan,
    /// Its price: one Gaussian measurement of the whole vector of cells.
    pub(crate) quote: Quote,
    /// Rows kept per unit (per attribute, for long tables).
    pub(crate) k: u64,
    /// For columns without a domain: the threshold their keys' noisy counts must reach.
    pub(crate) selection: Option<crate::noise::Selection>,
    /// With a privacy unit: the units (per attribute) with more than `k` rows, each with its row count.
    pub(crate) over_limit: Option<PrivatePlan>,
    /// Every row: the counted columns, then (with a privacy unit) the unit's key columns.
    pub(crate) rows: PrivatePlan,
}

impl DpSession {
    /// Releases the one-way marginals (histograms) of `columns` of `table` at once: one σ, one debit, exact
    /// discrete Gaussian noise on every cell, computed in a single pass over the data. See [`crate::marginals`]
    /// for the privacy claim.
    pub async fn marginals(&self, table: &str, columns: &[String], spec: &MarginalSpec) -> Result<MarginalRelease> {
        self.release_marginals(table, &MarginalLayout::Wide(columns.to_vec()), spec).await
    }

    /// One-way marginals of a long table (`unit, attribute, value`): one histogram of `value_column` per
    /// attribute in the domain of `attribute_column`. Units are bounded to `max_rows_per_unit` rows per attribute.
    pub async fn marginals_long(
        &self,
        table: &str,
        attribute_column: &str,
        value_column: &str,
        spec: &MarginalSpec,
    ) -> Result<MarginalRelease> {
        let layout = MarginalLayout::Long { attribute: attribute_column.to_string(), value: value_column.to_string() };
        self.release_marginals(table, &layout, spec).await
    }

    /// The marginal release of `layout`: prepared and priced (everything [`DpSession::explain_marginals`] does),
    /// then debited, run once and noised.
    pub async fn release_marginals(
        &self,
        table: &str,
        layout: &MarginalLayout,
        spec: &MarginalSpec,
    ) -> Result<MarginalRelease> {
        let prepared = self.prepare_marginals(table, layout, spec).await?;
        self.answer_marginals(prepared).await
    }

    /// What [`DpSession::release_marginals`] would do and cost: the noise, the accuracy of every cell and the
    /// (ε, δ), after every check the release makes before its debit, so it refuses exactly what the release would
    /// refuse. Spends nothing, reads no data.
    pub async fn explain_marginals(
        &self,
        table: &str,
        layout: &MarginalLayout,
        spec: &MarginalSpec,
    ) -> Result<MarginalPlan> {
        Ok(self.prepare_marginals(table, layout, spec).await?.plan)
    }

    async fn prepare_marginals(
        &self,
        table: &str,
        layout: &MarginalLayout,
        spec: &MarginalSpec,
    ) -> Result<PreparedMarginals> {
        let policy = self.policy(table)?;
        let no_domain =
            |c: &str| DpError::Refused(Refusal::MarginalNoDomain { table: table.to_string(), column: c.into() });
        let domain = |c: &str| policy.domain(c).map(<[DomainValue]>::to_vec).ok_or_else(|| no_domain(c));
        // A counted column without a domain has its keys selected, where this budget allows it.
        let counted_domain = |c: &str| match policy.domain(c) {
            Some(d) => Ok(Some(d.to_vec())),
            None => self.allow_selection(table, c, policy.privacy_unit.as_deref()).map(|()| None),
        };
        // The columns each row of the pass carries (counted first), and what is counted.
        let (counted, histograms) = match layout {
            MarginalLayout::Wide(columns) => {
                if let Some((_, c)) = columns.iter().enumerate().find(|(i, c)| columns[..*i].contains(c)) {
                    return Err(DpError::Refused(Refusal::MarginalDuplicateColumn { column: c.clone() }));
                }
                let domains = columns.iter().map(|c| counted_domain(c)).collect::<Result<Vec<_>>>()?;
                let h = Histograms {
                    table: table.to_string(),
                    names: columns.clone(),
                    domains,
                    attributes: None,
                    consistency: spec.consistency,
                };
                (columns.clone(), h)
            }
            MarginalLayout::Long { attribute, value } => {
                let attrs = domain(attribute)?;
                let values = counted_domain(value)?;
                let h = Histograms {
                    table: table.to_string(),
                    names: attrs.iter().map(marginals::domain_label).collect(),
                    domains: vec![values; attrs.len()],
                    attributes: Some(attrs),
                    consistency: spec.consistency,
                };
                (vec![attribute.clone(), value.clone()], h)
            }
        };
        let confidence = spec.confidence.unwrap_or(self.defaults.confidence);
        accuracy::check_confidence(confidence)?;
        let k = policy.max_rows_per_unit;
        let (d, cells) = (histograms.names.len(), histograms.cells());
        let open = match histograms.open() {
            0 => None,
            n => {
                let delta = self.checked_selection_delta(spec.selection_delta)?;
                let names = match layout {
                    MarginalLayout::Wide(_) => histograms.open_names(),
                    MarginalLayout::Long { value, .. } => vec![value.clone()],
                };
                Some(marginals::OpenColumns { names, histograms: n, delta })
            }
        };
        let (plan, cal, selection) = marginals::plan_accounted(
            self.defaults.accounting,
            d,
            cells,
            k,
            spec.budget,
            None,
            confidence,
            self.defaults.delta,
            open,
        )?;
        let quote = Quote::new(vec![cal], self.defaults.delta, confidence, &self.quotes)?;

        let attribute = match layout {
            MarginalLayout::Long { attribute, .. } => Some(attribute.as_str()),
            MarginalLayout::Wide(_) => None,
        };
        let scan = self.tables.scan(table).await?;
        let (over_limit, rows, _) =
            self.bounded_rows(scan, policy.privacy_unit.as_deref(), &counted, attribute, k).await?;
        marginals::check_counted_types(&histograms, &rows.schema())?;
        // A counted column without a domain must have a type whose keys are exact (no floats): the columns of a
        // wide table each, the value column (the second) of a long one.
        let schema = rows.schema();
        let open: Vec<usize> = match histograms.attributes {
            None => (0..histograms.domains.len()).filter(|&i| histograms.domains[i].is_none()).collect(),
            Some(_) => histograms.domains.first().is_some_and(Option::is_none).then_some(1).into_iter().collect(),
        };
        for field in open.into_iter().filter_map(|i| schema.fields().get(i)) {
            if !crate::plan::selected::selectable(field.data_type()) {
                return Err(no_domain(field.name()));
            }
        }
        Ok(PreparedMarginals { histograms, plan, quote, k, selection, over_limit, rows })
    }

    /// The plans of a release that bounds each unit to `k` rows while counting: every row of `scan` (a private
    /// table's scan, possibly under WHERE filters) with the `counted` columns first, then (with a privacy `unit`)
    /// the unit's key columns (and `attribute`'s, for a long table: k rows per unit and attribute); and the units
    /// over the limit with their row counts, which the `RowSampler` needs; and the rows' optimized logical plan
    /// (checked total, as every private plan). Nothing is read.
    pub(crate) async fn bounded_rows(
        &self,
        scan: datafusion::logical_expr::LogicalPlan,
        unit: Option<&str>,
        counted: &[String],
        attribute: Option<&str>,
        k: u64,
    ) -> Result<(Option<PrivatePlan>, PrivatePlan, datafusion::logical_expr::LogicalPlan)> {
        let mut project: Vec<Expr> = counted.iter().map(|c| Expr::Column(Column::from_name(c))).collect();
        let (input, over_limit) = match unit {
            None => (scan, None),
            Some(pu) => {
                let input = bound::carry_unit(scan, pu)?;
                let mut unit_key = vec![col(Column::from_name(bound::UNIT))];
                unit_key.extend(attribute.map(|a| col(Column::from_name(a))));
                project.extend(unit_key.iter().enumerate().map(|(i, e)| e.clone().alias(format!("__dp_key{i}"))));
                let n = datafusion::functions_aggregate::expr_fn::count(lit(1i64));
                let over = LogicalPlanBuilder::from(input.clone())
                    .aggregate(unit_key, vec![n.alias("__dp_n")])
                    .and_then(|b| b.filter(col("__dp_n").gt(lit(k as i64))))
                    .and_then(|b| b.build())
                    .map_err(engine)?;
                (input, Some(self.tables.plan(&over).await?.1))
            }
        };
        let rows = LogicalPlanBuilder::from(input).project(project).and_then(|b| b.build()).map_err(engine)?;
        let (logical, rows) = self.tables.plan(&rows).await?;
        Ok((over_limit, rows, logical))
    }

    /// The δ a key selection spends: `delta`, or the session's `dp.selection_delta`; refused outside (0, 0.001).
    pub(crate) fn checked_selection_delta(&self, delta: Option<f64>) -> Result<f64> {
        let delta = delta.unwrap_or_else(|| self.selection_delta());
        super::statement::check_selection_delta(delta).map_err(|reason| {
            DpError::Refused(Refusal::BadOptionValue { option: "selection_delta", value: delta.to_string(), reason })
        })?;
        Ok(delta)
    }

    /// Whether column `c` of `table`, which has no domain, may have its keys selected: only under a zCDP budget
    /// that has a δ for it, and never the privacy unit (`unit`). Decided from the policy and the ledger only.
    pub(crate) fn allow_selection(&self, table: &str, c: &str, unit: Option<&str>) -> Result<()> {
        if self.defaults.accounting == crate::accounting::calibrate::Accounting::Gdp {
            let why = super::quote::GDP_CANNOT_SELECT.into();
            return Err(DpError::Refused(Refusal::SelectionNotAllowed { column: c.to_string(), why }));
        }
        if self.ledger.delta()?.total <= 0.0 {
            let (table, column) = (table.to_string(), c.to_string());
            return Err(DpError::Refused(Refusal::MarginalNoDomain { table, column }));
        }
        if unit == Some(c) {
            return Err(DpError::Refused(Refusal::UnitAsKey { column: c.to_string() }));
        }
        Ok(())
    }
}
