//! A grouping-sets statement's answer from its workload release: the released cells read as the statement's output
//! columns (keys, counts, sums, averages, and expressions of them), HAVING, ORDER BY and LIMIT, and each column's
//! accuracy. All of it is post-processing of the noisy counts and sums and the public (or selected) keys (BS16
//! Lemma 1.8), and every expression was checked total before the debit ([`crate::plan::grouping::OverCells`]), so
//! nothing here can fail on a value.
//!
//! # Intervals
//! A count's or a sum's interval is its marginal's (sub-Gaussian, [`crate::workload`], "Accuracy"). The others are
//! computed as in any query ([`crate::session::accuracy`]): an AVG from its sum's and count's intervals at level √c
//! each (their noises are independent) by [`accuracy::avg_interval`]; a linear expression `Σ aᵢ·Xᵢ + (keys and
//! constants)` of m counts and sums has half-width Σ |aᵢ|·hᵢ, each hᵢ at level 1 − (1 − c)/m (a union bound; m = 1:
//! exact); `a·AVG + …` is the average's interval scaled; anything else states no interval and why. A sub-Gaussian
//! half-width √(2V·ln(2/(1 − c))) is restated at another level from the same V ([`restated`]).
//!
//! Neighbouring relation: add/remove all rows of one privacy unit.

use crate::error::{DpError, Result, engine};
use crate::plan::grouping::{GroupingOutput, GroupingPlan, OverCells};
use crate::release::Accuracy;
use crate::session::accuracy::{self, Form};
use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Schema, SchemaRef};
use datafusion::logical_expr::ExprSchemable;
use std::sync::Arc;

/// A release's cells (`WorkloadRelease::to_record_batch` over the statement's key columns: `marginal`, the keys,
/// `count` and its half-width, then each sum and its half-width), read as the statement's columns.
pub(super) struct Cells<'a> {
    pub(super) g: &'a GroupingPlan,
    pub(super) batch: RecordBatch,
    /// Each summed value's bounds (its average is clamped to them).
    pub(super) bounds: Vec<(f64, f64)>,
    /// The confidence of the release's intervals.
    pub(super) confidence: f64,
}

