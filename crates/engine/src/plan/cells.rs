//! GROUP BY cells as dense integers: `dp_cell(k1, …, kn)` and `dp_cell_key(cell)`.
//!
//! The keys' domains are public, so the cells of a GROUP BY are the public product of the domains, and each cell
//! has an index: `Σ index(kᵢ in domainᵢ) · strideᵢ` (the first key varies slowest). Before the per-unit bounding
//! ([`super::bound::per_unit`]) every row's keys are replaced by its cell index, whatever their types (strings,
//! several keys): the per-unit aggregation and the choice of each unit's cells then hash and compare one small
//! integer instead of strings, and the one-cell pick ([`super::pick`]) applies to every GROUP BY. After the noise
//! the keys are decoded from the index (`dp_cell_key`), on at most one row per cell.
//!
//! # Why it is safe
//! * **Nothing changes in what is released.** The index is a bijection between the domain's cells and
//!   `0..cells`; a row with a NULL key or a key outside its domain gets a NULL index and is dropped before any
//!   bounding, exactly as the domain filter dropped it ([`super::keys::scope`]). Equality of indices is equality
//!   of keys, so every unit's rows fall in the same cells as before.
//! * **Total.** Both functions are lookups that cannot fail on any value: an unknown or NULL key gives NULL, an
//!   index outside `0..cells` decodes to NULL. The plan-safety check ([`super::safety`]) accepts them for that.
//! * `dp_cell` is declared volatile only so that DataFusion's optimizer never copies it into a pushed-down filter
//!   (it would compute every row's index twice); its value depends on its arguments alone.

use crate::error::{DpError, Result};
use crate::plan::{GroupKey, int64_null_where};
use datafusion::arrow::array::builder::make_view;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, MAX_INLINE_VIEW_LEN};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float64Type, Int64Type};
use datafusion::common::{HashMap, ScalarValue, exec_err};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use std::hash::{Hash, Hasher};

/// Name of the cell-index column the bounding works on.
pub const CELL: &str = "__dp_cell";

/// One key's domain and how to look a value up in it.
#[derive(Debug)]
struct KeyIndex {
    /// The domain, as literals of the key column's type; a value's index is its position.
    domain: Vec<ScalarValue>,
    /// The index of each domain value, by kind of column (the fast paths compare without allocating).
    lookup: Lookup,
    /// Cells between two consecutive values of this key.
    stride: i64,
}

#[derive(Debug)]
enum Lookup {
    /// Strings, and the inline views of those of at most 12 bytes (a Utf8View row of such a string is compared
    /// as one 128-bit word, without reading its bytes); `few`, the views of a domain of at most [`FEW`] strings
    /// that are all inline, each at its index: a row's view is compared with each of them, without hashing.
    Strings {
        by_text: HashMap<String, i64>,
        by_view: HashMap<u128, i64>,
        few: Option<Vec<u128>>,
    },
    /// Integers within a span of at most [`DENSE_SPAN`]: the index of `min + i` at `table[i]` (NO_CELL for a value
    /// not in the domain).
    Dense {
        min: i64,
        table: Vec<i64>,
    },
    Ints(HashMap<i64, i64>),
    /// By the bits of the value as f64, with -0.0 read as 0.0 (as `=` compares floats).
    Floats(HashMap<u64, i64>),
    Other(HashMap<ScalarValue, i64>),
}

/// The index of a row without a cell (a NULL key or one outside its domain); cells are `0..cells`. -1, which
/// [`few_index`] counts on.
const NO_CELL: i64 = -1;

/// The widest integer domain (largest minus smallest value) looked up in a table rather than a hash map.
const DENSE_SPAN: i64 = 1 << 16;

/// The largest string domain whose Utf8View rows are compared with every value rather than looked up by hash.
const FEW: usize = 8;

/// A Utf8View view that holds its string inline (at most 12 bytes: the length, the bytes, zeros after them, as
/// Arrow requires of every valid array), which is then the string itself.
fn inline_view(view: u128) -> Option<u128> {
    (view as u32 <= MAX_INLINE_VIEW_LEN).then_some(view)
}

