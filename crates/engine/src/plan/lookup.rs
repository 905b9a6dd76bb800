//! Public tables, and the joins of a private table with them, rewritten as lookups.
//!
//! A public table (`[tables.NAME] public = true`) has no privacy unit and no noise: its rows are public (a list of
//! regions, a product catalogue, a code list). It is read once into memory when the session opens, at most
//! [`MAX_PUBLIC_ROWS`] rows, and the columns whose values are unique are noted then.
//!
//! **Joins.** `private ⋈ public` (INNER, or LEFT from the private side) with one equality between an expression of
//! the private side and a column that is unique in the public table is answered as what it is, a lookup: each
//! private row gains the public columns of the one public row whose key it holds (NULL when none does), and an
//! INNER join keeps only the private rows that found one. [`inline_public_joins`] rewrites every such join of the
//! analyst's plan into a projection of [`PublicLookup`] calls (and, for INNER, a filter) over the private side,
//! before the plan is validated and bounded, so the bounding, the safety checks and the cluster codec see one
//! chain over one private table as for any other query.
//!
//! **Privacy.** Under add/remove of one privacy unit (all its rows), the rewrite maps each private row to at most
//! one output row computed from that row and public data only: the neighbouring datasets' joined rows differ by
//! the joined images of that unit's rows and nothing else. The per-unit bounds (rows per unit, groups per unit,
//! clamped values) are applied **after** the lookup, to the joined rows, so every sensitivity is the one of a
//! single-table query. A many-to-one join would not be a map of private rows (one private row could become many,
//! multiplying a unit's contribution), which is why the key must be unique in the public table; that is a property
//! of public data, checked when the table is registered and again for the join key's type.

use crate::error::{DpError, Result, engine};
use crate::plan::validate;
use crate::refusal::Refusal;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, UInt32Array};
use datafusion::arrow::buffer::{BooleanBuffer, NullBuffer};
use datafusion::arrow::compute::{cast, concat_batches, take};
use datafusion::arrow::datatypes::{DataType, Int64Type, SchemaRef};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, JoinType, ScalarValue, TableReference, exec_err};
use datafusion::logical_expr::{
    ColumnarValue, Expr, Filter, Join, LogicalPlan, Projection, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature, Volatility,
};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

/// Most rows a public table may have (it is held in memory, and a lookup index is built over its keys).
pub const MAX_PUBLIC_ROWS: usize = 1_000_000;

/// A public table, in memory: its rows, which of its columns hold unique values (the join keys), and the size of
/// the largest value of each column (what bounds a query over it before it runs: [`crate::plan::size`]).
#[derive(Debug)]
pub struct PublicTable {
    name: String,
    rows: RecordBatch,
    unique: BTreeSet<String>,
    /// Bytes of the largest value of each column, by index.
    value_bytes: Vec<u64>,
    /// Lookup indexes by key column and key type, built on first use.
    indexes: Mutex<HashMap<(String, DataType), Arc<KeyIndex>>>,
}

/// Bytes of the largest value of `column` (its type's width for a fixed-width type; 0 without values).
fn largest_value(column: &ArrayRef) -> Result<u64> {
    fn longest<'a, T: AsRef<[u8]> + ?Sized + 'a>(values: impl Iterator<Item = Option<&'a T>>) -> u64 {
        values.flatten().map(|v| v.as_ref().len() as u64).max().unwrap_or(0)
    }
    Ok(match column.data_type() {
        DataType::Utf8 => longest(column.as_string::<i32>().iter()),
        DataType::LargeUtf8 => longest(column.as_string::<i64>().iter()),
        DataType::Utf8View => longest(column.as_string_view().iter()),
        DataType::Binary => longest(column.as_binary::<i32>().iter()),
        DataType::LargeBinary => longest(column.as_binary::<i64>().iter()),
        DataType::BinaryView => longest(column.as_binary_view().iter()),
        dt => match crate::plan::size::fixed_width(dt) {
            Some(w) => w,
            None => (0..column.len())
                .map(|i| ScalarValue::try_from_array(column, i).map(|v| crate::plan::size::literal_bytes(&v)))
                .try_fold(0, |acc, b| b.map(|b| acc.max(b)))
                .map_err(engine)?,
        },
    })
}

