//! Why a statement is refused: one variant per cause, each with its message (`Display`), what to change
//! ([`Refusal::hint`]) and a stable code ([`Refusal::code`]) that the JSON output carries and a server can map to
//! an SQLSTATE.
//!
//! A refusal spends nothing, and depends only on the statement, the policy and the session (never on the data):
//! its fields hold names, types and parts of the query, never a value read from a table.

use thiserror::Error;

/// The cause of a refusal.
#[derive(Clone, Debug, PartialEq, Error)]
#[non_exhaustive]
pub enum Refusal {
    // ----- Statements
    /// The statement is empty.
    #[error("the statement is empty")]
    EmptyStatement,
    /// The SQL does not parse.
    #[error("{message}")]
    Syntax {
        /// The parser's message.
        message: String,
    },
    /// A table or column name is not known.
    #[error("{message}")]
    UnknownName {
        /// The planner's message (names from the query and the schema only).
        message: String,
    },
    /// A table the query reads is not a private table of the session.
    #[error("`{table}` is not a private table of this session")]
    NotPrivateTable {
        /// The table as the query names it.
        table: String,
    },
    /// DataFusion cannot plan the query for another reason.
    #[error("{message}")]
    Planning {
        /// The planner's message.
        message: String,
    },
    /// The query does not type-check.
    #[error("the query does not type-check: {message}")]
    TypeCheck {
        /// The analyzer's message.
        message: String,
    },
    /// `EXPLAIN ANALYZE`.
    #[error("EXPLAIN ANALYZE executes the query and its metrics carry exact row counts")]
    ExplainAnalyze,
    /// Plain `EXPLAIN`.
    #[error("plain EXPLAIN is not available")]
    PlainExplain,
    /// DDL, DML, COPY: anything that would reach outside a read-only view.
    #[error("{what} would reach outside the analyst's read-only view")]
    OutsideReadOnly {
        /// The kind of statement.
        what: String,
    },
    /// A session statement other than `SET dp.*`.
    #[error("this statement is not available")]
    StatementNotAvailable,
    /// More operators than the planner can recurse over safely.
    #[error("the statement has {count} operators; at most {max} are accepted in one statement")]
    TooManyOperators {
        /// Operators in the statement.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// Expressions nested deeper than the SQL parser can take safely.
    #[error("the statement nests expressions {depth} levels deep; at most {max} are accepted")]
    TooDeep {
        /// The deepest nesting (brackets, CASE, prefix operators such as NOT and unary minus).
        depth: usize,
        /// The limit.
        max: usize,
    },
    /// A name with dpfusion's reserved prefix.
    #[error("the name `{name}` begins with `__dp_`, which dpfusion reserves for its own columns")]
    ReservedName {
        /// The name.
        name: String,
    },
    /// An empty request id.
    #[error("the request id is empty")]
    EmptyRequestId,

    // ----- SET
    /// `SET` without `=`.
    #[error("cannot read the SET statement")]
    SetUnreadable,
    /// `SET` of something other than a `dp.` option.
    #[error("`SET {name}` is not available to the analyst")]
    SetNotAvailable {
        /// The option as written.
        name: String,
    },
    /// `SET dp.<unknown>`.
    #[error("there is no option dp.{name}")]
    NoSuchOption {
        /// The option name after `dp.`.
        name: String,
    },
    /// A value that is not valid for its option.
    #[error("dp.{option} = {value} is not valid: {reason}")]
    BadOptionValue {
        /// `rho`, `mechanism` or `confidence`.
        option: &'static str,
        /// The value as written.
        value: String,
        /// Why.
        reason: String,
    },
    /// A per-query ρ above the session's total.
    #[error(
        "dp.rho = {} exceeds the session's total budget {}",
        crate::format::fmt_num(*.rho),
        crate::format::fmt_num(*.total)
    )]
    RhoOverTotal {
        /// The ρ asked for.
        rho: f64,
        /// The session's total.
        total: f64,
    },
    /// `SET dp.target` names a column that cannot be targeted: not an output, or one whose interval is not known
    /// before the data is read.
    #[error("dp.target cannot be met for `{column}`: {reason}")]
    TargetColumn {
        /// The column (or the whole target, when it constrains no column).
        column: String,
        /// Why.
        reason: String,
    },
    /// No ρ the search tries meets `SET dp.target`.
    #[error(
        "no ρ up to {} meets dp.target = '{target}': at that ρ `{column}` is still ± {}",
        crate::format::fmt_num(*.max_rho),
        crate::format::fmt_num(*.reached)
    )]
    TargetUnreachable {
        /// The target as set.
        target: String,
        /// A column that misses it.
        column: String,
        /// The largest ρ tried.
        max_rho: f64,
        /// That column's half-width at that ρ.
        reached: f64,
    },

    // ----- The shape of the query
    /// A subquery inside an expression.
    #[error("subqueries inside expressions (IN (SELECT ...), EXISTS, scalar subqueries) are not supported")]
    Subquery,
    /// A plan shape dpfusion does not answer.
    #[error("unexpected plan shape")]
    UnexpectedShape,
    /// Rows of a private table, not aggregated.
    #[error("the query returns rows of the private table `{table}` without aggregating them")]
    RawRows {
        /// The table.
        table: String,
    },
    /// No private table is read.
    #[error("the query reads no private table")]
    NoPrivateTable,
    /// A join or union of query results.
    #[error("{what} of query results is not supported")]
    CombinedResults {
        /// `a JOIN` or `UNION`.
        what: String,
    },
    /// Another node above the aggregate.
    #[error("{what} is not supported")]
    UnsupportedNode {
        /// The node.
        what: String,
    },
    /// An aggregate of aggregates.
    #[error("aggregates of aggregates (a GROUP BY inside a subquery) are not supported")]
    NestedAggregate,
    /// A computed projection below the aggregate.
    #[error("the subquery computes `{expr}` row by row, and dpfusion cannot bound computed values")]
    ComputedBeforeAggregate {
        /// The expression.
        expr: String,
    },
    /// A join of private tables that is not on their privacy units.
    #[error("{what} is not supported (it could pair one unit's rows with another's)")]
    Join {
        /// What the join does.
        what: String,
    },
    /// A join with a public table that is not a lookup (INNER or LEFT from the private side, one equality with a
    /// unique public column).
    #[error("{what} is not supported")]
    UnsupportedJoin {
        /// What the join does.
        what: String,
    },
    /// A join on a public column whose values are not unique.
    #[error(
        "the join key {table}.{column} is not unique in the public table {table}: a private row could match \
         several public rows, multiplying its unit's contribution"
    )]
    PublicKeyNotUnique {
        /// The public table.
        table: String,
        /// The key column.
        column: String,
        /// The columns of the public table that are unique.
        unique: Vec<String>,
    },
    /// An aggregate of a public table's column.
    #[error("`{column}` is a column of a public table; aggregates measure the private table's columns")]
    PublicColumnMeasured {
        /// The column.
        column: String,
    },
    /// A query over public tables only that is not answered (EXPLAIN DP, or a shape refused for public tables).
    #[error("{what}")]
    PublicQuery {
        /// Why.
        what: String,
    },
    /// Another node below the aggregate.
    #[error("{what} before the aggregation is not supported")]
    BeforeAggregate {
        /// The node.
        what: String,
    },

    // ----- Run-time safety (nothing may fail on a value)
    /// A WHERE condition that could fail on some value.
    #[error("the WHERE condition uses {what}, which could fail on some rows and reveal them through the error")]
    UnsafeCondition {
        /// The offending part.
        what: String,
    },
    /// The optimized private plan evaluates something that could fail on some value.
    #[error(
        "the query would evaluate {what} on private rows, which could fail on some of them and reveal them through the error"
    )]
    UnsafePlan {
        /// The offending part.
        what: String,
    },
    /// The optimized private plan holds a node dpfusion does not run.
    #[error("the optimized private plan contains {node}, which dpfusion does not run")]
    UnsafeNode {
        /// The node.
        node: String,
    },
    /// A constant that fails when it is evaluated.
    #[error("the constant `{constant}` cannot be evaluated: {error}")]
    ConstantFails {
        /// The constant.
        constant: String,
        /// The evaluator's message (about constants only).
        error: String,
    },
    /// A value that could be too large for memory.
    #[error("`{expr}` could produce a value larger than {max_mib} MiB (or of a size dpfusion cannot bound)")]
    ValueTooLarge {
        /// The expression.
        expr: String,
        /// The limit.
        max_mib: u64,
    },
    /// A post-processing column that could be too large for memory.
    #[error("`{expr}` over {rows} result rows could take more than {max_mib} MiB")]
    ColumnTooLarge {
        /// The expression.
        expr: String,
        /// The result's rows.
        rows: u64,
        /// The limit.
        max_mib: u64,
    },

    // ----- GROUP BY
    /// GROUPING SETS / ROLLUP / CUBE outside the shape a workload release answers.
    #[error("GROUPING SETS / ROLLUP / CUBE {why}")]
    GroupingSets {
        /// What the statement must change.
        why: String,
    },
    /// A computed GROUP BY key.
    #[error("GROUP BY `{expr}` is computed, and a computed key has no public domain")]
    ComputedKey {
        /// The key.
        expr: String,
    },
    /// A GROUP BY key that is not a table column.
    #[error("GROUP BY `{column}` is not a table column")]
    KeyNotColumn {
        /// The key.
        column: String,
    },
    /// GROUP BY the privacy unit.
    #[error("GROUP BY on column `{column}`, the privacy unit, would release one group per person")]
    UnitAsKey {
        /// The unit column.
        column: String,
    },
    /// GROUP BY a column without a public domain.
    #[error("GROUP BY on column `{column}`, which has no public domain")]
    NoDomain {
        /// The table.
        table: String,
        /// The column.
        column: String,
    },
    /// A measurement that keys without a public domain cannot carry (yet).
    #[error("{what} over GROUP BY keys without a public domain")]
    SelectionUnsupported {
        /// What was asked.
        what: String,
    },
    /// Keys without a public domain in a session whose (ε, δ) budget cannot compose their selection.
    #[error("GROUP BY on column `{column}`, which has no public domain, in a session {why}")]
    SelectionNotAllowed {
        /// The column.
        column: String,
        /// Why not.
        why: String,
    },
    /// Too many cells.
    #[error("the GROUP BY has {cells} cells (the product of the key domains), more than {max}")]
    TooManyCells {
        /// The cells.
        cells: u64,
        /// The limit.
        max: u64,
    },

    // ----- Aggregates
    /// An aggregate expression that is not an aggregate function call.
    #[error("`{expr}` is not an aggregate dpfusion supports")]
    NotAnAggregate {
        /// The expression.
        expr: String,
    },
    /// `AGG(DISTINCT ...)`.
    #[error("{name}(DISTINCT ...) is not supported yet")]
    DistinctAggregate {
        /// The aggregate.
        name: String,
    },
    /// `AGG(...) FILTER (WHERE ...)`.
    #[error("{name}(...) FILTER (WHERE ...) is not supported")]
    FilteredAggregate {
        /// The aggregate.
        name: String,
    },
    /// `AGG(... ORDER BY ...)`.
    #[error("{name}(... ORDER BY ...) is not supported")]
    OrderedAggregate {
        /// The aggregate.
        name: String,
    },
    /// An aggregate with other than one argument.
    #[error("{aggregate} takes one column")]
    ArgumentCount {
        /// The aggregate.
        aggregate: &'static str,
    },
    /// An aggregate of a computed value.
    #[error("{aggregate}({arg}) aggregates a computed value, which dpfusion cannot bound")]
    ComputedArgument {
        /// The aggregate.
        aggregate: &'static str,
        /// The argument.
        arg: String,
    },
    /// An aggregate argument that is not a table column.
    #[error("`{column}` is not a table column")]
    ArgumentNotColumn {
        /// The argument.
        column: String,
    },
    /// SUM/AVG of the privacy unit.
    #[error("{aggregate} over the privacy unit `{column}` is meaningless")]
    UnitAggregated {
        /// The aggregate.
        aggregate: &'static str,
        /// The unit column.
        column: String,
    },
    /// SUM/AVG of a column without bounds.
    #[error("{aggregate}({column}) needs bounds on column `{column}`, and the policy declares none")]
    NoBounds {
        /// The aggregate.
        aggregate: &'static str,
        /// The table.
        table: String,
        /// The column.
        column: String,
    },
    /// Integer bounds that contain no integer.
    #[error(
        "bounds [{}, {}] of integer column `{column}` contain no integer",
        crate::format::fmt_num(*.lo),
        crate::format::fmt_num(*.hi)
    )]
    EmptyIntegerBounds {
        /// The column.
        column: String,
        /// Lower bound.
        lo: f64,
        /// Upper bound.
        hi: f64,
    },
    /// SUM/AVG of a non-numeric column.
    #[error("SUM/AVG needs a numeric column, but `{column}` is {data_type}")]
    NotNumeric {
        /// The column.
        column: String,
        /// Its type.
        data_type: String,
    },
    /// A quantile whose fraction is not a constant between 0 and 1 with at most 6 decimals.
    #[error("{aggregate}: the quantile must be a constant between 0 and 1 with at most 6 decimals, not {given}")]
    BadQuantile {
        /// The aggregate.
        aggregate: &'static str,
        /// What was given.
        given: String,
    },
    /// Quantile histograms over more slots than one query may hold.
    #[error(
        "{cells} GROUP BY cells × {slots} histogram slots of a quantile's grid exceed the {limit} one query may hold"
    )]
    QuantileTooLarge {
        /// Cells of the GROUP BY.
        cells: u64,
        /// Slots of the grid (2 per candidate, plus 1).
        slots: u64,
        /// The limit.
        limit: u64,
    },
    /// An aggregate dpfusion does not answer.
    #[error("the aggregate {name} is not supported yet")]
    UnsupportedAggregate {
        /// The aggregate.
        name: String,
    },
    /// No aggregate at all.
    #[error("the query has no aggregate (SELECT DISTINCT or GROUP BY alone would release keys and nothing else)")]
    NoAggregate,

    // ----- Pricing and planning
    /// ρ cannot be split over the measurements.
    #[error("ρ = {} cannot be split over {measures} measurements: {reason}", crate::format::fmt_num(*.rho))]
    RhoSplit {
        /// The query's ρ.
        rho: f64,
        /// The number of measurements.
        measures: usize,
        /// Why.
        reason: String,
    },
    /// A measurement cannot be calibrated.
    #[error("{measure} cannot be calibrated: {reason}")]
    Calibration {
        /// The measurement, e.g. `SUM(income)`.
        measure: String,
        /// Why.
        reason: String,
    },
    /// The private plan dpfusion built cannot be optimized or physically planned.
    #[error("the private plan cannot be {stage}: {message}")]
    PrivatePlan {
        /// `optimized` or `planned`.
        stage: &'static str,
        /// The engine's message.
        message: String,
    },

    // ----- Post-processing
    /// Post-processing that cannot be planned.
    #[error("the computation on the aggregates cannot be planned: {message}")]
    PostProcessingPlan {
        /// The engine's message.
        message: String,
    },
    /// Post-processing that fails whatever the noisy values are.
    #[error("the computation on the aggregates fails whatever their noisy values: {message}")]
    PostProcessingFails {
        /// The engine's message, on public stand-in values.
        message: String,
    },
    /// A node the post-processing size check does not know.
    #[error("post-processing with {node} is not supported")]
    PostProcessingNode {
        /// The node.
        node: String,
    },

    // ----- Request ids
    /// A request id used for another query.
    #[error("request id `{id}` was used for another query (charge #{charge})")]
    RequestIdReused {
        /// The id.
        id: String,
        /// Its charge.
        charge: u64,
    },
    /// A request id whose noise an older dpfusion did not keep.
    #[error(
        "request id `{id}` was charged by an earlier dpfusion that did not keep its noisy values, and it was never \
         answered; answering it now would need a second draw of noise"
    )]
    RequestIdLost {
        /// The id.
        id: String,
    },
    /// A request id charged at another price, or for another plan, than the query has now.
    #[error(
        "request id `{id}` was charged ρ = {} for this query, which now costs ρ = {} or runs another plan: the \
         policy or the session's settings (dp.rho, dp.mechanism) changed since the charge; its noisy values cannot \
         be reused, and new noise would be a second draw",
        crate::format::fmt_num(*.charged),
        crate::format::fmt_num(*.quoted)
    )]
    PolicyChanged {
        /// The id.
        id: String,
        /// ρ of the stored charge.
        charged: f64,
        /// ρ of the query with the current policy and settings.
        quoted: f64,
    },

    // ----- Tables and marginals
    /// No such private table.
    #[error("no private table `{table}`")]
    NoTable {
        /// The name asked for.
        table: String,
    },
    /// A column asked for twice in one marginal release.
    #[error("column `{column}` is asked for twice")]
    MarginalDuplicateColumn {
        /// The column.
        column: String,
    },
    /// A marginal of a column without a public domain.
    #[error(
        "column `{column}` has no public domain, and its keys cannot be selected from the data here (a float column, \
         or a budget without a delta for key selection)"
    )]
    MarginalNoDomain {
        /// The table.
        table: String,
        /// The column.
        column: String,
    },
    /// A marginal column whose type cannot be compared with its domain's values.
    #[error("column `{column}` is {data_type}, which cannot be compared with the {domain_type} values of its domain")]
    MarginalColumnType {
        /// The column.
        column: String,
        /// Its type.
        data_type: String,
        /// The type of its domain's values.
        domain_type: String,
    },
    /// A workload release larger than the limits allow.
    #[error("the workload has more {what} than the {limit} one release may have")]
    WorkloadTooLarge {
        /// What is too many.
        what: String,
        /// The limit.
        limit: u64,
    },
    /// A workload release under an (ε, δ) budget.
    #[error("workload releases are priced in zCDP, and this budget is an (epsilon, delta) budget")]
    WorkloadNeedsZcdp,
    /// `--all` on a table without any domain.
    #[error("table {table} has no column with a public domain")]
    NoDomainColumns {
        /// The table.
        table: String,
    },
}

