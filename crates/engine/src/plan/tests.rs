//! The compiler's phases, each alone, and snapshots of the rewritten plans they build (as DataFusion's optimizer
//! tests pin theirs): a change in the shape of a bounded plan shows up here as a readable diff.

use super::*;
use crate::policy::{ColumnPolicy, DomainValue};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use std::collections::BTreeMap;
use std::sync::Arc;

/// `t(pid, age, sex, income, score)`: age and sex have domains, income and score bounds; score is a float key.
fn policy(unit: bool, groups: u64) -> TablePolicy {
    let ints = |v: &[i64]| ColumnPolicy::Domain(v.iter().map(|i| DomainValue::Int(*i)).collect());
    let cols = BTreeMap::from([
        ("age".to_string(), ints(&[0, 1, 2, 3])),
        ("sex".to_string(), ColumnPolicy::Domain(vec![DomainValue::Str("F".into()), DomainValue::Str("M".into())])),
        ("income".to_string(), ColumnPolicy::Bounds { lo: 0.0, hi: 1000.0 }),
        ("score".to_string(), ints(&[0, 1])),
    ]);
    if unit { TablePolicy::with_unit("pid", 2, groups, cols).unwrap() } else { TablePolicy::row_level(cols).unwrap() }
}

/// The analyzed plan of `sql` over an empty `t` (as `session::prepare` plans it before compiling).
async fn analyzed(sql: &str) -> LogicalPlan {
    let schema = Schema::new(vec![
        Field::new("pid", DataType::Int64, false),
        Field::new("age", DataType::Int64, true),
        Field::new("sex", DataType::Utf8, true),
        Field::new("income", DataType::Int64, true),
        Field::new("score", DataType::Float64, true),
    ]);
    let ctx = SessionContext::new();
    ctx.register_table("t", Arc::new(MemTable::try_new(Arc::new(schema), vec![vec![]]).unwrap())).unwrap();
    let state = ctx.state();
    let plan = state.create_logical_plan(sql).await.unwrap();
    state.analyzer().execute_and_check(plan, state.config_options(), |_, _| {}).unwrap()
}

async fn compiled(sql: &str, policy: &TablePolicy) -> Result<DpPlan> {
    compile(&analyzed(sql).await, &|t| (t.table() == "t").then(|| policy.clone()))
}

/// Asserts that `plan` displays as `expected` (indented lines; common indentation and blank ends ignored).
#[track_caller]
fn assert_plan(plan: &LogicalPlan, expected: &str) {
    let lines: Vec<&str> = expected.lines().filter(|l| !l.trim().is_empty()).collect();
    let indent = lines.iter().map(|l| l.len() - l.trim_start().len()).min().unwrap_or(0);
    let expected: Vec<&str> = lines.iter().map(|l| &l[indent..]).collect();
    let actual = plan.display_indent().to_string();
    assert_eq!(actual.lines().collect::<Vec<_>>(), expected, "\nthe plan is now:\n{actual}\n");
}

/// The refusal code of compiling `sql`.
async fn refused(sql: &str, policy: &TablePolicy) -> &'static str {
    match compiled(sql, policy).await {
        Err(e) => e.code(),
        Ok(_) => panic!("{sql} compiled"),
    }
}

/// The single Aggregate of `sql`'s plan, with its table.
fn located(plan: &LogicalPlan) -> (&datafusion::logical_expr::Aggregate, TableReference) {
    let l = validate::locate(plan, &|t| t.table() == "t").unwrap();
    (l.aggregate, l.table)
}

