//! No declared order reaches a private plan: what a table claims about how its rows are sorted or partitioned is
//! forgotten before DataFusion plans on it.
//!
//! DataFusion takes an order from what a table declares — a Parquet file's `sorting_columns` (those of its first
//! row group, for the whole file), a `ListingTable`'s `file_sort_order`, a `MemTable`'s sort order, any provider's
//! output ordering or hash partitioning — and plans on it without checking it against the rows. An aggregation by
//! privacy unit over input declared sorted by unit then runs in streaming mode (`ordering_mode=Sorted`): it closes
//! a unit's group as soon as another unit begins, so a unit whose rows come back later starts a second group and is
//! clipped twice, up to twice the `k` rows' worth the sensitivity assumes. A Parquet file whose row groups are
//! each sorted, which is what `sorting_columns` means, but not sorted as a whole is enough. Likewise a leaf declared
//! hash-partitioned by the unit would let a unit found in two partitions be aggregated once in each.
//!
//! # Why it is safe
//! [`ForgetDeclaredOrder`] is the first of a private context's physical optimizer rules (see
//! [`crate::session`]). It wraps every leaf of the plan (a scan) that declares an ordering or a partitioning by
//! keys in [`UnorderedExec`], which passes the leaf's batches through unchanged and declares neither; every node
//! above is rebuilt on it, and DataFusion derives each node's modes again from its input's properties. So no part
//! of a private plan rests on a claim about the rows that nothing verified; where order helps, the bounding checks
//! it itself while it streams ([`super::runs`]). The rows read and the results computed from them are those of
//! the same table without the claim: only the plan's shape, hence its running time, differs, and only for tables
//! that make one.

use datafusion::common::Result;
use datafusion::common::config::ConfigOptions;
use datafusion::common::internal_err;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties};
use std::fmt;
use std::sync::Arc;

/// The physical optimizer rule: every leaf that declares an ordering or a partitioning by keys is wrapped in
/// [`UnorderedExec`]. Runs before DataFusion's own rules.
#[derive(Debug)]
pub(crate) struct ForgetDeclaredOrder;

/// Whether `plan` claims something about its rows beyond their schema: an ordering, or a partitioning by keys.
fn declares(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.output_ordering().is_some()
        || !matches!(
            plan.output_partitioning(),
            Partitioning::UnknownPartitioning(_) | Partitioning::RoundRobinBatch(_)
        )
}

impl PhysicalOptimizerRule for ForgetDeclaredOrder {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_down(|node| {
            if node.is::<UnorderedExec>() {
                // Already wrapped (the rule ran before): nothing below to look at.
                return Ok(Transformed::new(node, false, TreeNodeRecursion::Jump));
            }
            if node.children().is_empty() && declares(&node) {
                let wrapped: Arc<dyn ExecutionPlan> = Arc::new(UnorderedExec::new(node));
                return Ok(Transformed::new(wrapped, true, TreeNodeRecursion::Jump));
            }
            Ok(Transformed::no(node))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "dp_forget_declared_order"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// A leaf's batches as they are, with no ordering and no partitioning by keys declared.
#[derive(Debug)]
pub(crate) struct UnorderedExec {
    input: Arc<dyn ExecutionPlan>,
    props: Arc<PlanProperties>,
}

impl UnorderedExec {
    /// `input`'s batches, with nothing declared about them.
    pub(crate) fn new(input: Arc<dyn ExecutionPlan>) -> Self {
        let partitions = input.output_partitioning().partition_count();
        let props = PlanProperties::new(
            EquivalenceProperties::new(input.schema()),
            Partitioning::UnknownPartitioning(partitions),
            input.pipeline_behavior(),
            input.boundedness(),
        );
        UnorderedExec { input, props: Arc::new(props) }
    }
}

impl DisplayAs for UnorderedExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "DpUnorderedExec: the order and partitioning its input declares are not relied upon")
    }
}

