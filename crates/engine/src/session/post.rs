//! Post-processing: the analyst's plan above the aggregate, run over the noisy table.
//!
//! The noisy table has one row per GROUP BY cell of the public domain (keys, then one column per aggregate output
//! in its original type). Everything computed from it is post-processing (BS16 Lemma 1.8): it costs no budget and
//! cannot weaken the guarantee. It can still fail (a cast of a noisy value out of range) or ask for too much
//! memory, so:
//!
//! * before anything is spent, the post-processing plan is bounded ([`crate::plan::size::check_post_sizes`]),
//!   planned, and run on a public stand-in for the noisy table, twice with different values; a query whose
//!   post-processing cannot be planned, or fails on both, is refused for free ([`DpSession::check_post_processing`]);
//! * it runs on its own DataFusion context whose memory pool is limited ([`POST_MEMORY`]), apart from the private
//!   plan, so that a memory limit can never be reached because of the size of the private data.
//!
//! A failure that remains depends on the noisy values only, and with a request id a retry post-processes the
//! same stored values, so it repeats identically and tells nothing new.

use crate::error::{DpError, Result, engine};
use crate::plan::{DpPlan, MeasureKind, OutputKind, size};
use crate::refusal::Refusal;
use crate::session::DpSession;
use crate::session::accuracy::{Halves, Spread3, avg_interval, interval_columns, is_interval_column, spread_interval};
use crate::session::pair;
use datafusion::arrow::array::{ArrayRef, Float64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::ScalarValue;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::{MemTable, provider_as_source};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder, Projection, col};
use datafusion::prelude::SessionContext;
use std::sync::Arc;

/// Memory pool of post-processing (bytes): sorts, windows and the like over at most [`crate::plan::MAX_CELLS`] rows.
pub const POST_MEMORY: usize = 1 << 30;

/// The context post-processing runs on: no tables, a memory pool of `limit` bytes.
pub(crate) fn post_context(limit: usize) -> Result<SessionContext> {
    let runtime = RuntimeEnvBuilder::new().with_memory_limit(limit, 1.0).build_arc().map_err(engine)?;
    let config = datafusion::prelude::SessionConfig::new().with_information_schema(false);
    Ok(SessionContext::new_with_config_rt(config, runtime))
}

/// Grid unit of a measurement: 2^-s for sums on a grid, 1 otherwise.
pub(crate) fn unit_of(kind: &MeasureKind) -> f64 {
    match kind {
        MeasureKind::Sum { scale_bits, .. } => 2f64.powi(-scale_bits),
        _ => 1.0,
    }
}

/// Every key of the cross product of the GROUP BY domains, in declaration order (one empty key without GROUP BY).
pub(crate) fn domain_product(dp: &DpPlan) -> Vec<Vec<ScalarValue>> {
    let mut keys: Vec<Vec<ScalarValue>> = vec![vec![]];
    for k in &dp.keys {
        keys = keys
            .into_iter()
            .flat_map(|prefix| {
                k.domain.iter().map(move |v| {
                    let mut key = prefix.clone();
                    key.push(v.clone());
                    key
                })
            })
            .collect();
    }
    keys
}

