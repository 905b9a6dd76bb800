//! Canonical fingerprints: the identity of a plan, of what a release measured, and of the data it read, as a
//! BLAKE3 hash of a typed encoding — never of printed text.
//!
//! Every identity the engine keeps of a plan or a release is a [`Fingerprint`]: the plans a charge paid for
//! ([`crate::accounting::Charge::plans`], checked before a private plan runs: [`crate::session::Unlocked`]), the
//! measurements a stored draw holds, the reuse keys under which draws are stored and shared, the shapes under
//! which derivable draws are indexed, a workload's residuals. Two statements get the same fingerprint only when
//! their typed encodings are byte for byte the same:
//!
//! * **Plans and expressions** are encoded with DataFusion's own serialisation (`datafusion-proto`, the format a
//!   cluster ships plans in): every node with every field that decides what it computes, every literal with its
//!   type (`'B0'` and `'B1'` are two typed strings, never a string printed into the text of another), every
//!   identifier as a typed reference; dpfusion's own functions with every parameter ([`crate::plan::codec`]) but
//!   the random keys that pick a unit's cells (drawn afresh for every run: the mechanism's randomness, like its
//!   noise), and its own plan nodes with their bounding ([`FingerprintCodec`]). A table scan is encoded by its name, its
//!   columns and types (without metadata, which does not decide a value), its projection, its filters and its
//!   fetch: what data the name stands for is a separate input ([`DataIdentity`]).
//! * **dpfusion's own values** (measurements, calibrations, policies, domains) are encoded by their serde
//!   derivation in `postcard`, a canonical binary format: fields in declaration order, enum variants by index,
//!   numbers as their bits.
//! * Each part is length-prefixed, and each kind of fingerprint has its own BLAKE3 key derivation context
//!   ([`Canon::new`]), so no encoding of one kind can be read as another's.
//!
//! The encoding is stable across builds of the same dpfusion version (it is not the in-memory `Hash` of a plan,
//! which depends on the compiler's type ids); a new version of DataFusion or of dpfusion may encode a plan
//! differently, and a stored release is then simply not found again (it is never confused with another).

use crate::error::{DpError, Result};
use crate::refusal::Refusal;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::catalog::default_table_source::provider_as_source;
use datafusion::common::tree_node::{Transformed, TreeNodeRecursion};
use datafusion::common::{ScalarValue, TableReference, not_impl_err};
use datafusion::datasource::empty::EmptyTable;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{AggregateUDF, Expr, Extension, LogicalPlan, ScalarUDF, TableScan, TableScanBuilder};
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::protobuf;
use prost::Message;
use serde::Serialize;
use std::fmt;
use std::sync::Arc;

/// A 256-bit canonical fingerprint (BLAKE3; see the module docs for what each kind keys on).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(blake3::Hash);

impl Fingerprint {
    /// The 64 hexadecimal digits of the fingerprint.
    pub fn to_hex(&self) -> String {
        self.0.to_hex().to_string()
    }

    /// A fingerprint written by [`Fingerprint::to_hex`]; None for any other text.
    pub fn from_hex(text: &str) -> Option<Fingerprint> {
        blake3::Hash::from_hex(text).ok().map(Fingerprint)
    }

    /// The 32 bytes of the fingerprint.
    pub fn as_bytes(&self) -> &[u8; 32] {
        self.0.as_bytes()
    }

    /// The fingerprint of 32 bytes written by [`Fingerprint::as_bytes`].
    pub fn from_bytes(bytes: [u8; 32]) -> Fingerprint {
        Fingerprint(blake3::Hash::from_bytes(bytes))
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", &self.to_hex()[..16])
    }
}

