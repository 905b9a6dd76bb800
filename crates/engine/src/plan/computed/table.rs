//! `dp_table(x)`: a computed value or key of one clamped integer column, computed once for each of the column's
//! values at planning time and looked up row by row ([`Tabulated`]).
//!
//! A computed expression of one integer column with bounds `[lo, hi]` (`age / 10 * 10` over `age` in `[0, 100]`)
//! reads that column only through its clamp `dp_clamp(age, lo, hi)` ([`super::Clamp`]): its value on a row is a
//! function of `clamp(age)` alone, one of at most `hi − lo + 2` values (NULL included). When that is at most
//! [`MAX_TABULATED`], DataFusion evaluates the expression once on each of them, and the plan that runs reads the
//! table: one pass that clamps and looks up, instead of the clamp and every operation of the expression
//! (an integer division is a hardware division per row).
//!
//! **Privacy claim: none of its own.** The table is the expression's own output on every value its clamped input
//! can take, computed by DataFusion from the policy's bounds before any row is read, so `dp_table(x)` equals the
//! expression on every row of every dataset: the bounds, the domain and the sensitivity of the computed column
//! ([`super`]) are unchanged, and so is every released value. [`crate::plan::interval`] bounds it by its table's
//! values, on the plan that runs.

use datafusion::arrow::array::{Array, ArrayRef, AsArray, UInt32Array};
use datafusion::arrow::datatypes::{ArrowNativeTypeOp, ArrowPrimitiveType, DataType};
use datafusion::common::{Result, exec_err};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use std::sync::Arc;

/// Most values (NULL included) of the one input of a computed column that [`Tabulated`] tabulates.
pub const MAX_TABULATED: usize = 4097;

/// `dp_table(x)`: `table[clamp(x, lo, lo + n − 1) − lo]` for a non-NULL integer `x`, `table[n]` for NULL, where
/// `n + 1` is the table's length (see the module docs). Total on every value.
#[derive(Debug)]
pub struct Tabulated {
    signature: Signature,
    lo: i64,
    table: ArrayRef,
}

impl PartialEq for Tabulated {
    fn eq(&self, other: &Self) -> bool {
        self.lo == other.lo && self.table.as_ref() == other.table.as_ref()
    }
}
impl Eq for Tabulated {}
impl std::hash::Hash for Tabulated {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.lo.hash(state);
        self.table.len().hash(state);
    }
}

impl Tabulated {
    /// The function of `table` (the values for `lo, lo + 1, …`, then the value for NULL: at least two entries).
    pub fn udf(lo: i64, table: ArrayRef) -> ScalarUDF {
        let signature = Signature::any(1, Volatility::Immutable);
        ScalarUDF::new_from_impl(Tabulated { signature, lo, table })
    }

    /// `dp_table(x)` of `table` from `lo`.
    pub fn call(x: Expr, lo: i64, table: ArrayRef) -> Expr {
        Expr::ScalarFunction(datafusion::logical_expr::expr::ScalarFunction::new_udf(
            Arc::new(Self::udf(lo, table)),
            vec![x],
        ))
    }

    /// The smallest input and the table.
    pub fn parts(&self) -> (i64, &ArrayRef) {
        (self.lo, &self.table)
    }

    /// The table's value for each row of `x`, whose positions (for its non-NULL rows) are `at`. Without NULL
    /// inputs, or when NULL maps to NULL and no other input does, the values are looked up in the non-NULL inputs'
    /// part of the table, and the NULL rows (if any) are `x`'s: a gather of values only, no bit of validity per
    /// row. Otherwise NULL rows are pointed at the last entry.
    fn look_up(&self, x: &dyn Array, at: UInt32Array) -> Result<ArrayRef> {
        use datafusion::arrow::array::make_array;
        let n = self.table.len() - 1;
        let values = self.table.slice(0, n);
        let Some(nulls) = x.logical_nulls() else { return Ok(datafusion::arrow::compute::take(&values, &at, None)?) };
        if self.table.is_null(n) && values.null_count() == 0 {
            let out = datafusion::arrow::compute::take(&values, &at, None)?;
            return Ok(make_array(out.into_data().into_builder().nulls(Some(nulls)).build()?));
        }
        let at: UInt32Array =
            at.values().iter().enumerate().map(|(i, &p)| if nulls.is_null(i) { n as u32 } else { p }).collect();
        Ok(datafusion::arrow::compute::take(&self.table, &at, None)?)
    }