/// The table the analyst's aggregate would have produced, from the noisy measurements: `values[c][m]` is
/// measurement m of cell `keys[c]`, in grid units. Keys first, then one column per aggregate output in its
/// original type (AVG = noisy SUM / noisy COUNT, clamped to the bounds; VARIANCE/STDDEV from three noisy sums),
/// then, for each such output j, its per-row interval as two hidden columns ([`interval_columns`]), from the
/// measurements' half-widths `half[m]` (grid units: at level √c each for an AVG's two measurements, at ∛c each
/// for a spread's three; see [`avg_interval`] and [`spread_interval`]).
pub(crate) fn noisy_batch(
    dp: &DpPlan,
    keys: Vec<Vec<ScalarValue>>,
    values: &[Vec<i128>],
    half: &[Halves],
) -> Result<RecordBatch> {
    let fields = dp.aggregate_fields();
    let mut key_cols: Vec<Vec<ScalarValue>> = vec![Vec::with_capacity(keys.len()); dp.keys.len()];
    let mut out_cols: Vec<Vec<ScalarValue>> = vec![Vec::with_capacity(keys.len()); dp.outputs.len()];
    let mut interval_cols: Vec<(usize, Vec<f64>, Vec<f64>)> = dp
        .outputs
        .iter()
        .enumerate()
        .filter(|(_, o)| matches!(o, OutputKind::Avg { .. } | OutputKind::Spread { .. } | OutputKind::Pair { .. }))
        .map(|(j, _)| (j, Vec::new(), Vec::new()))
        .collect();
    // Each quantile's candidates, built once for all cells.
    let candidates = dp
        .measures
        .iter()
        .map(|m| match &m.kind {
            MeasureKind::Quantile { grid, .. } => grid.grid().map(|g| Some(g.candidates().to_vec())),
            _ => Ok(None),
        })
        .collect::<Result<Vec<_>>>()?;
    // A pair's bootstrap: fewer draws per cell for releases of very many cells ([`pair::draws`]).
    let draws = pair::draws(keys.len());
    for (key, cell) in keys.into_iter().zip(values) {
        let noisy: Vec<NoisyValue> =
            dp.measures.iter().zip(cell).map(|(m, v)| NoisyValue { grid: *v, unit: unit_of(&m.kind) }).collect();
        if noisy.len() != dp.measures.len() {
            return Err(DpError::Internal("a noisy cell does not have one value per measurement".into()));
        }
        for (k, v) in key.into_iter().enumerate() {
            key_cols[k].push(v);
        }
        for (j, o) in dp.outputs.iter().enumerate() {
            let dt = fields[j].data_type();
            let value = match o {
                OutputKind::Measure(i) => match &candidates[*i] {
                    // The drawn candidate's index, as the candidate's value (a stand-in index beyond the grid, as
                    // the checks before the debit use, as the last one).
                    Some(candidates) => {
                        let last = candidates.len().saturating_sub(1);
                        let j = usize::try_from(noisy[*i].grid.max(0)).unwrap_or(last).min(last);
                        let c = candidates.get(j).copied().unwrap_or(f64::NAN);
                        ScalarValue::Float64(Some(c)).cast_to(dt).map_err(engine)?
                    }
                    None => noisy[*i].scalar(dt)?,
                },
                OutputKind::Avg { sum, count } => {
                    let (lo, hi) = match &dp.measures[*sum].kind {
                        MeasureKind::Sum { lo, hi, .. } => (*lo, *hi),
                        _ => (f64::NEG_INFINITY, f64::INFINITY),
                    };
                    let half_of = |m: usize| half.get(m).map_or(0.0, |h| h.sqrt) * noisy[m].unit;
                    let (avg, low, high) = avg_interval(
                        noisy[*sum].as_f64(),
                        noisy[*count].grid as f64,
                        half_of(*sum),
                        half_of(*count),
                        lo,
                        hi,
                    );
                    if let Some((_, dn, up)) = interval_cols.iter_mut().find(|(k, ..)| *k == j) {
                        dn.push(avg - low);
                        up.push(high - avg);
                    }
                    ScalarValue::Float64(Some(avg)).cast_to(dt).map_err(engine)?
                }
                OutputKind::Spread { count, sum, squares, half_range, sample, root } => {
                    let half_of = |m: usize| half.get(m).map_or(0.0, |h| h.cbrt) * noisy[m].unit;
                    let noisy_of = |m: usize| Spread3 { value: noisy[m].as_f64(), half: half_of(m) };
                    let (v, low, high) = spread_interval(
                        [noisy_of(*count), noisy_of(*sum), noisy_of(*squares)],
                        *half_range,
                        *sample,
                        *root,
                    );
                    if let Some((_, dn, up)) = interval_cols.iter_mut().find(|(k, ..)| *k == j) {
                        dn.push(v - low);
                        up.push(high - v);
                    }
                    ScalarValue::Float64(Some(v)).cast_to(dt).map_err(engine)?
                }
                OutputKind::Pair { count, sx, sxx, sy, syy, sxy, centre, half: halves, what } => {
                    let measured = [Some(*count), *sx, *sxx, *sy, *syy, *sxy];
                    let sums = measured.map(|m| {
                        m.map(|m| {
                            let h = half.get(m);
                            pair::Noisy {
                                value: noisy[m].as_f64(),
                                std: h.map_or(0.0, |h| h.std) * noisy[m].unit,
                                laplace: h.is_some_and(|h| h.laplace),
                            }
                        })
                    });
                    let confidence = half.first().map_or(0.95, |h| h.confidence);
                    let released: Vec<i128> = measured.iter().flatten().map(|m| noisy[*m].grid).collect();
                    let shape = pair::Shape { centre: *centre, half: *halves };
                    let (v, low, high) =
                        pair::interval(*what, sums, shape, confidence, draws, pair::seed(*what, &released));
                    if let Some((_, dn, up)) = interval_cols.iter_mut().find(|(k, ..)| *k == j) {
                        // (NaN for a NULL value: its interval is [NaN, NaN], as a NULL's is.)
                        let v = v.unwrap_or(f64::NAN);
                        dn.push(v - low);
                        up.push(high - v);
                    }
                    ScalarValue::Float64(v).cast_to(dt).map_err(engine)?
                }
            };
            out_cols[j].push(value);
        }
    }
    let mut arrays: Vec<ArrayRef> = Vec::new();
    let mut schema_fields = Vec::new();
    for (i, vals) in key_cols.into_iter().enumerate() {
        let dt = dp.agg_schema.field(i).data_type().clone();
        arrays.push(scalars_to_array(vals, &dt)?);
        schema_fields.push(Field::new(format!("c{i}"), dt, true));
    }
    for (j, vals) in out_cols.into_iter().enumerate() {
        let dt = fields[j].data_type().clone();
        arrays.push(scalars_to_array(vals, &dt)?);
        schema_fields.push(Field::new(format!("c{}", dp.keys.len() + j), dt, true));
    }
    for (j, dn, up) in interval_cols {
        for (name, v) in interval_columns(j).into_iter().zip([dn, up]) {
            arrays.push(Arc::new(Float64Array::from(v)));
            schema_fields.push(Field::new(name, DataType::Float64, false));
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(schema_fields)), arrays).map_err(|e| DpError::Internal(e.to_string()))
}