impl Serialize for Fingerprint {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

/// The identity of a table's data, part of every key under which an answer about it is stored for reuse: a
/// statement asked again after the data changed is answered afresh, never from a release about other data.
///
/// What it keys on: for a table read from files, each file's path, size, modification time and (on Unix) inode
/// and status-change time, read when the statement is prepared (so a file rewritten, replaced or touched is other
/// data; a file changed between that moment and the read is not noticed until the next statement); for a table
/// held in memory, its contents (a BLAKE3 hash of its rows when registered as Arrow batches or loaded from its
/// files, which are then identified as they were when loaded), or for a table given as a provider, a random value
/// drawn when it was registered (reused only in this session).
///
/// Only *whether* the data changed can be observed through it (an answer reused, or charged afresh), never what
/// changed: a change of the files is the data owner's act, and what it shows is that the owner changed them.
#[derive(Clone, Debug)]
pub(crate) enum DataIdentity {
    /// Read from these files at every statement.
    Files(Vec<std::path::PathBuf>),
    /// Fixed when the table was registered.
    Fixed(Fingerprint),
}

impl DataIdentity {
    /// The identity of the data now: the files' metadata as they are (an error if a file cannot be read: the
    /// statement would fail to read it too), or the fixed identity.
    pub(crate) fn now(&self, table: &str) -> Result<Fingerprint> {
        let files = match self {
            DataIdentity::Fixed(f) => return Ok(*f),
            DataIdentity::Files(files) => files,
        };
        let mut canon = Canon::new("data files");
        for path in files {
            let meta = std::fs::metadata(path).map_err(|e| {
                DpError::Config(format!("[tables.{table}] cannot read {}: {e}; fix the file", path.display()))
            })?;
            canon.str(&path.to_string_lossy()).u64(meta.len());
            let mtime = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
            canon.u64(mtime.map_or(u64::MAX, |d| d.as_secs())).u64(mtime.map_or(0, |d| u64::from(d.subsec_nanos())));
            #[cfg(unix)]
            {
                use std::os::unix::fs::MetadataExt;
                canon.u64(meta.ino()).u64(meta.ctime() as u64).u64(meta.ctime_nsec() as u64);
            }
        }
        Ok(canon.finish())
    }

    /// The identity of in-memory rows: a hash of their Arrow IPC encoding (schema and values).
    pub(crate) fn of_batches(batches: &[datafusion::arrow::array::RecordBatch]) -> Result<DataIdentity> {
        let fail = |e: datafusion::arrow::error::ArrowError| DpError::Internal(format!("hashing a table: {e}"));
        let mut hasher = blake3::Hasher::new_derive_key("dpfusion 2026-11 table rows");
        if let Some(first) = batches.first() {
            let mut w =
                datafusion::arrow::ipc::writer::StreamWriter::try_new(&mut hasher, &first.schema()).map_err(fail)?;
            for b in batches {
                w.write(b).map_err(fail)?;
            }
            w.finish().map_err(fail)?;
        }
        Ok(DataIdentity::Fixed(Fingerprint(hasher.finalize())))
    }

    /// An identity drawn at random: data that cannot be hashed (a table provider), the same only to itself.
    pub(crate) fn random() -> DataIdentity {
        let bytes: [u8; 32] = rand::random();
        DataIdentity::Fixed(Fingerprint::from_bytes(bytes))
    }
}

/// A canonical encoder: typed parts, each length-prefixed, into a BLAKE3 hash whose key derivation context names
/// the kind of fingerprint.
pub(crate) struct Canon(blake3::Hasher);

impl Canon {
    /// An encoder for fingerprints of kind `purpose` (each kind its own BLAKE3 context).
    pub(crate) fn new(purpose: &str) -> Canon {
        Canon(blake3::Hasher::new_derive_key(&format!("dpfusion 2026-11 {purpose}")))
    }

    /// Raw bytes, length first.
    pub(crate) fn bytes(&mut self, b: &[u8]) -> &mut Canon {
        self.0.update(&(b.len() as u64).to_le_bytes());
        self.0.update(b);
        self
    }

    /// A string (its UTF-8 bytes).
    pub(crate) fn str(&mut self, s: &str) -> &mut Canon {
        self.bytes(s.as_bytes())
    }

