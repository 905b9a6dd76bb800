//! Why a statement is refused: one variant per cause, each declared once with its message (`Display`), what to
//! change ([`Refusal::hint`]), a stable code ([`Refusal::code`]) that the JSON output carries, and the SQLSTATE a
//! server sends ([`Refusal::sqlstate`]). [`Refusal::catalogue`] lists them all; `docs/refusals.md` is made from it
//! (a test in `tests/docs.rs` keeps the two equal).
//!
//! A refusal spends nothing, and depends only on the statement, the policy and the session (never on the data):
//! its fields hold names, types and parts of the query, never a value read from a table.

#[macro_use]
mod declare;

use crate::format::fmt_num;
use declare::Placeholder;
use thiserror::Error;

/// The hint of the two kinds of EXPLAIN that are not `EXPLAIN DP`.
const EXPLAIN: &str = "use `EXPLAIN DP <query>` to see the private plan, its sensitivity and its cost";
/// The hint of a plan shape dpfusion does not answer.
const ONE_AGGREGATE: &str = "write one aggregate query (COUNT, SUM, AVG, optionally GROUP BY) over one private table";
/// The hint of an expression that could fail on some value.
const SAFE: &str =
    "use comparisons of columns with literals, AND/OR/NOT, IN, BETWEEN, LIKE and IS NULL; casts only to wider types";

crate::dp_options_table!(option_hints);

/// A PostgreSQL SQLSTATE (the PostgreSQL manual's appendix A, "PostgreSQL Error Codes"): the five characters a
/// client matches, and the name of the condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SqlState {
    /// The five characters, e.g. `42501`.
    pub code: &'static str,
    /// The condition's name, e.g. `insufficient_privilege`.
    pub condition: &'static str,
}

impl SqlState {
    /// 22023: a `SET dp.…` value (or a request id) that is not valid.
    pub const INVALID_PARAMETER_VALUE: SqlState = SqlState { code: "22023", condition: "invalid_parameter_value" };
    /// 42501: the privacy policy does not allow the query; most refusals.
    pub const INSUFFICIENT_PRIVILEGE: SqlState = SqlState { code: "42501", condition: "insufficient_privilege" };
    /// 42601: the statement cannot be read.
    pub const SYNTAX_ERROR: SqlState = SqlState { code: "42601", condition: "syntax_error" };
    /// 42703: a name the query uses is not known.
    pub const UNDEFINED_COLUMN: SqlState = SqlState { code: "42703", condition: "undefined_column" };
    /// 42704: an option that does not exist or cannot be set.
    pub const UNDEFINED_OBJECT: SqlState = SqlState { code: "42704", condition: "undefined_object" };
    /// 42P01: a table that is not a private table of the session.
    pub const UNDEFINED_TABLE: SqlState = SqlState { code: "42P01", condition: "undefined_table" };
    /// 54001: a statement too large or too deep to plan safely.
    pub const STATEMENT_TOO_COMPLEX: SqlState = SqlState { code: "54001", condition: "statement_too_complex" };
    /// 55000: a request id whose charge does not fit the statement.
    pub const OBJECT_NOT_IN_PREREQUISITE_STATE: SqlState =
        SqlState { code: "55000", condition: "object_not_in_prerequisite_state" };
}

/// One refusal as the documentation describes it ([`Refusal::catalogue`]): values are shown as `{name}`.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The group it is listed in (`Statements`, `SET`, `Aggregates`, ...).
    pub group: &'static str,
    /// The variant of [`Refusal`].
    pub variant: &'static str,
    /// The stable code ([`Refusal::code`]).
    pub code: &'static str,
    /// The SQLSTATE ([`Refusal::sqlstate`]).
    pub sqlstate: SqlState,
    /// What it means (the variant's documentation).
    pub meaning: String,
    /// The variant's fields, which the message and hints show as `{field}`.
    pub fields: Vec<&'static str>,
    /// The message, as thiserror takes it: `{name}` where a value goes.
    pub message: &'static str,
    /// What to change.
    pub hint: String,
    /// Hints given instead of [`Entry::hint`] in some cases: when, and what.
    pub other_hints: Vec<(&'static str, String)>,
}