    /// The smallest and largest inputs (the table holds one value for each, and then NULL's).
    fn range(&self) -> (i64, i64) {
        let n = self.table.len().saturating_sub(2);
        (self.lo, self.lo.saturating_add(n as i64))
    }
}

/// The position in a table of inputs `lo..=hi` of each row of `x`, an integer array of native type `N`, in one
/// branch-free pass (a NULL row's position is arbitrary: see [`Tabulated::look_up`]).
fn positions<T: ArrowPrimitiveType<Native = N>, N>(x: &dyn Array, (lo, hi): (i64, i64)) -> Result<UInt32Array>
where
    N: ArrowNativeTypeOp + TryFrom<i64> + Ord,
{
    let (Ok(l), Ok(h)) = (N::try_from(lo), N::try_from(hi)) else {
        return exec_err!("dp_table: inputs {lo} to {hi} are not values of {}", x.data_type());
    };
    let values = x.as_primitive::<T>().values();
    Ok(values.iter().map(|&v| v.max(l).min(h).sub_wrapping(l).as_usize() as u32).collect())
}

impl ScalarUDFImpl for Tabulated {
    fn name(&self) -> &str {
        "dp_table"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match args {
            [x] if x.is_integer() && self.table.len() >= 2 => Ok(self.table.data_type().clone()),
            _ => exec_err!("dp_table takes one integer column, not {args:?}"),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        use datafusion::arrow::datatypes::*;
        let [x] = args.args.as_slice() else { return exec_err!("dp_table takes one argument") };
        if self.table.len() < 2 {
            return exec_err!("dp_table: a table of {} values", self.table.len());
        }
        let x = x.to_array(args.number_rows)?;
        let range = self.range();
        let at = match x.data_type() {
            DataType::Int8 => positions::<Int8Type, _>(&x, range),
            DataType::Int16 => positions::<Int16Type, _>(&x, range),
            DataType::Int32 => positions::<Int32Type, _>(&x, range),
            DataType::Int64 => positions::<Int64Type, _>(&x, range),
            DataType::UInt8 => positions::<UInt8Type, _>(&x, range),
            DataType::UInt16 => positions::<UInt16Type, _>(&x, range),
            DataType::UInt32 => positions::<UInt32Type, _>(&x, range),
            DataType::UInt64 => positions::<UInt64Type, _>(&x, range),
            other => return exec_err!("dp_table of {other}"),
        }?;
        Ok(ColumnarValue::Array(self.look_up(&x, at)?))
    }
}

#[cfg(test)]
mod tests {
    use super::super::Rewrite;
    use super::*;
    use crate::plan::interval;
    use crate::policy::{ColumnPolicy, TablePolicy};
    use datafusion::arrow::array::{Int32Array, RecordBatch};
    use datafusion::arrow::datatypes::{Field, Schema};
    use datafusion::common::{DFSchema, ScalarValue};
    use datafusion::functions::{core, math};
    use datafusion::logical_expr::{LogicalPlan, cast, col, lit, when};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use std::collections::BTreeMap;

    /// A plan over `x: Int32` (NULLs allowed), with `x` bounded by `[lo, hi]` and `w: Int32` by `[0, 10^6]`.
    fn input() -> LogicalPlan {
        use datafusion::catalog::default_table_source::provider_as_source;
        use datafusion::datasource::empty::EmptyTable;
        let schema = Schema::new(vec![Field::new("x", DataType::Int32, true), Field::new("w", DataType::Int32, true)]);
        let table = provider_as_source(Arc::new(EmptyTable::new(Arc::new(schema))));
        datafusion::logical_expr::LogicalPlanBuilder::scan("t", table, None).unwrap().build().unwrap()
    }

