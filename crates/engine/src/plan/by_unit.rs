//! `DpByUnit`: the rows, hash-partitioned by privacy unit, so that the aggregation by unit above them runs in one
//! phase. Used for `max_groups_per_unit = g > 1`.
//!
//! DataFusion plans every grouped aggregation in two phases: a partial aggregation in each input partition, a
//! repartition of its states by the keys, then the final aggregation. Grouped by privacy unit, the first phase
//! reduces little when units have a few rows each spread over the file, and DataFusion stops it after its first
//! 100 000 rows: each row then becomes a state of its own that crosses the repartition. With a pick of g > 1 cells
//! (`dp_clipped`) such a state has g sub-slots, all but the first of them empty: g times the columns of a row.
//! This node asks for the rows themselves to be repartitioned by unit instead; the aggregation's input is then
//! partitioned as its final phase needs, and DataFusion runs it in one phase (`SinglePartitioned`) over the rows.
//!
//! Measured (BENCHMARKS.md, issue 16): at 10^7 rows and 3.3 M persons, g = 2 takes 15–20 % less CPU time; with
//! g = 1 or no pick (one sub-slot) it gains nothing, and over tables of few units (50 units of 200 000 rows), where
//! the partial phase does reduce the rows, moving every row through the repartition costs 15–40 %. Hence g > 1 only.
//!
//! # Why it is safe
//! The node passes its input's rows through unchanged; it only states how they must be partitioned, which
//! DataFusion's distribution rule satisfies with a hash repartition. The aggregation above it computes the same
//! function of the rows in one phase as in two (the bounding's accumulators merge exactly, in any order), so the
//! released numbers and every sensitivity are unchanged. Its one expression is the unit column, and nothing in it
//! can fail on a value.

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DFSchemaRef, Result, internal_err};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};
use datafusion::physical_expr::{Distribution, PhysicalExpr};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use std::fmt;
use std::sync::Arc;

/// The logical node: `input`, to be hash-partitioned by `unit` (a column of it).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd)]
pub(crate) struct ByUnit {
    input: LogicalPlan,
    unit: Expr,
}

impl ByUnit {
    /// `input` hash-partitioned by `unit`, the GROUP BY of the aggregation placed right above it.
    pub(crate) fn new(input: LogicalPlan, unit: Expr) -> Self {
        ByUnit { input, unit }
    }

    /// The unit it partitions by.
    pub(crate) fn unit(&self) -> &Expr {
        &self.unit
    }
}

impl UserDefinedLogicalNodeCore for ByUnit {
    fn name(&self) -> &str {
        "DpByUnit"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        self.input.schema()
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![self.unit.clone()]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "DpByUnit: hash-partitioned by {} (one-phase aggregation above)", self.unit)
    }

    fn with_exprs_and_inputs(&self, exprs: Vec<Expr>, inputs: Vec<LogicalPlan>) -> Result<Self> {
        let (Ok([unit]), Ok([input])) = (<[Expr; 1]>::try_from(exprs), <[LogicalPlan; 1]>::try_from(inputs)) else {
            return internal_err!("DpByUnit has one expression and one input");
        };
        Ok(ByUnit { input, unit })
    }

    /// The columns asked for, and the unit: the node passes its input's columns through, so projections are pushed
    /// below it (the scan then reads only what the aggregation needs).
    fn necessary_children_exprs(&self, output_columns: &[usize]) -> Option<Vec<Vec<usize>>> {
        let Expr::Column(unit) = &self.unit else { return None };
        let mut needed = output_columns.to_vec();
        needed.push(self.input.schema().index_of_column(unit).ok()?);
        needed.sort_unstable();
        needed.dedup();
        Some(vec![needed])
    }
}

/// Plans [`ByUnit`] as [`ByUnitExec`].
#[derive(Debug)]
pub(crate) struct ByUnitPlanner;

#[async_trait::async_trait]
impl datafusion::physical_planner::ExtensionPlanner for ByUnitPlanner {
    async fn plan_extension(
        &self,
        planner: &dyn datafusion::physical_planner::PhysicalPlanner,
        node: &dyn datafusion::logical_expr::UserDefinedLogicalNode,
        logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        session: &dyn datafusion::catalog::Session,
        ctx: &datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(node) = node.as_any().downcast_ref::<ByUnit>() else { return Ok(None) };
        let ([logical], [input]) = (logical_inputs, physical_inputs) else {
            return internal_err!("DpByUnit has one input");
        };
        let unit = planner.create_physical_expr(&node.unit, logical.schema(), session, ctx)?;
        Ok(Some(Arc::new(ByUnitExec::new(Arc::clone(input), unit))))
    }
}

/// The physical node: its input's partitions as they are, once the distribution rule has hash-partitioned them
/// by `unit` ([`ExecutionPlan::required_input_distribution`]).
#[derive(Debug)]
pub(crate) struct ByUnitExec {
    input: Arc<dyn ExecutionPlan>,
    unit: Arc<dyn PhysicalExpr>,
    props: Arc<PlanProperties>,
}

impl ByUnitExec {
    /// `input`, to be hash-partitioned by `unit`.
    pub(crate) fn new(input: Arc<dyn ExecutionPlan>, unit: Arc<dyn PhysicalExpr>) -> Self {
        let props = Arc::clone(input.properties());
        ByUnitExec { input, unit, props }
    }

    #[cfg(feature = "cluster")]
    /// The unit expression the rows are partitioned by.
    pub(crate) fn unit(&self) -> &Arc<dyn PhysicalExpr> {
        &self.unit
    }
}

impl DisplayAs for ByUnitExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "DpByUnitExec: hash-partitioned by {}", self.unit)
    }
}

impl ExecutionPlan for ByUnitExec {
    fn name(&self) -> &str {
        "DpByUnitExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![Distribution::KeyPartitioned(vec![Arc::clone(&self.unit)])]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        f(&self.unit)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let Ok([input]) = <[Arc<dyn ExecutionPlan>; 1]>::try_from(children) else {
            return internal_err!("DpByUnitExec has one input");
        };
        Ok(Arc::new(ByUnitExec::new(input, Arc::clone(&self.unit))))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        self.input.execute(partition, context)
    }
}