#[tokio::test]
async fn keys_are_bare_columns_with_a_public_domain_and_never_the_unit() {
    let plan = analyzed("SELECT sex, age, COUNT(*) FROM t GROUP BY sex, age").await;
    let (agg, table) = located(&plan);
    let keys = keys::group_keys(agg, &policy(true, 1), &table, &Default::default()).unwrap();
    let shown: Vec<(String, String)> = keys
        .iter()
        .map(|k| (k.base.clone(), k.domain.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(",")))
        .collect();
    assert_eq!(shown, [("sex".to_string(), "F,M".to_string()), ("age".into(), "0,1,2,3".into())]);
    assert_eq!(keys::cells(&keys).unwrap(), 8);
    let p = policy(true, 1);
    // A computed key's domain is the image of its inputs' domains (`plan::computed`).
    let plus = compiled("SELECT age + 1, COUNT(*) FROM t GROUP BY age + 1", &p).await.unwrap();
    let domain: Vec<String> = plus.keys[0].domain.iter().map(ToString::to_string).collect();
    assert_eq!((plus.keys[0].base.as_str(), domain), ("age + 1", vec!["1".into(), "2".into(), "3".into(), "4".into()]));
    assert!(!plus.keys[0].selected);
    assert_eq!(refused("SELECT CAST(pid AS DOUBLE) * 2.0, COUNT(*) FROM t GROUP BY 1", &p).await, "computed_key");
    assert_eq!(refused("SELECT pid, COUNT(*) FROM t GROUP BY pid", &p).await, "unit_as_key");
    // A column without a domain is a selected key (issue 38): its values come from the noisy counts.
    let selected = compiled("SELECT income, COUNT(*) FROM t GROUP BY income", &p).await.unwrap();
    assert!(selected.keys[0].selected && selected.selection == Some(0) && selected.cells().is_none());
    assert_eq!(refused("SELECT age, COUNT(*) FROM t GROUP BY ROLLUP(age)", &p).await, "grouping_sets");
    let wide = |base: &str| GroupKey {
        column: Column::from_name(base),
        base: base.into(),
        domain: (0..1001).map(|i| ScalarValue::Int64(Some(i))).collect(),
        selected: false,
    };
    assert_eq!(keys::cells(&[wide("a")]).unwrap(), 1001);
    assert_eq!(keys::cells(&[wide("a"), wide("b")]).unwrap_err().code(), "too_many_cells");
}

#[tokio::test]
async fn the_scope_carries_the_unit_and_drops_rows_outside_the_domains() {
    let scope = |sql: &'static str, p: TablePolicy| async move {
        let plan = analyzed(sql).await;
        let (agg, table) = located(&plan);
        let keys = keys::group_keys(agg, &p, &table, &Default::default()).unwrap();
        keys::scope(agg.input.as_ref(), &p, &keys).unwrap()
    };
    // Row level, integer key: nothing to add (out-of-domain groups are discarded unseen after the aggregate).
    let s = scope("SELECT age, COUNT(*) FROM t WHERE sex = 'F' GROUP BY age", policy(false, 1)).await;
    assert_plan(
        &s,
        r#"
        Filter: t.sex = Utf8("F")
          TableScan: t
        "#,
    );
    // A float key compares -0.0 = 0.0: filtered to its domain.
    let s = scope("SELECT score, COUNT(*) FROM t GROUP BY score", policy(false, 1)).await;
    assert_plan(
        &s,
        "
        Filter: t.score IN ([Float64(0), Float64(1)])
          TableScan: t
        ",
    );
    // Person level: the unit carried up, then each row's cell as one integer, NULL (dropped) outside the domains.
    let s = scope("SELECT age, COUNT(*) FROM t GROUP BY age", policy(true, 1)).await;
    assert_plan(
        &s,
        "
        Filter: __dp_cell IS NOT NULL
          Projection: t.pid, t.age, t.sex, t.income, t.score, __dp_unit, dp_cell(t.age) AS __dp_cell
            Projection: t.pid, t.age, t.sex, t.income, t.score, t.pid AS __dp_unit
              TableScan: t
        ",
    );
}

#[tokio::test]
async fn measurements_are_shared_and_carry_their_sensitivities() {
    let p = policy(true, 1);
    let plan = analyzed("SELECT SUM(income), AVG(income), COUNT(income), COUNT(*) FROM t").await;
    let (agg, table) = located(&plan);
    let scoped = keys::scope(agg.input.as_ref(), &p, &[]).unwrap();
    let contribution = Contribution::of(&p, None);
    let m = measures::measurements(agg, scoped.schema(), &p, &table, contribution, &[]).unwrap();
    let labels: Vec<String> = m.measures.iter().map(Measure::label).collect();
    assert_eq!(labels, ["SUM(income)", "COUNT(income)", "COUNT(*)"], "AVG shares the SUM and the COUNT");
    assert_eq!(
        m.outputs,
        [OutputKind::Measure(0), OutputKind::Avg { sum: 0, count: 1 }, OutputKind::Measure(1), OutputKind::Measure(2)]
    );
    // k = 2 rows per person, one group: a COUNT moves by 2, a SUM of values in [0, 1000] by 2000.
    let l1: Vec<f64> = m.measures.iter().map(|m| m.sensitivity.l1).collect();
    assert_eq!(l1, [2000.0, 2.0, 2.0]);
    for (sql, code) in [
        ("SELECT COUNT(DISTINCT age) FROM t", "distinct_aggregate"),
        ("SELECT SUM(income / (income - 1)) FROM t", "computed_fails"),
        ("SELECT SUM(score * 2.0) FROM t", "unbounded_value"),
        ("SELECT SUM(age) FROM t", "no_bounds"),
        ("SELECT SUM(pid) FROM t", "unit_aggregated"),
        ("SELECT first_value(income) FROM t", "unsupported_aggregate"),
        ("SELECT MAX(DISTINCT income) FROM t", "distinct_aggregate"),
    ] {
        assert_eq!(refused(sql, &p).await, code, "{sql}");
    }
}