/// Whether values of this type can be a join key: they compare exactly (no floats, where -0.0 = 0.0 and NaN ≠ NaN).
fn joinable(dt: &DataType) -> bool {
    dt.is_integer()
        || matches!(
            dt,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Boolean | DataType::Date32
        )
        || matches!(dt, DataType::Timestamp(_, None))
}

impl PublicTable {
    /// The public table `name` of `batches` (all of its rows, of `schema`); refused above [`MAX_PUBLIC_ROWS`].
    pub fn new(name: &str, schema: SchemaRef, batches: &[RecordBatch]) -> Result<Self> {
        let rows = concat_batches(&schema, batches)
            .map_err(|e| DpError::Config(format!("[tables.{name}] cannot hold the public table: {e}")))?;
        if rows.num_rows() > MAX_PUBLIC_ROWS {
            return Err(DpError::Config(format!(
                "[tables.{name}] a public table is held in memory, at most {MAX_PUBLIC_ROWS} rows; this one has {}. \
                 Declare a large table private (with its privacy unit), or keep in the public file only the rows \
                 that queries join with",
                rows.num_rows()
            )));
        }
        let mut unique = BTreeSet::new();
        for (field, column) in schema.fields().iter().zip(rows.columns()) {
            if joinable(field.data_type()) && KeyIndex::build(column, field.data_type())?.is_some() {
                unique.insert(field.name().clone());
            }
        }
        let value_bytes = rows.columns().iter().map(largest_value).collect::<Result<_>>()?;
        Ok(PublicTable { name: name.to_string(), rows, unique, value_bytes, indexes: Mutex::default() })
    }

    /// Bytes of the largest value of column `i` (public data: the rows are known exactly), `None` for no column.
    pub fn value_bytes(&self, i: usize) -> Option<u64> {
        self.value_bytes.get(i).copied()
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// All of its rows.
    pub fn rows(&self) -> &RecordBatch {
        &self.rows
    }

    /// The columns whose non-NULL values are all different (of a type that compares exactly): the columns a
    /// private table can be joined on.
    pub fn unique_columns(&self) -> impl Iterator<Item = &str> {
        self.unique.iter().map(String::as_str)
    }

    fn column(&self, name: &str) -> Result<&ArrayRef> {
        self.rows.column_by_name(name).ok_or_else(|| DpError::Internal(format!("{}.{name}: no such column", self.name)))
    }

    /// The lookup index of `key` with values of `key_type` (the join key's type), or `None` if the column's values
    /// are not unique as that type.
    fn index(&self, key: &str, key_type: &DataType) -> Result<Option<Arc<KeyIndex>>> {
        let id = (key.to_string(), key_type.clone());
        if let Some(i) = self.indexes.lock().ok().and_then(|m| m.get(&id).cloned()) {
            return Ok(Some(i));
        }
        if !self.unique.contains(key) || !joinable(key_type) {
            return Ok(None);
        }
        let Some(index) = KeyIndex::build(self.column(key)?, key_type)? else { return Ok(None) };
        let index = Arc::new(index);
        if let Ok(mut m) = self.indexes.lock() {
            m.insert(id, Arc::clone(&index));
        }
        Ok(Some(index))
    }
}

/// The rows of a public key column, by value: which row holds each key.
#[derive(Debug)]
pub(crate) struct KeyIndex {
    /// The key column, as the join key's type.
    keys: ArrayRef,
    converter: RowConverter,
    rows: HashMap<Box<[u8]>, u32>,
    /// For integer keys in a narrow range (codes, states, small ids): the row of each key `lo + i` at `i`
    /// ([`NO_ROW`] for none), so that a probe is an array read rather than an encoding and a hash.
    dense: Option<(i64, Vec<u32>)>,
}

/// No public row holds this key (in [`KeyIndex`]'s dense table).
const NO_ROW: u32 = u32::MAX;

/// The dense table of [`KeyIndex`] for integer `keys` (already unique) spanning at most `DENSE_SPAN` values or four
/// times their number; None for other keys.
fn dense_rows(keys: &ArrayRef) -> Option<(i64, Vec<u32>)> {
    /// Keys up to this span always get a dense table (4 MiB at most).
    const DENSE_SPAN: i64 = 1 << 20;
    if !keys.data_type().is_integer() || *keys.data_type() == DataType::UInt64 {
        return None;
    }
    let ints = cast(keys, &DataType::Int64).ok()?;
    let ints = ints.as_primitive_opt::<Int64Type>()?;
    let (lo, hi) = (ints.iter().flatten().min()?, ints.iter().flatten().max()?);
    let span = hi.checked_sub(lo)?.checked_add(1)?;
    if span > DENSE_SPAN.max(4 * ints.len() as i64) || ints.len() >= NO_ROW as usize {
        return None;
    }
    let mut rows = vec![NO_ROW; usize::try_from(span).ok()?];
    for (i, k) in ints.iter().enumerate() {
        if let Some(k) = k {
            *rows.get_mut(usize::try_from(k - lo).ok()?)? = i as u32;
        }
    }
    Some((lo, rows))
}

impl KeyIndex {
    /// The index of `keys` as values of `key_type`; `None` if two rows hold the same (non-NULL) key. NULL keys match
    /// nothing (SQL's `=`).
    pub(crate) fn build(keys: &ArrayRef, key_type: &DataType) -> Result<Option<Self>> {
        let arrow = |e: datafusion::arrow::error::ArrowError| engine(e.into());
        let keys = cast(keys, key_type).map_err(arrow)?;
        let converter = RowConverter::new(vec![SortField::new(key_type.clone())]).map_err(arrow)?;
        let encoded = converter.convert_columns(std::slice::from_ref(&keys)).map_err(arrow)?;
        let mut rows = HashMap::with_capacity(keys.len());
        for i in 0..keys.len() {
            if keys.is_valid(i) && rows.insert(Box::from(encoded.row(i).as_ref()), i as u32).is_some() {
                return Ok(None);
            }
        }
        let dense = dense_rows(&keys);
        Ok(Some(KeyIndex { keys, converter, rows, dense }))
    }