impl Refusal {
    /// What to change so that the statement is answered.
    pub fn hint(&self) -> String {
        use Refusal::*;
        let explain = "use `EXPLAIN DP <query>` to see the private plan, its sensitivity and its cost";
        let one_aggregate = "write one aggregate query (COUNT, SUM, AVG, optionally GROUP BY) over one private table";
        let safe = "use comparisons of columns with literals, AND/OR/NOT, IN, BETWEEN, LIKE and IS NULL; casts only \
                    to wider types";
        match self {
            EmptyStatement => "type a query such as SELECT COUNT(*) FROM <table>".into(),
            Syntax { .. } => "check the SQL syntax".into(),
            UnknownName { .. } => "check table and column names (\\tables and \\describe in the REPL)".into(),
            NotPrivateTable { .. } => {
                "query one of the tables listed by the configuration (\\tables in the REPL)".into()
            }
            Planning { .. } => "rewrite the query as aggregates (COUNT, SUM, AVG, quantiles, VAR/STDDEV) over one \
                                 private table"
                .into(),
            TypeCheck { .. } => {
                "compare values of compatible types, and use functions with the argument types they take".into()
            }
            ExplainAnalyze => format!("{explain}, without touching data"),
            PlainExplain => explain.into(),
            OutsideReadOnly { .. } => "dpfusion answers SELECT queries with aggregates; tables are declared by the \
                                       data owner in the configuration file"
                .into(),
            StatementNotAvailable | SetNotAvailable { .. } => format!(
                "only {SETTABLE} can be set; the budget, policy and engine settings come from the configuration file"
            ),
            TooDeep { .. } => {
                "flatten the expression: fewer nested parentheses, CASEs and NOTs (write `a AND b` rather \
                                 than nested conditions, a list of values with IN (...))"
                    .into()
            }
            TooManyOperators { .. } => {
                "shorten the expression: list values with IN (...) instead of chains of OR, or split the query".into()
            }
            ReservedName { .. } => "choose another name".into(),
            EmptyRequestId => "give a non-empty id (e.g. job-2026-11-23-1)".into(),
            SetUnreadable => "write `SET dp.rho = 0.02`".into(),
            NoSuchOption { .. } => format!("the options are {SETTABLE}"),
            BadOptionValue { option: "rho", .. } => "give a ρ > 0, e.g. SET dp.rho = 0.02".into(),
            BadOptionValue { option: "mechanism", .. } => "SET dp.mechanism = 'gaussian', 'laplace' or 'auto'".into(),
            BadOptionValue { option: "selection_delta", .. } => "give a δ in (0, 0.001), e.g. SET \
                dp.selection_delta = 1e-8"
                .into(),
            BadOptionValue { option: "reuse", .. } => "SET dp.reuse = 'exact' (the default), 'derive' or 'off'".into(),
            BadOptionValue { option: "target", .. } => "give a half-width for every noisy column (SET dp.target = \
                '±10') or per column (SET dp.target = 'n:±10, total:±500'); 'off' removes it"
                .into(),
            BadOptionValue { .. } => "give a level strictly between 0 and 1, e.g. SET dp.confidence = 0.9".into(),
            RhoOverTotal { .. } => "choose a per-query ρ no larger than the total (\\budget shows what remains)".into(),
            TargetColumn { .. } => "target by name only columns that are counts, sums or linear combinations of \
                them (SET dp.target = 'n:±10'), or SET dp.target = 'off' and choose ρ with SET dp.rho"
                .into(),
            TargetUnreachable { .. } => "ask for a wider interval (a larger ±), or a lower dp.confidence".into(),
            Subquery => "rewrite the query as one aggregate over one table, with conditions in WHERE".into(),
            UnexpectedShape | UnsupportedNode { .. } => one_aggregate.into(),
            RawRows { .. } => "ask for aggregates instead, e.g. `SELECT COUNT(*) ...` or `SELECT sex, AVG(income) \
                               ... GROUP BY sex`"
                .into(),
            NoPrivateTable => "dpfusion answers aggregate queries over the private tables of the configuration".into(),
            CombinedResults { .. } => "ask one aggregate query over one private table at a time".into(),
            NestedAggregate => "ask one level of aggregation; post-process its noisy result instead".into(),
            ComputedBeforeAggregate { .. } => "aggregate table columns directly (SUM(income), not SUM(income * 2)); \
                                               arithmetic on the aggregates themselves is fine (SUM(income) * 2)"
                .into(),
            Join { .. } => "join private tables only on their privacy units (INNER or LEFT JOIN ... ON a.unit = \
                            b.unit, every table with a privacy unit), and public tables on a column unique in them"
                .into(),
            UnsupportedJoin { .. } => "join the private table with a public table by INNER JOIN or LEFT JOIN (from \
                                       the private table) ON private_column = public_key, where public_key is unique \
                                       in the public table (\\describe shows which columns are)"
                .into(),
            PublicKeyNotUnique { unique, .. } if unique.is_empty() => {
                "give the public table a column with unique values to join on".into()
            }
            PublicKeyNotUnique { unique, .. } => format!("join on a unique column: {}", unique.join(", ")),
            PublicColumnMeasured { .. } => "GROUP BY or filter on public columns; aggregate the private table's \
                                            columns"
                .into(),
            PublicQuery { .. } => "query one public table at a time (it is answered exactly, and costs nothing), \
                                   or join it with a private table inside a DP query"
                .into(),
            BeforeAggregate { .. } => "keep only WHERE conditions between the table and the aggregate".into(),
            UnsafeCondition { .. } | UnsafePlan { .. } => safe.into(),
            UnsafeNode { .. } => "simplify the query to one aggregate over one table with WHERE conditions".into(),
            ConstantFails { .. } => "fix the constant (an overflow, a division by zero, a failed cast, a too large \
                                     LIKE pattern): dpfusion evaluates every constant before the query runs"
                .into(),
            ValueTooLarge { .. } => "use functions whose result size follows from their inputs, with literal \
                                     lengths and counts (lpad(x, 10), repeat(x, 3)); numbers and short texts are fine"
                .into(),
            ColumnTooLarge { .. } => "produce shorter values, or GROUP BY fewer cells".into(),
            GroupingSets { .. } => {
                "write SELECT <keys>, COUNT(*) FROM t [WHERE ...] GROUP BY GROUPING SETS ((a, b), (a), ()) \
                                    (or CUBE (a, b), ROLLUP (a, b)) over keys with a public domain, then ORDER BY and \
                                    LIMIT over the output columns if needed; filter the result afterwards"
                    .into()
            }
            ComputedKey { .. } => "GROUP BY columns that have a `domain` in the policy".into(),
            KeyNotColumn { .. } => "GROUP BY columns of the table".into(),
            UnitAsKey { .. } => "group by a column with a public domain instead".into(),
            NoDomain { table, column } => format!(
                "add `domain = [...]` for column {column} in [tables.{table}.columns] (the values a key can take); or, \
                 for a key of integers, strings, dates or booleans, have the data owner give this budget a delta for \
                 key selection ([session] delta_budget = 1e-6, or `dpfusion analyst set-budget NAME --delta 1e-6`), \
                 and dpfusion releases the keys whose noisy count passes a threshold"
            ),
            SelectionUnsupported { .. } => "ask for COUNT, SUM or AVG over keys without a domain".into(),
            SelectionNotAllowed { column, .. } => format!(
                "declare `domain = [...]` for column {column}, or use a zCDP budget ([session] rho = ... with \
                 delta_budget = 1e-6)"
            ),
            TooManyCells { .. } => "group by fewer columns, or columns with smaller domains".into(),
            NotAnAggregate { .. } => "use COUNT, SUM or AVG".into(),
            DistinctAggregate { .. } => "use COUNT(*), COUNT(column), or COUNT(DISTINCT <privacy unit>) (not beside \
                                          a quantile)"
                .into(),
            FilteredAggregate { .. } => "move the condition into WHERE".into(),
            OrderedAggregate { .. } => "remove the ORDER BY inside the aggregate".into(),
            ArgumentCount { aggregate } => format!("write {aggregate}(column)"),
            ComputedArgument { aggregate, .. } => format!(
                "aggregate a table column ({aggregate}(income)); arithmetic on the result is fine ({aggregate}(income) * 2)"
            ),
            ArgumentNotColumn { .. } => "aggregate table columns".into(),
            UnitAggregated { .. } => "aggregate a value column".into(),
            NoBounds { table, column, .. } => {
                format!("add `bounds = [lo, hi]` for column {column} in [tables.{table}.columns]")
            }
            EmptyIntegerBounds { column, .. } => {
                format!("widen `bounds` of column {column} to include at least one integer")
            }
            NotNumeric { .. } => {
                "use COUNT on non-numeric columns, or GROUP BY them if they have a public domain".into()
            }
            UnsupportedAggregate { .. } => "dpfusion answers COUNT, SUM, AVG, MEDIAN, PERCENTILE_CONT, \
                                            APPROX_PERCENTILE_CONT, MIN, MAX, VAR_POP, VAR_SAMP, STDDEV_POP and \
                                            STDDEV_SAMP"
                .into(),
            BadQuantile { .. } => "write the quantile as a literal such as 0.5 or 0.95".into(),
            QuantileTooLarge { .. } => "group by fewer keys, or give the column a coarser `grid` in the policy".into(),
            NoAggregate => {
                "add an aggregate such as COUNT(*); the keys of a public domain are known without a query".into()
            }
            RhoSplit { .. } => "raise SET dp.rho".into(),
            Calibration { .. } => "check the column's bounds and the per-query ρ (SET dp.rho)".into(),
            PrivatePlan { .. } => "simplify the query; if it looks valid, report it as a dpfusion bug".into(),
            PostProcessingPlan { .. } => "fix the expressions, HAVING, ORDER BY or LIMIT above the aggregates".into(),
            PostProcessingFails { .. } => "fix the expressions above the aggregates (a division by zero, a cast \
                                           that cannot succeed, ...)"
                .into(),
            PostProcessingNode { .. } => "post-process the aggregate with projections, HAVING, ORDER BY, LIMIT and \
                                          window functions"
                .into(),
            RequestIdReused { .. } => "use a new request id for a new query".into(),
            RequestIdLost { .. } | PolicyChanged { .. } => "use a new request id (a new charge)".into(),
            NoTable { .. } => "see \\tables for the tables of this session".into(),
            MarginalDuplicateColumn { column } => format!("name `{column}` once in --columns"),
            MarginalNoDomain { table, column } => format!(
                "add `domain = [...]` for column {column} in [tables.{table}.columns] (for 0/1 columns: domain = [0, 1]); \
                 or, for a column of integers, strings, dates or booleans, have the data owner give this budget a \
                 delta for key selection ([session] delta_budget = 1e-6), and the keys whose noisy count passes a \
                 threshold are released"
            ),
            MarginalColumnType { column, .. } => {
                format!("declare the domain of `{column}` with values of the column's type")
            }
            NoDomainColumns { .. } => "declare `domain = [...]` for the columns to release".into(),
            WorkloadTooLarge { .. } => {
                "ask for fewer marginals, fewer columns per marginal or columns with smaller domains, or split the \
                 workload into several releases"
                    .into()
            }
            WorkloadNeedsZcdp => "release one-way marginals (no --way), or ask the data owner for a rho budget".into(),
        }
    }

