//! dpfusion's own functions as protobuf messages: what a cluster's plan codec sends to the executors
//! ([`crate::cluster`]) and what a plan's canonical fingerprint hashes ([`crate::plan::fingerprint`]).
//!
//! The functions `dp_priority` and `dp_key_priority` (their keys), `dp_cell`, `dp_cell_key` (domains and strides),
//! `dp_quantile_slot` (its grid), the lookups of public tables (their rows), and the aggregates `dp_bounded_sum`
//! (its grid), `dp_clipped` and `dp_kept_key` (the clipping rules and the pick), `dp_slot_histogram` and
//! `dp_keep_rows`: every parameter that decides what the function computes, so that an executor evaluates exactly
//! the function the plan was checked with, and two plans whose functions differ in any parameter have different
//! fingerprints.
//!
//! Every message starts with [`MAGIC`], which holds the format's version: bytes of another version are refused
//! (an executor older or newer than the dpfusion process fails the job before reading a row).

use crate::plan::cells::{CellIndex, CellKey};
use crate::plan::clip::{Clip, Clipped, KeptKey};
use crate::plan::exact_sum::{BoundedSum, Grid};
use crate::plan::lookup::PublicLookup;
use crate::plan::pick::Priority;
use crate::plan::quantile::{KeepRows, Kept, QuantileSlot, SlotHistogram};
use crate::plan::runs::RowValue;
#[cfg(feature = "cluster")]
use crate::plan::runs::{RunMeasure, Spec};
use crate::plan::selected::KeyPriority;
use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::logical_expr::{AggregateUDF, ScalarUDF};
use datafusion_proto::protobuf;
use prost::Message;
use std::sync::Arc;

/// The first bytes of every message of this codec: `DPF` and the format's version. No message of Ballista's
/// codec starts with them (`D` would open a protobuf field 8 as a deprecated group).
pub(crate) const MAGIC: &[u8; 4] = b"DPF1";

/// An error of the codec.
pub(crate) fn err(msg: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Internal(format!("dpfusion plan codec: {msg}"))
}