    /// The key column, as the join key's type.
    pub(crate) fn keys(&self) -> &ArrayRef {
        &self.keys
    }

    /// For each value of `probe`, the row that holds it as a key; NULL where none does (and for NULL).
    fn positions(&self, probe: &ArrayRef) -> datafusion::common::Result<UInt32Array> {
        let probe = cast(probe, self.keys.data_type())?;
        if let Some((lo, rows)) = &self.dense {
            // The probe has the keys' integer type, which widens exactly to Int64.
            let ints = cast(&probe, &DataType::Int64)?;
            let Some(ints) = ints.as_primitive_opt::<Int64Type>() else { return exec_err!("an integer key") };
            // One tight pass over the values (NULL slots hold arbitrary values: they read some row or none, and
            // the probe's validity masks them below), then the misses as NULLs: no per-value `Option`.
            let span = rows.len() as u64;
            let mut at: Vec<u32> = ints
                .values()
                .iter()
                .map(|&k| {
                    // (k − lo) mod 2⁶⁴ < span exactly when lo ≤ k ≤ hi (hi = lo + span − 1 does not overflow).
                    let i = k.wrapping_sub(*lo) as u64;
                    if i < span { rows[i as usize] } else { NO_ROW }
                })
                .collect();
            let found = BooleanBuffer::collect_bool(at.len(), |i| at[i] != NO_ROW);
            let nulls = NullBuffer::union(ints.nulls(), Some(&NullBuffer::new(found)));
            if nulls.is_some() {
                at.iter_mut().filter(|r| **r == NO_ROW).for_each(|r| *r = 0);
            }
            return Ok(UInt32Array::new(at.into(), nulls));
        }
        let encoded = self.converter.convert_columns(std::slice::from_ref(&probe))?;
        Ok((0..probe.len())
            .map(|i| if probe.is_valid(i) { self.rows.get(encoded.row(i).as_ref()).copied() } else { None })
            .collect())
    }
}

/// `dp_lookup_<table>_<column>(key)`: the value of a public table's column in the row whose (unique) key equals
/// `key`, NULL when no row does. Total: every key, of the key's type, has an answer.
#[derive(Debug)]
pub(crate) struct PublicLookup {
    name: String,
    /// `table.column`, for labels and refusals.
    label: String,
    index: Arc<KeyIndex>,
    values: ArrayRef,
    signature: Signature,
}

impl PartialEq for PublicLookup {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && Arc::ptr_eq(&self.index, &other.index) && Arc::ptr_eq(&self.values, &other.values)
    }
}
impl Eq for PublicLookup {}
impl std::hash::Hash for PublicLookup {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}