    /// A number.
    pub(crate) fn u64(&mut self, v: u64) -> &mut Canon {
        self.bytes(&v.to_le_bytes())
    }

    /// Another fingerprint.
    pub(crate) fn fingerprint(&mut self, f: &Fingerprint) -> &mut Canon {
        self.bytes(f.as_bytes())
    }

    /// A value of dpfusion's own types, by its serde derivation in postcard (canonical: fields in order, variants
    /// by index, numbers by their bits).
    pub(crate) fn value<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<&mut Canon> {
        let bytes = postcard_bytes(v).map_err(|e| unencodable(format!("a value: {e}")))?;
        Ok(self.bytes(&bytes))
    }

    /// A typed scalar (its type and value, as DataFusion serialises them).
    pub(crate) fn scalar(&mut self, v: &ScalarValue) -> Result<&mut Canon> {
        let proto = protobuf::ScalarValue::try_from(v).map_err(|e| unencodable(format!("a value: {e}")))?;
        Ok(self.bytes(&proto.encode_to_vec()))
    }

    /// An Arrow type.
    pub(crate) fn data_type(&mut self, dt: &DataType) -> Result<&mut Canon> {
        let proto = protobuf::ArrowType::try_from(dt).map_err(|e| unencodable(format!("a type: {e}")))?;
        Ok(self.bytes(&proto.encode_to_vec()))
    }

    /// An expression.
    pub(crate) fn expr(&mut self, e: &Expr) -> Result<&mut Canon> {
        let proto = datafusion_proto::logical_plan::to_proto::serialize_expr(e, &FingerprintCodec)
            .map_err(|e| unencodable(format!("an expression: {e}")))?;
        Ok(self.bytes(&proto.encode_to_vec()))
    }

    /// A logical plan (module docs): its canonical form ([`canonical`]) as DataFusion serialises it, then the
    /// fetch of each of its scans (which that serialisation leaves out).
    pub(crate) fn plan(&mut self, plan: &LogicalPlan) -> Result<&mut Canon> {
        let canonical = canonical(plan)?;
        let bytes = datafusion_proto::bytes::logical_plan_to_bytes_with_extension_codec(&canonical, &FingerprintCodec)
            .map_err(|e| unencodable(format!("a plan: {e}")))?;
        self.bytes(&bytes);
        let mut fetches = Vec::new();
        canonical
            .apply_with_subqueries(|n| {
                if let LogicalPlan::TableScan(s) = n {
                    fetches.push(s.fetch.map_or(u64::MAX, |f| f as u64));
                }
                Ok(TreeNodeRecursion::Continue)
            })
            .map_err(crate::error::engine)?;
        for f in fetches {
            self.u64(f);
        }
        Ok(self)
    }

    /// A table's policy: its unit, limits, every column's bounds or typed domain, its quantile settings.
    pub(crate) fn policy(&mut self, p: &crate::policy::TablePolicy) -> Result<&mut Canon> {
        use crate::policy::ColumnPolicy;
        self.value(&p.privacy_unit)?.u64(p.max_rows_per_unit).u64(p.max_groups_per_unit);
        self.u64(p.columns.len() as u64);
        for (name, column) in &p.columns {
            self.str(name);
            match column {
                ColumnPolicy::Bounds { lo, hi } => self.u64(0).u64(lo.to_bits()).u64(hi.to_bits()),
                ColumnPolicy::Domain(values) => self.u64(1).domain(values),
                ColumnPolicy::Period { lo, hi } => self.u64(2).u64(*lo as u64).u64(*hi as u64),
            };
        }
        self.value(&p.quantiles.grid)?.u64(p.quantiles.min_max_quantile.to_bits());
        Ok(self)
    }

    /// A public domain: each value with its kind.
    pub(crate) fn domain(&mut self, values: &[crate::policy::DomainValue]) -> &mut Canon {
        use crate::policy::DomainValue;
        self.u64(values.len() as u64);
        for v in values {
            match v {
                DomainValue::Int(i) => self.u64(0).u64(*i as u64),
                DomainValue::Str(s) => self.u64(1).str(s),
                DomainValue::Bool(b) => self.u64(2).u64(u64::from(*b)),
            };
        }
        self
    }