    /// A stable identifier of the cause, for programs (the JSON output's `code`; a server maps it to SQLSTATE).
    pub fn code(&self) -> &'static str {
        use Refusal::*;
        match self {
            EmptyStatement => "empty_statement",
            Syntax { .. } => "syntax_error",
            UnknownName { .. } => "unknown_name",
            NotPrivateTable { .. } => "not_a_private_table",
            Planning { .. } => "cannot_plan",
            TypeCheck { .. } => "type_error",
            ExplainAnalyze => "explain_analyze",
            PlainExplain => "plain_explain",
            OutsideReadOnly { .. } => "outside_read_only_view",
            StatementNotAvailable => "statement_not_available",
            TooManyOperators { .. } => "too_many_operators",
            TooDeep { .. } => "too_deeply_nested",
            ReservedName { .. } => "reserved_name",
            EmptyRequestId => "empty_request_id",
            SetUnreadable => "set_unreadable",
            SetNotAvailable { .. } => "set_not_available",
            NoSuchOption { .. } => "no_such_option",
            BadOptionValue { .. } => "bad_option_value",
            RhoOverTotal { .. } => "rho_over_total",
            TargetColumn { .. } => "target_column",
            TargetUnreachable { .. } => "target_unreachable",
            Subquery => "subquery",
            UnexpectedShape => "unexpected_shape",
            RawRows { .. } => "raw_rows",
            NoPrivateTable => "no_private_table",
            CombinedResults { .. } => "combined_results",
            UnsupportedNode { .. } => "unsupported_node",
            NestedAggregate => "nested_aggregate",
            ComputedBeforeAggregate { .. } => "computed_before_aggregate",
            Join { .. } => "join",
            UnsupportedJoin { .. } => "unsupported_join",
            PublicKeyNotUnique { .. } => "public_key_not_unique",
            PublicColumnMeasured { .. } => "public_column_measured",
            PublicQuery { .. } => "public_query",
            BeforeAggregate { .. } => "before_aggregate",
            UnsafeCondition { .. } => "unsafe_condition",
            UnsafePlan { .. } => "unsafe_plan",
            UnsafeNode { .. } => "unsafe_node",
            ConstantFails { .. } => "constant_fails",
            ValueTooLarge { .. } => "value_too_large",
            ColumnTooLarge { .. } => "column_too_large",
            GroupingSets { .. } => "grouping_sets",
            ComputedKey { .. } => "computed_key",
            KeyNotColumn { .. } => "key_not_column",
            UnitAsKey { .. } => "unit_as_key",
            NoDomain { .. } => "no_domain",
            SelectionUnsupported { .. } => "selection_unsupported",
            SelectionNotAllowed { .. } => "selection_not_allowed",
            TooManyCells { .. } => "too_many_cells",
            NotAnAggregate { .. } => "not_an_aggregate",
            DistinctAggregate { .. } => "distinct_aggregate",
            FilteredAggregate { .. } => "filtered_aggregate",
            OrderedAggregate { .. } => "ordered_aggregate",
            ArgumentCount { .. } => "argument_count",
            ComputedArgument { .. } => "computed_argument",
            ArgumentNotColumn { .. } => "argument_not_column",
            UnitAggregated { .. } => "unit_aggregated",
            NoBounds { .. } => "no_bounds",
            EmptyIntegerBounds { .. } => "empty_integer_bounds",
            NotNumeric { .. } => "not_numeric",
            UnsupportedAggregate { .. } => "unsupported_aggregate",
            BadQuantile { .. } => "bad_quantile",
            QuantileTooLarge { .. } => "quantile_too_large",
            NoAggregate => "no_aggregate",
            RhoSplit { .. } => "rho_split",
            Calibration { .. } => "cannot_calibrate",
            PrivatePlan { .. } => "private_plan",
            PostProcessingPlan { .. } => "post_processing_plan",
            PostProcessingFails { .. } => "post_processing_fails",
            PostProcessingNode { .. } => "post_processing_node",
            RequestIdReused { .. } => "request_id_reused",
            RequestIdLost { .. } => "request_id_lost",
            PolicyChanged { .. } => "policy_changed",
            NoTable { .. } => "no_table",
            MarginalNoDomain { .. } => "marginal_no_domain",
            MarginalDuplicateColumn { .. } => "marginal_duplicate_column",
            MarginalColumnType { .. } => "marginal_column_type",
            NoDomainColumns { .. } => "no_domain_columns",
            WorkloadTooLarge { .. } => "workload_too_large",
            WorkloadNeedsZcdp => "workload_needs_zcdp",
        }
    }
}

