//! The plan codec of a dpfusion cluster: dpfusion's physical operators and functions as protobuf, everything
//! else through Ballista's own codec.
//!
//! The same codec runs in the dpfusion process (encoding the submitted plan), in the scheduler (decoding it to
//! split stages, then encoding each stage) and in the executors (decoding tasks). What it encodes:
//! * `DpSealedScan` (a private table's scan): its description, the bytes its capability signs
//!   ([`super::Remote`]), either a text scan (table, files, format, projected schema, limit: the executor reads the
//!   same files at the same paths) or DataFusion's own encoding of the reader (Parquet). The bytes are sent
//!   again as they were received, so a capability never goes stale when the scheduler re-encodes a stage.
//!   Its one input is the carrier of its slice ([`super::Slice`]), which the scheduler restricts per task.
//!   A table held in memory is refused: its rows would travel inside the plan.
//! * `DpByUnitExec` (its unit expression) and `DpUnorderedExec` (nothing); their inputs travel as DataFusion's.
//! * The functions `dp_priority` and `dp_key_priority` (their keys), `dp_cell`, `dp_cell_key` (domains and strides), `dp_bounded_sum` (its
//!   grid) and `dp_clipped` (the clipping rules and the pick), so an executor evaluates exactly the function the
//!   plan was checked with.
//!
//! Every message starts with [`MAGIC`], which holds the format's version: bytes of another version are refused
//! (an executor older or newer than the dpfusion process fails the job before reading a row).

use super::Remote;
use crate::plan::by_unit::ByUnitExec;
use crate::plan::cells::{CellIndex, CellKey};
use crate::plan::clip::{Clip, Clipped, KeptKey};
use crate::plan::exact_sum::{BoundedSum, Grid};
use crate::plan::lookup::{KeyIndex, PublicLookup};
use crate::plan::pick::Priority;
use crate::plan::quantile::{GridSpec, KeepRows, Kept, QuantileSlot, SlotHistogram};
use crate::plan::runs::RowValue;
use crate::plan::selected::KeyPriority;
use crate::plan::unordered::UnorderedExec;
use crate::session::private::SealedScanExec;
use crate::source::text::{TextFormat, TextScan};
use ballista_core::serde::BallistaPhysicalExtensionCodec;
use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{AggregateUDF, ScalarUDF};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::physical_plan::{
    PhysicalExtensionCodec, PhysicalPlanDecodeContext, PhysicalProtoConverterExtension,
};
use datafusion_proto::protobuf;
use prost::Message;
use std::sync::Arc;

/// The first bytes of every message of this codec: `DPF` and the format's version. No message of Ballista's
/// codec starts with them (`D` would open a protobuf field 8 as a deprecated group).
pub(crate) const MAGIC: &[u8; 4] = b"DPF1";

/// dpfusion's [`PhysicalExtensionCodec`]: dpfusion's operators and functions, and Ballista's for everything else.
/// Use it in the dpfusion process, the scheduler and every executor.
#[derive(Debug, Default)]
pub struct DpPhysicalCodec {
    ballista: BallistaPhysicalExtensionCodec,
}

fn err(msg: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Internal(format!("dpfusion plan codec: {msg}"))
}