    fn policy(lo: f64, hi: f64) -> TablePolicy {
        let columns = BTreeMap::from([
            ("x".to_string(), ColumnPolicy::Bounds { lo, hi }),
            ("w".to_string(), ColumnPolicy::Bounds { lo: 0.0, hi: 1e6 }),
        ]);
        TablePolicy::row_level(columns).unwrap()
    }

    /// A random expression of `x`: integer valued, or float or boolean valued at the top (`top`).
    fn expr(rng: &mut ChaCha8Rng, depth: u32, top: bool) -> Expr {
        let small = |rng: &mut ChaCha8Rng| lit(rng.random_range(-20i32..=20));
        if depth >= 3 || rng.random_bool(0.25) {
            return if rng.random_bool(0.7) { col("x") } else { small(rng) };
        }
        let d = depth + 1;
        let int = |rng: &mut ChaCha8Rng| expr(rng, d, false);
        match rng.random_range(0..if top { 13 } else { 9 }) {
            0 => int(rng) + int(rng),
            1 => int(rng) * int(rng),
            2 => int(rng) / lit(rng.random_range(1i32..=12)),
            3 => int(rng) % lit(rng.random_range(1i32..=12)),
            4 => math::abs().call(vec![int(rng)]),
            5 => when(int(rng).lt(small(rng)), int(rng)).otherwise(int(rng)).unwrap(),
            6 => core::coalesce().call(vec![int(rng), small(rng)]),
            7 => when(col("x").is_null(), small(rng)).otherwise(int(rng)).unwrap(),
            8 => core::nullif().call(vec![int(rng), small(rng)]),
            9 => cast(int(rng), DataType::Float64) / lit(rng.random_range(1.0..7.0)),
            10 => int(rng).gt(small(rng)),
            11 => when(int(rng).gt_eq(small(rng)), lit("a")).otherwise(lit("b")).unwrap().eq(lit("a")),
            _ => int(rng).eq(small(rng)).or(int(rng).lt(small(rng))),
        }
    }

    /// Rows of `x` inside and outside `[lo, hi]`, the type's extremes and NULL (or not).
    fn batch(rng: &mut ChaCha8Rng, (lo, hi): (i32, i32), schema: &DFSchema) -> RecordBatch {
        // A third of the batches without NULLs (a table is read another way without them).
        let nulls = rng.random_bool(2.0 / 3.0);
        let xs: Int32Array = (0..32)
            .map(|_| match rng.random_range(0..6) {
                0 if nulls => None,
                0 => Some(lo),
                1 => Some([i32::MIN, i32::MAX, lo - 1, hi + 1][rng.random_range(0..4)]),
                2 => Some(rng.random_range(-10_000..10_000)),
                _ => Some(rng.random_range(lo..=hi)),
            })
            .collect();
        let ws = Int32Array::from(vec![Some(7); 32]);
        RecordBatch::try_new(Arc::new(schema.as_arrow().clone()), vec![Arc::new(xs), Arc::new(ws)]).unwrap()
    }

    fn values(a: &ArrayRef) -> Vec<String> {
        (0..a.len()).map(|i| format!("{:?}", ScalarValue::try_from_array(a, i).unwrap())).collect()
    }