impl ExecutionPlan for UnorderedExec {
    fn name(&self) -> &str {
        "DpUnorderedExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    /// Nothing between it and the leaf: a scan that can read its files in more partitions does so through
    /// [`ExecutionPlan::repartitioned`] below.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let Ok([input]) = <[Arc<dyn ExecutionPlan>; 1]>::try_from(children) else {
            return internal_err!("DpUnorderedExec has one input");
        };
        Ok(Arc::new(UnorderedExec::new(input)))
    }

    /// The leaf read in `target_partitions` partitions when it can be (files split into ranges), still wrapped.
    fn repartitioned(
        &self,
        target_partitions: usize,
        config: &ConfigOptions,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        Ok(self
            .input
            .repartitioned(target_partitions, config)?
            .map(|input| Arc::new(UnorderedExec::new(input)) as Arc<dyn ExecutionPlan>))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        self.input.execute(partition, context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
    use datafusion::datasource::MemTable;
    use datafusion::physical_plan::displayable;
    use datafusion::physical_plan::empty::EmptyExec;
    use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
    use datafusion::prelude::col;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("pid", DataType::Int64, false)]))
    }

    /// How many leaves of `plan` are wrapped, and whether `plan` declares an ordering.
    fn wrapped(plan: &Arc<dyn ExecutionPlan>) -> (usize, bool) {
        let text = displayable(plan.as_ref()).indent(false).to_string();
        (text.matches("DpUnorderedExec").count(), plan.output_ordering().is_some())
    }

    /// A scan declared sorted is wrapped once (the rule run again adds nothing) and nothing above it is ordered;
    /// a scan that declares nothing is left as it is.
    #[tokio::test]
    async fn a_declared_order_is_wrapped_once_and_nothing_else_is() {
        for (sorted, want) in [(true, (1, false)), (false, (0, false))] {
            let mut table = MemTable::try_new(schema(), vec![vec![]]).unwrap();
            if sorted {
                table = table.with_sort_order(vec![vec![col("pid").sort(true, false)]]);
            }
            let ctx = crate::session::private_context();
            ctx.register_table("t", Arc::new(table)).unwrap();
            let plan = ctx.sql("SELECT pid FROM t").await.unwrap().create_physical_plan().await.unwrap();
            assert_eq!(wrapped(&plan), want, "sorted: {sorted}");
            let again = ForgetDeclaredOrder.optimize(plan, &ConfigOptions::default()).unwrap();
            assert_eq!(wrapped(&again), want, "sorted: {sorted}, the rule run twice");
        }
    }

    /// A leaf that claims its rows hash-partitioned by `pid`.
    #[derive(Debug)]
    struct HashLeaf(Arc<PlanProperties>);

    impl DisplayAs for HashLeaf {
        fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "HashLeaf")
        }
    }

    impl ExecutionPlan for HashLeaf {
        fn name(&self) -> &str {
            "HashLeaf"
        }
        fn properties(&self) -> &Arc<PlanProperties> {
            &self.0
        }
        fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
            vec![]
        }
        fn apply_expressions(
            &self,
            _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
        ) -> Result<TreeNodeRecursion> {
            Ok(TreeNodeRecursion::Continue)
        }
        fn with_new_children(self: Arc<Self>, _c: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
            Ok(self)
        }
        fn execute(&self, p: usize, c: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
            EmptyExec::new(schema()).execute(p, c)
        }
    }

    /// A leaf declared hash-partitioned by a column is wrapped: its partitions are no longer taken to hold each
    /// value of the column in one of them (an aggregation by unit would otherwise skip the repartition).
    #[test]
    fn a_declared_partitioning_by_keys_is_forgotten() {
        let pid = datafusion::physical_expr::expressions::col("pid", &schema()).unwrap();
        let props = PlanProperties::new(
            EquivalenceProperties::new(schema()),
            Partitioning::Hash(vec![pid], 2),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        let leaf: Arc<dyn ExecutionPlan> = Arc::new(HashLeaf(Arc::new(props)));
        let plan = ForgetDeclaredOrder.optimize(leaf, &ConfigOptions::default()).unwrap();
        assert!(plan.is::<UnorderedExec>());
        assert!(matches!(plan.output_partitioning(), Partitioning::UnknownPartitioning(2)));
    }
}