impl KeyIndex {
    fn new(domain: &[ScalarValue], stride: i64) -> Self {
        let positions = || domain.iter().enumerate().map(|(i, v)| (v, i as i64));
        let strings: Option<HashMap<String, i64>> =
            positions().map(|(v, i)| v.try_as_str().flatten().map(|s| (s.to_string(), i))).collect();
        let ints: Option<HashMap<i64, i64>> = positions()
            .map(|(v, i)| match v.cast_to(&DataType::Int64) {
                Ok(ScalarValue::Int64(Some(x))) if v.data_type().is_integer() => Some((x, i)),
                _ => None,
            })
            .collect();
        let floats: Option<HashMap<u64, i64>> = positions()
            .map(|(v, i)| match v.cast_to(&DataType::Float64) {
                Ok(ScalarValue::Float64(Some(x))) if v.data_type().is_floating() => Some((float_bits(x), i)),
                _ => None,
            })
            .collect();
        let lookup = match (strings, ints, floats) {
            (Some(by_text), _, _) => {
                let by_view: HashMap<u128, i64> = by_text
                    .iter()
                    .filter(|(s, _)| s.len() <= MAX_INLINE_VIEW_LEN as usize)
                    .map(|(s, &i)| (make_view(s.as_bytes(), 0, 0), i))
                    .collect();
                // Distinct strings, all inline: their views in domain order.
                let few = (by_view.len() == domain.len() && domain.len() <= FEW).then(|| {
                    let mut views = vec![0; domain.len()];
                    for (&v, &i) in &by_view {
                        views[i as usize] = v;
                    }
                    views
                });
                Lookup::Strings { by_text, by_view, few }
            }
            (None, Some(n), _) => dense(&n).unwrap_or(Lookup::Ints(n)),
            (None, None, Some(f)) => Lookup::Floats(f),
            _ => Lookup::Other(positions().map(|(v, i)| (v.clone(), i)).collect()),
        };
        KeyIndex { domain: domain.to_vec(), lookup, stride }
    }

    /// Adds each row's index in the domain, times the stride, to its cell in `cells`; a row whose key is NULL or
    /// outside the domain (or whose cell is NO_CELL already) gets NO_CELL.
    fn add_to(&self, values: &ArrayRef, cells: &mut [i64]) -> datafusion::common::Result<()> {
        let stride = self.stride;
        let text = |m: &HashMap<String, i64>, s: &str| m.get(s).copied().unwrap_or(NO_CELL);
        // Every integer type but UInt64 (whose values may not fit) is read as Int64.
        let int64 = values.data_type().is_integer() && values.data_type() != &DataType::UInt64;
        match &self.lookup {
            Lookup::Strings { by_text, by_view, few } => match values.data_type() {
                DataType::Utf8View => {
                    let a = values.as_string_view();
                    let views = a.views();
                    match few {
                        Some(few) => add_each(cells, a.nulls(), stride, |i| few_index(few, views[i])),
                        None => add_each(cells, a.nulls(), stride, |i| match inline_view(views[i]) {
                            Some(v) => by_view.get(&v).copied().unwrap_or(NO_CELL),
                            None => text(by_text, a.value(i)),
                        }),
                    }
                }
                DataType::LargeUtf8 => {
                    let a = values.as_string::<i64>();
                    add_each(cells, a.nulls(), stride, |i| text(by_text, a.value(i)));
                }
                _ => {
                    let utf8 = cast(values, &DataType::Utf8)?;
                    let a = utf8.as_string::<i32>();
                    add_each(cells, a.nulls(), stride, |i| text(by_text, a.value(i)));
                }
            },
            Lookup::Dense { min, table } if int64 => {
                let ints = cast(values, &DataType::Int64)?;
                let (xs, nulls) = (ints.as_primitive::<Int64Type>().values(), ints.nulls());
                add_each(cells, nulls, stride, |i| {
                    let at = xs[i].checked_sub(*min).and_then(|d| usize::try_from(d).ok());
                    at.and_then(|d| table.get(d)).copied().unwrap_or(NO_CELL)
                });
            }
            Lookup::Ints(m) if int64 => {
                let ints = cast(values, &DataType::Int64)?;
                let (xs, nulls) = (ints.as_primitive::<Int64Type>().values(), ints.nulls());
                add_each(cells, nulls, stride, |i| m.get(&xs[i]).copied().unwrap_or(NO_CELL));
            }
            Lookup::Floats(m) if values.data_type().is_floating() => {
                let floats = cast(values, &DataType::Float64)?;
                let (xs, nulls) = (floats.as_primitive::<Float64Type>().values(), floats.nulls());
                add_each(cells, nulls, stride, |i| m.get(&float_bits(xs[i])).copied().unwrap_or(NO_CELL));
            }
            // Dates and other types, and integers of a type the domain was not made for: one value at a time.
            _ => {
                for (row, cell) in cells.iter_mut().enumerate() {
                    let v = ScalarValue::try_from_array(values, row)?;
                    let p = match &self.lookup {
                        Lookup::Other(m) => m.get(&v).copied(),
                        _ => self.domain.iter().position(|d| *d == v).map(|i| i as i64),
                    };
                    add_index(cell, p.unwrap_or(NO_CELL), stride);
                }
            }
        }
        Ok(())
    }
}

