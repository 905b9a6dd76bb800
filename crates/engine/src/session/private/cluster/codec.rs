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
//! * `DpUnitRunsExec` detached from its fallback (its bounding, output schema and its rows' partition count).
//! * dpfusion's functions, with every parameter ([`crate::plan::codec`]), so an executor evaluates exactly the
//!   function the plan was checked with.
//!
//! Every message starts with [`MAGIC`](crate::plan::codec::MAGIC), which holds the format's version: bytes of another version are refused
//! (an executor older or newer than the dpfusion process fails the job before reading a row).

use super::super::SealedScanExec;
use super::Remote;
use crate::plan::by_unit::ByUnitExec;
use crate::plan::codec::{self, err, read, write};
use crate::plan::runs::UnitRunsExec;
use crate::plan::unordered::UnorderedExec;
use crate::source::text::{MAX_PIECES, TextFormat, TextScan};
use ballista_core::serde::BallistaPhysicalExtensionCodec;
use datafusion::arrow::datatypes::Schema;
use datafusion::common::Result;
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

/// dpfusion's [`PhysicalExtensionCodec`]: dpfusion's operators and functions, and Ballista's for everything else.
/// Use it in the dpfusion process, the scheduler and every executor.
#[derive(Debug, Default)]
pub struct DpPhysicalCodec {
    ballista: BallistaPhysicalExtensionCodec,
}

#[derive(Clone, PartialEq, Message)]
struct NodeMsg {
    #[prost(oneof = "Node", tags = "1, 2, 3, 4")]
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
    #[prost(message, tag = "4")]
    Runs(RunsMsg),
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
    /// Each file's size when planned.
    #[prost(uint64, repeated, tag = "6")]
    sizes: Vec<u64>,
    #[prost(uint64, tag = "7")]
    pieces: u64,
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

/// A detached streaming pass ([`UnitRunsExec::detached`]): its bounding, its output schema, and how many
/// partitions its rows had when it was detached.
#[derive(Clone, PartialEq, Message)]
struct RunsMsg {
    #[prost(message, optional, tag = "1")]
    spec: Option<codec::SpecMsg>,
    #[prost(message, optional, tag = "2")]
    schema: Option<protobuf::Schema>,
    #[prost(uint64, tag = "3")]
    partitions: u64,
}

/// [`read`] of a node, for the tests of another version.
#[cfg(test)]
pub(super) fn read_for_tests(buf: &[u8]) -> Result<Option<()>> {
    read::<NodeMsg>(buf).map(|m| m.map(|_| ()))
}

impl DpPhysicalCodec {
    /// The encoded description of a sealed scan's reader: what its capability signs. The bytes it was received
    /// with, if it came from another process; a text scan's files; or DataFusion's encoding of its reader.
    pub(in crate::session) fn encode_source(&self, scan: &SealedScanExec) -> Result<Vec<u8>> {
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
                sizes: text.sizes.clone(),
                pieces: text.pieces as u64,
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
                let pieces = usize::try_from(t.pieces).ok().filter(|p| (1..=MAX_PIECES).contains(p));
                let pieces = pieces.ok_or_else(|| err(format!("a text scan in {} pieces per file", t.pieces)))?;
                if t.sizes.len() != t.files.len() {
                    return Err(err("a text scan without each file's size"));
                }
                let scan = TextScan {
                    table: t.table,
                    schema: Arc::new(Schema::try_from(schema).map_err(err)?),
                    files: t.files.into_iter().map(Into::into).collect(),
                    sizes: t.sizes,
                    pieces,
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
            Node::Runs(r) => {
                let spec = codec::spec_from(r.spec.as_ref().ok_or_else(|| err("DpUnitRunsExec without its spec"))?)?;
                let schema = r.schema.as_ref().ok_or_else(|| err("DpUnitRunsExec without its schema"))?;
                let out = Arc::new(Schema::try_from(schema).map_err(err)?);
                let partitions = usize::try_from(r.partitions).map_err(err)?;
                Arc::new(UnitRunsExec::decoded(one_input()?, out, spec, partitions)?)
            }
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
        } else if let Some(runs) = node.downcast_ref::<UnitRunsExec>() {
            // Only a detached pass travels (its fallback runs as a job of its own, [`super::Cluster::stream`]).
            let (Some(partitions), None) = (runs.partitions(), runs.fallback()) else {
                return Err(err("DpUnitRunsExec is sent detached from its fallback"));
            };
            let schema = protobuf::Schema::try_from(node.schema().as_ref()).map_err(err)?;
            Node::Runs(RunsMsg {
                spec: Some(codec::spec_to(runs.spec())),
                schema: Some(schema),
                partitions: partitions as u64,
            })
        } else {
            return self.ballista.try_encode(node, buf, converter);
        };
        write(&NodeMsg { node: Some(msg) }, buf);
        Ok(())
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> Result<Arc<ScalarUDF>> {
        match codec::decode_udf(name, buf)? {
            Some(udf) => Ok(Arc::new(udf)),
            None => self.ballista.try_decode_udf(name, buf),
        }
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
        match codec::encode_udf(node)? {
            Some(bytes) => {
                buf.extend(bytes);
                Ok(())
            }
            None => self.ballista.try_encode_udf(node, buf),
        }
    }

    fn try_decode_udaf(&self, name: &str, buf: &[u8]) -> Result<Arc<AggregateUDF>> {
        match codec::decode_udaf(name, buf)? {
            Some(udaf) => Ok(Arc::new(udaf)),
            None => self.ballista.try_decode_udaf(name, buf),
        }
    }

    fn try_encode_udaf(&self, node: &AggregateUDF, buf: &mut Vec<u8>) -> Result<()> {
        match codec::encode_udaf(node)? {
            Some(bytes) => {
                buf.extend(bytes);
                Ok(())
            }
            None => self.ballista.try_encode_udaf(node, buf),
        }
    }
}