refusals! {
    "Statements" {
        /// The statement is empty.
        #[code = "empty_statement", sqlstate = SYNTAX_ERROR]
        #[error("the statement is empty")]
        #[hint("type a query such as SELECT COUNT(*) FROM <table>")]
        EmptyStatement,
        /// The SQL does not parse.
        #[code = "syntax_error", sqlstate = SYNTAX_ERROR]
        #[error("{message}")]
        #[hint("check the SQL syntax")]
        Syntax {
            /// The parser's message.
            message: String,
        },
        /// A table or column name is not known.
        #[code = "unknown_name", sqlstate = UNDEFINED_COLUMN]
        #[error("{message}")]
        #[hint("check table and column names (\\tables and \\describe in the REPL)")]
        UnknownName {
            /// The planner's message (names from the query and the schema only).
            message: String,
        },
        /// A table the query reads is not a private table of the session.
        #[code = "not_a_private_table", sqlstate = UNDEFINED_TABLE]
        #[error("`{table}` is not a private table of this session")]
        #[hint("query one of the tables listed by the configuration (\\tables in the REPL)")]
        NotPrivateTable {
            /// The table as the query names it.
            table: String,
        },
        /// DataFusion cannot plan the query for another reason.
        #[code = "cannot_plan", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("{message}")]
        #[hint("rewrite the query as aggregates (COUNT, SUM, AVG, quantiles, VAR/STDDEV) over one private table")]
        Planning {
            /// The planner's message.
            message: String,
        },
        /// The query does not type-check.
        #[code = "type_error", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("the query does not type-check: {message}")]
        #[hint("compare values of compatible types, and use functions with the argument types they take")]
        TypeCheck {
            /// The analyzer's message.
            message: String,
        },
        /// `EXPLAIN ANALYZE`.
        #[code = "explain_analyze", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("EXPLAIN ANALYZE executes the query and its metrics carry exact row counts")]
        #[hint("{EXPLAIN}, without touching data")]
        ExplainAnalyze,
        /// Plain `EXPLAIN`.
        #[code = "plain_explain", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("plain EXPLAIN is not available")]
        #[hint("{EXPLAIN}")]
        PlainExplain,
        /// DDL, DML, COPY: anything that would reach outside a read-only view.
        #[code = "outside_read_only_view", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("{what} would reach outside the analyst's read-only view")]
        #[hint(
            "dpfusion answers SELECT queries with aggregates; tables are declared by the data owner in the \
             configuration file"
        )]
        OutsideReadOnly {
            /// The kind of statement.
            what: String,
        },
        /// A session statement other than `SET dp.*`.
        #[code = "statement_not_available", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("this statement is not available")]
        #[hint("only {SETTABLE} can be set; the budget, policy and engine settings come from the configuration file")]
        StatementNotAvailable,
        /// More operators than the planner can recurse over safely.
        #[code = "too_many_operators", sqlstate = STATEMENT_TOO_COMPLEX]
        #[error("the statement has {count} operators; at most {max} are accepted in one statement")]
        #[hint("shorten the expression: list values with IN (...) instead of chains of OR, or split the query")]
        TooManyOperators {
            /// Operators in the statement.
            count: usize,
            /// The limit.
            max: usize,
        },
        /// Expressions nested deeper than the SQL parser can take safely.
        #[code = "too_deeply_nested", sqlstate = STATEMENT_TOO_COMPLEX]
        #[error("the statement nests expressions {depth} levels deep; at most {max} are accepted")]
        #[hint(
            "flatten the expression: fewer nested parentheses, CASEs and NOTs (write `a AND b` rather than nested \
             conditions, a list of values with IN (...))"
        )]
        TooDeep {
            /// The deepest nesting (brackets, CASE, prefix operators such as NOT and unary minus).
            depth: usize,
            /// The limit.
            max: usize,
        },
        /// A name with dpfusion's reserved prefix.
        #[code = "reserved_name", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("the name `{name}` begins with `__dp_`, which dpfusion reserves for its own columns")]
        #[hint("choose another name")]
        ReservedName {
            /// The name.
            name: String,
        },
        /// An empty request id.
        #[code = "empty_request_id", sqlstate = INVALID_PARAMETER_VALUE]
        #[error("the request id is empty")]
        #[hint("give a non-empty id (e.g. job-2026-11-23-1)")]
        EmptyRequestId,
    },
    "SET" {
        /// `SET` without `=`.
        #[code = "set_unreadable", sqlstate = SYNTAX_ERROR]
        #[error("cannot read the SET statement")]
        #[hint("write `SET dp.rho = 0.02`")]
        SetUnreadable,
        /// `SET` of something other than a `dp.` option.
        #[code = "set_not_available", sqlstate = UNDEFINED_OBJECT]
        #[error("`SET {name}` is not available to the analyst")]
        #[hint("only {SETTABLE} can be set; the budget, policy and engine settings come from the configuration file")]
        SetNotAvailable {
            /// The option as written.
            name: String,
        },
        /// `SET dp.<unknown>`.
        #[code = "no_such_option", sqlstate = UNDEFINED_OBJECT]
        #[error("there is no option dp.{name}")]
        #[hint("the options are {SETTABLE}")]
        NoSuchOption {
            /// The option name after `dp.`.
            name: String,
        },
        /// A value that is not valid for its option. The hint is the option's own, what it accepts (the table of
        /// options in docs/queries.md shows each).
        #[code = "bad_option_value", sqlstate = INVALID_PARAMETER_VALUE]
        #[error("dp.{option} = {value} is not valid: {reason}")]
        #[hint("{accepted}", accepted = accepted(option))]
        BadOptionValue {
            /// The option, as named after `dp.` (`rho`, `target`, ...).
            option: &'static str,
            /// The value as written.
            value: String,
            /// Why.
            reason: String,
        },
        /// A per-query ρ above the session's total.
        #[code = "rho_over_total", sqlstate = INVALID_PARAMETER_VALUE]
        #[error(
            "dp.rho = {rho} exceeds the session's total budget {total}",
            rho = fmt_num(*.rho),
            total = fmt_num(*.total)
        )]
        #[hint("choose a per-query ρ no larger than the total (\\budget shows what remains)")]
        RhoOverTotal {
            /// The ρ asked for.
            rho: f64,
            /// The session's total.
            total: f64,
        },
        /// `SET dp.target` names a column that cannot be targeted: not an output, or one whose interval is not known
        /// before the data is read.
        #[code = "target_column", sqlstate = INVALID_PARAMETER_VALUE]
        #[error("dp.target cannot be met for `{column}`: {reason}")]
        #[hint(
            "target by name only columns that are counts, sums or linear combinations of them (SET dp.target = \
             'n:±10'), or SET dp.target = 'off' and choose ρ with SET dp.rho"
        )]
        TargetColumn {
            /// The column (or the whole target, when it constrains no column).
            column: String,
            /// Why.
            reason: String,
        },
        /// No ρ the search tries meets `SET dp.target`.
        #[code = "target_unreachable", sqlstate = INVALID_PARAMETER_VALUE]
        #[error(
            "no ρ up to {max_rho} meets dp.target = '{target}': at that ρ `{column}` is still ± {reached}",
            max_rho = fmt_num(*.max_rho),
            reached = fmt_num(*.reached)
        )]
        #[hint("ask for a wider interval (a larger ±), or a lower dp.confidence")]
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
    },
    "The shape of the query" {
        /// A subquery inside an expression that is not a semi- or anti-join on the privacy unit.
        #[code = "subquery", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("{what} is not answered: a subquery inside an expression is answered only when it filters by each \
                 unit's own rows")]
        #[hint(
            "write `WHERE pid IN (SELECT pid FROM t WHERE ...)`, `NOT IN`, or `[NOT] EXISTS (SELECT ... FROM t2 WHERE \
             t2.pid = t.pid AND ...)`, at the top of WHERE (pid: the privacy unit of both tables); scalar \
             subqueries over private tables are not answered"
        )]
        Subquery {
            /// The subquery.
            what: String,
        },
        /// A plan shape dpfusion does not answer.
        #[code = "unexpected_shape", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("unexpected plan shape")]
        #[hint("{ONE_AGGREGATE}")]
        UnexpectedShape,
        /// Rows of a private table, not aggregated.
        #[code = "raw_rows", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("the query returns rows of the private table `{table}` without aggregating them")]
        #[hint("ask for aggregates instead, e.g. `SELECT COUNT(*) ...` or `SELECT sex, AVG(income) ... GROUP BY sex`")]
        RawRows {
            /// The table.
            table: String,
        },
        /// No private table is read.
        #[code = "no_private_table", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("the query reads no private table")]
        #[hint("dpfusion answers aggregate queries over the private tables of the configuration")]
        NoPrivateTable,
        /// A join or union of query results.
        #[code = "combined_results", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("{what} of query results is not supported")]
        #[hint("ask one aggregate query over one private table at a time")]
        CombinedResults {
            /// `a JOIN` or `UNION`.
            what: String,
        },
        /// Another node above the aggregate.
        #[code = "unsupported_node", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("{what} is not supported")]
        #[hint("{ONE_AGGREGATE}")]
        UnsupportedNode {
            /// The node.
            what: String,
        },
        /// An aggregate of aggregates that is not a question about each person.
        #[code = "nested_aggregate", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("an aggregate of aggregates is answered only over a subquery grouped by the privacy unit: {why}")]
        #[hint(
            "ask about each person first, in a subquery grouped by the privacy unit, e.g. SELECT AVG(n) FROM (SELECT \
             pid, COUNT(*) AS n FROM t GROUP BY pid) s; or ask one level of aggregation and post-process its result"
        )]
        NestedAggregate {
            /// What is wrong with the inner aggregate.
            why: String,
        },
        /// A join of private tables that is not on their privacy units.
        #[code = "join", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("{what} is not supported (it could pair one unit's rows with another's)")]
        #[hint(
            "join private tables only on their privacy units (INNER or LEFT JOIN ... ON a.unit = b.unit, every table \
             with a privacy unit), and public tables on a column unique in them"
        )]
        Join {
            /// What the join does.
            what: String,
        },
        /// A join with a public table that is not a lookup (INNER or LEFT from the private side, one equality with a
        /// unique public column).
        #[code = "unsupported_join", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("{what} is not supported")]
        #[hint(
            "join the private table with a public table by INNER JOIN or LEFT JOIN (from the private table) ON \
             private_column = public_key, where public_key is unique in the public table (\\describe shows which \
             columns are)"
        )]
        UnsupportedJoin {
            /// What the join does.
            what: String,
        },
        /// A join on a public column whose values are not unique.
        #[code = "public_key_not_unique", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error(
            "the join key {table}.{column} is not unique in the public table {table}: a private row could match \
             several public rows, multiplying its unit's contribution"
        )]
        #[hint_if(
            unique.is_empty(),
            "no column of the public table is unique",
            "give the public table a column with unique values to join on"
        )]
        #[hint("join on a unique column: {unique}", unique = unique.join(", "))]
        PublicKeyNotUnique {
            /// The public table.
            table: String,
            /// The key column.
            column: String,
            /// The columns of the public table that are unique.
            unique: Vec<String>,
        },
        /// An aggregate of a public table's column.
        #[code = "public_column_measured", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("`{column}` is a column of a public table; aggregates measure the private table's columns")]
        #[hint("GROUP BY or filter on public columns; aggregate the private table's columns")]
        PublicColumnMeasured {
            /// The column.
            column: String,
        },
        /// A query over public tables only that is not answered (EXPLAIN DP, or a shape refused for public tables).
        #[code = "public_query", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("{what}")]
        #[hint(
            "query one public table at a time (it is answered exactly, and costs nothing), or join it with a private \
             table inside a DP query"
        )]
        PublicQuery {
            /// Why.
            what: String,
        },
        /// Another node below the aggregate.
        #[code = "before_aggregate", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("{what} before the aggregation is not supported")]
        #[hint("keep only WHERE conditions between the table and the aggregate")]
        BeforeAggregate {
            /// The node.
            what: String,
        },
    },
    "Run-time safety (nothing may fail on a value)" {
        /// A WHERE condition that could fail on some value.
        #[code = "unsafe_condition", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("the WHERE condition uses {what}, which could fail on some rows and reveal them through the error")]
        #[hint("{SAFE}")]
        UnsafeCondition {
            /// The offending part.
            what: String,
        },
        /// The optimized private plan evaluates something that could fail on some value.
        #[code = "unsafe_plan", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error(
            "the query would evaluate {what} on private rows, which could fail on some of them and reveal them \
             through the error"
        )]
        #[hint("{SAFE}")]
        UnsafePlan {
            /// The offending part.
            what: String,
        },
        /// The optimized private plan holds a node dpfusion does not run.
        #[code = "unsafe_node", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("the optimized private plan contains {node}, which dpfusion does not run")]
        #[hint("simplify the query to one aggregate over one table with WHERE conditions")]
        UnsafeNode {
            /// The node.
            node: String,
        },
        /// A constant that fails when it is evaluated.
        #[code = "constant_fails", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("the constant `{constant}` cannot be evaluated: {error}")]
        #[hint(
            "fix the constant (an overflow, a division by zero, a failed cast, a too large LIKE pattern): dpfusion \
             evaluates every constant before the query runs"
        )]
        ConstantFails {
            /// The constant.
            constant: String,
            /// The evaluator's message (about constants only).
            error: String,
        },
        /// A value that could be too large for memory.
        #[code = "value_too_large", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("`{expr}` could produce a value larger than {max_mib} MiB (or of a size dpfusion cannot bound)")]
        #[hint(
            "use functions whose result size follows from their inputs, with literal lengths and counts (lpad(x, 10), \
             repeat(x, 3)); numbers and short texts are fine"
        )]
        ValueTooLarge {
            /// The expression.
            expr: String,
            /// The limit.
            max_mib: u64,
        },
        /// A post-processing column that could be too large for memory.
        #[code = "column_too_large", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("`{expr}` over {rows} result rows could take more than {max_mib} MiB")]
        #[hint("produce shorter values, or GROUP BY fewer cells")]
        ColumnTooLarge {
            /// The expression.
            expr: String,
            /// The result's rows.
            rows: u64,
            /// The limit.
            max_mib: u64,
        },
    },
    "GROUP BY" {
        /// GROUPING SETS / ROLLUP / CUBE outside the shape a workload release answers.
        #[code = "grouping_sets", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("GROUPING SETS / ROLLUP / CUBE {why}")]
        #[hint(
            "write SELECT <keys>, COUNT(*) [, SUM(x), AVG(x), expressions of them] FROM t [WHERE ...] GROUP BY \
             GROUPING SETS ((a, b), (a), ()) (or CUBE (a, b), ROLLUP (a, b)), then HAVING, ORDER BY and LIMIT over \
             the output columns if needed"
        )]
        GroupingSets {
            /// What the statement must change.
            why: String,
        },
        /// A computed GROUP BY key whose values cannot be listed from the policy, without a δ budget to select
        /// them.
        #[code = "computed_key", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("GROUP BY `{expr}` has no public domain: {why}")]
        #[hint(
            "group by an expression of columns with a domain or integer bounds (age / 10 * 10, CASE WHEN age < 30 \
             THEN 'young' ELSE 'older' END), or give the session a δ budget so that its values are selected by \
             their noisy counts"
        )]
        ComputedKey {
            /// The key.
            expr: String,
            /// Why its values cannot be listed.
            why: String,
        },
        /// A computed value or key that could fail on some value of the columns it reads.
        #[code = "computed_fails", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("`{expr}` could fail on some values: {what}")]
        #[hint(
            "declare bounds for the columns it reads, clamp them (LEAST(GREATEST(x, lo), hi)), or guard the \
             operation (x / NULLIF(y, 0))"
        )]
        ComputedFails {
            /// The expression, as written.
            expr: String,
            /// The sub-expression that could fail, and why.
            what: String,
        },
        /// An aggregate (other than COUNT) of a computed value without finite bounds.
        #[code = "unbounded_value", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("{aggregate}({expr}) needs bounds on `{expr}`, and {why}")]
        #[hint("declare bounds for the columns it reads in the policy, or clamp it: LEAST(GREATEST({expr}, lo), hi)")]
        UnboundedValue {
            /// The aggregate.
            aggregate: String,
            /// The value, as written.
            expr: String,
            /// Why it has no bounds.
            why: String,
        },
        /// A GROUP BY key that is not a table column.
        #[code = "key_not_column", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("GROUP BY `{column}` is not a table column")]
        #[hint("GROUP BY columns of the table")]
        KeyNotColumn {
            /// The key.
            column: String,
        },
        /// GROUP BY the privacy unit.
        #[code = "unit_as_key", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("GROUP BY on column `{column}`, the privacy unit, would release one group per person")]
        #[hint("group by a column with a public domain instead")]
        UnitAsKey {
            /// The unit column.
            column: String,
        },
        /// GROUP BY a column without a public domain.
        #[code = "no_domain", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("GROUP BY on column `{column}`, which has no public domain")]
        #[hint(
            "add `domain = [...]` for column {column} in [tables.{table}.columns] (the values a key can take); or, for \
             a key of integers, strings, dates or booleans, have the data owner give this budget a delta for key \
             selection ([session] delta_budget = 1e-6, or `dpfusion analyst set-budget NAME --delta 1e-6`), and \
             dpfusion releases the keys whose noisy count passes a threshold"
        )]
        NoDomain {
            /// The table.
            table: String,
            /// The column.
            column: String,
        },
        /// A measurement that keys without a public domain cannot carry (yet).
        #[code = "selection_unsupported", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("{what} over GROUP BY keys without a public domain")]
        #[hint("ask for COUNT, SUM or AVG over keys without a domain")]
        SelectionUnsupported {
            /// What was asked.
            what: String,
        },
        /// Keys without a public domain in a session whose (ε, δ) budget cannot compose their selection.
        #[code = "selection_not_allowed", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("GROUP BY on column `{column}`, which has no public domain, in a session {why}")]
        #[hint(
            "declare `domain = [...]` for column {column}, or use a zCDP budget ([session] rho = ... with delta_budget \
             = 1e-6)"
        )]
        SelectionNotAllowed {
            /// The column.
            column: String,
            /// Why not.
            why: String,
        },
        /// Too many cells.
        #[code = "too_many_cells", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("the GROUP BY has {cells} cells (the product of the key domains), more than {max}")]
        #[hint("group by fewer columns, or columns with smaller domains")]
        TooManyCells {
            /// The cells.
            cells: u64,
            /// The limit.
            max: u64,
        },
    },
    "Aggregates" {
        /// An aggregate expression that is not an aggregate function call.
        #[code = "not_an_aggregate", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("`{expr}` is not an aggregate dpfusion supports")]
        #[hint("use COUNT, SUM or AVG")]
        NotAnAggregate {
            /// The expression.
            expr: String,
        },
        /// `AGG(DISTINCT ...)`.
        #[code = "distinct_aggregate", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("{name}(DISTINCT ...) is not supported yet")]
        #[hint("use COUNT(*), COUNT(column), or COUNT(DISTINCT <privacy unit>) (not beside a quantile)")]
        DistinctAggregate {
            /// The aggregate.
            name: String,
        },
        /// `AGG(DISTINCT ...) FILTER (WHERE ...)` but `COUNT(DISTINCT <privacy unit>) FILTER (WHERE ...)`.
        #[code = "distinct_with_filter", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("{name}(DISTINCT ...) FILTER (WHERE ...) is not supported yet")]
        #[hint(
            "count persons with COUNT(DISTINCT <privacy unit>) FILTER (WHERE ...), rows with COUNT(*) FILTER \
             (WHERE ...), or move the condition into WHERE (one query per condition)"
        )]
        DistinctWithFilter {
            /// The aggregate.
            name: String,
        },
        /// `AGG(... ORDER BY ...)`.
        #[code = "ordered_aggregate", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("{name}(... ORDER BY ...) is not supported")]
        #[hint("remove the ORDER BY inside the aggregate")]
        OrderedAggregate {
            /// The aggregate.
            name: String,
        },
        /// An aggregate with other than one argument.
        #[code = "argument_count", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("{aggregate} takes one column")]
        #[hint("write {aggregate}(column)")]
        ArgumentCount {
            /// The aggregate.
            aggregate: &'static str,
        },
        /// An aggregate of a constant.
        #[code = "computed_argument", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("{aggregate}({arg}) aggregates a constant")]
        #[hint(
            "aggregate a column or an expression of columns ({aggregate}(income), {aggregate}(income * 2)); COUNT(*) \
             counts rows"
        )]
        ComputedArgument {
            /// The aggregate.
            aggregate: &'static str,
            /// The argument.
            arg: String,
        },
        /// An aggregate argument that is not a table column.
        #[code = "argument_not_column", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("`{column}` is not a table column")]
        #[hint("aggregate table columns")]
        ArgumentNotColumn {
            /// The argument.
            column: String,
        },
        /// SUM/AVG of the privacy unit.
        #[code = "unit_aggregated", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("{aggregate} over the privacy unit `{column}` is meaningless")]
        #[hint("aggregate a value column")]
        UnitAggregated {
            /// The aggregate.
            aggregate: &'static str,
            /// The unit column.
            column: String,
        },
        /// SUM/AVG of a column without bounds.
        #[code = "no_bounds", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("{aggregate}({column}) needs bounds on column `{column}`, and the policy declares none")]
        #[hint("add `bounds = [lo, hi]` for column {column} in [tables.{table}.columns]")]
        NoBounds {
            /// The aggregate.
            aggregate: &'static str,
            /// The table.
            table: String,
            /// The column.
            column: String,
        },
        /// Integer bounds that contain no integer.
        #[code = "empty_integer_bounds", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error(
            "bounds [{lo}, {hi}] of integer column `{column}` contain no integer",
            lo = fmt_num(*.lo),
            hi = fmt_num(*.hi)
        )]
        #[hint("widen `bounds` of column {column} to include at least one integer")]
        EmptyIntegerBounds {
            /// The column.
            column: String,
            /// Lower bound.
            lo: f64,
            /// Upper bound.
            hi: f64,
        },
        /// SUM/AVG of a non-numeric column.
        #[code = "not_numeric", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("SUM/AVG needs a numeric column, but `{column}` is {data_type}")]
        #[hint("use COUNT on non-numeric columns, or GROUP BY them if they have a public domain")]
        NotNumeric {
            /// The column.
            column: String,
            /// Its type.
            data_type: String,
        },
        /// A quantile whose fraction is not a constant between 0 and 1 with at most 6 decimals.
        #[code = "bad_quantile", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("{aggregate}: the quantile must be a constant between 0 and 1 with at most 6 decimals, not {given}")]
        #[hint("write the quantile as a literal such as 0.5 or 0.95")]
        BadQuantile {
            /// The aggregate.
            aggregate: &'static str,
            /// What was given.
            given: String,
        },
        /// Quantile histograms over more slots than one query may hold.
        #[code = "quantile_too_large", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error(
            "{cells} GROUP BY cells × {slots} histogram slots of a quantile's grid exceed the {limit} one query may \
             hold"
        )]
        #[hint("group by fewer keys, or give the column a coarser `grid` in the policy")]
        QuantileTooLarge {
            /// Cells of the GROUP BY.
            cells: u64,
            /// Slots of the grid (2 per candidate, plus 1).
            slots: u64,
            /// The limit.
            limit: u64,
        },
        /// An aggregate dpfusion does not answer.
        #[code = "unsupported_aggregate", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("the aggregate {name} is not supported yet")]
        #[hint(
            "dpfusion answers COUNT, SUM, AVG, MEDIAN, PERCENTILE_CONT, APPROX_PERCENTILE_CONT, MIN, MAX, VAR_POP, \
             VAR_SAMP, STDDEV_POP, STDDEV_SAMP, CORR, COVAR_POP, COVAR_SAMP and REGR_SLOPE, REGR_INTERCEPT, \
             REGR_R2, REGR_COUNT, REGR_AVGX, REGR_AVGY, REGR_SXX, REGR_SYY, REGR_SXY"
        )]
        UnsupportedAggregate {
            /// The aggregate.
            name: String,
        },
        /// No aggregate at all.
        #[code = "no_aggregate", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("the query has no aggregate (SELECT DISTINCT or GROUP BY alone would release keys and nothing else)")]
        #[hint("add an aggregate such as COUNT(*); the keys of a public domain are known without a query")]
        NoAggregate,
    },
    "Pricing and planning" {
        /// ρ cannot be split over the measurements.
        #[code = "rho_split", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("ρ = {rho} cannot be split over {measures} measurements: {reason}", rho = fmt_num(*.rho))]
        #[hint("raise SET dp.rho")]
        RhoSplit {
            /// The query's ρ.
            rho: f64,
            /// The number of measurements.
            measures: usize,
            /// Why.
            reason: String,
        },
        /// A measurement cannot be calibrated.
        #[code = "cannot_calibrate", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("{measure} cannot be calibrated: {reason}")]
        #[hint("check the column's bounds and the per-query ρ (SET dp.rho)")]
        Calibration {
            /// The measurement, e.g. `SUM(income)`.
            measure: String,
            /// Why.
            reason: String,
        },
        /// The private plan dpfusion built cannot be optimized or physically planned.
        #[code = "private_plan", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("the private plan cannot be {stage}: {message}")]
        #[hint("simplify the query; if it looks valid, report it as a dpfusion bug")]
        PrivatePlan {
            /// `optimized` or `planned`.
            stage: &'static str,
            /// The engine's message.
            message: String,
        },
    },
    "Post-processing" {
        /// Post-processing that cannot be planned.
        #[code = "post_processing_plan", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("the computation on the aggregates cannot be planned: {message}")]
        #[hint("fix the expressions, HAVING, ORDER BY or LIMIT above the aggregates")]
        PostProcessingPlan {
            /// The engine's message.
            message: String,
        },
        /// Post-processing that fails whatever the noisy values are.
        #[code = "post_processing_fails", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("the computation on the aggregates fails whatever their noisy values: {message}")]
        #[hint("fix the expressions above the aggregates (a division by zero, a cast that cannot succeed, ...)")]
        PostProcessingFails {
            /// The engine's message, on public stand-in values.
            message: String,
        },
        /// A node the post-processing size check does not know.
        #[code = "post_processing_node", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("post-processing with {node} is not supported")]
        #[hint("post-process the aggregate with projections, HAVING, ORDER BY, LIMIT and window functions")]
        PostProcessingNode {
            /// The node.
            node: String,
        },
    },
    "Request ids" {
        /// A request id used for another query.
        #[code = "request_id_reused", sqlstate = OBJECT_NOT_IN_PREREQUISITE_STATE]
        #[error("request id `{id}` was used for another query (charge #{charge})")]
        #[hint("use a new request id for a new query")]
        RequestIdReused {
            /// The id.
            id: String,
            /// Its charge.
            charge: u64,
        },
        /// A request id whose noise an older dpfusion did not keep.
        #[code = "request_id_lost", sqlstate = OBJECT_NOT_IN_PREREQUISITE_STATE]
        #[error(
            "request id `{id}` was charged by an earlier dpfusion that did not keep its noisy values, and it was never \
             answered; answering it now would need a second draw of noise"
        )]
        #[hint("use a new request id (a new charge)")]
        RequestIdLost {
            /// The id.
            id: String,
        },
        /// A request id charged at another price, or for another plan, than the query has now.
        #[code = "policy_changed", sqlstate = OBJECT_NOT_IN_PREREQUISITE_STATE]
        #[error(
            "request id `{id}` was charged ρ = {charged} for this query, which now costs ρ = {quoted} or runs another \
             plan: the policy or the session's settings (dp.rho, dp.mechanism) changed since the charge; its noisy \
             values cannot be reused, and new noise would be a second draw",
            charged = fmt_num(*.charged),
            quoted = fmt_num(*.quoted)
        )]
        #[hint("use a new request id (a new charge)")]
        PolicyChanged {
            /// The id.
            id: String,
            /// ρ of the stored charge.
            charged: f64,
            /// ρ of the query with the current policy and settings.
            quoted: f64,
        },
    },
    "Tables and marginals" {
        /// No such private table.
        #[code = "no_table", sqlstate = UNDEFINED_TABLE]
        #[error("no private table `{table}`")]
        #[hint("see \\tables for the tables of this session")]
        NoTable {
            /// The name asked for.
            table: String,
        },
        /// A column asked for twice in one marginal release.
        #[code = "marginal_duplicate_column", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("column `{column}` is asked for twice")]
        #[hint("name `{column}` once in --columns")]
        MarginalDuplicateColumn {
            /// The column.
            column: String,
        },
        /// A marginal of a column without a public domain.
        #[code = "marginal_no_domain", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error(
            "column `{column}` has no public domain, and its keys cannot be selected from the data here (a float \
             column, or a budget without a delta for key selection)"
        )]
        #[hint(
            "add `domain = [...]` for column {column} in [tables.{table}.columns] (for 0/1 columns: domain = [0, 1]); \
             or, for a column of integers, strings, dates or booleans, have the data owner give this budget a delta \
             for key selection ([session] delta_budget = 1e-6), and the keys whose noisy count passes a threshold are \
             released"
        )]
        MarginalNoDomain {
            /// The table.
            table: String,
            /// The column.
            column: String,
        },
        /// A workload column without a public domain of a type whose keys a workload cannot select.
        #[code = "workload_key_type", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error(
            "column `{column}` has no public domain, and a workload selects the keys of integers, strings, dates and \
             booleans only, not of {data_type}"
        )]
        #[hint(
            "declare `domain = [...]` for column {column}, or group by a date, an integer or a string computed from it"
        )]
        WorkloadKeyType {
            /// The column.
            column: String,
            /// Its type.
            data_type: String,
        },
        /// A marginal column whose type cannot be compared with its domain's values.
        #[code = "marginal_column_type", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error(
            "column `{column}` is {data_type}, which cannot be compared with the {domain_type} values of its domain"
        )]
        #[hint("declare the domain of `{column}` with values of the column's type")]
        MarginalColumnType {
            /// The column.
            column: String,
            /// Its type.
            data_type: String,
            /// The type of its domain's values.
            domain_type: String,
        },
        /// A workload release larger than the limits allow.
        #[code = "workload_too_large", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("the workload has more {what} than the {limit} one release may have")]
        #[hint(
            "ask for fewer marginals, fewer columns per marginal or columns with smaller domains, or split the \
             workload into several releases"
        )]
        WorkloadTooLarge {
            /// What is too many.
            what: String,
            /// The limit.
            limit: u64,
        },
        /// A workload release that would need more memory than the configuration allows.
        #[code = "workload_memory", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("the workload's release would hold about {needs_mb} MiB, more than the {limit_mb} MiB allowed")]
        #[hint(
            "ask for fewer marginals or marginals with fewer cells, split the workload into several releases, or ask \
             the data owner to raise [session] workload_memory_mb"
        )]
        WorkloadMemory {
            /// What the release needs (MiB, from the workload's cells and contrasts).
            needs_mb: u64,
            /// The limit (MiB).
            limit_mb: u64,
        },
        /// A workload release under an (ε, δ) budget.
        #[code = "workload_needs_zcdp", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("workload releases are priced in zCDP, and this budget is an (epsilon, delta) budget")]
        #[hint("release one-way marginals (no --way), or ask the data owner for a rho budget")]
        WorkloadNeedsZcdp,
        /// `--all` on a table without any domain.
        #[code = "no_domain_columns", sqlstate = INSUFFICIENT_PRIVILEGE]
        #[error("table {table} has no column with a public domain")]
        #[hint("declare `domain = [...]` for the columns to release")]
        NoDomainColumns {
            /// The table.
            table: String,
        },
    },
}

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
    fn codes_are_distinct_snake_case_and_every_refusal_has_a_hint() {
        let all = Refusal::catalogue();
        let mut codes: Vec<&str> = all.iter().map(|e| e.code).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), all.len(), "a code is used twice");
        for e in &all {
            let snake = e.code.split('_').all(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase()));
            assert!(snake, "{}: `{}` is not a snake_case identifier", e.variant, e.code);
            assert!(!e.hint.is_empty() && !e.meaning.is_empty(), "{}", e.variant);
        }
    }

    #[test]
    fn a_refusal_has_the_code_sqlstate_and_hint_of_its_declaration() {
        let r = Refusal::NoBounds { aggregate: "SUM", table: "pums".into(), column: "income".into() };
        let e = Refusal::catalogue().into_iter().find(|e| e.code == r.code()).expect("declared");
        assert_eq!((e.variant, r.sqlstate()), ("NoBounds", SqlState::INSUFFICIENT_PRIVILEGE));
        assert_eq!(e.hint, "add `bounds = [lo, hi]` for column {column} in [tables.{table}.columns]");
        assert_eq!(r.hint(), "add `bounds = [lo, hi]` for column income in [tables.pums.columns]");
        let key = |unique: Vec<String>| Refusal::PublicKeyNotUnique { table: "t".into(), column: "k".into(), unique };
        assert_eq!(key(vec!["a".into(), "b".into()]).hint(), "join on a unique column: a, b");
        assert_eq!(key(vec![]).hint(), "give the public table a column with unique values to join on");
        assert_eq!(Refusal::PlainExplain.hint(), EXPLAIN);
        let bad = Refusal::BadOptionValue { option: "reuse", value: "x".into(), reason: "no".into() };
        assert_eq!(bad.hint(), "SET dp.reuse = 'exact' (the default), 'derive' or 'off'");
    }
}