/// The noisy table of [`noisy_batch`] with its keys and aggregates named as in the analyst's aggregate (`sex`,
/// `count(*)`) rather than `c0`, `c1`, ...: what a release shows when post-processing failed on the noisy values.
pub(crate) fn named_aggregates(dp: &DpPlan, noisy: RecordBatch) -> Result<RecordBatch> {
    let fields: Vec<Field> = noisy
        .schema()
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| match aggregate_name(dp, i) {
            Some(name) if !is_interval_column(f.name()) => f.as_ref().clone().with_name(name),
            _ => f.as_ref().clone(),
        })
        .collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), noisy.columns().to_vec())
        .map_err(|e| DpError::Internal(e.to_string()))
}

/// The name of column `i` of the aggregate (keys, then aggregates) as the analyst wrote it: the analyzer writes
/// COUNT(*) as count(Int64(1)).
pub(crate) fn aggregate_name(dp: &DpPlan, i: usize) -> Option<String> {
    Some(dp.agg_schema.fields().get(i)?.name().replace("count(Int64(1))", "count(*)"))
}

fn scalars_to_array(vals: Vec<ScalarValue>, dt: &DataType) -> Result<ArrayRef> {
    if vals.is_empty() {
        return Ok(datafusion::arrow::array::new_empty_array(dt));
    }
    ScalarValue::iter_to_array(vals).map_err(engine)
}

/// A noisy measurement value on its grid.
struct NoisyValue {
    grid: i128,
    unit: f64,
}

impl NoisyValue {
    fn as_f64(&self) -> f64 {
        self.grid as f64 * self.unit
    }

    /// The value in the analyst's result type. Integer types get the nearest integer, saturated to the type's
    /// range (a noisy SUM of an unsigned column can be negative): post-processing, never an error after the debit.
    fn scalar(&self, dt: &DataType) -> Result<ScalarValue> {
        // `as` from f64 to i128 saturates; on the unit grid the exact integer is used as is.
        let v = if self.unit == 1.0 { self.grid } else { self.as_f64().round() as i128 };
        let sat = |lo: i128, hi: i128| v.clamp(lo, hi);
        Ok(match dt {
            DataType::Int8 => ScalarValue::Int8(Some(sat(i8::MIN.into(), i8::MAX.into()) as i8)),
            DataType::Int16 => ScalarValue::Int16(Some(sat(i16::MIN.into(), i16::MAX.into()) as i16)),
            DataType::Int32 => ScalarValue::Int32(Some(sat(i32::MIN.into(), i32::MAX.into()) as i32)),
            DataType::Int64 => ScalarValue::Int64(Some(sat(i64::MIN.into(), i64::MAX.into()) as i64)),
            DataType::UInt8 => ScalarValue::UInt8(Some(sat(0, u8::MAX.into()) as u8)),
            DataType::UInt16 => ScalarValue::UInt16(Some(sat(0, u16::MAX.into()) as u16)),
            DataType::UInt32 => ScalarValue::UInt32(Some(sat(0, u32::MAX.into()) as u32)),
            DataType::UInt64 => ScalarValue::UInt64(Some(sat(0, u64::MAX.into()) as u64)),
            _ => return ScalarValue::Float64(Some(self.as_f64())).cast_to(dt).map_err(engine),
        })
    }
}