/// The options `SET dp.<name>` accepts, as hints list them.
pub const SETTABLE: &str = "dp.rho, dp.mechanism, dp.confidence, dp.selection_delta, dp.target and dp.reuse";

/// Longest engine message a refusal quotes (characters); the rest is cut (a message can quote the statement's own
/// constants, e.g. a 120 KB LIKE pattern).
pub const MAX_ENGINE_MESSAGE: usize = 1000;

/// A DataFusion error's text as a refusal quotes it: without its backtrace, without the "Did you mean ...?"
/// suggestion (DataFusion picks it among equally close names in a per-process hash order, so the same query got
/// different texts from run to run), and cut at [`MAX_ENGINE_MESSAGE`] characters. It names the query's own text
/// and the declared schema only, never a value of the data.
pub fn engine_message(e: &datafusion::error::DataFusionError) -> String {
    let mut text = e.strip_backtrace();
    while let Some(start) = text.find(" Did you mean '") {
        let after = start + " Did you mean '".len();
        match text[after..].find("'?") {
            Some(end) => text.replace_range(start..after + end + 2, ""),
            None => break,
        }
    }
    match text.char_indices().nth(MAX_ENGINE_MESSAGE) {
        Some((cut, _)) => {
            let more = text[cut..].chars().count();
            format!("{}… ({more} more characters)", &text[..cut])
        }
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_messages_lose_suggestions_and_length() {
        use datafusion::error::DataFusionError as E;
        let e = E::Plan("No field named agee. Did you mean 'pums.age'?\nValid fields are pums.age.".into());
        assert_eq!(engine_message(&e), "Error during planning: No field named agee.\nValid fields are pums.age.");
        let long = engine_message(&E::Plan("x".repeat(5000)));
        assert!(long.ends_with("x… (4023 more characters)"), "{long}");
        let open = E::Plan("a Did you mean 'b".into());
        assert_eq!(engine_message(&open), "Error during planning: a Did you mean 'b");
    }

    #[test]
    fn codes_are_distinct_and_snake_case() {
        let samples = [
            Refusal::EmptyStatement,
            Refusal::Subquery,
            Refusal::Join { what: "a join".into() },
            Refusal::NoAggregate,
            Refusal::NoDomain { table: "t".into(), column: "c".into() },
            Refusal::NoBounds { aggregate: "SUM", table: "t".into(), column: "c".into() },
            Refusal::BadOptionValue { option: "rho", value: "x".into(), reason: "not a number".into() },
        ];
        let codes: std::collections::HashSet<_> = samples.iter().map(Refusal::code).collect();
        assert_eq!(codes.len(), samples.len());
        assert!(codes.iter().all(|c| c.chars().all(|ch| ch.is_ascii_lowercase() || ch == '_')));
        assert!(samples.iter().all(|r| !r.hint().is_empty()));
    }
}