    /// The fingerprint of everything written.
    pub(crate) fn finish(&self) -> Fingerprint {
        Fingerprint(self.0.finalize())
    }
}

/// The postcard encoding of `v` (canonical: fields in order, variants by index, numbers by their bits).
fn postcard_bytes<T: Serialize + ?Sized>(v: &T) -> std::result::Result<Vec<u8>, postcard::Error> {
    postcard::serialize_with_flavor(v, Bytes(Vec::new()))
}

/// postcard's output into a `Vec` (postcard's own needs its `alloc` feature, which turns on serde's for the whole
/// dependency tree).
struct Bytes(Vec<u8>);

impl postcard::ser_flavors::Flavor for Bytes {
    type Output = Vec<u8>;

    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.0.push(byte);
        Ok(())
    }

    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<Vec<u8>> {
        Ok(self.0)
    }
}

/// The fingerprint of a plan alone (module docs): what a charge names when it pays for running it.
pub fn plan_fingerprint(plan: &LogicalPlan) -> Result<Fingerprint> {
    Ok(Canon::new("plan").plan(plan)?.finish())
}

/// The tables `plan` scans, subqueries included, each once, in the order first met.
pub(crate) fn scanned_tables(plan: &LogicalPlan) -> Result<Vec<TableReference>> {
    let mut tables: Vec<TableReference> = Vec::new();
    plan.apply_with_subqueries(|n| {
        if let LogicalPlan::TableScan(s) = n
            && !tables.contains(&s.table_name)
        {
            tables.push(s.table_name.clone());
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .map_err(crate::error::engine)?;
    Ok(tables)
}

/// A plan dpfusion made that its fingerprint cannot encode: refused before anything is spent (a plan shape this
/// version does not know how to identify).
fn unencodable(message: String) -> DpError {
    DpError::Refused(Refusal::PrivatePlan { stage: "fingerprinted", message })
}

/// `plan` with each scan's source replaced by an empty table of its columns and types without metadata, and every
/// schema recomputed from those: what the plan computes, without the providers (which encode as what they
/// read, not what they are) or metadata (whose maps have no fixed order).
fn canonical(plan: &LogicalPlan) -> Result<LogicalPlan> {
    plan.clone()
        .transform_up_with_subqueries(|node| match node {
            LogicalPlan::TableScan(scan) => {
                let schema = scan.source.schema();
                let fields: Vec<Field> = schema
                    .fields()
                    .iter()
                    .map(|f| Field::new(f.name(), f.data_type().clone(), f.is_nullable()))
                    .collect();
                let source = provider_as_source(Arc::new(EmptyTable::new(Arc::new(Schema::new(fields)))));
                let TableScan { table_name, projection, filters, fetch, .. } = scan;
                let scan = TableScanBuilder::new(table_name, source)
                    .with_projection(projection)
                    .with_filters(filters)
                    .with_fetch(fetch)
                    .build()?;
                Ok(Transformed::yes(LogicalPlan::TableScan(scan)))
            }
            other => other.recompute_schema().map(Transformed::yes),
        })
        .map(|t| t.data)
        .map_err(|e| unencodable(format!("a plan: {e}")))
}

/// The extension codec of fingerprints: dpfusion's plan nodes and functions with every parameter; never decodes.
#[derive(Debug)]
pub(crate) struct FingerprintCodec;

impl LogicalExtensionCodec for FingerprintCodec {
    fn try_decode(
        &self,
        _buf: &[u8],
        _inputs: &[LogicalPlan],
        _ctx: &TaskContext,
    ) -> datafusion::error::Result<Extension> {
        not_impl_err!("a fingerprint is never decoded")
    }

    /// A node's name, then its parameters (its inputs are encoded by DataFusion).
    fn try_encode(&self, node: &Extension, buf: &mut Vec<u8>) -> datafusion::error::Result<()> {
        let any = node.node.as_any();
        let name = node.node.name();
        buf.extend_from_slice(&(name.len() as u64).to_le_bytes());
        buf.extend_from_slice(name.as_bytes());
        let params = if let Some(runs) = any.downcast_ref::<crate::plan::runs::UnitRuns>() {
            postcard_bytes(runs.spec()).map_err(|e| datafusion::error::DataFusionError::External(e.into()))?
        } else if let Some(by_unit) = any.downcast_ref::<crate::plan::by_unit::ByUnit>() {
            datafusion_proto::logical_plan::to_proto::serialize_expr(by_unit.unit(), self)?.encode_to_vec()
        } else {
            return not_impl_err!("the plan node {name}");
        };
        buf.extend_from_slice(&params);
        Ok(())
    }

    fn try_decode_table_provider(
        &self,
        _buf: &[u8],
        _table_ref: &TableReference,
        _schema: datafusion::arrow::datatypes::SchemaRef,
        _ctx: &TaskContext,
    ) -> datafusion::error::Result<Arc<dyn datafusion::catalog::TableProvider>> {
        not_impl_err!("a fingerprint is never decoded")
    }

    /// Never reached: [`canonical`] replaced every provider with an empty table.
    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        _node: Arc<dyn datafusion::catalog::TableProvider>,
        _buf: &mut Vec<u8>,
    ) -> datafusion::error::Result<()> {
        not_impl_err!("the table {table_ref} without its canonical form")
    }

    /// dpfusion's functions with every parameter but the keys of `dp_priority` and `dp_key_priority`: drawn afresh
    /// for every run to pick a unit's cells at random, they are the mechanism's randomness, as its noise is, not
    /// what the plan measures.
    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> datafusion::error::Result<()> {
        let inner = node.inner();
        if inner.is::<crate::plan::pick::Priority>() || inner.is::<crate::plan::selected::KeyPriority>() {
            return Ok(());
        }
        if let Some(bytes) = crate::plan::codec::encode_udf(node)? {
            buf.extend(bytes);
        }
        Ok(())
    }

    fn try_encode_udaf(&self, node: &AggregateUDF, buf: &mut Vec<u8>) -> datafusion::error::Result<()> {
        if let Some(bytes) = crate::plan::codec::encode_udaf(node)? {
            buf.extend(bytes);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::DataType;
    use datafusion::logical_expr::{LogicalPlanBuilder, col, lit};
    use std::collections::HashMap;

    /// A scan of table `t` with these Int64 columns (and a Utf8 `name`), `metadata` on its first field.
    fn scan(columns: &[&str], metadata: HashMap<String, String>) -> LogicalPlanBuilder {
        let mut fields: Vec<Field> = columns.iter().map(|c| Field::new(*c, DataType::Int64, true)).collect();
        fields.push(Field::new("name", DataType::Utf8, true));
        fields[0] = fields[0].clone().with_metadata(metadata);
        let source = provider_as_source(Arc::new(EmptyTable::new(Arc::new(Schema::new(fields)))));
        LogicalPlanBuilder::scan("t", source, None).unwrap()
    }

    fn filtered(columns: &[&str], predicate: Expr) -> LogicalPlan {
        scan(columns, HashMap::new()).filter(predicate).unwrap().build().unwrap()
    }

    /// Pairs of different plans that print the same (DataFusion prints string literals unescaped, column names
    /// unquoted, and a right operand of the same precedence without parentheses) have different fingerprints; the
    /// same plan made twice has the same one.
    #[test]
    fn plans_that_print_the_same_have_different_fingerprints() {
        let literal = (
            filtered(&["x"], col("name").eq(lit("B0")).or(col("name").eq(lit("B1")))),
            filtered(&["x"], col("name").eq(lit("B0\") OR t.name = Utf8(\"B1"))),
        );
        let odd = datafusion::common::Column::new(Some("t"), "x > Int64(1) OR t.y");
        let identifier = (
            filtered(&["x", "y", "x > Int64(1) OR t.y"], col("x").gt(lit(1i64)).or(col("y").gt(lit(2i64)))),
            filtered(&["x", "y", "x > Int64(1) OR t.y"], Expr::Column(odd).gt(lit(2i64))),
        );
        let nested = (
            filtered(&["a", "b", "c"], (col("a") - (col("b") - col("c"))).gt(lit(0i64))),
            filtered(&["a", "b", "c"], (col("a") - col("b") - col("c")).gt(lit(0i64))),
        );
        for (what, (one, other)) in [("literal", literal), ("identifier", identifier), ("nested", nested)] {
            let text = |p: &LogicalPlan| p.display_indent().to_string();
            assert_eq!(text(&one), text(&other), "{what}: the two plans print the same");
            assert_ne!(one, other, "{what}: they are different plans");
            let fp = |p: &LogicalPlan| plan_fingerprint(p).unwrap();
            assert_ne!(fp(&one), fp(&other), "{what}");
            assert_eq!(fp(&one), fp(&one.clone()), "{what}: the same plan, the same fingerprint");
        }
    }

    /// A column's metadata (a map, whose order is not fixed) does not change a fingerprint; a scan's fetch, which
    /// DataFusion's serialisation leaves out, does; so does every typed value (1 as Int64 or Int32).
    #[test]
    fn fingerprints_ignore_metadata_and_keep_fetch_and_types() {
        let with_metadata = |n: usize| {
            let metadata = (0..n).map(|i| (format!("k{i}"), format!("v{i}"))).collect();
            let plan = scan(&["x"], metadata).filter(col("x").gt(lit(1i64))).unwrap().build().unwrap();
            plan_fingerprint(&plan).unwrap()
        };
        assert_eq!(with_metadata(0), with_metadata(5));
        let limited = |fetch: Option<usize>| {
            let source = provider_as_source(Arc::new(EmptyTable::new(Arc::new(Schema::new(vec![Field::new(
                "x",
                DataType::Int64,
                true,
            )])))));
            let plan = TableScanBuilder::new("t", source).with_fetch(fetch).build().unwrap();
            plan_fingerprint(&LogicalPlan::TableScan(plan)).unwrap()
        };
        assert_ne!(limited(Some(1)), limited(Some(2)));
        assert_ne!(limited(None), limited(Some(1)));
        let typed = |v: Expr| plan_fingerprint(&filtered(&["x"], col("x").eq(v))).unwrap();
        assert_ne!(typed(lit(1i64)), typed(lit(1i32)));
    }

    /// The keys that pick a unit's cells at random, drawn afresh for every plan, are not part of its fingerprint:
    /// the same statement planned again is the same plan.
    #[test]
    fn the_random_keys_of_a_plan_are_not_part_of_it() {
        let pick = || filtered(&["x"], crate::plan::pick::Priority::call(col("x"), col("x")).gt(lit(0u64)));
        let (one, other) = (pick(), pick());
        assert_ne!(one, other, "two keys");
        assert_eq!(plan_fingerprint(&one).unwrap(), plan_fingerprint(&other).unwrap());
    }

    /// Each kind of fingerprint has its own context, and every part is length-prefixed: the same bytes written as
    /// one part or as two, or under another kind, differ.
    #[test]
    fn parts_and_kinds_are_unambiguous() {
        let one = Canon::new("a").str("xy").finish();
        let two = Canon::new("a").str("x").str("y").finish();
        let other = Canon::new("b").str("xy").finish();
        assert!(one != two && one != other && two != other);
        assert_eq!(one, Canon::new("a").str("xy").finish());
        let f = Canon::new("a").u64(7).finish();
        assert_eq!(Fingerprint::from_hex(&f.to_hex()), Some(f));
        assert_eq!(Fingerprint::from_hex("not hex"), None);
    }
}