#[tokio::test]
async fn bounded_plans_keep_their_shape() {
    let snapshot = |sql: &'static str, p: TablePolicy, expected: &'static str| async move {
        let dp = compiled(sql, &p).await.unwrap();
        assert_plan(&dp.private, expected);
    };
    // Row level: one aggregation, each measurement once.
    snapshot(
        "SELECT age, SUM(income), AVG(income), COUNT(income) FROM t WHERE sex = 'F' GROUP BY age",
        policy(false, 1),
        r#"
        Aggregate: groupBy=[[t.age]], aggr=[[dp_bounded_sum(CAST(t.income AS Int64)) AS __dp_m0, count(t.income) AS __dp_m1]]
          Filter: t.sex = Utf8("F")
            TableScan: t
        "#,
    )
    .await;
    // Person level without GROUP BY: each person's rows counted, clipped to k = 2, summed — by one pass over the
    // rows when they turn out to be clustered by person (first input), else by hash aggregation (second input).
    snapshot(
        "SELECT COUNT(*) FROM t",
        policy(true, 1),
        r#"
        DpUnitRuns: k=2, groups=None, cells=1 (one pass over the first input if it is verified clustered by unit, else the second)
          Projection: __dp_unit
            Projection: t.pid, t.age, t.sex, t.income, t.score, t.pid AS __dp_unit
              TableScan: t
          Aggregate: groupBy=[[]], aggr=[[sum(__dp_x0) AS __dp_m0]]
            Projection: __dp_unit, get_field(__dp_s, Utf8("x0")) AS __dp_x0
              Aggregate: groupBy=[[__dp_unit]], aggr=[[dp_clipped(Int64(1)) AS __dp_s]]
                Projection: t.pid, t.age, t.sex, t.income, t.score, t.pid AS __dp_unit
                  TableScan: t
        "#,
    )
    .await;
    // One group per person: one aggregation per person picks the cell of smallest keyed-hash priority
    // and clips the person's rows in that cell (dp_clipped); the key is decoded from the cell at the end.
    snapshot(
        "SELECT age, AVG(income) FROM t GROUP BY age",
        policy(true, 1),
        r#"
        Projection: dp_cell_key(__dp_cell) AS age, __dp_m0, __dp_m1
          DpUnitRuns: k=2, groups=Some(1), cells=4 (one pass over the first input if it is verified clustered by unit, else the second)
            Projection: __dp_unit, __dp_cell, CAST(t.income AS Int64) AS __dp_row0, t.income AS __dp_row1
              Filter: __dp_cell IS NOT NULL
                Projection: t.pid, t.age, t.sex, t.income, t.score, __dp_unit, dp_cell(t.age) AS __dp_cell
                  Projection: t.pid, t.age, t.sex, t.income, t.score, t.pid AS __dp_unit
                    TableScan: t
            Aggregate: groupBy=[[__dp_cell]], aggr=[[sum(__dp_x0) AS __dp_m0, sum(__dp_x1) AS __dp_m1]]
              Projection: get_field(__dp_s, Utf8("cell")) AS __dp_cell, get_field(__dp_s, Utf8("x0")) AS __dp_x0, get_field(__dp_s, Utf8("x1")) AS __dp_x1
                Aggregate: groupBy=[[__dp_unit]], aggr=[[dp_clipped(CAST(t.income AS Int64), t.income, __dp_p) AS __dp_s]]
                  Projection: t.pid, t.age, t.sex, t.income, t.score, __dp_unit, __dp_cell, dp_priority(__dp_unit, __dp_cell) AS __dp_p
                    Filter: __dp_cell IS NOT NULL
                      Projection: t.pid, t.age, t.sex, t.income, t.score, __dp_unit, dp_cell(t.age) AS __dp_cell
                        Projection: t.pid, t.age, t.sex, t.income, t.score, t.pid AS __dp_unit
                          TableScan: t
        "#,
    )
    .await;
    // Two groups per person (fewer than the four cells): the same one aggregation per person keeps the two cells
    // of smallest priority, as lists, unnested; no sort. Its rows are hash-partitioned by person first, so that
    // it runs in one phase (DpByUnit).
    snapshot(
        "SELECT age, COUNT(*) FROM t GROUP BY age",
        policy(true, 2),
        r#"
        Projection: dp_cell_key(__dp_cell) AS age, __dp_m0
          DpUnitRuns: k=2, groups=Some(2), cells=4 (one pass over the first input if it is verified clustered by unit, else the second)
            Projection: __dp_unit, __dp_cell
              Filter: __dp_cell IS NOT NULL
                Projection: t.pid, t.age, t.sex, t.income, t.score, __dp_unit, dp_cell(t.age) AS __dp_cell
                  Projection: t.pid, t.age, t.sex, t.income, t.score, t.pid AS __dp_unit
                    TableScan: t
            Aggregate: groupBy=[[__dp_cell]], aggr=[[sum(__dp_x0) AS __dp_m0]]
              Unnest: lists[__dp_cell|depth=1, __dp_x0|depth=1] structs[]
                Projection: get_field(__dp_s, Utf8("cell")) AS __dp_cell, get_field(__dp_s, Utf8("x0")) AS __dp_x0
                  Aggregate: groupBy=[[__dp_unit]], aggr=[[dp_clipped(__dp_p) AS __dp_s]]
                    DpByUnit: hash-partitioned by __dp_unit (one-phase aggregation above)
                      Projection: t.pid, t.age, t.sex, t.income, t.score, __dp_unit, __dp_cell, dp_priority(__dp_unit, __dp_cell) AS __dp_p
                        Filter: __dp_cell IS NOT NULL
                          Projection: t.pid, t.age, t.sex, t.income, t.score, __dp_unit, dp_cell(t.age) AS __dp_cell
                            Projection: t.pid, t.age, t.sex, t.income, t.score, t.pid AS __dp_unit
                              TableScan: t
        "#,
    )
    .await;
    // As many groups allowed as there are cells: no selection at all.
    snapshot(
        "SELECT sex, COUNT(*) FROM t GROUP BY sex",
        policy(true, 2),
        r#"
        Projection: dp_cell_key(__dp_cell) AS sex, __dp_m0
          DpUnitRuns: k=2, groups=None, cells=2 (one pass over the first input if it is verified clustered by unit, else the second)
            Projection: __dp_unit, __dp_cell
              Filter: __dp_cell IS NOT NULL
                Projection: t.pid, t.age, t.sex, t.income, t.score, __dp_unit, dp_cell(t.sex) AS __dp_cell
                  Projection: t.pid, t.age, t.sex, t.income, t.score, t.pid AS __dp_unit
                    TableScan: t
            Aggregate: groupBy=[[__dp_cell]], aggr=[[sum(__dp_x0) AS __dp_m0]]
              Projection: __dp_cell, __dp_unit, get_field(__dp_s, Utf8("x0")) AS __dp_x0
                Aggregate: groupBy=[[__dp_unit, __dp_cell]], aggr=[[dp_clipped(Int64(1)) AS __dp_s]]
                  Filter: __dp_cell IS NOT NULL
                    Projection: t.pid, t.age, t.sex, t.income, t.score, __dp_unit, dp_cell(t.sex) AS __dp_cell
                      Projection: t.pid, t.age, t.sex, t.income, t.score, t.pid AS __dp_unit
                        TableScan: t
        "#,
    )
    .await;
}