    /// For random expressions of one bounded integer column (arithmetic, integer division and remainder, ABS, CASE,
    /// COALESCE, NULLIF, casts to float, comparisons, `IS NULL`), clamped as the rewrite clamps them: the tabulated
    /// form of a number is a `dp_table` (a condition stays as it is), and DataFusion evaluates it to exactly the clamped expression's values (same type,
    /// same NULLs, same bits) on rows inside and outside the bounds, the type's extremes and NULL; the bounds
    /// derived for it hold its values. 3 000 expressions × 32 rows, seeded.
    #[test]
    fn a_table_computes_what_its_expression_computes() {
        let mut rng = ChaCha8Rng::seed_from_u64(4097);
        let plan = input();
        let (mut tabulated, mut cases) = (0, 0);
        for _ in 0..3_000 {
            let lo = rng.random_range(-300i32..300);
            let width = [3, 100, 4095][rng.random_range(0..3)];
            let hi = lo + rng.random_range(0..=width);
            let policy = policy(f64::from(lo), f64::from(hi));
            let cx = Rewrite::new(&plan, &policy, vec![]);
            let e = expr(&mut rng, 0, true);
            let clamped = cx.clamp(&e).unwrap();
            let Ok(bounds) = interval::derive(&clamped, cx.schema) else { continue };
            let table = cx.tabulated(&clamped).unwrap();
            if !clamped.any_column_refs() {
                assert_eq!(table, clamped);
                continue;
            }
            let batch = batch(&mut rng, (lo, hi), cx.schema);
            let run = |e: &Expr| {
                let p = interval::physical(e, cx.schema)?;
                p.evaluate(&batch).and_then(|v| v.into_array(batch.num_rows()))
            };
            // (The generator writes some expressions the analyzer would not let through, CASE branches of two
            // types: DataFusion cannot evaluate them, and they are left as they are.)
            let Ok(want) = run(&clamped) else {
                assert_eq!(table, clamped);
                continue;
            };
            // A condition, and the clamp alone, are computed, not looked up (see [`Rewrite::tabulated`]).
            let bare = matches!(&clamped, Expr::ScalarFunction(f) if f.func.inner().is::<super::super::Clamp>());
            if want.data_type() == &DataType::Boolean || bare {
                assert_eq!(table, clamped);
                continue;
            }
            let Expr::ScalarFunction(f) = &table else { panic!("{clamped} was not tabulated: {table}") };
            assert!(f.func.inner().is::<Tabulated>(), "{table}");
            tabulated += 1;
            let table_bounds = interval::derive(&table, cx.schema).unwrap();
            let got = run(&table).unwrap();
            assert_eq!(want.data_type(), got.data_type(), "{clamped}");
            assert_eq!(values(&want), values(&got), "{clamped} over {:?}", batch.column(0));
            // The table's bounds are its values': within the expression's own, and they hold.
            assert_eq!(table_bounds.may_null, got.null_count() > 0 || table_bounds.may_null);
            if let (interval::Range::Int(a, b), interval::Range::Int(c, d)) = (&bounds.range, &table_bounds.range) {
                assert!(a <= c && d <= b, "{clamped}: {table_bounds:?} not within {bounds:?}");
            }
            cases += batch.num_rows();
        }
        assert!(tabulated >= 1_500 && cases >= 48_000, "{tabulated} tabulated, {cases} cases");
    }

    /// What is not tabulated: two columns, a column of more than [`MAX_TABULATED`] values, text.
    #[test]
    fn only_one_column_of_few_values_is_tabulated() {
        let plan = input();
        let policy = policy(0.0, 100.0);
        let cx = Rewrite::new(&plan, &policy, vec![]);
        for e in
            [col("x") + col("w"), col("w") / lit(10), when(col("x").gt(lit(3)), lit("a")).otherwise(lit("b")).unwrap()]
        {
            let clamped = cx.clamp(&e).unwrap();
            assert_eq!(cx.tabulated(&clamped).unwrap(), clamped, "{e}");
        }
        let clamped = cx.clamp(&(col("x") / lit(10) * lit(10))).unwrap();
        let Expr::ScalarFunction(f) = cx.tabulated(&clamped).unwrap() else { panic!("not tabulated") };
        let t = f.func.inner().downcast_ref::<Tabulated>().unwrap();
        let (lo, table) = t.parts();
        assert_eq!((lo, table.len()), (0, 102));
    }
}