#[derive(Clone, PartialEq, Message)]
struct NodeMsg {
    #[prost(oneof = "Node", tags = "1, 2, 3")]
    node: Option<Node>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Node {
    #[prost(message, tag = "1")]
    Sealed(SealedMsg),
    #[prost(message, tag = "2")]
    ByUnit(Box<ByUnitMsg>),
    #[prost(message, tag = "3")]
    Unordered(UnorderedMsg),
}

#[derive(Clone, PartialEq, Message)]
struct SealedMsg {
    /// A [`SourceMsg`], encoded: the bytes the capability signs.
    #[prost(bytes = "vec", tag = "1")]
    source: Vec<u8>,
    #[prost(message, optional, tag = "2")]
    capability: Option<CapabilityMsg>,
}

#[derive(Clone, PartialEq, Message)]
struct CapabilityMsg {
    #[prost(uint64, tag = "1")]
    charge: u64,
    #[prost(uint64, tag = "2")]
    not_after: u64,
    #[prost(bytes = "vec", tag = "3")]
    mac: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
struct SourceMsg {
    #[prost(oneof = "Source", tags = "1, 2")]
    source: Option<Source>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Source {
    #[prost(message, tag = "1")]
    Text(TextMsg),
    #[prost(message, tag = "2")]
    Plan(Box<protobuf::PhysicalPlanNode>),
}

#[derive(Clone, PartialEq, Message)]
struct TextMsg {
    #[prost(string, tag = "1")]
    table: String,
    #[prost(string, repeated, tag = "2")]
    files: Vec<String>,
    #[prost(message, optional, tag = "3")]
    schema: Option<protobuf::Schema>,
    /// Absent: JSON lines.
    #[prost(message, optional, tag = "4")]
    csv: Option<CsvMsg>,
    #[prost(uint64, optional, tag = "5")]
    limit: Option<u64>,
}

#[derive(Clone, PartialEq, Message)]
struct CsvMsg {
    #[prost(bool, tag = "1")]
    has_header: bool,
    #[prost(uint32, tag = "2")]
    delimiter: u32,
    #[prost(bool, tag = "3")]
    multiline_fields: bool,
}

#[derive(Clone, PartialEq, Message)]
struct ByUnitMsg {
    #[prost(message, optional, tag = "1")]
    unit: Option<protobuf::PhysicalExprNode>,
}

#[derive(Clone, PartialEq, Message)]
struct UnorderedMsg {}

#[derive(Clone, PartialEq, Message)]
struct FnMsg {
    #[prost(oneof = "Function", tags = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11")]
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

/// The key and value columns of a lookup as one Arrow IPC stream.
fn lookup_to(keys: &ArrayRef, values: &ArrayRef) -> Result<Vec<u8>> {
    use datafusion::arrow::ipc::writer::StreamWriter;
    let batch = RecordBatch::try_from_iter([("key", Arc::clone(keys)), ("value", Arc::clone(values))]).map_err(err)?;
    let mut out = Vec::new();
    let mut w = StreamWriter::try_new(&mut out, &batch.schema()).map_err(err)?;
    w.write(&batch).map_err(err)?;
    w.finish().map_err(err)?;
    drop(w);
    Ok(out)
}

/// The lookup `m` encodes.
fn lookup_from(m: LookupMsg) -> Result<ScalarUDF> {
    use datafusion::arrow::ipc::reader::StreamReader;
    let reader = StreamReader::try_new(std::io::Cursor::new(m.columns), None).map_err(err)?;
    let batches = reader.collect::<std::result::Result<Vec<_>, _>>().map_err(err)?;
    let [batch] = batches.as_slice() else { return Err(err("a lookup's columns are one batch")) };
    let [keys, values] = batch.columns() else { return Err(err("a lookup has a key and a value column")) };
    let index = KeyIndex::build(keys, keys.data_type())
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
fn write(msg: &impl Message, buf: &mut Vec<u8>) {
    buf.extend_from_slice(MAGIC);
    buf.extend(msg.encode_to_vec());
}

/// The message after [`MAGIC`], or None when `buf` is not this codec's; an error for another version of it.
fn read<M: Message + Default>(buf: &[u8]) -> Result<Option<M>> {
    match buf.get(..4) {
        Some(head) if head == MAGIC => M::decode(&buf[4..]).map(Some).map_err(err),
        Some(head) if head[..3] == MAGIC[..3] => Err(err(format!(
            "this dpfusion reads plan format {}, the plan is in format {}: run the same dpfusion version everywhere",
            MAGIC[3] as char, head[3] as char
        ))),
        _ => Ok(None),
    }
}

/// [`read`] of a node, for the tests of another version.
#[cfg(test)]
pub(super) fn read_for_tests(buf: &[u8]) -> Result<Option<()>> {
    read::<NodeMsg>(buf).map(|m| m.map(|_| ()))
}

fn scalar_to(v: &ScalarValue) -> Result<protobuf::ScalarValue> {
    protobuf::ScalarValue::try_from(v).map_err(err)
}

fn scalar_from(v: &protobuf::ScalarValue) -> Result<ScalarValue> {
    ScalarValue::try_from(v).map_err(err)
}

fn grid_to(g: Grid) -> GridMsg {
    match g {
        Grid::Int { lo, hi } => GridMsg { float: false, lo: lo as u64, hi: hi as u64, scale: 0 },
        Grid::Float { lo, hi, scale } => GridMsg { float: true, lo, hi, scale },
    }
}

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

fn key_from(k: &KeyMsg) -> Result<(Vec<ScalarValue>, i64)> {
    Ok((k.domain.iter().map(scalar_from).collect::<Result<_>>()?, k.stride))
}

impl DpPhysicalCodec {
    /// The encoded description of a sealed scan's reader: what its capability signs. The bytes it was received
    /// with, if it came from another process; a text scan's files; or DataFusion's encoding of its reader.
    pub(crate) fn encode_source(&self, scan: &SealedScanExec) -> Result<Vec<u8>> {
        if let Some(remote) = scan.remote() {
            return Ok(remote.source.clone());
        }
        let source = match scan.source() {
            (_, Some(text)) => Source::Text(TextMsg {
                table: text.table.clone(),
                files: text.files.iter().map(|f| f.to_string_lossy().into_owned()).collect(),
                schema: Some(protobuf::Schema::try_from(text.schema.as_ref()).map_err(err)?),
                csv: match text.format {
                    TextFormat::Csv { has_header, delimiter, multiline_fields } => {
                        Some(CsvMsg { has_header, delimiter: u32::from(delimiter), multiline_fields })
                    }
                    TextFormat::Json => None,
                },
                limit: text.limit.map(|l| l as u64),
            }),
            (inner, None) => {
                let in_memory =
                    inner.downcast_ref::<DataSourceExec>().is_some_and(|d| d.data_source().is::<MemorySourceConfig>());
                if in_memory {
                    return Err(err(
                        "a table held in memory cannot run on a cluster (its rows would travel in the plan)",
                    ));
                }
                let converter = datafusion_proto::physical_plan::DefaultPhysicalProtoConverter {};
                Source::Plan(Box::new(converter.execution_plan_to_proto(inner, self)?))
            }
        };
        Ok(SourceMsg { source: Some(source) }.encode_to_vec())
    }

    /// The reader a scan's description names (on the scheduler and the executors; the owner's log of
    /// unreadable values is the dpfusion process's only).
    fn decode_source(
        &self,
        bytes: &[u8],
        ctx: &TaskContext,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let msg = SourceMsg::decode(bytes).map_err(err)?;
        match msg.source {
            Some(Source::Text(t)) => {
                let schema = t.schema.as_ref().ok_or_else(|| err("a text scan without a schema"))?;
                let format = match t.csv {
                    Some(c) => TextFormat::Csv {
                        has_header: c.has_header,
                        delimiter: u8::try_from(c.delimiter).map_err(err)?,
                        multiline_fields: c.multiline_fields,
                    },
                    None => TextFormat::Json,
                };
                let scan = TextScan {
                    table: t.table,
                    schema: Arc::new(Schema::try_from(schema).map_err(err)?),
                    files: t.files.into_iter().map(Into::into).collect(),
                    format,
                    limit: t.limit.map(|l| usize::try_from(l).unwrap_or(usize::MAX)),
                };
                scan.exec(None, Arc::default())
            }
            Some(Source::Plan(node)) => {
                converter.proto_to_execution_plan(&node, &PhysicalPlanDecodeContext::new(ctx, self))
            }
            None => Err(err("a sealed scan without a source")),
        }
    }

    fn decode_node(
        &self,
        msg: NodeMsg,
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let one_input = || match inputs {
            [input] => Ok(Arc::clone(input)),
            _ => Err(err("a node with one input came with another number")),
        };
        Ok(match msg.node.ok_or_else(|| err("an empty node"))? {
            Node::Sealed(s) => {
                let inner = self.decode_source(&s.source, ctx, converter)?;
                let capability = s.capability.map(|c| super::Capability {
                    charge: c.charge,
                    not_after: c.not_after,
                    mac: <[u8; 32]>::try_from(c.mac.as_slice()).unwrap_or([0; 32]),
                });
                let remote = Arc::new(Remote { source: s.source, capability });
                let slice = match inputs {
                    // Not sent by a dpfusion process (which always sends the slice): the whole reader.
                    [] => super::Slice::all(&inner)?,
                    [carrier] => super::Slice::from_carrier(carrier, &inner)?,
                    _ => return Err(err("a sealed scan has one input, its slice")),
                };
                Arc::new(SealedScanExec::sent(inner, remote, slice))
            }
            Node::ByUnit(b) => {
                let input = one_input()?;
                let unit = b.unit.as_ref().ok_or_else(|| err("DpByUnitExec without its unit"))?;
                let decode = PhysicalPlanDecodeContext::new(ctx, self);
                let unit = converter.proto_to_physical_expr(unit, input.schema().as_ref(), &decode)?;
                Arc::new(ByUnitExec::new(input, unit))
            }
            Node::Unordered(_) => Arc::new(UnorderedExec::new(one_input()?)),
        })
    }
}

impl PhysicalExtensionCodec for DpPhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match read::<NodeMsg>(buf)? {
            Some(msg) => self.decode_node(msg, inputs, ctx, converter),
            None => self.ballista.try_decode(buf, inputs, ctx, converter),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        let msg = if let Some(scan) = node.downcast_ref::<SealedScanExec>() {
            let capability = scan.remote().and_then(|r| r.capability.as_ref()).map(|c| CapabilityMsg {
                charge: c.charge,
                not_after: c.not_after,
                mac: c.mac.to_vec(),
            });
            Node::Sealed(SealedMsg { source: self.encode_source(scan)?, capability })
        } else if let Some(by_unit) = node.downcast_ref::<ByUnitExec>() {
            Node::ByUnit(Box::new(ByUnitMsg { unit: Some(converter.physical_expr_to_proto(by_unit.unit(), self)?) }))
        } else if node.is::<UnorderedExec>() {
            Node::Unordered(UnorderedMsg {})
        } else {
            return self.ballista.try_encode(node, buf, converter);
        };
        write(&NodeMsg { node: Some(msg) }, buf);
        Ok(())
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> Result<Arc<ScalarUDF>> {
        let Some(msg) = read::<FnMsg>(buf)? else { return self.ballista.try_decode_udf(name, buf) };
        Ok(Arc::new(match msg.function {
            Some(Function::Priority(key)) => Priority::udf(key),
            Some(Function::Cell(c)) => CellIndex::from_parts(c.keys.iter().map(key_from).collect::<Result<_>>()?),
            Some(Function::CellKey(c)) => {
                let (domain, stride) = key_from(c.key.as_ref().ok_or_else(|| err("dp_cell_key without its key"))?)?;
                let data_type = c.data_type.as_ref().ok_or_else(|| err("dp_cell_key without its type"))?;
                CellKey::from_parts(domain, stride, c.cells, DataType::try_from(data_type).map_err(err)?)
            }
            Some(Function::QuantileSlot(g)) => {
                let (lo, hi) = (f64::from_bits(g.lo), f64::from_bits(g.hi));
                let points = usize::try_from(g.points).map_err(err)?;
                QuantileSlot::udf(GridSpec::new(lo, hi, points, g.integer).map_err(err)?)
            }
            Some(Function::Lookup(m)) => lookup_from(m)?,
            Some(Function::KeyPriority(key)) => KeyPriority::udf(key),
            _ => return Err(err(format!("`{name}` is not a scalar function of dpfusion"))),
        }))
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
        let inner = node.inner();
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
        } else if let Some(l) = inner.downcast_ref::<PublicLookup>() {
            let (name, label, keys, values) = l.parts();
            Function::Lookup(LookupMsg { name: name.into(), label: label.into(), columns: lookup_to(keys, values)? })
        } else {
            return self.ballista.try_encode_udf(node, buf);
        };
        write(&FnMsg { function: Some(function) }, buf);
        Ok(())
    }

    fn try_decode_udaf(&self, name: &str, buf: &[u8]) -> Result<Arc<AggregateUDF>> {
        let Some(msg) = read::<FnMsg>(buf)? else { return self.ballista.try_decode_udaf(name, buf) };
        Ok(Arc::new(match msg.function {
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

    fn try_encode_udaf(&self, node: &AggregateUDF, buf: &mut Vec<u8>) -> Result<()> {
        let inner = node.inner();
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
            return self.ballista.try_encode_udaf(node, buf);
        };
        write(&FnMsg { function: Some(function) }, buf);
        Ok(())
    }
}