/// With g > 1 the aggregation by unit runs in one phase over rows hash-partitioned by unit (DpByUnit), not over a
/// state per row with g sub-slots; with g = 1 it keeps DataFusion's two phases (one sub-slot per state, and the
/// partial phase still reduces tables of few units). Checked on the physical plan, which DataFusion's distribution
/// rules shape: a change there that undid the one phase would show here.
#[tokio::test]
async fn the_aggregation_by_unit_runs_in_one_phase_only_for_g_above_one() {
    // The table in two partitions: DataFusion hash-partitions an input of one only when it expects many rows.
    let ctx = crate::session::private_context();
    let schema = analyzed("SELECT * FROM t").await.schema().as_arrow().clone();
    ctx.register_table("t", Arc::new(MemTable::try_new(Arc::new(schema), vec![vec![], vec![]]).unwrap())).unwrap();
    let mut state = ctx.state();
    state.config_mut().options_mut().execution.target_partitions = 4;
    let plan = state.create_logical_plan("SELECT age, COUNT(*) FROM t GROUP BY age").await.unwrap();
    let plan = state.analyzer().execute_and_check(plan, state.config_options(), |_, _| {}).unwrap();
    for (g, one_phase) in [(2, true), (1, false)] {
        let dp = compile(&plan, &|t| (t.table() == "t").then(|| policy(true, g))).unwrap();
        let physical = state.create_physical_plan(&dp.private).await.unwrap();
        let text = datafusion::physical_plan::displayable(physical.as_ref()).indent(false).to_string();
        let by_unit =
            |mode: &str| text.contains(&format!("AggregateExec: mode={mode}, gby=[__dp_unit@0 as __dp_unit]"));
        assert_eq!(by_unit("SinglePartitioned"), one_phase, "g = {g}:\n{text}");
        assert_eq!(by_unit("Partial"), !one_phase, "g = {g}:\n{text}");
        assert_eq!(text.contains("DpByUnitExec: hash-partitioned by __dp_unit@0"), one_phase, "g = {g}:\n{text}");
    }
}