impl Cells<'_> {
    /// Where the cells hold a key's labels, or a count's or a sum's values (its half-width next).
    fn at(&self, what: &GroupingOutput) -> Option<usize> {
        let d = self.g.columns.len();
        match what {
            GroupingOutput::Key(k) => Some(1 + k),
            GroupingOutput::Count => Some(d + 1),
            GroupingOutput::Sum(j) => Some(d + 3 + 2 * j),
            GroupingOutput::Avg(_) | GroupingOutput::Expr(_) => None,
        }
    }

    /// The values and half-widths of a count or a sum.
    fn noisy(&self, what: &GroupingOutput) -> Result<(&Float64Array, &Float64Array)> {
        let at = self.at(what).filter(|_| matches!(what, GroupingOutput::Count | GroupingOutput::Sum(_)));
        let column = |i: usize| self.batch.column(i).as_primitive_opt::<Float64Type>();
        match at.and_then(|at| column(at).zip(column(at + 1))) {
            Some(pair) => Ok(pair),
            None => Err(DpError::Internal("a count or a sum of the cells".into())),
        }
    }

    /// The average of summed value `j` in each row, and its interval at the release's confidence.
    fn averages(&self, j: usize) -> Result<Vec<(f64, f64, f64)>> {
        let ((s, hs), (n, hn)) = (self.noisy(&GroupingOutput::Sum(j))?, self.noisy(&GroupingOutput::Count)?);
        let &(lo, hi) = self.bounds.get(j).ok_or_else(|| DpError::Internal("an average without its bounds".into()))?;
        let (c, half) = (self.confidence, self.confidence.sqrt());
        Ok((0..self.batch.num_rows())
            .map(|i| {
                let (hs, hn) = (restated(hs.value(i), c, half), restated(hn.value(i), c, half));
                accuracy::avg_interval(s.value(i), n.value(i), hs, hn, lo, hi)
            })
            .collect())
    }

    /// The column of `what`, typed as `field` is (a key) or as its expression is.
    pub(super) fn column(&self, what: &GroupingOutput, field: &Field) -> Result<ArrayRef> {
        match what {
            GroupingOutput::Key(_) => match self.at(what) {
                Some(at) => typed_keys(self.batch.column(at), field),
                None => Err(DpError::Internal("a key of the cells".into())),
            },
            GroupingOutput::Count | GroupingOutput::Sum(_) => Ok(Arc::new(self.noisy(what)?.0.clone())),
            GroupingOutput::Avg(j) => {
                Ok(Arc::new(Float64Array::from_iter_values(self.averages(*j)?.into_iter().map(|a| a.0))))
            }
            GroupingOutput::Expr(k) => {
                self.evaluate(self.g.exprs.get(*k).ok_or_else(|| DpError::Internal("an expression".into()))?)
            }
        }
    }

    /// `e` over every row of the cells.
    pub(super) fn evaluate(&self, e: &OverCells) -> Result<ArrayRef> {
        let internal = |e: datafusion::arrow::error::ArrowError| DpError::Internal(e.to_string());
        let arrays = e
            .reads
            .iter()
            .zip(e.schema.fields())
            .map(|(what, field)| self.column(what, field))
            .collect::<Result<Vec<_>>>()?;
        let options = datafusion::arrow::array::RecordBatchOptions::new().with_row_count(Some(self.batch.num_rows()));
        let batch = RecordBatch::try_new_with_options(Arc::new(e.schema.as_arrow().clone()), arrays, &options)
            .map_err(internal)?;
        crate::plan::interval::physical(&e.expr, &e.schema)
            .and_then(|p| p.evaluate(&batch))
            .and_then(|v| v.into_array(batch.num_rows()))
            .map_err(engine)
    }

    /// The accuracy of output column `i` (holding `what`, its values `values` as [`Cells::column`] gave them) over
    /// `rows` of the cells (module docs, "Intervals").
    pub(super) fn accuracy(
        &self,
        (i, what): (usize, &GroupingOutput),
        values: &ArrayRef,
        rows: &[usize],
    ) -> Result<Accuracy> {
        let confidence = self.confidence;
        let per_row = |intervals: Vec<[f64; 2]>| Accuracy::PerRow { confidence, intervals };
        Ok(match what {
            GroupingOutput::Key(_) => Accuracy::Public,
            GroupingOutput::Count | GroupingOutput::Sum(_) => {
                let (v, h) = self.noisy(what)?;
                per_row(rows.iter().map(|&r| [v.value(r) - h.value(r), v.value(r) + h.value(r)]).collect())
            }
            GroupingOutput::Avg(j) => {
                let a = self.averages(*j)?;
                per_row(rows.iter().map(|&r| [a[r].1, a[r].2]).collect())
            }
            GroupingOutput::Expr(_) => match accuracy::form_of(&self.g.projection, i) {
                Form::Exact => Accuracy::Public,
                Form::Other(reason) => Accuracy::NoInterval { reason },
                Form::Linear(terms) => {
                    let values = datafusion::arrow::compute::cast(values, &DataType::Float64)
                        .map_err(|e| DpError::Internal(e.to_string()))?;
                    self.linear(&terms, values.as_primitive::<Float64Type>(), rows)?
                }
            },
        })
    }

    /// The accuracy of `values`, `Σ aᵢ·Xᵢ + (keys and constants)` over the aggregates `terms` (index, aᵢ).
    fn linear(&self, terms: &[(usize, f64)], values: &Float64Array, rows: &[usize]) -> Result<Accuracy> {
        let mut merged: Vec<(GroupingOutput, f64)> = vec![];
        for (agg, a) in terms {
            let what = self.g.aggregates.get(*agg).ok_or_else(|| DpError::Internal("an aggregate".into()))?;
            match merged.iter_mut().find(|(w, _)| w == what) {
                Some((_, b)) => *b += a,
                None => merged.push((what.clone(), *a)),
            }
        }
        merged.retain(|(_, a)| *a != 0.0);
        let confidence = self.confidence;
        let value = |r: usize| if values.is_valid(r) { values.value(r) } else { f64::NAN };
        let intervals = match merged.as_slice() {
            [] => return Ok(Accuracy::Public),
            [(GroupingOutput::Avg(j), a)] => {
                let avg = self.averages(*j)?;
                rows.iter()
                    .map(|&r| {
                        let (v, lo, hi) = avg[r];
                        let ends = [value(r) + a * (lo - v), value(r) + a * (hi - v)];
                        [ends[0].min(ends[1]), ends[0].max(ends[1])]
                    })
                    .collect()
            }
            terms if terms.iter().all(|(w, _)| matches!(w, GroupingOutput::Count | GroupingOutput::Sum(_))) => {
                let m = terms.len();
                let level = if m == 1 { confidence } else { 1.0 - (1.0 - confidence) / m as f64 };
                let halves = terms.iter().map(|(w, a)| Ok((self.noisy(w)?.1, a.abs()))).collect::<Result<Vec<_>>>()?;
                rows.iter()
                    .map(|&r| {
                        let h: f64 = halves.iter().map(|(h, a)| a * restated(h.value(r), confidence, level)).sum();
                        [value(r) - h, value(r) + h]
                    })
                    .collect()
            }
            _ => {
                let reason = "an average combined with other noisy values".to_string();
                return Ok(Accuracy::NoInterval { reason });
            }
        };
        Ok(Accuracy::PerRow { confidence, intervals })
    }

    /// The rows the statement returns, in its order: those where its HAVING holds, sorted by its ORDER BY, then
    /// cut by its OFFSET and LIMIT.
    pub(super) fn present(&self, schema: &SchemaRef) -> Result<Vec<usize>> {
        use datafusion::arrow::compute::{SortColumn, SortOptions, lexsort_to_indices};
        let g = self.g;
        let mut rows: Vec<usize> = (0..self.batch.num_rows()).collect();
        if !g.order.is_empty() {
            let columns = g
                .order
                .iter()
                .map(|&(i, asc, nulls_first)| {
                    let field = schema.fields().get(i).ok_or_else(|| DpError::Internal("an ORDER BY column".into()))?;
                    let values = self.column(&g.outputs[i].1, field)?;
                    Ok(SortColumn { values, options: Some(SortOptions { descending: !asc, nulls_first }) })
                })
                .collect::<Result<Vec<_>>>()?;
            let sorted = lexsort_to_indices(&columns, None).map_err(|e| DpError::Internal(e.to_string()))?;
            rows = sorted.values().iter().map(|&i| i as usize).collect();
        }
        if let Some(h) = &g.having {
            let holds = self.evaluate(h)?;
            let holds = holds.as_boolean_opt().ok_or_else(|| DpError::Internal("HAVING is a condition".into()))?;
            rows.retain(|&i| holds.is_valid(i) && holds.value(i));
        }
        let n = rows.len();
        let start = g.skip.min(n);
        let end = g.fetch.map_or(n, |f| start.saturating_add(f).min(n));
        Ok(rows[start..end].to_vec())
    }
}