/// Adds `index · stride` to `cell`, or makes it NO_CELL if either is NO_CELL (index · stride < cells ≤ MAX_CELLS:
/// no overflow).
fn add_index(cell: &mut i64, index: i64, stride: i64) {
    *cell = if *cell < 0 || index < 0 { NO_CELL } else { *cell + index * stride };
}

/// [`add_index`] for every row `i`, of `index(i)` (NO_CELL where `nulls` says NULL).
fn add_each(cells: &mut [i64], nulls: Option<&NullBuffer>, stride: i64, index: impl Fn(usize) -> i64) {
    for (i, cell) in cells.iter_mut().enumerate() {
        add_index(cell, if nulls.is_some_and(|n| n.is_null(i)) { NO_CELL } else { index(i) }, stride);
    }
}

/// The index of `view` among the inline views `few` of a domain (distinct strings), NO_CELL if none: each compared,
/// without a branch (-1 plus j + 1 for the one that matches). A view that is not inline holds a string of more
/// than 12 bytes, whose length (its low 32 bits) differs from every one of them.
fn few_index(few: &[u128], view: u128) -> i64 {
    few.iter().zip(1..).fold(NO_CELL, |at, (&d, j)| at + std::hint::select_unpredictable(d == view, j, 0))
}

/// A table lookup for an integer domain of a small span.
fn dense(index: &HashMap<i64, i64>) -> Option<Lookup> {
    let (min, max) = (*index.keys().min()?, *index.keys().max()?);
    let span = max.checked_sub(min).filter(|&s| s < DENSE_SPAN)?;
    let mut table = vec![NO_CELL; usize::try_from(span).ok()? + 1];
    for (&x, &i) in index {
        table[usize::try_from(x - min).ok()?] = i;
    }
    Some(Lookup::Dense { min, table })
}

/// The key of a float in a lookup: its bits, with -0.0 as 0.0 (NaN is in no domain: domains hold integers).
fn float_bits(x: f64) -> u64 {
    if x == 0.0 { 0 } else { x.to_bits() }
}

/// `dp_cell(k1, …, kn)`: the cell index of a row's keys, NULL when a key is NULL or outside its domain.
#[derive(Debug)]
pub struct CellIndex {
    keys: Vec<KeyIndex>,
    signature: Signature,
}

impl PartialEq for CellIndex {
    fn eq(&self, other: &Self) -> bool {
        self.keys.len() == other.keys.len()
            && self.keys.iter().zip(&other.keys).all(|(a, b)| a.domain == b.domain && a.stride == b.stride)
    }
}

impl Eq for CellIndex {}

impl Hash for CellIndex {
    fn hash<H: Hasher>(&self, state: &mut H) {
        for k in &self.keys {
            k.domain.hash(state);
            k.stride.hash(state);
        }
    }
}

/// The stride of each key: the product of the sizes of the domains after it.
fn strides(keys: &[GroupKey]) -> Result<Vec<i64>> {
    let mut strides = vec![1i64; keys.len()];
    for i in (0..keys.len().saturating_sub(1)).rev() {
        let len = i64::try_from(keys[i + 1].domain.len()).unwrap_or(i64::MAX);
        strides[i] = strides[i + 1]
            .checked_mul(len)
            .ok_or_else(|| DpError::Internal("the GROUP BY cells do not fit an integer index".into()))?;
    }
    Ok(strides)
}