/// Keys without a domain (issue 38): per (unit, key) clipped contributions, at most g keys per unit by
/// `LAG(__dp_unit, g) OVER (ORDER BY __dp_unit, dp_key_priority(…), keys)` IS DISTINCT FROM the unit, summed per key; public keys
/// keep their domain filter; a query without COUNT(*) gets a hidden one to select with; quantiles are refused.
#[tokio::test]
async fn keys_without_a_domain_are_bounded_per_unit_and_ranked_within_it() {
    let p = policy(true, 2);
    let dp = compiled("SELECT income, sex, SUM(income) FROM t GROUP BY income, sex", &p).await.unwrap();
    let plan = dp.private.display_indent().to_string();
    let plan = plan.lines().map(|l| l.split("dp_key_priority").next().unwrap_or(l)).collect::<Vec<_>>().join("\n");
    assert!(plan.contains("WindowAggr: windowExpr=[[lag(__dp_unit, Int64(2), NULL) ORDER BY [__dp_unit ASC NULLS FIRST, __dp_p ASC NULLS FIRST, t.income ASC NULLS FIRST, t.sex ASC NULLS FIRST]"), "{plan}");
    assert!(plan.contains("Filter: __dp_r IS DISTINCT FROM __dp_unit"), "{plan}");
    assert!(
        plan.contains("t.income IS NOT NULL") && plan.contains("t.sex = Utf8(\"F\") OR t.sex = Utf8(\"M\")")
            || plan.contains("t.sex IN"),
        "{plan}"
    );
    let labels: Vec<String> = dp.measures.iter().map(Measure::label).collect();
    assert_eq!(labels, ["SUM(income)", "COUNT(*)"], "a hidden COUNT(*) selects");
    assert_eq!(dp.selection, Some(1));
    assert_eq!(dp.outputs.len(), 1);
    assert_eq!(refused("SELECT income, MEDIAN(income) FROM t GROUP BY income", &p).await, "selection_unsupported");
    let unsafe_free = safety::check_total(&dp.private);
    assert!(unsafe_free.is_ok(), "{unsafe_free:?}");
}

/// With g = 1 a unit's key is kept in the aggregation by unit itself (`dp_kept_key`: its key of smallest priority,
/// clipped), with no window and no sort, as the fallback of the streaming pass over the keys numbered as met (the
/// private and the public key both); the plan passes the safety check.
#[tokio::test]
async fn keys_without_a_domain_with_one_group_per_unit_keep_it_in_the_aggregation_by_unit() {
    let p = policy(true, 1);
    let dp = compiled("SELECT income, sex, SUM(income) FROM t GROUP BY income, sex", &p).await.unwrap();
    let plan = dp.private.display_indent().to_string();
    assert!(plan.contains("DpUnitRuns: k=2, groups=Some(1), open keys=2 "), "{plan}");
    assert!(plan.contains("Aggregate: groupBy=[[__dp_unit]], aggr=[[dp_kept_key("), "{plan}");
    assert!(plan.contains("Aggregate: groupBy=[[t.income, t.sex]]"), "{plan}");
    assert!(!plan.contains("WindowAggr") && !plan.contains("Sort"), "{plan}");
    let unsafe_free = safety::check_total(&dp.private);
    assert!(unsafe_free.is_ok(), "{unsafe_free:?}");
}