/// A sub-Gaussian half-width `h` stated at `confidence`, restated at `level` (the same variance V: both are
/// √(2V·ln(2/(1 − level)))).
fn restated(h: f64, confidence: f64, level: f64) -> f64 {
    h * ((2.0 / (1.0 - level)).ln() / (2.0 / (1.0 - confidence)).ln()).sqrt()
}

/// A key column's labels (NULL where a marginal does not group by it) as the statement types the key. Every label
/// converts (a domain's, checked before the debit by `prepare_grouping`; a selected key's, of a type whose values
/// are their text read back: `keys::selectable`).
pub(super) fn typed_keys(labels: &ArrayRef, field: &Field) -> Result<ArrayRef> {
    let strict = datafusion::arrow::compute::CastOptions { safe: false, ..Default::default() };
    datafusion::arrow::compute::cast_with_options(labels, field.data_type(), &strict).map_err(|_| {
        DpError::Config(format!(
            "the domain of `{}` declares values that are not of the column's type {}",
            field.name(),
            field.data_type()
        ))
    })
}

/// The output schema of a grouping-sets statement: its keys as the statement types them (nullable: NULL where a
/// marginal does not group by them), counts, sums and averages as Float64 (least-squares estimates and their
/// ratios), and each expression as its type over them.
pub(crate) fn grouping_schema(g: &GroupingPlan) -> SchemaRef {
    let fields: Vec<Field> = g
        .outputs
        .iter()
        .zip(g.schema.fields())
        .map(|((name, what), f)| match what {
            GroupingOutput::Key(_) => Field::new(name, f.data_type().clone(), true),
            GroupingOutput::Count | GroupingOutput::Sum(_) | GroupingOutput::Avg(_) => {
                Field::new(name, DataType::Float64, false)
            }
            GroupingOutput::Expr(k) => {
                let typed = g.exprs.get(*k).and_then(|e| e.expr.get_type(&e.schema).ok());
                Field::new(name, typed.unwrap_or(DataType::Float64), true)
            }
        })
        .collect();
    Arc::new(Schema::new(fields))
}