impl CellIndex {
    /// `dp_cell(keys…) ` over the key columns.
    pub fn call(keys: &[GroupKey]) -> Result<Expr> {
        let parts = strides(keys)?.into_iter().zip(keys).map(|(s, k)| (k.domain.clone(), s)).collect();
        Ok(Self::from_parts(parts).call(keys.iter().map(|k| Expr::Column(k.column.clone())).collect()))
    }
}

impl CellIndex {
    /// Each key's domain and stride (for a plan sent to a cluster).
    pub(crate) fn parts(&self) -> Vec<(&[ScalarValue], i64)> {
        self.keys.iter().map(|k| (k.domain.as_slice(), k.stride)).collect()
    }

    /// The function of [`CellIndex::parts`].
    pub(crate) fn from_parts(parts: Vec<(Vec<ScalarValue>, i64)>) -> ScalarUDF {
        let signature = Signature::any(parts.len(), Volatility::Volatile);
        let keys = parts.iter().map(|(domain, stride)| KeyIndex::new(domain, *stride)).collect();
        ScalarUDF::new_from_impl(CellIndex { keys, signature })
    }
}

impl ScalarUDFImpl for CellIndex {
    fn name(&self) -> &str {
        "dp_cell"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> datafusion::common::Result<DataType> {
        Ok(DataType::Int64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> datafusion::common::Result<ColumnarValue> {
        let rows = args.number_rows;
        if args.args.len() != self.keys.len() {
            return exec_err!("dp_cell takes {} arguments", self.keys.len());
        }
        let mut cells = vec![0i64; rows];
        for (key, arg) in self.keys.iter().zip(&args.args) {
            key.add_to(&arg.to_array(rows)?, &mut cells)?;
        }
        Ok(ColumnarValue::Array(int64_null_where(cells, NO_CELL)))
    }
}

/// `dp_cell_key(cell)`: one key's value in a cell (NULL for an index outside `0..cells`).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct CellKey {
    domain: Vec<ScalarValue>,
    stride: i64,
    /// Number of cells: valid indices are `0..cells`.
    cells: i64,
    data_type: DataType,
    signature: Signature,
}

impl CellKey {
    /// The domain, stride, number of cells and type (for a plan sent to a cluster).
    pub(crate) fn parts(&self) -> (&[ScalarValue], i64, i64, &DataType) {
        (&self.domain, self.stride, self.cells, &self.data_type)
    }

    /// The function of [`CellKey::parts`].
    pub(crate) fn from_parts(domain: Vec<ScalarValue>, stride: i64, cells: i64, data_type: DataType) -> ScalarUDF {
        let signature = Signature::exact(vec![DataType::Int64], Volatility::Immutable);
        ScalarUDF::new_from_impl(CellKey { domain, stride, cells, data_type, signature })
    }

    /// The value of key `i` of `keys` in the cell `cell` (an index made by [`CellIndex`] over the same keys).
    pub fn call(keys: &[GroupKey], i: usize, cell: Expr) -> Result<Expr> {
        let strides = strides(keys)?;
        let stride = *strides.get(i).ok_or_else(|| DpError::Internal(format!("no GROUP BY key {i}")))?;
        let cells = strides[0].saturating_mul(keys[0].domain.len() as i64);
        let domain = keys[i].domain.clone();
        let data_type = domain.first().map(ScalarValue::data_type).unwrap_or(DataType::Null);
        Ok(Self::from_parts(domain, stride, cells, data_type).call(vec![cell]))
    }
}

impl ScalarUDFImpl for CellKey {
    fn name(&self) -> &str {
        "dp_cell_key"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> datafusion::common::Result<DataType> {
        Ok(self.data_type.clone())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> datafusion::common::Result<ColumnarValue> {
        let rows = args.number_rows;
        let [cell] = args.args.as_slice() else { return exec_err!("dp_cell_key takes one argument") };
        let cells = cell.to_array(rows)?;
        let null = ScalarValue::try_from(&self.data_type)?;
        let len = self.domain.len() as i64;
        let values = cells.as_primitive::<Int64Type>().iter().map(|c| {
            c.filter(|c| (0..self.cells).contains(c) && len > 0)
                .and_then(|c| self.domain.get(((c / self.stride) % len) as usize))
                .cloned()
                .unwrap_or_else(|| null.clone())
        });
        let array = if rows == 0 {
            datafusion::arrow::array::new_empty_array(&self.data_type)
        } else {
            ScalarValue::iter_to_array(values)?
        };
        Ok(ColumnarValue::Array(array))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{BooleanArray, Int32Array, Int64Array, StringArray, StringViewArray};
    use datafusion::common::Column;
    use std::sync::Arc;

    /// Runs the function call `e` over argument columns `args`, as DataFusion would.
    fn invoke(e: Expr, args: Vec<ArrayRef>) -> ArrayRef {
        use datafusion::arrow::datatypes::Field;
        let Expr::ScalarFunction(f) = e else { panic!("not a function call") };
        let types: Vec<DataType> = args.iter().map(|a| a.data_type().clone()).collect();
        let out = f
            .func
            .invoke_with_args(ScalarFunctionArgs {
                arg_fields: types.iter().map(|t| Arc::new(Field::new("a", t.clone(), true))).collect(),
                number_rows: args[0].len(),
                args: args.into_iter().map(ColumnarValue::Array).collect(),
                return_field: Arc::new(Field::new("r", f.func.return_type(&types).unwrap(), true)),
                config_options: Arc::default(),
            })
            .unwrap();
        let ColumnarValue::Array(a) = out else { panic!("not an array") };
        a
    }

    /// The cell indices of rows of key values, as the bounding computes them.
    fn index_of(keys: &[GroupKey], columns: Vec<ArrayRef>) -> Vec<Option<i64>> {
        let a = invoke(CellIndex::call(keys).unwrap(), columns);
        a.as_primitive::<Int64Type>().iter().collect()
    }

    fn key(name: &str, domain: Vec<ScalarValue>) -> GroupKey {
        GroupKey { column: Column::from_name(name), base: name.into(), domain, selected: false }
    }

    fn strs(v: &[&str]) -> Vec<ScalarValue> {
        v.iter().map(|s| ScalarValue::Utf8(Some(s.to_string()))).collect()
    }

    fn decode(keys: &[GroupKey], i: usize, cells: Vec<Option<i64>>) -> Vec<ScalarValue> {
        let cell = Expr::Column(Column::from_name(CELL));
        let a = invoke(CellKey::call(keys, i, cell).unwrap(), vec![Arc::new(Int64Array::from(cells))]);
        (0..a.len()).map(|r| ScalarValue::try_from_array(&a, r).unwrap()).collect()
    }

    #[test]
    fn every_cell_has_one_index_and_decodes_back() {
        let keys = vec![
            key("state", strs(&["CA", "NY", "TX"])),
            key("sex", vec![ScalarValue::Int32(Some(0)), ScalarValue::Int32(Some(1))]),
            key("ok", vec![ScalarValue::Boolean(Some(true)), ScalarValue::Boolean(Some(false))]),
        ];
        let mut seen = std::collections::BTreeSet::new();
        for s in ["CA", "NY", "TX"] {
            for x in 0..2 {
                for b in [true, false] {
                    let got = index_of(
                        &keys,
                        vec![
                            Arc::new(StringArray::from(vec![s])),
                            Arc::new(Int32Array::from(vec![x])),
                            Arc::new(BooleanArray::from(vec![b])),
                        ],
                    );
                    let cell = got[0].unwrap();
                    assert!(seen.insert(cell), "two cells share index {cell}");
                    assert_eq!(decode(&keys, 0, vec![Some(cell)]), vec![ScalarValue::Utf8(Some(s.to_string()))]);
                    assert_eq!(decode(&keys, 1, vec![Some(cell)]), vec![ScalarValue::Int32(Some(x))]);
                    assert_eq!(decode(&keys, 2, vec![Some(cell)]), vec![ScalarValue::Boolean(Some(b))]);
                }
            }
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), (0..12).collect::<Vec<_>>(), "dense: 0..cells");
    }

    #[test]
    fn null_and_out_of_domain_keys_have_no_cell() {
        let keys = vec![key("state", strs(&["CA", "NY"]))];
        let got =
            index_of(&keys, vec![Arc::new(StringViewArray::from(vec![Some("NY"), None, Some("ny"), Some("CA")]))]);
        assert_eq!(got, vec![Some(1), None, None, Some(0)]);
        let ints = vec![key("educ", (1..=16).map(|i| ScalarValue::Int64(Some(i))).collect())];
        let got = index_of(&ints, vec![Arc::new(Int64Array::from(vec![Some(1), Some(0), None, Some(16), Some(17)]))]);
        assert_eq!(got, vec![Some(0), None, None, Some(15), None]);
        // An index no cell has decodes to NULL instead of failing.
        let decoded = decode(&keys, 0, vec![Some(-1), None, Some(2), Some(1)]);
        assert_eq!(decoded, [None, None, None, Some("NY".to_string())].map(ScalarValue::Utf8));
    }

    /// Every lookup (inline and long Utf8View strings, Utf8, integer domains in a table or a hash map, other
    /// integer types) gives each row the index of its key's position in the domain, as comparing values would.
    #[test]
    fn every_lookup_finds_the_position_in_the_domain() {
        let long = "a string longer than twelve bytes";
        let texts = strs(&["", "CA", "twelve bytes", "thirteen byte", long]);
        let rows =
            vec![Some("CA"), Some(""), None, Some("twelve bytes"), Some("thirteen byte"), Some(long), Some("ca")];
        let want = vec![Some(1), Some(0), None, Some(2), Some(3), Some(4), None];
        let keys = vec![key("s", texts.clone())];
        assert_eq!(index_of(&keys, vec![Arc::new(StringViewArray::from(rows.clone()))]), want);
        assert_eq!(index_of(&keys, vec![Arc::new(StringArray::from(rows))]), want);
        // Domains of inline strings: at most eight compared with every row's view, more looked up by hash; rows of
        // long strings, of 13 bytes and differing in case or in their last byte are in neither.
        let rows = [Some("CA"), Some(""), None, Some("twelve bytes"), Some("twelve bytez"), Some("thirteen byte")];
        let rows = rows.into_iter().chain([Some(long), Some("ca"), Some("S07"), Some("S08")]).collect::<Vec<_>>();
        let states: Vec<String> = (0..9).map(|i| format!("S0{i}")).collect();
        for d in [vec!["", "CA", "twelve bytes", "NY"], states.iter().map(String::as_str).collect()] {
            let want: Vec<Option<i64>> =
                rows.iter().map(|r| r.and_then(|r| d.iter().position(|&x| x == r)).map(|p| p as i64)).collect();
            let keys = vec![key("s", strs(&d))];
            assert_eq!(index_of(&keys, vec![Arc::new(StringViewArray::from(rows.clone()))]), want, "{d:?}");
        }

        // A small span (a table, with holes) and a wide one (a hash map), read from Int64 and Int32 columns.
        for domain in [vec![-3i64, 0, 7, 2], vec![-3, 0, 7, 1 << 40]] {
            let keys = vec![key("x", domain.iter().map(|&x| ScalarValue::Int64(Some(x))).collect())];
            let xs = [Some(7), Some(-3), None, Some(1), Some(8), Some(-4), Some(i64::MIN), Some(i64::MAX), Some(0)];
            let want: Vec<Option<i64>> =
                xs.iter().map(|x| x.and_then(|x| domain.iter().position(|&d| d == x)).map(|p| p as i64)).collect();
            assert_eq!(index_of(&keys, vec![Arc::new(Int64Array::from(xs.to_vec()))]), want, "{domain:?}");
            let small: Vec<Option<i32>> = xs.iter().map(|x| x.and_then(|x| i32::try_from(x).ok())).collect();
            let want32: Vec<Option<i64>> = small
                .iter()
                .map(|x| x.and_then(|x| domain.iter().position(|&d| d == i64::from(x))).map(|p| p as i64))
                .collect();
            assert_eq!(index_of(&keys, vec![Arc::new(Int32Array::from(small))]), want32, "{domain:?}");
        }
        // Two keys: a row is in no cell when either key is outside its domain.
        let keys = vec![key("s", strs(&["F", "M"])), key("x", (0..3).map(|x| ScalarValue::Int64(Some(x))).collect())];
        let got = index_of(
            &keys,
            vec![
                Arc::new(StringViewArray::from(vec![Some("M"), Some("M"), None, Some("X"), Some("F")])),
                Arc::new(Int64Array::from(vec![Some(2), Some(3), Some(0), Some(2), None])),
            ],
        );
        assert_eq!(got, vec![Some(5), None, None, None, None]);
    }
}