/// The analyst's plan with its aggregate replaced by the noisy table (post-processing only). The hidden interval
/// columns of the noisy table are carried through every projection to the output, unless a DISTINCT (which they
/// would change) stands above the aggregate.
pub(crate) fn post_plan(dp: &DpPlan, noisy: RecordBatch) -> Result<LogicalPlan> {
    let schema = noisy.schema();
    let hidden: Vec<String> =
        schema.fields().iter().map(|f| f.name().clone()).filter(|n| is_interval_column(n)).collect();
    let carry =
        !hidden.is_empty() && !dp.original.exists(|n| Ok(matches!(n, LogicalPlan::Distinct(_)))).map_err(engine)?;
    let mem = MemTable::try_new(schema.clone(), vec![vec![noisy]]).map_err(engine)?;
    let scan = LogicalPlanBuilder::scan("__dp_noisy", provider_as_source(Arc::new(mem)), None).map_err(engine)?;
    let mut exprs: Vec<Expr> = dp
        .agg_schema
        .iter()
        .enumerate()
        .map(|(i, (q, f))| col(format!("__dp_noisy.c{i}")).alias_qualified(q.cloned(), f.name()))
        .collect();
    if carry {
        exprs.extend(hidden.iter().map(|h| col(format!("__dp_noisy.{h}")).alias(h)));
    }
    let replacement = scan.project(exprs).and_then(|b| b.build()).map_err(engine)?;
    // The outermost aggregate is the one measured (a question about each person has another below it).
    let mut replaced = false;
    let down = dp
        .original
        .clone()
        .transform_down(|node| {
            if matches!(node, LogicalPlan::Aggregate(_)) && !replaced {
                replaced = true;
                return Ok(Transformed::new(replacement.clone(), true, TreeNodeRecursion::Jump));
            }
            Ok(Transformed::no(node))
        })
        .map_err(engine)?
        .data;
    let mut above = false;
    let out = down
        .transform_up(|node| {
            if !above && node == replacement {
                above = true;
                return Ok(Transformed::no(node));
            }
            match node {
                LogicalPlan::Projection(p) if carry && above => {
                    // Keep the hidden interval columns: the analyst's projection would drop them.
                    let mut exprs = p.expr.clone();
                    for h in &hidden {
                        let (q, _) = p.input.schema().qualified_field_with_unqualified_name(h)?;
                        exprs.push(Expr::Column(datafusion::common::Column::new(q.cloned(), h)));
                    }
                    Ok(Transformed::yes(LogicalPlan::Projection(Projection::try_new(exprs, p.input.clone())?)))
                }
                other => Ok(Transformed::yes(other.recompute_schema()?)),
            }
        })
        .map_err(engine)?
        .data;
    if !replaced {
        return Err(DpError::Internal("aggregate not found for post-processing".into()));
    }
    Ok(out)
}

/// The post-processed result when nothing is computed above the aggregate: the analyst's plan is, from its root
/// down to the aggregate, only projections of plain columns (with or without an alias) and subquery aliases. The
/// result is then the noisy table's columns, chosen and named as that plan says, with the hidden interval columns
/// after them, exactly as [`DpSession::run_post`] would return it (same schema: names, types, nullability; same
/// values), without planning or running anything. `None` for any other plan (its post-processing runs on
/// DataFusion). Depends on the plan only, never on a value.
pub(crate) fn passthrough(dp: &DpPlan, noisy: &RecordBatch) -> Option<(SchemaRef, Vec<RecordBatch>)> {
    let columns = chosen_columns(&dp.original, dp.agg_schema.fields().len())?;
    let source = noisy.schema();
    let names = dp.original.schema().fields().iter().map(|f| f.name().clone());
    let mut fields = Vec::with_capacity(columns.len());
    let mut arrays = Vec::with_capacity(columns.len());
    for (name, i) in names.zip(&columns) {
        let f = source.fields().get(*i)?;
        // Neither a key nor an aggregate is ever a hidden column; a plan naming one is left to DataFusion.
        if is_interval_column(f.name()) {
            return None;
        }
        fields.push(Field::new(name, f.data_type().clone(), f.is_nullable()));
        arrays.push(Arc::clone(noisy.column(*i)));
    }
    // The hidden interval columns, carried through every projection to the end (see `post_plan`).
    for (f, a) in source.fields().iter().zip(noisy.columns()).filter(|(f, _)| is_interval_column(f.name())) {
        fields.push(f.as_ref().clone());
        arrays.push(Arc::clone(a));
    }
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(Arc::clone(&schema), arrays).ok()?;
    Some((schema, vec![batch]))
}