impl PublicLookup {
    /// The lookup of `values` (a column `label` = `table.column`) by `index`, under the function name `name`.
    pub(crate) fn udf(name: String, label: String, index: Arc<KeyIndex>, values: ArrayRef) -> ScalarUDF {
        let signature = Signature::exact(vec![index.keys.data_type().clone()], Volatility::Immutable);
        ScalarUDF::new_from_impl(PublicLookup { name, label, index, values, signature })
    }

    /// The public column, `table.column`.
    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    /// Its parts, for the cluster codec: the name, the label, the key column and the looked-up column.
    pub(crate) fn parts(&self) -> (&str, &str, &ArrayRef, &ArrayRef) {
        (&self.name, &self.label, self.index.keys(), &self.values)
    }

    /// The distinct non-NULL values of the looked-up column, in order: the domain of a GROUP BY on it.
    pub(crate) fn domain(&self) -> Result<Vec<ScalarValue>> {
        let mut out = Vec::with_capacity(self.values.len());
        for i in 0..self.values.len() {
            if self.values.is_valid(i) {
                out.push(ScalarValue::try_from_array(&self.values, i).map_err(engine)?);
            }
        }
        out.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        out.dedup();
        Ok(out)
    }
}

impl ScalarUDFImpl for PublicLookup {
    fn name(&self) -> &str {
        &self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> datafusion::common::Result<DataType> {
        Ok(self.values.data_type().clone())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> datafusion::common::Result<ColumnarValue> {
        let [key] = args.args.as_slice() else { return exec_err!("{} takes one argument", self.name) };
        let positions = self.index.positions(&key.to_array(args.number_rows)?)?;
        Ok(ColumnarValue::Array(take(self.values.as_ref(), &positions, None)?))
    }
}

/// The public lookup `e` calls, if it is one (through aliases).
pub(crate) fn as_lookup(e: &Expr) -> Option<&PublicLookup> {
    match validate::strip_aliases(e) {
        Expr::ScalarFunction(f) => f.func.inner().downcast_ref::<PublicLookup>(),
        _ => None,
    }
}

/// `plan` with every join of a private table with a public table (see the module docs) replaced by lookups.
/// Joins of another shape are refused here when a public table is in them (with what would make them answerable),
/// and left as they are otherwise (the validation refuses them). `public` gives the public table a scan names.
pub fn inline_public_joins(
    plan: LogicalPlan,
    public: &dyn Fn(&TableReference) -> Option<Arc<PublicTable>>,
) -> Result<LogicalPlan> {
    let (mut rewrote, mut refusal) = (false, None);
    let out = plan
        .transform_up(|node| {
            let LogicalPlan::Join(join) = node else {
                // Above a rewritten join, schemas are recomputed (a looked-up column may be NULL).
                return Ok(if rewrote { Transformed::yes(node.recompute_schema()?) } else { Transformed::no(node) });
            };
            match lookup_join(&join, public) {
                Ok(Some(p)) => {
                    rewrote = true;
                    Ok(Transformed::yes(p))
                }
                Ok(None) => Ok(Transformed::no(LogicalPlan::Join(join))),
                Err(e) => {
                    refusal = Some(e);
                    Ok(Transformed::new(LogicalPlan::Join(join), false, TreeNodeRecursion::Stop))
                }
            }
        })
        .map_err(engine)?;
    refusal.map_or(Ok(out.data), Err)
}

/// The public table `plan` reads, if it is one read as it is (through aliases and projections of its columns).
fn public_side(
    plan: &LogicalPlan,
    public: &dyn Fn(&TableReference) -> Option<Arc<PublicTable>>,
) -> Option<Arc<PublicTable>> {
    match plan {
        LogicalPlan::TableScan(scan) if scan.filters.is_empty() && scan.fetch.is_none() => public(&scan.table_name),
        LogicalPlan::SubqueryAlias(a) => public_side(&a.input, public),
        LogicalPlan::Projection(p) if p.expr.iter().all(|e| matches!(validate::strip_aliases(e), Expr::Column(_))) => {
            public_side(&p.input, public)
        }
        _ => None,
    }
}

/// Whether `plan` reads a public table anywhere.
fn reads_public(plan: &LogicalPlan, public: &dyn Fn(&TableReference) -> Option<Arc<PublicTable>>) -> bool {
    plan.exists(|n| Ok(matches!(n, LogicalPlan::TableScan(s) if public(&s.table_name).is_some()))).unwrap_or(true)
}

fn unsupported<T>(what: String) -> Result<T> {
    Err(DpError::Refused(Refusal::UnsupportedJoin { what }))
}

/// `join` as lookups, if it joins a private side with a public table; `None` if no public table is in it.
fn lookup_join(
    join: &Join,
    public: &dyn Fn(&TableReference) -> Option<Arc<PublicTable>>,
) -> Result<Option<LogicalPlan>> {
    let (left, right) = (public_side(&join.left, public), public_side(&join.right, public));
    let (table, public_left) = match (left, right) {
        (None, None) => {
            if reads_public(&join.left, public) || reads_public(&join.right, public) {
                return unsupported(
                    "a public table read through a filter, an aggregate or a subquery before the join".into(),
                );
            }
            return Ok(None);
        }
        (Some(_), Some(_)) => return unsupported("a join of two public tables below the aggregate".into()),
        (Some(t), None) => (t, true),
        (None, Some(t)) => (t, false),
    };
    let name = table.name().to_string();
    let keeps_private = match (join.join_type, public_left) {
        (JoinType::Inner, _) => false,
        (JoinType::Left, false) | (JoinType::Right, true) => true,
        (other, _) => {
            let kind = other.to_string().to_uppercase();
            return unsupported(format!(
                "a {kind} JOIN with the public table {name} (only INNER JOIN, or LEFT JOIN from the private table, \
                 keeps each private row as one row)"
            ));
        }
    };
    let (private_plan, public_plan) = if public_left { (&join.right, &join.left) } else { (&join.left, &join.right) };
    let Some((private_key, public_key)) = validate::equality(join, private_plan, public_plan) else {
        return unsupported(format!(
            "a join with the public table {name} on anything but one equality `private expression = public column`"
        ));
    };
    let key_column = match validate::strip_total_casts(public_key, public_plan.schema()) {
        Expr::Column(c) => validate::base_column(public_plan, c),
        _ => None,
    };
    let Some(key_column) = key_column else {
        return unsupported(format!("a join key `{public_key}` computed from the public table {name}"));
    };
    use datafusion::logical_expr::ExprSchemable;
    let key_type = private_key.get_type(private_plan.schema()).map_err(engine)?;
    if !joinable(&key_type) {
        return unsupported(format!(
            "a join with the public table {name} on a key of type {key_type} (join on integers, strings, booleans, \
             dates or timestamps, which compare exactly)"
        ));
    }
    let Some(index) = table.index(&key_column, &key_type)? else {
        return Err(DpError::Refused(Refusal::PublicKeyNotUnique {
            table: name,
            column: key_column,
            unique: table.unique_columns().map(str::to_string).collect(),
        }));
    };
    let lookup = |column: &str| -> Result<Expr> {
        let values = Arc::clone(table.column(column)?);
        let udf = PublicLookup::udf(
            format!("dp_lookup_{name}_{column}"),
            format!("{name}.{column}"),
            Arc::clone(&index),
            values,
        );
        Ok(Arc::new(udf).call(vec![private_key.clone()]))
    };
    let private_fields = private_plan.schema().fields().len();
    let mut exprs = Vec::with_capacity(join.schema.fields().len());
    for (i, (qualifier, field)) in join.schema.iter().enumerate() {
        let column = Column::new(qualifier.cloned(), field.name());
        let on_private = if public_left { i >= public_plan.schema().fields().len() } else { i < private_fields };
        if on_private {
            exprs.push(Expr::Column(column));
            continue;
        }
        let base = validate::base_column(public_plan, &column)
            .ok_or_else(|| DpError::Internal(format!("{column}: not a column of {name}")))?;
        exprs.push(lookup(&base)?.alias_qualified(qualifier.cloned(), field.name()));
    }
    let mut input = Arc::clone(private_plan);
    if !keeps_private {
        let found = Expr::IsNotNull(Box::new(lookup(&key_column)?));
        input = Arc::new(LogicalPlan::Filter(Filter::try_new(found, input).map_err(engine)?));
    }
    Ok(Some(LogicalPlan::Projection(Projection::try_new(exprs, input).map_err(engine)?)))
}

/// The public lookup that computes `col` (a column of `plan`'s output), following it down through filters,
/// aliases and projections as [`validate::base_column`] does.
pub(crate) fn lookup_column<'a>(plan: &'a LogicalPlan, col: &Column) -> Option<&'a PublicLookup> {
    let idx = plan.schema().index_of_column(col).ok()?;
    match plan {
        LogicalPlan::Filter(f) => lookup_column(&f.input, col),
        LogicalPlan::SubqueryAlias(a) => {
            let (q, f) = a.input.schema().qualified_field(idx);
            lookup_column(&a.input, &Column::new(q.cloned(), f.name()))
        }
        LogicalPlan::Projection(p) => {
            let e = p.expr.get(idx)?;
            match validate::strip_aliases(e) {
                Expr::Column(c) => lookup_column(&p.input, c),
                _ => as_lookup(e),
            }
        }
        LogicalPlan::Join(j) => {
            let (side, c) = validate::join_side(j, idx);
            lookup_column(side, &c)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int32Array, Int64Array};

    fn positions(index: &KeyIndex, probe: ArrayRef) -> Vec<Option<u32>> {
        index.positions(&probe).unwrap().iter().collect()
    }

    /// Integer keys in a narrow range are found by an array read, keys far apart by the hash table: the same
    /// rows either way, NULL for absent keys, NULL probes and keys outside the range (at the ends of i64 too).
    #[test]
    fn dense_and_hashed_keys_find_the_same_rows() {
        let probe: ArrayRef = Arc::new(Int64Array::from(vec![
            Some(3),
            Some(4),
            Some(9),
            None,
            Some(-1),
            Some(i64::MAX),
            Some(i64::MIN),
            Some(5),
        ]));
        let narrow: ArrayRef = Arc::new(Int64Array::from(vec![Some(5), Some(3), Some(9), None]));
        let index = KeyIndex::build(&narrow, &DataType::Int64).unwrap().unwrap();
        assert!(index.dense.is_some());
        let want = vec![Some(1), None, Some(2), None, None, None, None, Some(0)];
        assert_eq!(positions(&index, Arc::clone(&probe)), want);
        let wide: ArrayRef = Arc::new(Int64Array::from(vec![Some(5), Some(3), Some(9), Some(i64::MIN), Some(1 << 40)]));
        let index = KeyIndex::build(&wide, &DataType::Int64).unwrap().unwrap();
        assert!(index.dense.is_none());
        let want = vec![Some(1), None, Some(2), None, None, None, Some(3), Some(0)];
        assert_eq!(positions(&index, probe), want);
        // Int32 keys and probes; a repeated key is no index at all.
        let keys: ArrayRef = Arc::new(Int32Array::from(vec![-2, 0, 7]));
        let index = KeyIndex::build(&keys, &DataType::Int32).unwrap().unwrap();
        assert!(index.dense.is_some());
        assert_eq!(positions(&index, Arc::new(Int32Array::from(vec![7, -2, 1]))), vec![Some(2), Some(0), None]);
        // Every key found (no NULLs at all); a NULL probe whose slot holds a present key finds nothing.
        assert_eq!(positions(&index, Arc::new(Int32Array::from(vec![7, -2]))), vec![Some(2), Some(0)]);
        let masked = Int32Array::new(vec![0, 7].into(), Some(NullBuffer::from(vec![false, true])));
        assert_eq!(positions(&index, Arc::new(masked)), vec![None, Some(2)]);
        let repeated: ArrayRef = Arc::new(Int32Array::from(vec![1, 1]));
        assert!(KeyIndex::build(&repeated, &DataType::Int32).unwrap().is_none());
    }
}