#[derive(Clone, PartialEq, Message)]
struct FnMsg {
    #[prost(oneof = "Function", tags = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14")]
    function: Option<Function>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Function {
    #[prost(uint64, tag = "1")]
    Priority(u64),
    #[prost(message, tag = "2")]
    Cell(CellMsg),
    #[prost(message, tag = "3")]
    CellKey(CellKeyMsg),
    #[prost(message, tag = "4")]
    BoundedSum(GridMsg),
    #[prost(message, tag = "5")]
    Clipped(ClippedMsg),
    #[prost(message, tag = "6")]
    QuantileSlot(QuantileGridMsg),
    #[prost(uint64, tag = "7")]
    SlotHistogram(u64),
    #[prost(message, tag = "8")]
    KeepRows(KeepRowsMsg),
    #[prost(message, tag = "9")]
    Lookup(LookupMsg),
    #[prost(uint64, tag = "10")]
    KeyPriority(u64),
    /// `dp_kept_key`: its measurements and number of arguments (no pick).
    #[prost(message, tag = "11")]
    KeptKey(ClippedMsg),
    /// `dp_clamp` (its bounds are its literal arguments).
    #[prost(bool, tag = "12")]
    Clamp(bool),
    /// `dp_table`: its smallest input and its table.
    #[prost(message, tag = "13")]
    Table(TableMsg),
    /// `dp_where` (nothing but its arguments).
    #[prost(bool, tag = "14")]
    Where(bool),
}

/// A tabulated computed column ([`crate::plan::computed::Tabulated`]): its smallest input, and its table (an Arrow
/// IPC stream of one batch, one column `value`): values computed from the policy, travelling with the plan.
#[derive(Clone, PartialEq, Message)]
struct TableMsg {
    #[prost(sint64, tag = "1")]
    lo: i64,
    #[prost(bytes = "vec", tag = "2")]
    table: Vec<u8>,
}

/// A public table's lookup: its function name, `table.column`, and the key and value columns (an Arrow IPC stream
/// of one batch, columns `key` and `value`): public rows, travelling with the plan.
#[derive(Clone, PartialEq, Message)]
struct LookupMsg {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    label: String,
    #[prost(bytes = "vec", tag = "3")]
    columns: Vec<u8>,
}

/// Named columns as one Arrow IPC stream of one batch.
fn ipc_to(columns: &[(&str, &ArrayRef)]) -> Result<Vec<u8>> {
    use datafusion::arrow::ipc::writer::StreamWriter;
    let batch = RecordBatch::try_from_iter(columns.iter().map(|(n, a)| (*n, Arc::clone(a)))).map_err(err)?;
    let mut out = Vec::new();
    let mut w = StreamWriter::try_new(&mut out, &batch.schema()).map_err(err)?;
    w.write(&batch).map_err(err)?;
    w.finish().map_err(err)?;
    drop(w);
    Ok(out)
}

#[cfg(feature = "cluster")]
/// The columns of the one batch [`ipc_to`] wrote in `bytes`.
fn ipc_from(bytes: Vec<u8>) -> Result<Vec<ArrayRef>> {
    use datafusion::arrow::ipc::reader::StreamReader;
    let reader = StreamReader::try_new(std::io::Cursor::new(bytes), None).map_err(err)?;
    let batches = reader.collect::<std::result::Result<Vec<_>, _>>().map_err(err)?;
    let [batch] = batches.as_slice() else { return Err(err("columns sent with a plan are one batch")) };
    Ok(batch.columns().to_vec())
}

#[cfg(feature = "cluster")]
/// The lookup `m` encodes.
fn lookup_from(m: LookupMsg) -> Result<ScalarUDF> {
    let [keys, values] = &ipc_from(m.columns)?[..] else { return Err(err("a lookup has a key and a value column")) };
    let index = crate::plan::lookup::KeyIndex::build(keys, keys.data_type())
        .map_err(err)?
        .ok_or_else(|| err(format!("{}: the keys sent are not unique", m.label)))?;
    Ok(PublicLookup::udf(m.name, m.label, Arc::new(index), Arc::clone(values)))
}

/// A quantile's grid: bounds (bit patterns), points, and whether its candidates are integers.
#[derive(Clone, PartialEq, Message)]
struct QuantileGridMsg {
    #[prost(fixed64, tag = "1")]
    lo: u64,
    #[prost(fixed64, tag = "2")]
    hi: u64,
    #[prost(uint64, tag = "3")]
    points: u64,
    #[prost(bool, tag = "4")]
    integer: bool,
}

/// `dp_keep_rows`: rows per cell, cells per unit, and what each measurement reads (0 rows, 1 values, 2 a sum on
/// `grid`, 3 slots).
#[derive(Clone, PartialEq, Message)]
struct KeepRowsMsg {
    #[prost(uint64, tag = "1")]
    k: u64,
    #[prost(uint64, optional, tag = "2")]
    groups: Option<u64>,
    #[prost(message, repeated, tag = "3")]
    kinds: Vec<KeptMsg>,
}

#[derive(Clone, PartialEq, Message)]
struct KeptMsg {
    #[prost(uint32, tag = "1")]
    value: u32,
    #[prost(message, optional, tag = "2")]
    grid: Option<GridMsg>,
}

#[derive(Clone, PartialEq, Message)]
struct CellMsg {
    #[prost(message, repeated, tag = "1")]
    keys: Vec<KeyMsg>,
}

#[derive(Clone, PartialEq, Message)]
struct KeyMsg {
    #[prost(message, repeated, tag = "1")]
    domain: Vec<protobuf::ScalarValue>,
    #[prost(int64, tag = "2")]
    stride: i64,
}

#[derive(Clone, PartialEq, Message)]
struct CellKeyMsg {
    #[prost(message, optional, tag = "1")]
    key: Option<KeyMsg>,
    #[prost(int64, tag = "2")]
    cells: i64,
    #[prost(message, optional, tag = "3")]
    data_type: Option<protobuf::ArrowType>,
}

/// A grid: integers `[lo, hi]`, or floats (bit patterns) with their scale.
#[derive(Clone, PartialEq, Message)]
struct GridMsg {
    #[prost(bool, tag = "1")]
    float: bool,
    #[prost(fixed64, tag = "2")]
    lo: u64,
    #[prost(fixed64, tag = "3")]
    hi: u64,
    #[prost(fixed64, tag = "4")]
    scale: u64,
}

#[derive(Clone, PartialEq, Message)]
struct ClippedMsg {
    #[prost(message, repeated, tag = "1")]
    measures: Vec<MeasureMsg>,
    #[prost(uint64, optional, tag = "2")]
    pick: Option<u64>,
    #[prost(uint64, tag = "3")]
    args: u64,
}

/// One measurement: what a row gives (0 rows, 1 values, 2 a sum on `grid`), and its clipping rule.
#[derive(Clone, PartialEq, Message)]
struct MeasureMsg {
    #[prost(uint32, tag = "1")]
    value: u32,
    #[prost(message, optional, tag = "2")]
    grid: Option<GridMsg>,
    #[prost(int64, tag = "3")]
    k: i64,
    /// The sum range `[lo, hi]` as two 16-byte little-endian integers, when there is one.
    #[prost(bytes = "vec", optional, tag = "4")]
    range: Option<Vec<u8>>,
}

/// `MAGIC` then `msg`.
pub(crate) fn write(msg: &impl Message, buf: &mut Vec<u8>) {
    buf.extend_from_slice(MAGIC);
    buf.extend(msg.encode_to_vec());
}

#[cfg(feature = "cluster")]
/// The message after [`MAGIC`], or None when `buf` is not this codec's; an error for another version of it.
pub(crate) fn read<M: Message + Default>(buf: &[u8]) -> Result<Option<M>> {
    match buf.get(..4) {
        Some(head) if head == MAGIC => M::decode(&buf[4..]).map(Some).map_err(err),
        Some(head) if head[..3] == MAGIC[..3] => Err(err(format!(
            "this dpfusion reads plan format {}, the plan is in format {}: run the same dpfusion version everywhere",
            MAGIC[3] as char, head[3] as char
        ))),
        _ => Ok(None),
    }
}

pub(crate) fn scalar_to(v: &ScalarValue) -> Result<protobuf::ScalarValue> {
    protobuf::ScalarValue::try_from(v).map_err(err)
}

#[cfg(feature = "cluster")]
pub(crate) fn scalar_from(v: &protobuf::ScalarValue) -> Result<ScalarValue> {
    ScalarValue::try_from(v).map_err(err)
}

fn grid_to(g: Grid) -> GridMsg {
    match g {
        Grid::Int { lo, hi } => GridMsg { float: false, lo: lo as u64, hi: hi as u64, scale: 0 },
        Grid::Float { lo, hi, scale } => GridMsg { float: true, lo, hi, scale },
    }
}

#[cfg(feature = "cluster")]
fn grid_from(g: &GridMsg) -> Grid {
    if g.float {
        Grid::Float { lo: g.lo, hi: g.hi, scale: g.scale }
    } else {
        Grid::Int { lo: g.lo as i64, hi: g.hi as i64 }
    }
}

fn measure_to((value, clip): &(RowValue, Clip)) -> MeasureMsg {
    let (k, range) = clip.parts();
    let (value, grid) = match value {
        RowValue::Rows => (0, None),
        RowValue::Values => (1, None),
        RowValue::Sum(g) => (2, Some(grid_to(*g))),
        // Never clipped (a quantile's slots are kept, `dp_keep_rows`); refused by `measure_from`.
        RowValue::Slot(_) => (3, None),
    };
    let range = range.map(|(lo, hi)| [lo.to_le_bytes(), hi.to_le_bytes()].concat());
    MeasureMsg { value, grid, k, range }
}

#[cfg(feature = "cluster")]
fn measure_from(m: &MeasureMsg) -> Result<(RowValue, Clip)> {
    let value = match (m.value, &m.grid) {
        (0, None) => RowValue::Rows,
        (1, None) => RowValue::Values,
        (2, Some(g)) => RowValue::Sum(grid_from(g)),
        _ => return Err(err("a measurement of an unknown kind")),
    };
    let range = match &m.range {
        None => None,
        Some(bytes) => {
            let half = |b: &[u8]| <[u8; 16]>::try_from(b).map(i128::from_le_bytes).map_err(err);
            let (lo, hi) = bytes.split_at_checked(16).ok_or_else(|| err("a sum range of the wrong size"))?;
            Some((half(lo)?, half(hi)?))
        }
    };
    Ok((value, Clip::from_parts(m.k, range)))
}

fn key_to(domain: &[ScalarValue], stride: i64) -> Result<KeyMsg> {
    Ok(KeyMsg { domain: domain.iter().map(scalar_to).collect::<Result<_>>()?, stride })
}

#[cfg(feature = "cluster")]
fn key_from(k: &KeyMsg) -> Result<(Vec<ScalarValue>, i64)> {
    Ok((k.domain.iter().map(scalar_from).collect::<Result<_>>()?, k.stride))
}

/// `udf` encoded, if it is one of dpfusion's functions (None: DataFusion's, encoded by name).
pub(crate) fn encode_udf(udf: &ScalarUDF) -> Result<Option<Vec<u8>>> {
    let inner = udf.inner();
    let function = if let Some(p) = inner.downcast_ref::<Priority>() {
        Function::Priority(p.key())
    } else if let Some(c) = inner.downcast_ref::<CellIndex>() {
        let keys = c.parts().into_iter().map(|(d, s)| key_to(d, s)).collect::<Result<_>>()?;
        Function::Cell(CellMsg { keys })
    } else if let Some(c) = inner.downcast_ref::<CellKey>() {
        let (domain, stride, cells, data_type) = c.parts();
        let data_type = Some(protobuf::ArrowType::try_from(data_type).map_err(err)?);
        Function::CellKey(CellKeyMsg { key: Some(key_to(domain, stride)?), cells, data_type })
    } else if let Some(q) = inner.downcast_ref::<QuantileSlot>() {
        let (lo, hi, points, integer) = q.spec().parts();
        Function::QuantileSlot(QuantileGridMsg { lo: lo.to_bits(), hi: hi.to_bits(), points, integer })
    } else if let Some(p) = inner.downcast_ref::<KeyPriority>() {
        Function::KeyPriority(p.key())
    } else if inner.is::<crate::plan::computed::Clamp>() {
        Function::Clamp(true)
    } else if inner.is::<crate::plan::computed::Where>() {
        Function::Where(true)
    } else if let Some(t) = inner.downcast_ref::<crate::plan::computed::Tabulated>() {
        let (lo, table) = t.parts();
        Function::Table(TableMsg { lo, table: ipc_to(&[("value", table)])? })
    } else if let Some(l) = inner.downcast_ref::<PublicLookup>() {
        let (name, label, keys, values) = l.parts();
        Function::Lookup(LookupMsg {
            name: name.into(),
            label: label.into(),
            columns: ipc_to(&[("key", keys), ("value", values)])?,
        })
    } else {
        return Ok(None);
    };
    let mut buf = Vec::new();
    write(&FnMsg { function: Some(function) }, &mut buf);
    Ok(Some(buf))
}

#[cfg(feature = "cluster")]
/// The function `buf` encodes, if [`encode_udf`] wrote it (None: not this codec's bytes).
pub(crate) fn decode_udf(name: &str, buf: &[u8]) -> Result<Option<ScalarUDF>> {
    let Some(msg) = read::<FnMsg>(buf)? else { return Ok(None) };
    Ok(Some(match msg.function {
        Some(Function::Priority(key)) => Priority::udf(key),
        Some(Function::Cell(c)) => CellIndex::from_parts(c.keys.iter().map(key_from).collect::<Result<_>>()?),
        Some(Function::CellKey(c)) => {
            let (domain, stride) = key_from(c.key.as_ref().ok_or_else(|| err("dp_cell_key without its key"))?)?;
            let data_type = c.data_type.as_ref().ok_or_else(|| err("dp_cell_key without its type"))?;
            CellKey::from_parts(
                domain,
                stride,
                c.cells,
                datafusion::arrow::datatypes::DataType::try_from(data_type).map_err(err)?,
            )
        }
        Some(Function::QuantileSlot(g)) => {
            let (lo, hi) = (f64::from_bits(g.lo), f64::from_bits(g.hi));
            let points = usize::try_from(g.points).map_err(err)?;
            QuantileSlot::udf(crate::plan::quantile::GridSpec::new(lo, hi, points, g.integer).map_err(err)?)
        }
        Some(Function::Lookup(m)) => lookup_from(m)?,
        Some(Function::KeyPriority(key)) => KeyPriority::udf(key),
        Some(Function::Clamp(_)) => crate::plan::computed::Clamp::udf(),
        Some(Function::Where(_)) => crate::plan::computed::Where::udf(),
        Some(Function::Table(t)) => {
            let [table] = &ipc_from(t.table)?[..] else { return Err(err("a table is one column")) };
            if table.len() < 2 || table.len() > crate::plan::computed::MAX_TABULATED {
                return Err(err(format!("a table of {} values", table.len())));
            }
            crate::plan::computed::Tabulated::udf(t.lo, Arc::clone(table))
        }
        _ => return Err(err(format!("`{name}` is not a scalar function of dpfusion"))),
    }))
}

/// A streaming pass's bounding ([`Spec`]) that clips (a pass that keeps rows never runs detached on a cluster).
#[cfg(feature = "cluster")]
#[derive(Clone, PartialEq, Message)]
pub(crate) struct SpecMsg {
    #[prost(message, repeated, tag = "1")]
    measures: Vec<MeasureMsg>,
    #[prost(uint64, optional, tag = "2")]
    groups: Option<u64>,
    #[prost(uint64, tag = "3")]
    cells: u64,
    #[prost(bool, tag = "4")]
    keyed: bool,
    #[prost(uint64, tag = "5")]
    open: u64,
    #[prost(uint64, tag = "6")]
    k: u64,
}

/// `spec` as its message.
#[cfg(feature = "cluster")]
pub(crate) fn spec_to(spec: &Spec) -> SpecMsg {
    let measures = spec.measures.iter().map(|m| measure_to(&(m.value, Clip::rule(spec.k, m.range)))).collect();
    SpecMsg { measures, groups: spec.groups, cells: spec.cells, keyed: spec.keyed, open: spec.open as u64, k: spec.k }
}

/// The spec of a message; every measurement clipped by the spec's own `k`.
#[cfg(feature = "cluster")]
pub(crate) fn spec_from(m: &SpecMsg) -> Result<Spec> {
    let measures = m
        .measures
        .iter()
        .map(|x| {
            let (value, clip) = measure_from(x)?;
            match clip.parts() {
                (k, range) if u64::try_from(k).ok() == Some(m.k) => Ok(RunMeasure { value, range }),
                _ => Err(err("a pass's measurement clipped by another k")),
            }
        })
        .collect::<Result<_>>()?;
    let open = usize::try_from(m.open).map_err(err)?;
    Ok(Spec { k: m.k, groups: m.groups, cells: m.cells, keyed: m.keyed, open, measures, keep: false })
}

/// `udaf` encoded, if it is one of dpfusion's aggregates (None: DataFusion's, encoded by name).
pub(crate) fn encode_udaf(udaf: &AggregateUDF) -> Result<Option<Vec<u8>>> {
    let inner = udaf.inner();
    let function = if let Some(s) = inner.downcast_ref::<BoundedSum>() {
        Function::BoundedSum(grid_to(s.grid()))
    } else if let Some(c) = inner.downcast_ref::<Clipped>() {
        let (measures, pick, args) = c.parts();
        Function::Clipped(ClippedMsg {
            measures: measures.iter().map(measure_to).collect(),
            pick: pick.map(|p| p as u64),
            args: args as u64,
        })
    } else if let Some(c) = inner.downcast_ref::<KeptKey>() {
        let (measures, args) = c.parts();
        Function::KeptKey(ClippedMsg {
            measures: measures.iter().map(measure_to).collect(),
            pick: None,
            args: args as u64,
        })
    } else if let Some(h) = inner.downcast_ref::<SlotHistogram>() {
        Function::SlotHistogram(h.slots() as u64)
    } else if let Some(keep) = inner.downcast_ref::<KeepRows>() {
        let (k, groups, kinds) = keep.parts();
        let kinds = kinds
            .iter()
            .map(|kind| match kind {
                Kept::Rows => KeptMsg { value: 0, grid: None },
                Kept::Values => KeptMsg { value: 1, grid: None },
                Kept::Sum(g) => KeptMsg { value: 2, grid: Some(grid_to(*g)) },
                Kept::Slots => KeptMsg { value: 3, grid: None },
            })
            .collect();
        Function::KeepRows(KeepRowsMsg { k, groups, kinds })
    } else {
        return Ok(None);
    };
    let mut buf = Vec::new();
    write(&FnMsg { function: Some(function) }, &mut buf);
    Ok(Some(buf))
}

#[cfg(feature = "cluster")]
/// The aggregate `buf` encodes, if [`encode_udaf`] wrote it (None: not this codec's bytes).
pub(crate) fn decode_udaf(name: &str, buf: &[u8]) -> Result<Option<AggregateUDF>> {
    let Some(msg) = read::<FnMsg>(buf)? else { return Ok(None) };
    Ok(Some(match msg.function {
        Some(Function::BoundedSum(g)) => AggregateUDF::new_from_impl(BoundedSum::on_grid(grid_from(&g))),
        Some(Function::Clipped(c)) => {
            let measures = c.measures.iter().map(measure_from).collect::<Result<_>>()?;
            let pick = c.pick.map(|p| usize::try_from(p).map_err(err)).transpose()?;
            Clipped::from_parts(measures, pick, usize::try_from(c.args).map_err(err)?)
        }
        Some(Function::KeptKey(c)) => {
            let measures = c.measures.iter().map(measure_from).collect::<Result<_>>()?;
            KeptKey::from_parts(measures, usize::try_from(c.args).map_err(err)?)
        }
        Some(Function::SlotHistogram(n)) => SlotHistogram::udaf(usize::try_from(n).map_err(err)?),
        Some(Function::KeepRows(m)) => {
            let kinds = m
                .kinds
                .iter()
                .map(|k| match (k.value, &k.grid) {
                    (0, _) => Ok(Kept::Rows),
                    (1, _) => Ok(Kept::Values),
                    (2, Some(g)) => Ok(Kept::Sum(grid_from(g))),
                    (3, _) => Ok(Kept::Slots),
                    (v, _) => Err(err(format!("dp_keep_rows: unknown measurement kind {v}"))),
                })
                .collect::<Result<_>>()?;
            KeepRows::udaf(m.k, m.groups, kinds)
        }
        _ => return Err(err(format!("`{name}` is not an aggregate function of dpfusion"))),
    }))
}