/// For a plan that is only projections of columns and subquery aliases down to an aggregate over no other
/// aggregate (the aggregate [`post_plan`] replaces), the aggregate's column (`0..width`) behind each output
/// column; `None` for any other plan.
fn chosen_columns(plan: &LogicalPlan, width: usize) -> Option<Vec<usize>> {
    match plan {
        LogicalPlan::Aggregate(a) => {
            let nested = a.input.exists(|n| Ok(matches!(n, LogicalPlan::Aggregate(_)))).ok()?;
            (!nested && plan.schema().fields().len() == width).then(|| (0..width).collect())
        }
        LogicalPlan::SubqueryAlias(s) => chosen_columns(&s.input, width),
        LogicalPlan::Projection(p) => {
            let below = chosen_columns(&p.input, width)?;
            let input = p.input.schema();
            p.expr
                .iter()
                .map(|mut e| {
                    // A column under any number of aliases (the analyzer names `COUNT(*) AS n` twice).
                    while let Expr::Alias(a) = e {
                        e = a.expr.as_ref();
                    }
                    let Expr::Column(column) = e else { return None };
                    below.get(input.index_of_column(column).ok()?).copied()
                })
                .collect()
        }
        _ => None,
    }
}

/// Why post-processing did not produce a result.
pub(crate) enum PostFailure {
    /// It cannot be planned (whatever the values): refused before the debit.
    Planning(DpError),
    /// It failed while running on these values.
    Running(datafusion::error::DataFusionError),
}

impl DpSession {
    /// Plans and runs post-processing over a noisy table; returns the output schema and batches.
    pub(crate) async fn run_post(
        &self,
        dp: &DpPlan,
        noisy: RecordBatch,
    ) -> std::result::Result<(SchemaRef, Vec<RecordBatch>), PostFailure> {
        let plan = bounded_post_plan(dp, noisy).map_err(PostFailure::Planning)?;
        let df = self.post.execute_logical_plan(plan).await.map_err(|e| PostFailure::Planning(post_planning(e)))?;
        let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
        let task = Arc::new(df.task_ctx());
        let physical = df.create_physical_plan().await.map_err(|e| PostFailure::Planning(post_planning(e)))?;
        let batches = datafusion::physical_plan::collect(physical, task).await.map_err(PostFailure::Running)?;
        Ok((schema, batches))
    }

    /// Checks post-processing before anything is spent: its plan is bounded in size ([`bounded_post_plan`]) and,
    /// unless it [`cannot_fail`], run on public stand-ins for the noisy table (one cell, every measurement 1, then
    /// every measurement 1 000 003). A query whose post-processing cannot be planned, or fails on both, is refused:
    /// it would almost surely fail on the real noisy values too. Everything here depends on the query and the
    /// policy only.
    pub(crate) async fn check_post_processing(&self, dp: &DpPlan) -> Result<()> {
        // A key of each domain, or for a key without one a default value of its type (its released values are
        // only known after the debit).
        let key: Vec<ScalarValue> = dp
            .keys
            .iter()
            .enumerate()
            .map(|(i, k)| match k.domain.first() {
                Some(v) => Ok(v.clone()),
                None => ScalarValue::new_default(dp.agg_schema.field(i).data_type()).map_err(engine),
            })
            .collect::<Result<_>>()?;
        let stand_in = |v: i128| noisy_batch(dp, vec![key.clone()], &[vec![v; dp.measures.len()]], &[]);
        if cannot_fail(&dp.original) {
            return bounded_post_plan(dp, stand_in(1)?).map(|_| ());
        }
        let mut failure = None;
        for v in [1i128, 1_000_003] {
            match self.run_post(dp, stand_in(v)?).await {
                Ok(_) => return Ok(()),
                Err(PostFailure::Planning(e)) => return Err(e),
                Err(PostFailure::Running(e)) => failure = failure.or(Some(e)),
            }
        }
        Err(DpError::Refused(Refusal::PostProcessingFails {
            message: failure.map(|e| crate::refusal::engine_message(&e)).unwrap_or_default(),
        }))
    }
}

/// The post-processing plan over `noisy`, every value and column of it bounded in size for the query's full
/// number of cells ([`size::check_post_sizes`]), before anything evaluates it.
fn bounded_post_plan(dp: &DpPlan, noisy: RecordBatch) -> Result<LogicalPlan> {
    // For keys without a domain, the rows are the keys released: a noisy number, public once drawn.
    let rows = (noisy.num_rows() as u64).max(dp.cells().unwrap_or(0));
    // Bounds of the scan's columns: keys from their public domains, or for a selected key from the values released
    // (public once drawn); the measurements are numbers.
    let key_bytes: Vec<u64> = dp
        .keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            if !k.selected {
                return Ok(k.domain.iter().map(size::literal_bytes).max().unwrap_or(0));
            }
            let column = noisy.column(i);
            (0..noisy.num_rows())
                .map(|r| ScalarValue::try_from_array(column, r).map(|v| size::literal_bytes(&v)).map_err(engine))
                .try_fold(0, |acc, b| b.map(|b| acc.max(b)))
        })
        .collect::<Result<_>>()?;
    let plan = post_plan(dp, noisy)?;
    size::check_post_sizes(&plan, rows, &|i: usize| key_bytes.get(i).copied())?;
    Ok(plan)
}

/// Whether the post-processing part of `plan` (the nodes above its aggregate) can be seen not to fail without
/// running it: only projections, aliases, filters (HAVING) and sorts, all of whose expressions are total
/// ([`crate::plan::safety::total`]: no function that can fail, no amplifying one, no LIMIT for the optimizer to
/// reject). The common case, `SELECT COUNT(*) AS n ...`, needs no dry run.
fn cannot_fail(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Aggregate(_) => true,
        LogicalPlan::Projection(_) | LogicalPlan::SubqueryAlias(_) | LogicalPlan::Filter(_) | LogicalPlan::Sort(_) => {
            let [input] = plan.inputs()[..] else { return false };
            let mut total = true;
            let _ = plan.apply_expressions(|e| {
                total &= crate::plan::safety::total(e, input.schema()).is_ok();
                Ok(TreeNodeRecursion::Continue)
            });
            total && cannot_fail(input)
        }
        _ => false,
    }
}

fn post_planning(e: datafusion::error::DataFusionError) -> DpError {
    DpError::Refused(Refusal::PostProcessingPlan { message: crate::refusal::engine_message(&e) })
}

/// A post-processed result: its schema and batches.
#[cfg(any(test, feature = "test-util"))]
pub(crate) type PostResult = (SchemaRef, Vec<RecordBatch>);

#[cfg(any(test, feature = "test-util"))]
impl DpSession {
    /// **Tests only.** Prepares `sql` (nothing spent, nothing read), makes a stand-in noisy table for it (every
    /// cell of its domain, values drawn from a generator seeded with `seed`, not from any data), and
    /// post-processes it both ways: the shortcut of a plan with nothing above its aggregate ([`passthrough`],
    /// `None` when it does not apply) and DataFusion ([`DpSession::run_post`]).
    pub async fn post_paths_for_tests(&self, sql: &str, seed: u64) -> Result<(Option<PostResult>, PostResult)> {
        use rand::{Rng, SeedableRng};
        let prepared = self.prepare(sql, &[]).await?;
        let dp = &prepared.dp;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let keys = domain_product(dp);
        let values: Vec<Vec<i128>> =
            keys.iter().map(|_| dp.measures.iter().map(|_| rng.random_range(-1000..100_000)).collect()).collect();
        let half: Vec<Halves> = dp
            .measures
            .iter()
            .map(|_| {
                let h = rng.random_range(0.5..50.0);
                Halves { sqrt: h, cbrt: h * 1.2, std: h / 2.0, laplace: false, confidence: 0.95 }
            })
            .collect();
        let noisy = noisy_batch(dp, keys, &values, &half)?;
        let short = passthrough(dp, &noisy);
        let full = self.run_post(dp, noisy).await.map_err(|e| match e {
            PostFailure::Planning(e) => e,
            PostFailure::Running(e) => engine(e),
        })?;
        Ok((short, full))
    }
}
